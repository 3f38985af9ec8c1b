package cache

import "github.com/prometheus/client_golang/prometheus"

// metrics are the cache's Prometheus metrics. They carry no per-object or
// per-client labels.
type metrics struct {
	sources         prometheus.Gauge
	subscribers     prometheus.Gauge
	objects         prometheus.Gauge
	upstreamLists   prometheus.Counter
	upstreamWatches prometheus.Counter
	upstreamRelists prometheus.Counter
	eventsIn        prometheus.Counter
	catchUps        prometheus.Counter
}

// newMetrics creates the metrics and registers them on reg if it is not nil.
func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		sources:         prometheus.NewGauge(prometheus.GaugeOpts{Name: "informerd_sources", Help: "Upstream informers running, in use or lingering."}),
		subscribers:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "informerd_subscribers", Help: "Subscriptions open."}),
		objects:         prometheus.NewGauge(prometheus.GaugeOpts{Name: "informerd_objects", Help: "Objects stored across all informers."}),
		upstreamLists:   prometheus.NewCounter(prometheus.CounterOpts{Name: "informerd_upstream_lists_total", Help: "Lists (LIST or WatchList) sent to the API server."}),
		upstreamWatches: prometheus.NewCounter(prometheus.CounterOpts{Name: "informerd_upstream_watches_total", Help: "Watches opened on the API server."}),
		upstreamRelists: prometheus.NewCounter(prometheus.CounterOpts{Name: "informerd_upstream_relists_total", Help: "Relists after a watch's resourceVersion expired."}),
		eventsIn:        prometheus.NewCounter(prometheus.CounterOpts{Name: "informerd_events_in_total", Help: "Events received from the API server (relists count their difference)."}),
		catchUps:        prometheus.NewCounter(prometheus.CounterOpts{Name: "informerd_subscriber_catchups_total", Help: "Times a subscriber fell out of an event log and was caught up from the store."}),
	}
	if reg != nil {
		reg.MustRegister(m.sources, m.subscribers, m.objects, m.upstreamLists, m.upstreamWatches, m.upstreamRelists, m.eventsIn, m.catchUps)
	}
	return m
}
