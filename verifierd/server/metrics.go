package server

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are verifierd's Prometheus collectors. They are served on the
// admin listener only, never on the public one.
type Metrics struct {
	requests      *prometheus.CounterVec
	duration      *prometheus.HistogramVec
	verifications *prometheus.CounterVec
	signerErrors  *prometheus.CounterVec
	storeErrors   prometheus.Counter
	toolCalls     *prometheus.CounterVec
}

// NewMetrics creates the collectors and registers them on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "aov", Subsystem: "verifierd", Name: "requests_total",
			Help: "HTTP requests by route and status code.",
		}, []string{"route", "status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "aov", Subsystem: "verifierd", Name: "request_duration_seconds",
			Help:    "Time from request to complete answer, by route (a verification includes signing and recording).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"route"}),
		verifications: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "aov", Subsystem: "verifierd", Name: "verifications_total",
			Help: "Signed and recorded verifications by result (pass/fail) and payment (free/paid/pending/unknown).",
		}, []string{"result", "payment"}),
		signerErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "aov", Subsystem: "verifierd", Name: "signer_errors_total",
			Help: "Failed calls to certd: unavailable (down or timing out), stale_key (a rotation, retried), refused (a bug).",
		}, []string{"kind"}),
		storeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "aov", Subsystem: "verifierd", Name: "store_errors_total",
			Help: "Verifications that were signed but could not be recorded (answered 503, receipt discarded).",
		}),
		toolCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "aov", Subsystem: "verifierd", Name: "mcp_tool_calls_total",
			Help: "MCP tool calls by tool and outcome: ok, or the error code of an isError result (invalid_request, upstream_unavailable, ...).",
		}, []string{"tool", "outcome"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.duration, m.verifications, m.signerErrors, m.storeErrors, m.toolCalls} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *Metrics) observeRequest(rec *requestLog, d time.Duration) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(rec.route, strconv.Itoa(rec.status)).Inc()
	m.duration.WithLabelValues(rec.route).Observe(d.Seconds())
	if rec.result != "" {
		m.verifications.WithLabelValues(rec.result, rec.payment).Inc()
	}
	if rec.tool != "" {
		outcome := rec.toolError
		if outcome == "" {
			outcome = "ok"
		}
		m.toolCalls.WithLabelValues(rec.tool, outcome).Inc()
	}
}

func (m *Metrics) signerError(kind string) {
	if m != nil {
		m.signerErrors.WithLabelValues(kind).Inc()
	}
}

func (m *Metrics) storeError() {
	if m != nil {
		m.storeErrors.Inc()
	}
}
