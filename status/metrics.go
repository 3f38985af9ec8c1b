package status

import "github.com/prometheus/client_golang/prometheus"

// metrics are the status engine's Prometheus metrics.
type metrics struct {
	objects      prometheus.Gauge
	feeds        prometheus.Gauge
	computations prometheus.Counter
	changes      prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		objects: prometheus.NewGauge(prometheus.GaugeOpts{Name: "informerd_status_objects", Help: "Objects whose status some watch asks for."}),
		feeds:   prometheus.NewGauge(prometheus.GaugeOpts{Name: "informerd_status_feeds", Help: "Subscriptions (kind, namespace) the status engine holds."}),
		computations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "informerd_status_computations_total", Help: "Status computations (each shared by every watch of the object).",
		}),
		changes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "informerd_status_changes_total", Help: "Computed statuses that differed from the object's previous status.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.objects, m.feeds, m.computations, m.changes)
	}
	return m
}
