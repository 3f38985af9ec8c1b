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
	objectsRefused  prometheus.Counter
	moves           prometheus.Counter
	scopeChanges    *prometheus.CounterVec
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
		objectsRefused:  prometheus.NewCounter(prometheus.CounterOpts{Name: "informerd_objects_refused_total", Help: "Object states not served because they were larger than -max-object-bytes."}),
		moves:           prometheus.NewCounter(prometheus.CounterOpts{Name: "informerd_subscriber_moves_total", Help: "Subscriptions moved, without a RESET, to another informer of their resource when the automatic scope changed the one that serves their namespace."}),
		scopeChanges: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "informerd_scope_changes_total",
			Help: "Times the automatic scope changed how a resource's namespaced subscriptions are served: to=cluster (one cluster-wide informer) or to=namespace (an informer per namespace)."}, []string{"to"}),
	}
	if reg != nil {
		reg.MustRegister(m.sources, m.subscribers, m.objects, m.upstreamLists, m.upstreamWatches, m.upstreamRelists, m.eventsIn, m.catchUps, m.objectsRefused, m.moves, m.scopeChanges)
	}
	return m
}

// sourceCollector reports per-resource figures computed at scrape time from
// the Manager's Sources: reference counts, log sizes and subscriber lag. Its
// only label is the resource, which has the cardinality of the resources
// the node watches.
type sourceCollector struct{ m *Manager }

var (
	descRefs  = prometheus.NewDesc("informerd_source_refs", "Subscriptions holding the informers of a resource.", []string{"resource"}, nil)
	descLog   = prometheus.NewDesc("informerd_log_events", "Events held in the event logs of a resource's informers.", []string{"resource"}, nil)
	descLag   = prometheus.NewDesc("informerd_subscriber_lag_events_max", "Events the slowest subscriber of a resource is behind.", []string{"resource"}, nil)
	descStale = prometheus.NewDesc("informerd_sources_stale", "Informers of a resource serving their last state while the API server is unreachable.", []string{"resource"}, nil)
)

func (c sourceCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descRefs
	ch <- descLog
	ch <- descLag
	ch <- descStale
}

func (c sourceCollector) Collect(ch chan<- prometheus.Metric) {
	type agg struct{ refs, log, lag, stale float64 }
	by := map[string]*agg{}
	for _, s := range c.m.Sources() {
		r := s.Key.GVR.GroupResource().String()
		a := by[r]
		if a == nil {
			a = &agg{}
			by[r] = a
		}
		a.refs += float64(s.RefCount)
		a.log += float64(s.LogEvents)
		a.lag = max(a.lag, float64(s.MaxLagEvents))
		if s.State == StateStale {
			a.stale++
		}
	}
	for r, a := range by {
		ch <- prometheus.MustNewConstMetric(descRefs, prometheus.GaugeValue, a.refs, r)
		ch <- prometheus.MustNewConstMetric(descLog, prometheus.GaugeValue, a.log, r)
		ch <- prometheus.MustNewConstMetric(descLag, prometheus.GaugeValue, a.lag, r)
		ch <- prometheus.MustNewConstMetric(descStale, prometheus.GaugeValue, a.stale, r)
	}
}
