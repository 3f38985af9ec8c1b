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
	// unaryRefused counts unary calls refused for their caller's share,
	// by RPC; newInformersRefused requests refused for their caller's rate
	// of new informers.
	unaryRefused        *prometheus.CounterVec
	newInformersRefused prometheus.Counter
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
		unaryRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "informerd_unary_calls_refused_total", Help: "Unary calls refused with RESOURCE_EXHAUSTED because their caller was over its share (-unary-calls-per-second, -unary-call-burst, -unary-calls-in-flight-per-caller), by RPC.",
		}, []string{"rpc"}),
		newInformersRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "informerd_new_informers_refused_total", Help: "Requests refused with RESOURCE_EXHAUSTED because they would have started an informer beyond their caller's -new-informers-per-minute.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.streams, m.eventsOut, m.bytesOut, m.requestErrors, m.statusStreams, m.statusEventsOut, m.limited, m.unaryRefused, m.newInformersRefused)
	}
	return m
}
