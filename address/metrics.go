package address

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the Tracker's Prometheus metrics; no label carries an
// address.
type metrics struct {
	subscribers prometheus.Gauge
	updates     prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		subscribers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "informerd_ip_port_subscribers", Help: "Address watches open.",
		}),
		updates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "informerd_ip_port_updates_total", Help: "Answers returned to address watches, the first one of each included.",
		}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.subscribers, m.updates} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("address: registering metrics: %w", err)
			}
		}
	}
	return m, nil
}
