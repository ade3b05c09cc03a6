package caddymodule

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// maxClaimHold bounds how long a claim outlives its request. An
// authorization valid for longer is still single-use after the claim lapses:
// its EIP-3009 nonce can settle only once on chain, and the facilitator
// checks it before settling.
const maxClaimHold = 7 * 24 * time.Hour

// exchange is one way of carrying x402 over a request: the HTTP transport
// (PAYMENT-SIGNATURE in, a 402 with PAYMENT-REQUIRED, PAYMENT-RESPONSE out)
// or MCP (the payment in params._meta, payment-required tool results,
// _meta["x402/payment-response"] on the result). The payment logic between
// them (claim, verify, run, settle) is the same and lives in servePaid.
type exchange interface {
	// demand answers with a demand for payment: msg is for people, reason
	// the x402 reason ("" for a plain demand), failed the refused
	// settlement when there was one.
	demand(w http.ResponseWriter, r *http.Request, status int, msg, reason string, failed *x402.SettleResponse) error
	// billable reports whether the held upstream answer is a success the
	// buyer pays for (an error answer is never charged).
	billable(bw *bufferedWriter) bool
	// deliver writes the held answer with the settlement attached.
	deliver(w http.ResponseWriter, bw *bufferedWriter, sr x402.SettleResponse)
}

// restExchange is x402 over plain HTTP.
type restExchange struct{ g *Gate }

func (e restExchange) demand(w http.ResponseWriter, r *http.Request, status int, msg, reason string, failed *x402.SettleResponse) error {
	if failed != nil {
		if header, err := x402.EncodeHeader(failed); err == nil {
			w.Header().Set(x402.HeaderPaymentResponse, header)
		}
	}
	if status != http.StatusPaymentRequired {
		w = &statusOverride{ResponseWriter: w, status: status}
	}
	return e.g.paymentRequired(w, r, msg, reason)
}

func (restExchange) billable(bw *bufferedWriter) bool { return bw.status() < 400 }

func (e restExchange) deliver(w http.ResponseWriter, bw *bufferedWriter, sr x402.SettleResponse) {
	e.g.setPaidHeaders(w.Header(), sr)
	bw.replay(w)
}

// servePaid handles a request that carries a payment: match it against our
// own offers, claim it, verify it, run the upstream, settle. raw is the
// payment as received (header or JSON), for the replay guard.
func (g *Gate) servePaid(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, ex exchange, payload x402.PaymentPayload, raw string) error {
	offer, ok := x402.Match(payload.Accepted, g.offers)
	if !ok {
		return ex.demand(w, r, http.StatusPaymentRequired, x402.ReasonNoMatchingRequirements, "no_matching_requirements", nil)
	}

	keys, until := claimKeys(raw, payload, offer)
	ctx := r.Context()
	claim, err := g.state.Claims().Claim(ctx, keys, until)
	if err != nil {
		var ce *store.ClaimedError
		if errors.As(err, &ce) {
			// Hook (pending.go): a claim kept for an unknown settlement is
			// resolved on the buyer's retry.
			if handled, err := g.resolveOnRetry(w, r, next, ex, ce.State); handled {
				return err
			}
			if ce.State.Settled {
				return ex.demand(w, r, http.StatusPaymentRequired, "This payment was already used; sign a new one.", x402.ReasonPaymentAlreadyUsed, nil)
			}
			return ex.demand(w, r, http.StatusPaymentRequired, "This payment is being processed by another request; do not reuse a payment.", reasonPaymentInFlight, nil)
		}
		return g.refuse(w, apierr.Unavailable("payment state store", 1, err))
	}
	// From here every path either settles the claim, releases it (nothing
	// was charged, the client may retry with the same payment), or keeps it
	// pending until it lapses (the outcome is unknown: never invite a second
	// payment).
	release := func() {
		if err := g.state.Claims().Release(context.WithoutCancel(ctx), claim); err != nil {
			g.logger.Warn("releasing payment claim", zap.Error(err))
		}
	}

	vctx, cancel := context.WithTimeout(ctx, defaultSettleTimeout)
	defer cancel()
	vr, err := g.facilitator.Verify(vctx, payload, offer)
	if err != nil {
		release()
		return g.refuse(w, apierr.Unavailable("payment facilitator", 2, err))
	}
	if !vr.IsValid {
		release()
		reason := vr.InvalidReason
		if reason == "" {
			reason = x402.ReasonInvalidPayload
		}
		return ex.demand(w, r, http.StatusPaymentRequired, reason, reason, nil)
	}

	r.Header.Set(HeaderUpstreamPayment, "paid")
	if vr.Payer != "" {
		r.Header.Set(HeaderUpstreamPayer, vr.Payer)
	}
	r.Header.Set(HeaderUpstreamNetwork, offer.Network)
	g.markSettlementPending(r, ex) // hook (pending.go): the outcome is reported

	if g.Settle == "before" {
		sr, ok := g.settle(w, r, ex, payload, offer, claim, release, nil)
		if !ok {
			return nil
		}
		g.setPaidHeaders(w.Header(), sr)
		return next.ServeHTTP(w, r)
	}

	buf := getBuffer()
	defer putBuffer(buf)
	bw := &bufferedWriter{header: make(http.Header), buf: buf, limit: g.MaxBuffer}
	err = runUpstream(next, bw, r, neverReached)
	if bw.overflow {
		release()
		return g.refuse(w, &apierr.Error{
			Code:        "upstream_response_too_large",
			Message:     fmt.Sprintf("The upstream answer exceeded the gateway's %d-byte buffer and nothing was charged; ask the operator to raise max_buffer.", g.MaxBuffer),
			Status:      http.StatusBadGateway,
			NextActions: []apierr.Action{{Action: "contact_operator"}},
		})
	}
	if err != nil {
		release()
		return err
	}
	if !ex.billable(bw) {
		// An error is never charged: hand it over as it is.
		release()
		metrics.outcomes.WithLabelValues("upstream_error_not_settled").Inc()
		bw.replay(w)
		return nil
	}
	if !g.settleAllowed(r) {
		// settle_on pass, and the output did not pass verification: the
		// buyer gets it with its receipt and is not charged.
		release()
		metrics.outcomes.WithLabelValues("verification_not_passed_not_settled").Inc()
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("Access-Control-Expose-Headers", exposedHeaders)
		bw.replay(w)
		return nil
	}
	sr, ok := g.settle(w, r, ex, payload, offer, claim, release, bw)
	g.reportOutcome(r, next, bw, claim, ok) // hook (pending.go): tell the upstream
	if !ok {
		return nil
	}
	ex.deliver(w, bw, sr)
	return nil
}

// settle settles the claimed payment. On success it marks the claim settled
// and returns the response for PAYMENT-RESPONSE; otherwise it has already
// answered the client (and ok is false). held is the answer held back (nil
// in settle before mode), kept when the outcome is unknown.
func (g *Gate) settle(w http.ResponseWriter, r *http.Request, ex exchange, payload x402.PaymentPayload, offer x402.PaymentRequirements, claim store.Claim, release func(), held *bufferedWriter) (x402.SettleResponse, bool) {
	// Settlement must not be abandoned because the client went away: the
	// upstream work is done and the authorization is ours to settle.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), defaultSettleTimeout)
	defer cancel()
	sr, err := g.facilitator.Settle(ctx, payload, offer)
	if err != nil {
		var unknown *x402.UnknownOutcomeError
		if errors.As(err, &unknown) {
			// Keep the claim: the money may have moved. The client is told
			// to wait, not to pay again.
			g.logger.Error("settlement outcome unknown", zap.Error(err))
			metrics.outcomes.WithLabelValues("settlement_unknown").Inc()
			// Hook (pending.go): keep the payment and the held answer
			// with the claim, for the retry and the background pass.
			g.holdUnknown(r.Context(), claim, payload, offer, held)
			g.refuse(w, errSettlementPending(err))
			return sr, false
		}
		release()
		g.refuse(w, apierr.Unavailable("payment facilitator", 2, err))
		return sr, false
	}
	if !sr.Success {
		release()
		if sr.Network == "" {
			sr.Network = offer.Network
		}
		reason := sr.ErrorReason
		if reason == "" {
			reason = x402.ReasonUnexpectedSettleError
		}
		ex.demand(w, r, http.StatusPaymentRequired, "Settlement failed: "+reason, reason, &sr)
		return sr, false
	}
	if err := g.state.Claims().Settle(context.WithoutCancel(r.Context()), claim, sr.Transaction, time.Time{}); err != nil {
		// The money moved; the claim will still block replays until it
		// lapses. Log loudly, serve the content that was paid for.
		g.logger.Error("marking payment claim settled", zap.Error(err))
	}
	metrics.outcomes.WithLabelValues("settled").Inc()
	return sr, true
}

// setPaidHeaders adds PAYMENT-RESPONSE and the caching and CORS headers of a
// paid answer.
func (g *Gate) setPaidHeaders(h http.Header, sr x402.SettleResponse) {
	if header, err := x402.EncodeHeader(sr); err == nil {
		h.Set(x402.HeaderPaymentResponse, header)
	}
	h.Set("Cache-Control", "no-store")
	h.Set("Access-Control-Expose-Headers", exposedHeaders)
}

// reasonPaymentInFlight refuses a payment that another request is using
// right now.
const reasonPaymentInFlight = "payment_in_flight"

// statusOverride replaces the status of the response written through it.
type statusOverride struct {
	http.ResponseWriter
	status int
}

func (s *statusOverride) WriteHeader(int) { s.ResponseWriter.WriteHeader(s.status) }

// reasonFor maps a header decoding error to an x402 reason.
func reasonFor(err error, fallback string) string {
	if errors.Is(err, x402.ErrUnsupportedVersion) {
		return x402.ReasonInvalidVersion
	}
	if reason := x402.ReasonOf(err); reason != "" {
		return reason
	}
	return fallback
}

// claimKeys names an authorization twice: by what it authorizes (payer and
// nonce on the asset's network, for EVM), so a re-encoded copy is caught, and
// by the exact header, so any scheme is covered. until is when the claim may
// lapse: after the authorization can no longer settle.
func claimKeys(header string, p x402.PaymentPayload, offer x402.PaymentRequirements) ([]string, time.Time) {
	sum := sha256.Sum256([]byte(header))
	keys := []string{"x402/payload/" + hex.EncodeToString(sum[:])}
	t := now()
	until := t.Add(time.Duration(offer.MaxTimeoutSeconds)*time.Second + time.Minute)
	// The header was already checked as a whole (valid UTF-8 JSON, no member
	// name twice at any depth, in any letter case), so a plain decode reads
	// the authorization exactly as the facilitator will; the full checks of
	// the payload are the facilitator's.
	var ev x402.ExactEVMPayload
	if err := json.Unmarshal(p.Payload, &ev); err == nil && ev.Authorization.From != "" && ev.Authorization.Nonce != "" {
		a := ev.Authorization
		keys = append(keys, strings.ToLower("x402/auth/"+offer.Network+"/"+offer.Asset+"/"+a.From+"/"+a.Nonce))
		if vb, ok := new(big.Int).SetString(a.ValidBefore, 10); ok && vb.IsInt64() {
			if exp := time.Unix(vb.Int64(), 0).Add(time.Minute); exp.After(until) {
				until = exp
			}
		}
	}
	if until.After(t.Add(maxClaimHold)) {
		until = t.Add(maxClaimHold)
	}
	return keys, until
}

// bufPool holds the buffers answers are held in (the gate's, verify_response's).
var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxPooledBuffer: a larger buffer is dropped instead of pooled, so one big
// answer does not pin memory forever.
const maxPooledBuffer = 4 << 20

// getBuffer takes an empty buffer from the pool.
func getBuffer() *bytes.Buffer {
	b := bufPool.Get().(*bytes.Buffer)
	b.Reset()
	return b
}

// putBuffer gives b back, unless it grew too large to keep.
func putBuffer(b *bytes.Buffer) {
	if b.Cap() <= maxPooledBuffer {
		bufPool.Put(b)
	}
}

// bufferedWriter holds an upstream response until the gate decides what to
// release. It never writes to the client; past limit it drops the body and
// fails writes, so a runaway upstream cannot exhaust memory.
type bufferedWriter struct {
	header   http.Header
	code     int
	buf      *bytes.Buffer
	limit    int64
	overflow bool
}

func (b *bufferedWriter) Header() http.Header { return b.header }

func (b *bufferedWriter) WriteHeader(code int) {
	if b.code == 0 && code >= 200 {
		b.code = code
	}
}

func (b *bufferedWriter) Write(p []byte) (int, error) {
	if b.code == 0 {
		b.code = http.StatusOK
	}
	if b.overflow || int64(b.buf.Len()+len(p)) > b.limit {
		b.overflow = true
		b.buf.Reset()
		return 0, errBufferFull
	}
	return b.buf.Write(p)
}

// Flush is a no-op: nothing leaves before the payment is settled.
func (b *bufferedWriter) Flush() {}

func (b *bufferedWriter) status() int {
	if b.code == 0 {
		return http.StatusOK
	}
	return b.code
}

// replay writes the held response to w (whose headers the gate may already
// have set).
func (b *bufferedWriter) replay(w http.ResponseWriter) {
	h := w.Header()
	for k, v := range b.header {
		if _, set := h[k]; set && (k == "Cache-Control" || k == x402.HeaderPaymentResponse || k == "Access-Control-Expose-Headers") {
			continue
		}
		h[k] = v
	}
	h.Del("Content-Length")
	w.WriteHeader(b.status())
	w.Write(b.buf.Bytes())
}

var errBufferFull = errors.New("upstream response larger than the gateway buffer")

// runUpstream runs next into w, a writer that holds the answer back (the
// gate's buffer, verify_response's hold). A proxy that cannot finish a
// response it has started (a hold is full, or the upstream died mid-body)
// aborts with http.ErrAbortHandler; while nothing has reached the client
// (reached reports false) that becomes errUpstreamAborted, an ordinary error
// the caller can answer.
func runUpstream(next caddyhttp.Handler, w http.ResponseWriter, r *http.Request, reached func() bool) (err error) {
	defer func() {
		if rec := recover(); rec != nil {
			if rec != http.ErrAbortHandler || reached() {
				panic(rec)
			}
			err = errUpstreamAborted
		}
	}()
	return next.ServeHTTP(w, r)
}

var errUpstreamAborted = caddyhttp.Error(http.StatusBadGateway, errors.New("upstream response aborted"))

// neverReached is the reached of a writer that releases nothing itself.
func neverReached() bool { return false }
