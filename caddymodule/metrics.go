package caddymodule

import (
	"errors"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are created once per process and registered into every new
// config's registry: Caddy builds a fresh registry on each reload, and
// collectors created per config would be lost or double-registered.
var metrics = struct {
	outcomes *prometheus.CounterVec
}{
	outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "aov",
		Subsystem: "x402",
		Name:      "outcomes_total",
		Help:      "Gateway decisions by outcome: settled, free, payment_required, an x402 reason, or an error code.",
	}, []string{"outcome"}),
}

// outcomeFree counts the calls served from the free allowance: the hot
// path's counter, looked up once instead of per call.
var outcomeFree = metrics.outcomes.WithLabelValues("free")

// registerMetrics adds the gateway's collectors to the config's registry,
// tolerating a registry that has them already.
func registerMetrics(ctx caddy.Context) {
	reg := ctx.GetMetricsRegistry()
	if reg == nil {
		return
	}
	for _, c := range []prometheus.Collector{metrics.outcomes} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				caddy.Log().Named("x402").Warn("registering metrics: " + err.Error())
			}
		}
	}
}
