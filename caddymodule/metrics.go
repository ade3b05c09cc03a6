package caddymodule

import (
	"errors"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/aovhq/aov/apidocs"
)

// metrics are created once per process and registered into every new
// config's registry: Caddy builds a fresh registry on each reload, and
// collectors created per config would be lost or double-registered.
var metrics = struct {
	outcomes        *prometheus.CounterVec
	uncheckedOffers prometheus.Counter
}{
	outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "aov",
		Subsystem: "x402",
		Name:      "outcomes_total",
		Help:      "Gateway decisions by outcome: settled, free, payment_required, an x402 reason, or an error code.",
	}, []string{"outcome"}),
	uncheckedOffers: prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "aov",
		Subsystem: "x402",
		Name:      "offers_unchecked_total",
		Help:      "402s of validate verify_request answered without the request check, every unpaid compile slot busy.",
	}),
}

// outcomeFree counts the calls served from the free allowance: the hot
// path's counter, looked up once instead of per call.
var outcomeFree = metrics.outcomes.WithLabelValues("free")

// outcomeLabel is the outcomes_total label of a demand for payment with
// reason ("" for a plain one, payment_required): the reason when it is one
// the code base documents (apidocs.PaymentCodes), else "other". The reason
// may be a facilitator's, any text it likes, and every label value is a
// series kept for the process's life: a facilitator that names each
// refusal differently (a recovered signer, a time) must not grow them.
func outcomeLabel(reason string) string {
	switch {
	case reason == "" || reason == "payment_required":
		return "payment_required"
	case knownReasons[reason]:
		return reason
	}
	return "other"
}

// knownReasons are the codes of apidocs.PaymentCodes, as a set.
var knownReasons = func() map[string]bool {
	m := make(map[string]bool, len(apidocs.PaymentCodes))
	for _, c := range apidocs.PaymentCodes {
		m[c.Code] = true
	}
	return m
}()

// registerMetrics adds the gateway's collectors to the config's registry,
// tolerating a registry that has them already.
func registerMetrics(ctx caddy.Context) {
	reg := ctx.GetMetricsRegistry()
	if reg == nil {
		return
	}
	for _, c := range []prometheus.Collector{metrics.outcomes, metrics.uncheckedOffers} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				caddy.Log().Named("x402").Warn("registering metrics: " + err.Error())
			}
		}
	}
}
