package daemon

import "github.com/prometheus/client_golang/prometheus"

// metrics are the gRPC side's Prometheus metrics.
type metrics struct {
	streams       prometheus.Gauge
	eventsOut     prometheus.Counter
	bytesOut      prometheus.Counter
	requestErrors *prometheus.CounterVec
	// statusStreams and statusEventsOut are WatchStatus's.
	statusStreams   prometheus.Gauge
	statusEventsOut prometheus.Counter
	limited         *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		streams:   prometheus.NewGauge(prometheus.GaugeOpts{Name: "informerd_streams", Help: "Watch streams open."}),
		eventsOut: prometheus.NewCounter(prometheus.CounterOpts{Name: "informerd_events_out_total", Help: "Events written to watch streams."}),
		bytesOut:  prometheus.NewCounter(prometheus.CounterOpts{Name: "informerd_bytes_out_total", Help: "Encoded event bytes written to watch streams."}),
		requestErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "informerd_stream_errors_total", Help: "Streams ended with an error, and requests refused before their handler (authentication, limits), by gRPC code.",
		}, []string{"code"}),
		statusStreams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "informerd_status_streams", Help: "WatchStatus streams open."}),
		statusEventsOut: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "informerd_status_events_out_total", Help: "Status events (statuses and SYNCED markers) written to WatchStatus streams.",
		}),
		limited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "informerd_limit_rejections_total", Help: "Streams and connections refused by a limit, by limit: streams_per_caller, status_objects_per_caller, connections, connections_per_peer, unauthenticated_connections.",
		}, []string{"limit"}),
	}
	if reg != nil {
		reg.MustRegister(m.streams, m.eventsOut, m.bytesOut, m.requestErrors, m.statusStreams, m.statusEventsOut, m.limited)
	}
	return m
}
