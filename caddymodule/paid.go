package caddymodule

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/plugins/svmfacilitator"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// maxClaimHold bounds how long a claim outlives its request. An
// authorization valid for longer is still single-use after the claim lapses:
// its EIP-3009 nonce can settle only once on chain, and the facilitator
// checks it before settling.
const maxClaimHold = 7 * 24 * time.Hour

// claimGrace is how long a claim outlives the moment its payment can no
// longer settle (max_timeout, an authorization's validBefore): the
// gateway's clock and the chain's may differ by that much. A variable so
// that a test waits out a lapse in seconds, not minutes.
var claimGrace = time.Minute

// exchange is one way of carrying x402 over a request: the HTTP transport
// (PAYMENT-SIGNATURE in, a 402 with PAYMENT-REQUIRED, PAYMENT-RESPONSE out)
// or MCP (the payment in params._meta, payment-required tool results,
// _meta["x402/payment-response"] on the result). The payment logic between
// them (claim, verify, run, settle) is the same and lives in servePaid and
// serveCharged.
//
// An exchange also carries the call's request-level check. Whenever the
// gate offers a call for sale (a 402) or answers a call without a payment
// itself instead of running the upstream (a store outage), it first runs
// that check, so a request that can never succeed is refused with 422 and
// is never offered for sale (SPEC §6). So does a payment settled before the
// upstream runs (settle before), or the buyer would be charged for the
// request the upstream then refuses. A refusal of a payment (one the gate
// cannot read, a store or facilitator outage) is the buyer's answer
// whatever the request, and is given without the check: the check is a
// schema compile, which under load waits for a slot (Gate.precheck), and
// would replace the answer about the payment with a retryable 503. Any
// other call the gate lets through is checked once, by the upstream,
// whose refusal is never charged.
type exchange interface {
	// demand answers with a demand for payment: msg is for people, reason
	// the x402 reason ("" for a plain demand), failed the refused
	// settlement when there was one.
	demand(w http.ResponseWriter, r *http.Request, status int, msg, reason string, failed *x402.SettleResponse) error
	// refuse answers with an error of the SPEC §6 shape. Every refusal of
	// a call the gate has read goes through it, never through Gate.refuse:
	// over MCP it must be the call's JSON-RPC tool result, which an MCP
	// client reads, not a bare HTTP error its transport rejects (losing
	// charged, and "do not sign a new payment").
	refuse(w http.ResponseWriter, r *http.Request, e *apierr.Error) error
	// rateLimited answers 429 rate_limited (Retry-After wait), never the
	// request's own 422 instead (requestCheck.answer): a refused request
	// of a client past its budget is counted, a 429 is not.
	rateLimited(w http.ResponseWriter, r *http.Request, wait int) error
	// billable reports whether the held upstream answer is a success the
	// buyer pays for (an error answer is never charged).
	billable(bw *bufferedWriter) bool
	// unbilled is what an answer billable did not bill is: an error
	// answer (outcomeNotBilled), or over MCP one it found unreadable and
	// replaced, or a round that is not the call's answer yet. A REST
	// answer is always one the client reads, and the request's answer.
	unbilled() outcome
	// deliver writes the held answer with the settlement attached.
	deliver(w http.ResponseWriter, bw *bufferedWriter, sr x402.SettleResponse)
	// invalid runs the call's request check (once) and returns its
	// refusal, if any: for a settle before payment, which is settled
	// before the upstream can check the request (the check, once the
	// payment verified, includes the request's evaluation).
	invalid() *apierr.Error
	// upstreamRan records that the upstream, which checks the request
	// itself, has answered: the gate's check is no longer needed.
	upstreamRan()
	// paymentVerified records that the facilitator verified the call's
	// payment, made by payer (payerOf; "" when it names none), whose
	// check is then bounded by paid calls' bounds (Gate.precheck).
	paymentVerified(payer string)
	// upstreamFailed answers a call whose upstream failed before
	// answering (upstream_timeout, a dead upstream, an answer cut off);
	// the charge is already released. err is the upstream's error.
	upstreamFailed(w http.ResponseWriter, r *http.Request, err error) error
	// retold is a kept answer's body (a payment identifier's saved answer,
	// the answer held for an unknown settlement) as the answer to this
	// call, a retry of the call that produced it.
	retold(body []byte) []byte
}

// requestCheck is the request-level check of one call: strict parse, field
// checks and schema compile (verify.Precheck), and for a settle before
// payment the facilitator verified also the request's evaluation
// (verify.Parse), the last thing that may refuse it uncharged. It runs at
// most once, and only when the gate answers the call itself or is about to
// settle a payment before the upstream runs (exchange).
type requestCheck struct {
	check func() error // nil: nothing to check
	done  bool
	// paying: the call carries a payment, readable or not. Its refusals
	// are about the payment and are answered as they are (answer).
	paying bool
	// verified: the facilitator verified the call's payment
	// (paymentVerified), made by payer, so its check waits for paid
	// calls' checks only, never for unpaid ones' (Gate.precheck).
	verified bool
	payer    string
	// unchecked: the check was left out, every unpaid compile slot busy
	// (errUnchecked); the 402 says so (offerNote).
	unchecked bool
}

// requestChecked, when set (by tests only), is called each time a call's
// request check runs, so that the rule of one validation per call is
// asserted by counting it.
var requestChecked func()

// offered is the request's own refusal to answer with instead of a
// demand for payment of status, if any: a 402 offers the call for sale,
// which an invalid request never is (SPEC §6), so it runs the check
// (invalid); a 400 refuses a payment the gate could not read, the buyer's
// answer whatever the request, and runs none.
func (c *requestCheck) offered(status int) *apierr.Error {
	if status != http.StatusPaymentRequired {
		return nil
	}
	return c.invalid()
}

// invalid runs the check (once) and returns its refusal, if any.
func (c *requestCheck) invalid() *apierr.Error {
	if c.done || c.check == nil {
		return nil
	}
	c.done = true
	if requestChecked != nil {
		requestChecked()
	}
	if err := c.check(); err != nil {
		if errors.Is(err, errUnchecked) {
			c.unchecked = true
			return nil
		}
		return apierr.From(err)
	}
	return nil
}

func (c *requestCheck) upstreamRan() { c.done = true }

// paymentVerified records that the facilitator verified the call's
// payment, made by payer: from then on it is a paid call.
func (c *requestCheck) paymentVerified(payer string) { c.verified, c.payer = true, payer }

// uncheckedNote ends the message of a 402 whose request was not checked.
const uncheckedNote = " (the gateway was too busy to check this request first: if it is invalid, a payment for it is refused with 422 invalid_request and not charged)"

// offerNote is msg, the message of a demand for payment, told that the
// request was not checked when it was not (unchecked), which is counted
// in aov_x402_offers_unchecked_total: a buyer, and the operator, learn
// that this offer may be of a request the paid call then refuses.
func (c *requestCheck) offerNote(msg string) string {
	if !c.unchecked {
		return msg
	}
	metrics.uncheckedOffers.Inc()
	return msg + uncheckedNote
}

// answer is the refusal to answer with instead of ae: for a call without
// a payment, the request's own 422 when it has one (an invalid request is
// never offered for sale, nor told to come back after an outage). A call
// carrying a payment gets ae as it is: every refusal of it is about its
// payment (see exchange), and a 422 in its place would say charged false
// and nothing of the payment, so a buyer told settlement_pending, charged,
// or a payment identifier's 409 (SPEC §7) would sign a second payment for
// one that may have moved, or did, or send the spent one again with a
// fixed body the id then refuses all the same. A settle before payment's
// request is checked once its payment verified, before it settles
// (servePaid).
func (c *requestCheck) answer(ae *apierr.Error) *apierr.Error {
	if c.paying {
		return ae
	}
	if invalid := c.invalid(); invalid != nil {
		return invalid
	}
	return ae
}

// restExchange is x402 over plain HTTP.
type restExchange struct {
	g *Gate
	requestCheck
}

func (e *restExchange) demand(w http.ResponseWriter, r *http.Request, status int, msg, reason string, failed *x402.SettleResponse) error {
	if ae := e.offered(status); ae != nil {
		return e.g.refuse(w, r, ae)
	}
	msg = e.offerNote(msg)
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

func (e *restExchange) refuse(w http.ResponseWriter, r *http.Request, ae *apierr.Error) error {
	return e.g.refuse(w, r, e.answer(ae))
}

func (e *restExchange) rateLimited(w http.ResponseWriter, r *http.Request, wait int) error {
	return e.g.refuse(w, r, apierr.RateLimited(wait))
}

func (*restExchange) billable(bw *bufferedWriter) bool { return bw.status() < 400 }

// upstreamFailed: over REST the upstream's failure is Caddy's error (504
// for upstream_timeout, 502 for a dead upstream), as without the gate.
func (*restExchange) upstreamFailed(_ http.ResponseWriter, _ *http.Request, err error) error {
	return err
}

// retold: an HTTP answer names no request; it is the same answer.
func (*restExchange) retold(body []byte) []byte { return body }

func (e *restExchange) unbilled() outcome { return outcomeNotBilled }

func (e *restExchange) deliver(w http.ResponseWriter, bw *bufferedWriter, sr x402.SettleResponse) {
	e.g.setPaidHeaders(w.Header(), sr)
	bw.replay(w)
}

// servePaid handles a request that carries a payment: match it against our
// own offers, claim it, verify it, then run the upstream and settle
// (serveCharged). pay is the payment as read, raw as received (header or
// JSON), for the replay guard.
func (g *Gate) servePaid(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, ex exchange, pay x402.Payment, raw string) error {
	// What follows costs the server whatever comes of it (the
	// facilitator's /verify, the upstream, a run again), and its failure
	// counts only once known: it holds one of the client's slots, at most
	// rate_limit's events at once (rateZone.enter), until it ends or its
	// answer starts to be written, whichever is first (slotWriter).
	slot, wait := g.enterRate(r)
	if wait > 0 {
		return ex.rateLimited(w, r, wait)
	}
	sw := &slotWriter{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: w}, slot: slot}
	defer sw.leave()
	if slot.b != nil {
		w = sw
	}
	payload := pay.PaymentPayload
	pid, err := g.paymentIDOf(r, pay, raw)
	if err != nil {
		return ex.refuse(w, r, apierr.From(err))
	}
	live := g.liveOffers()
	i := x402.MatchIndex(payload.Accepted, live.offers)
	if i < 0 {
		if handled, err := g.serveHeldUnderOldOffer(w, r, next, ex, pid, pay, raw); handled {
			return err
		}
		return ex.demand(w, r, http.StatusPaymentRequired, x402.ReasonNoMatchingRequirements, "no_matching_requirements", nil)
	}
	offer, offerJS := live.offers[i], live.offerJSON(i)

	// A payment is read once, here, before it is claimed or forwarded.
	auth, svmTx, err := readPayment(pay, offer.Network)
	if err != nil {
		return ex.demand(w, r, http.StatusBadRequest, "Invalid payment: "+err.Error(), reasonFor(err, x402.ReasonInvalidPayload), nil)
	}
	// The accepted copy matched an offer; what is signed must pay it too,
	// whatever the facilitator's verdict: one that judged the authorization
	// or transaction by itself would settle, and report success for, 1
	// atom or a transfer to another account. Nothing is claimed or charged.
	// On a network readPayment does not read, the verdict alone decides
	// (warnUnreadOffers).
	var unpaid error
	switch {
	case auth != nil:
		unpaid = auth.CheckPays(offer)
	case svmTx != nil:
		unpaid = svmTx.CheckPays(offer)
	}
	if unpaid != nil {
		return ex.demand(w, r, http.StatusPaymentRequired, "Invalid payment: "+unpaid.Error(), x402.ReasonOf(unpaid), nil)
	}
	payer := paymentPayer(auth, svmTx)
	keys, until := claimKeys(raw, offer, auth, svmTx)
	until = pid.holdUntil(until)
	// A settlement this gateway keeps unrecorded (unrecorded.go) is
	// written first, before anything is claimed: the store may have lost
	// the claim.
	if handled, err := g.serveUnrecorded(w, r, next, ex, pid, keys, payload); handled {
		return err
	}
	ctx := r.Context()
	claimed := now()
	claim, note, err := g.claimPaid(r, keys, until, pay, offerJS, pid)
	if err != nil {
		var ce *store.ClaimedError
		if errors.As(err, &ce) {
			return g.serveClaimed(w, r, next, ex, pid, payload, ce.State)
		}
		return ex.refuse(w, r, apierr.Unavailable("payment state store", 1, err))
	}
	if note != "" {
		defer endLive(claim.Token) // after the last move on the claim (claimPaid)
	}
	if handled, err := pid.bind(w, r, ex, claim); handled {
		return err
	}
	// From here every path either settles the claim, releases it (nothing
	// was charged, the client may retry with the same payment), or keeps it
	// pending until it lapses (the outcome is unknown: never invite a second
	// payment).
	pc := &paidCharge{g: g, ex: ex, next: next, pay: pay, offer: offer, offerJS: offerJS, claim: claim, claimed: claimed, note: note, pid: pid, payer: payer}

	verifyTimeout, _ := g.callTimeouts()
	vctx, cancel := context.WithTimeout(ctx, verifyTimeout)
	defer cancel()
	vr, err := g.facilitator.Verify(vctx, payload, offer)
	if err != nil {
		pc.release(r)
		g.noteIfClientLeft(r)
		return ex.refuse(w, r, facilitatorUnavailable(err))
	}
	if !vr.IsValid {
		pc.release(r)
		switch sr, settled, unknown := g.settledEarlier(ctx, payload, offer, vr.InvalidReason); {
		case settled:
			return ex.demand(w, r, http.StatusPaymentRequired,
				"This payment settled earlier (PAYMENT-RESPONSE names its transaction) and the answer it bought is no longer kept; it cannot be used again. Sign a new payment only for a new call.",
				x402.ReasonPaymentAlreadyUsed, &sr)
		case unknown, vr.InvalidReason == x402.ReasonSettlementPending:
			// The facilitator (or the chain) holds a settlement of this
			// payment whose outcome is not known yet: a 402 would ask
			// for a second payment while the first may still land.
			g.noteIfClientLeft(r)
			return ex.refuse(w, r, errSettlementPending(nil))
		case g.unresolvable(ctx, keys, offer):
			g.noteIfClientLeft(r)
			return ex.refuse(w, r, errSettlementUnresolvable())
		}
		reason := facilitatorReason(vr.InvalidReason, x402.ReasonInvalidPayload)
		return ex.demand(w, r, http.StatusPaymentRequired, reason, reason, nil)
	}
	// The payment's payer, never the one the reply names: see settledAs.
	ex.paymentVerified(payer)
	if g.Settle == "before" {
		// Settled before the upstream runs, the call would be paid for
		// before the upstream's own check of the request: the gate
		// checks it first (validate), so an invalid request is refused
		// uncharged, its claim and payment identifier given back for the
		// fixed request. Here, once the facilitator verified the
		// payment, the request also evaluated (its evaluation costs
		// what verifierd's own does): the check then waits for paid
		// calls' checks only, never for unpaid ones', and is bounded
		// all the same, compile and evaluation within one hold, since
		// a refused call is charged nothing and its payment may be sent
		// again (Gate.precheck). Before the
		// facilitator, a payment that pays nothing would have it done
		// past every bound; a payment the facilitator refuses is
		// answered by its 402, which checks the request as any 402 does,
		// bounded as an unpaid one's.
		if ae := ex.invalid(); ae != nil {
			pc.release(r)
			return ex.refuse(w, r, ae)
		}
	}

	r.Header.Set(HeaderUpstreamPayment, "paid")
	if payer != "" {
		r.Header.Set(HeaderUpstreamPayer, payer)
	}
	r.Header.Set(HeaderUpstreamNetwork, offer.Network)
	g.markSettlementPending(r) // the outcome is reported after settling (pending.go)

	if g.Settle == "before" {
		if !pc.settle(w, r, nil) {
			return nil
		}
		pid.save(nil, pc.sr) // streamed: settled, its answer not kept
		// Paid for now: nothing of it will count, and a stream may run
		// long, so it holds no slot of the refusal budget.
		sw.leave()
		return g.serveSettled(w, r, next, ex, pc.sr)
	}
	return g.serveCharged(w, r, next, ex, pc)
}

// serveClaimed answers a payment whose claim another call made (cs, its
// state): it never claims or charges anything.
func (g *Gate) serveClaimed(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, ex exchange, pid *paymentIDCall, payload x402.PaymentPayload, cs store.ClaimState) error {
	// The id's saved answer, once there is one, is the id's retry's
	// answer, also when the claim still carries the record of an unknown
	// settlement resolved since (its answer saved as it was served, or its
	// run again streamed: only the id then says it was delivered).
	if handled, err := pid.savedOnly(w, r, ex); handled {
		return err
	}
	// A claim kept for an unknown settlement is resolved on the buyer's
	// retry (pending.go), settled or not by now.
	rex := pid.resolving(ex)
	if handled, err := g.resolveOnRetry(w, r, next, rex, cs, payload); handled {
		return err
	}
	if handled, err := pid.claimed(w, r, ex, cs); handled {
		return err
	}
	if cs.Settled {
		// Settled under its bare transaction, maybe by a gateway whose
		// write landed unacknowledged and which still holds the answer
		// (unrecorded.go).
		if mayBeUnrecordedElsewhere(cs) {
			g.noteRefusal(r) // a replay costs what payment_already_used does
			return ex.refuse(w, r, errSettledElsewhere())
		}
		return ex.demand(w, r, http.StatusPaymentRequired, "This payment was already used; sign a new one.", x402.ReasonPaymentAlreadyUsed, nil)
	}
	return paymentInFlight(w, r, ex)
}

// paymentInFlight refuses a payment another request is using: claiming
// it, or running its one run again (resolveOnRetry).
func paymentInFlight(w http.ResponseWriter, r *http.Request, ex exchange) error {
	return ex.demand(w, r, http.StatusPaymentRequired, "This payment is being processed by another request; do not reuse a payment.", reasonPaymentInFlight, nil)
}

// serveHeldUnderOldOffer answers a payment that matches none of the
// route's offers but that the gate already holds: claimed under an offer
// a reload has since changed (a new price, pay_to or accept line) while
// its settlement was unknown, or settled with its answer saved under a
// payment identifier. The buyer was charged, or may have been, under the
// offer it accepted: its retry is resolved by the claim's record
// (resolveOnRetry, which reads the offer from the record) or the id's
// saved answer, exactly as before the reload. handled false: the gate
// holds nothing of the payment, and a new payment is never served against
// an offer the route no longer makes.
//
// The claim keys are named as servePaid names them, by the offer the
// payment accepted; only the store is read, nothing is claimed.
func (g *Gate) serveHeldUnderOldOffer(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, ex exchange, pid *paymentIDCall, pay x402.Payment, raw string) (bool, error) {
	payload := pay.PaymentPayload
	auth, svmTx, err := readPayment(pay, payload.Accepted.Network)
	if err != nil {
		return false, nil // never claimed: servePaid claims only what it read
	}
	keys, _ := claimKeys(raw, payload.Accepted, auth, svmTx)
	if handled, err := g.serveUnrecorded(w, r, next, ex, pid, keys, payload); handled {
		return true, err
	}
	for _, k := range keys {
		cs, err := g.state.Claims().Lookup(r.Context(), k)
		switch {
		case errors.Is(err, store.ErrNotFound):
			continue
		case err != nil:
			// Fail closed: a demand would invite a second payment for
			// one that may have moved.
			return true, ex.refuse(w, r, apierr.Unavailable("payment state store", 1, err))
		}
		return true, g.serveClaimed(w, r, next, ex, pid, payload, cs)
	}
	// The claim lapsed; an id's saved answer outlives it (the window).
	return pid.savedOnly(w, r, ex)
}

// timedFacilitator is implemented by a facilitator whose calls end by
// bounds of its own configuration (facilitator http's timeout, evm's
// receipt_timeout, a multi's members'): how long a Verify and a Settle
// take at most.
type timedFacilitator interface {
	callTimeouts() (verify, settle time.Duration)
}

// facilitatorTimeouts is how long f's Verify and Settle may run: f's own
// bounds (timedFacilitator), else defaultSettleTimeout. The gate waits for
// at most maxFacilitatorWait of it (Gate.callTimeouts); the rest counts in
// the attempt span, as the facilitator may still be settling.
func facilitatorTimeouts(f x402.Facilitator) (verify, settle time.Duration) {
	if tf, ok := f.(timedFacilitator); ok {
		return tf.callTimeouts()
	}
	return defaultSettleTimeout, defaultSettleTimeout
}

// maxFacilitatorWait is the longest the gate waits for one facilitator
// call, whatever the facilitator's own bound: a paid call (verify,
// upstream_timeout, settle) must end within the server's write timeout
// (Caddyfile.example's 120s) and the stop grace, or its response is cut
// after its settlement landed and its retry is refused as already used:
// charged, nothing delivered. A settle still running when the gate stops
// waiting has an unknown outcome: 503 settlement_pending, the payment held
// and its retry served once the outcome is known (the facilitator goes on;
// evm's relayer keeps its settlement). A variable so tests can shorten it.
var maxFacilitatorWait = defaultSettleTimeout

// callTimeouts is how long the gate waits for its facilitator's Verify and
// Settle: the facilitator's own bounds (facilitatorTimeouts), at most
// maxFacilitatorWait.
func (g *Gate) callTimeouts() (verify, settle time.Duration) {
	verify, settle = facilitatorTimeouts(g.facilitator)
	return min(verify, maxFacilitatorWait), min(settle, maxFacilitatorWait)
}

// sentAfter is a time before which p's settlement was not asked for: the
// later of when its claim was asked for and when its Settle was, both
// true, and the later the closer to when its attempt began. A read by the
// chain alone takes a transaction that landed earlier than that, by more
// than a few seconds, for another settlement's
// (svmfacilitator.AttemptMargin): a replay of a payment settled before is
// refused duplicate_settlement, so the closer the bound, the shorter the
// time in which a replay would pass as this attempt. It is never reckoned
// back from a later time (now, less the settle wait): what follows the
// Settle, the tries to record it against a stalled store, would date the
// attempt after its own transfer landed, and the chain read would take
// that transfer for another settlement's, the charged buyer refused.
func (p *paidCharge) sentAfter() time.Time {
	return later(p.claimed, p.settleAsked)
}

// later is the later of two times.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// settle settles the claimed payment: the one settlement step of the gate.
// On success it marks the claim settled and keeps the response for
// PAYMENT-RESPONSE; otherwise it has already answered the client. An
// unknown outcome keeps the claim (the money may have moved) and, with it,
// the payment and the held answer (nil in settle-before mode), so that the
// buyer's retry or the background pass can resolve it (pending.go).
func (p *paidCharge) settle(w http.ResponseWriter, r *http.Request, held *bufferedWriter) bool {
	end := p.settleOnce(w, r, held)
	if held != nil {
		// Tell the upstream, which recorded the call as pending, how it
		// ended (pending.go).
		p.reportOutcome(r, held, end)
	}
	return end == settleDone
}

func (p *paidCharge) settleOnce(w http.ResponseWriter, r *http.Request, held *bufferedWriter) settleEnd {
	g := p.g
	// Settlement must not be abandoned because the client went away: the
	// upstream work is done and the authorization is ours to settle.
	_, settleTimeout := g.callTimeouts()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), settleTimeout)
	defer cancel()
	p.settleAsked = now()
	sr, err := g.facilitator.Settle(ctx, p.pay.PaymentPayload, p.offer)
	if err != nil {
		var unknown *x402.UnknownOutcomeError
		if errors.As(err, &unknown) {
			// Keep the claim: the money may have moved. The client is told
			// to wait, not to pay again.
			if unknown.Reply != nil {
				unknown.Reply.Transaction = p.toldTransaction(unknown.Reply.Transaction) // the record's Sent
			}
			g.logger.Error("settlement outcome unknown", zap.Error(err))
			metrics.outcomes.WithLabelValues("settlement_unknown").Inc()
			if failedUnnamed(unknown) {
				g.noteRefusal(r) // a payer can cause it: see failedUnnamed
			}
			g.holdUnknown(r, p.claim, p.pay.JSON, p.offerJS, p.offer, p.pid, p.sentAfter(), held, unknown)
			p.ex.refuse(w, r, errSettlementPending(err))
			return settleUnknown
		}
		p.release(r)
		p.ex.refuse(w, r, facilitatorUnavailable(err))
		return settleRefused
	}
	p.settledAs(&sr)
	if !sr.Success {
		p.release(r)
		if g.unresolvable(ctx, p.claim.Keys, p.offer) {
			p.ex.refuse(w, r, errSettlementUnresolvable())
			return settleRefused
		}
		reason := sr.ErrorReason // told: facilitatorReason's
		p.ex.demand(w, r, http.StatusPaymentRequired, "Settlement failed: "+reason, reason, &sr)
		return settleRefused
	}
	// Nothing is delivered before the store records the settlement (in
	// both settle modes the answer is still held, or the upstream not yet
	// run): the claim's record, written with it, would otherwise be
	// resolved from the chain by a later retry and delivered a second time.
	switch err := p.recordSettled(r.Context(), sr); {
	case err == nil:
	case errors.Is(err, store.ErrNoteChanged):
		// While this request waited, past its attempt span, another
		// gateway resolved the payment from the chain and took its one
		// delivery.
		g.logger.Warn("payment settled, and resolved elsewhere meanwhile: not delivered again", zap.String("transaction", sr.Transaction))
		metrics.outcomes.WithLabelValues("settled_resolved_elsewhere").Inc()
		alreadyUsed(w, r, p.ex)
		return settleUnknown // the claim tells
	case errors.Is(err, store.ErrClaimLost) || p.note == "":
		// No record of the payment is left for anything to resolve and
		// deliver by (the claim is gone, or the store keeps none), and
		// the transfer spent the authorization, so no new claim of it
		// can verify: this request's delivery is the only one.
		g.logger.Error("marking payment claim settled", zap.Error(err))
	default:
		// The store is down, and the write may have landed all the same
		// (its reply lost): the settlement and the answer are kept and
		// written as a settled record once the store is back
		// (unrecorded.go), for the buyer's retry to get the one delivery.
		// Past the bound on those kept, the payment is kept as an unknown
		// outcome (if the store takes even that), resolved from the chain.
		g.logger.Error("payment settled but not recorded: not delivered; the retry gets it once the settlement is written",
			zap.String("transaction", sr.Transaction), zap.Error(err))
		metrics.outcomes.WithLabelValues("settled_unrecorded").Inc()
		if p.unrecorded = p.keepUnrecorded(r, sr, held); p.unrecorded == nil {
			g.holdUnknown(r, p.claim, p.pay.JSON, p.offerJS, p.offer, p.pid, p.sentAfter(), held, &x402.UnknownOutcomeError{Op: "settle", Reply: &sr, Err: err})
		}
		p.ex.refuse(w, r, errSettledUnrecorded(err))
		return settleUnknown // settled: reportOutcome reports p.unrecorded as it was kept
	}
	outcomeSettled.Inc()
	g.creditSettled(r) // the 402 before this payment no longer counts (ratelimit.go)
	g.noteSettled(r, sr)
	p.sr = sr
	return settleDone
}

// settledAs makes the facilitator's settle reply sr the settlement the
// buyer is told of and the gate records (toldSettlement): a facilitator
// reports whether a settlement succeeded, by which transaction, or why it
// failed; it does not say whose it was, where, or for how much. A reply
// that names another payer or network comes from a lying or broken
// facilitator. Its verdict is still taken: a success is honoured, since
// the buyer signed and the money has most likely moved (a refusal would
// leave them paid and unserved), but what it named is never passed on
// (PAYMENT-RESPONSE) nor recorded (sign-in-with-x access, which would
// otherwise go to a wallet that never paid), and the operator is told
// with an Error. Its errorMessage, free text, goes to the log only.
func (p *paidCharge) settledAs(sr *x402.SettleResponse) {
	sr.Transaction = p.toldTransaction(sr.Transaction) // logged here, once
	told := toldSettlement(*sr, p.payer, p.offer.Network)
	// An EVM address's letter case is a checksum (store.SameWallet). A
	// payload that names no payer the gate can read (payer "") leaves none
	// to tell, or record.
	otherPayer := sr.Payer != "" && told.Payer != "" && !store.SameWallet(sr.Payer, told.Payer)
	if otherPayer || (sr.Network != "" && sr.Network != told.Network) {
		p.g.logger.Error("the facilitator's settle reply names another payer or network than the payment's: the payment's are used",
			zap.Bool("success", sr.Success), zap.String("transaction", sr.Transaction), zap.String("payer", told.Payer), zap.String("network", told.Network),
			zap.String("facilitator_payer", sr.Payer), zap.String("facilitator_network", sr.Network))
	}
	if !sr.Success {
		p.g.logger.Info("the facilitator did not settle the payment", zap.String("reason", sr.ErrorReason), zap.String("facilitator_message", sr.ErrorMessage),
			zap.String("payer", told.Payer), zap.String("network", told.Network))
	}
	*sr = told
}

// toldTransaction is the transaction tx a facilitator named for p's
// settlement as the gate tells and records it (facilitatorTransaction),
// with an Error for the operator when it is not kept, naming its length:
// the value itself, of any length, goes nowhere, the log included.
func (p *paidCharge) toldTransaction(tx string) string {
	told := facilitatorTransaction(tx, p.offer.Network)
	if told != tx {
		p.g.logger.Error("the facilitator's settle reply names a transaction not of its network's shape: none is told or recorded",
			zap.Int("transaction_bytes", len(tx)), zap.String("network", p.offer.Network))
	}
	return told
}

// toldSettlement is settlement sr of payment p, made on network (the
// offer's the gate verified and settled), as the gate tells and records
// it: SPEC's PAYMENT-RESPONSE, {success, transaction, network, payer,
// errorReason?}, and nothing else. Of sr only success, transaction and
// errorReason are kept, the transaction as facilitatorTransaction and a
// failure's errorReason as facilitatorReason tell them; the payer is the
// payment's own (payerOf, paymentPayer). It is
// the one builder of every settlement a buyer sees (PAYMENT-RESPONSE, a
// payment identifier's saved answer, MCP's _meta), also of one read back
// from the store, which may have been saved by an older gateway that
// passed on what a facilitator said.
func toldSettlement(sr x402.SettleResponse, payer, network string) x402.SettleResponse {
	told := x402.SettleResponse{Success: sr.Success, Transaction: facilitatorTransaction(sr.Transaction, network), Network: network, Payer: payer}
	if !sr.Success {
		told.ErrorReason = facilitatorReason(sr.ErrorReason, x402.ReasonUnexpectedSettleError)
	}
	return told
}

// reasonShape is what a reason code looks like: every code x402 and this
// gateway sends fits it (the longest, Solana's, has 85 characters).
var reasonShape = regexp.MustCompile(`^[a-z0-9_]{1,100}$`)

// facilitatorReason is a facilitator's reason for refusing a payment (a
// verify's invalidReason, a settle's errorReason) as the buyer is told it:
// kept when it has the shape of a code, so that a newer facilitator's codes
// reach the buyer, and unnamed otherwise (fallback, a code SPEC lists).
// Anything else a facilitator may send, free text of any length, would
// reach the buyer's headers: 60 KiB of it push PAYMENT-RESPONSE and
// PAYMENT-REQUIRED past x402.MaxHeaderBytes, and a refused settlement
// would be answered 500 without either.
func facilitatorReason(reason, fallback string) string {
	if reasonShape.MatchString(reason) {
		return reason
	}
	return fallback
}

// evmTransaction is what an EVM transaction hash looks like.
var evmTransaction = regexp.MustCompile(`^0x[0-9a-fA-F]{64}$`)

// otherTransaction bounds a transaction id on a network the gate knows no
// shape for: visible ASCII without spaces, as hashes, signatures and ids
// such as Hedera's (0.0.9000@1700000000.123456789) are written.
var otherTransaction = regexp.MustCompile(`^[!-~]{1,128}$`)

// maxSolanaTransaction is the length of the longest base58 text of a
// 64-byte signature: longer text is refused before it is decoded (base58
// decoding takes time quadratic in its length).
const maxSolanaTransaction = 88

// facilitatorTransaction is the transaction a facilitator named for a
// settlement on network as the buyer is told it and the claim's record
// keeps it: kept when it has its network's shape (EVM: 0x and 64 hex
// digits; Solana: base58 of a 64-byte signature; another network: at most
// 128 visible ASCII characters), "" otherwise. A facilitator is believed on a
// settlement's outcome (settledAs), not on what it writes: 80 KB of text
// as a transaction pushed PAYMENT-RESPONSE past x402.MaxHeaderBytes, and
// the charged buyer was served without it. "" stays "".
func facilitatorTransaction(tx, network string) string {
	var ok bool
	switch {
	case tx == "":
	case x402.IsEVM(network):
		ok = evmTransaction.MatchString(tx)
	case x402.IsSolana(network):
		if len(tx) <= maxSolanaTransaction {
			b, err := base58.Decode(tx)
			ok = err == nil && len(b) == 64
		}
	default:
		ok = otherTransaction.MatchString(tx)
	}
	if !ok {
		return ""
	}
	return tx
}

// settleWriteWaits are the waits before each further try of the write that
// records a settlement the store failed: a blip (a failover, a timeout)
// must not cost the buyer the answer paid for. Counted in attemptSpan.
var settleWriteWaits = []time.Duration{100 * time.Millisecond, 500 * time.Millisecond, 2 * time.Second}

// recordSettled marks the claim settled with the transaction: with a store
// that holds records, as a compare-and-swap from the record written with
// the claim (store.ErrNoteChanged: something else has moved it on since).
// A failed write is tried again (settleWriteWaits); ErrNoteChanged and
// store.ErrClaimLost are final.
func (p *paidCharge) recordSettled(ctx context.Context, sr x402.SettleResponse) error {
	ctx = context.WithoutCancel(ctx)
	cl := p.g.state.Claims()
	for i := 0; ; i++ {
		var err error
		if p.note == "" {
			err = cl.Settle(ctx, p.claim, sr.Transaction, time.Time{})
		} else {
			err = cl.(store.HeldClaims).Swap(ctx, p.claim, p.note, sr.Transaction)
		}
		if errors.Is(err, store.ErrNoteChanged) {
			return p.settledMeanwhile(ctx, sr, err)
		}
		if err == nil || errors.Is(err, store.ErrClaimLost) || i == len(settleWriteWaits) {
			return err
		}
		p.g.logger.Warn("recording a settlement; trying again", zap.Error(err))
		time.Sleep(settleWriteWaits[i])
	}
}

// settledMeanwhile is recordSettled's answer when the claim no longer
// carries the record written with it (err, store.ErrNoteChanged): nil when
// this request may deliver after all, because the settled note is its own
// (a try whose answer was lost wrote it: resolvers write records, never a
// bare transaction) or because the claim was resolved from the chain
// elsewhere (a background pass) and its one delivery not yet made, which
// this request then takes as a retry would (the Swap to delivered); err
// when that delivery is made or taken. A claim that cannot be read, or is
// still unsettled under another note, is an error of the store: nothing is
// delivered, and the chain decides on the retry.
func (p *paidCharge) settledMeanwhile(ctx context.Context, sr x402.SettleResponse, err error) error {
	st, lerr := p.g.state.Claims().Lookup(ctx, p.claim.Keys[0])
	switch {
	case errors.Is(lerr, store.ErrNotFound):
		return store.ErrClaimLost // gone since: see settleOnce
	case lerr != nil:
		return fmt.Errorf("reading the claim whose record changed: %v", lerr)
	}
	if !st.Settled {
		return errors.New("the claim's record changed, and it is not settled")
	}
	if st.Note == sr.Transaction {
		return nil
	}
	h, ok := decodeHeld(st.Note)
	if !ok || h.Token != p.claim.Token || h.Delivered || h.Held {
		return err
	}
	if markDelivered(ctx, p.g.state.Claims().(store.HeldClaims), p.claim, h, st.Note) != nil {
		return err
	}
	return nil
}

// outcomeSettled counts settled payments (looked up once: every paid call
// counts on it).
var outcomeSettled = metrics.outcomes.WithLabelValues("settled")

// setPaidHeaders adds PAYMENT-RESPONSE and the caching and CORS headers of a
// paid answer.
func (g *Gate) setPaidHeaders(h http.Header, sr x402.SettleResponse) {
	if header, err := x402.EncodeHeader(sr); err == nil {
		h.Set(x402.HeaderPaymentResponse, header)
	}
	setChargedHeaders(h)
}

// paidStream is w for a paid answer the upstream writes straight to the
// client (settle before mode; a run again after an unknown settlement,
// pending.go), with the paid headers set: whatever headers the upstream
// adds, PAYMENT-RESPONSE goes out as the gate set it (sr) and an
// upstream's PAYMENT-REQUIRED not at all. Only the gate speaks x402 to the
// client: an upstream that is itself an x402 client (a seller's agent
// calling another paid API) must not hand its receipts on as the buyer's.
// A held answer is cleaned the same way when it is replayed. The request
// is marked as settled before its answer (varSettledBefore), so that a
// verify_response after the gate that withholds the output says the
// buyer was charged. started, if not nil, is called once, at the
// upstream's first write, before its header goes out: the moment its
// answer is under way.
func (g *Gate) paidStream(w http.ResponseWriter, r *http.Request, sr x402.SettleResponse, started func()) *statusWriter {
	caddyhttp.SetVar(r.Context(), varSettledBefore, true)
	g.setPaidHeaders(w.Header(), sr)
	// The gate's own values, which the upstream's header replaces in the
	// map (headerDeadline refills it) and which go back on it as replay
	// keeps them: a Cache-Control of the upstream's beside no-store would
	// let a shared cache keep one buyer's paid answer for everyone.
	var own [len(streamKept)][]string
	for i, k := range streamKept {
		own[i] = w.Header()[k]
	}
	return &statusWriter{ResponseWriter: w, onHeader: func(h http.Header, _ int) {
		if started != nil {
			started()
		}
		dropGateHeaders(h)
		dropTargetedCaching(h)
		for i, k := range streamKept {
			if own[i] != nil {
				h[k] = own[i]
			}
		}
	}}
}

// streamKept are the headers a paid answer streamed (paidStream) carries
// as the gate set them, whatever the upstream said: PAYMENT-RESPONSE, and
// those setChargedHeaders sets on every answer the gate decides on.
var streamKept = [...]string{keyPaymentResponse, "Cache-Control", "Access-Control-Expose-Headers"}

// serveSettled runs the upstream straight to the client for a payment
// already settled (paidStream). An upstream that fails before writing
// anything (nothing listens, upstream_timeout before its headers) is
// answered here, not left to Caddy's error handling: a handle_errors block
// (Caddyfile.example's) would tell the charged buyer that nothing was
// charged and to retry. The gate's answer keeps the settlement's
// PAYMENT-RESPONSE and says charged true, asking for no retry with the
// spent payment (SettledBefore); so does a chain where nothing answered
// at all (noUpstream). Once the upstream has written, its answer is under
// way and its error stays Caddy's.
func (g *Gate) serveSettled(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, ex exchange, sr x402.SettleResponse) error {
	failed, err := g.runSettled(w, r, next, sr, nil)
	if failed != nil {
		return ex.refuse(w, r, failed.SettledBefore())
	}
	return err
}

// runSettled runs the upstream straight to the client for a payment
// already settled (paidStream). failed is the gate's answer, not yet
// written, when the upstream wrote nothing (as an error of its caller's
// whose payment is spent or kept, SettledBefore or runAgainFailed), nil
// once it has written, err then its error. started, if not nil, is called
// at the upstream's first write, before its header goes out.
//
// upstream_timeout bounds the wait for that first write, not the answer:
// a stream (SSE), or a tunnel after a protocol switch (101: startsAnswer;
// or a hijack, for a handler that writes its 101 itself:
// headerDeadline.Hijack), runs as long as it runs once its header is out, and a
// deadline on the whole call would cut it off with the buyer charged. Up
// to its header the request's context is cancelled at the deadline
// (headerDeadline), so a stalled upstream does not hold a charged buyer
// for as long as the transport's own timeouts, if it has any: a handler
// that honours its context, as reverse_proxy does, returns, and the
// caller answers failed. The upstream is told that deadline
// (X-Aov-Answer-By), as serveCharged tells its own: by it the answer must
// have begun. verifierd records a verification before it writes any of
// its answer, so by it it records none whose answer would begin after the
// gate has given the buyer its 503.
func (g *Gate) runSettled(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, sr x402.SettleResponse, started func()) (failed *apierr.Error, err error) {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	wait := time.Duration(g.UpstreamTimeout)
	tellAnswerBy(r, time.Now().Add(wait))
	// The paid headers are set on w's own map, which the gate's answer
	// starts from should the deadline come first; the upstream writes
	// into a copy (headerDeadline) and reaches paidStream only with a
	// header that came in time.
	sw := g.paidStream(w, r, sr, started)
	hd := &headerDeadline{ResponseWriter: sw, header: sw.Header().Clone()}
	hd.timer = time.AfterFunc(wait, func() {
		if hd.state.CompareAndSwap(headerDue, headerLate) {
			cancel()
		}
	})
	defer hd.timer.Stop()
	err = runCallUpstream(next, hd, r.WithContext(ctx), hd.reached)
	hd.trailers()
	switch {
	case hd.state.Load() == headerLate:
		return apierr.Unavailable("upstream service", 0, fmt.Errorf("%w %s (upstream: %v)", errHeaderLate, wait, err)), nil
	case sw.status != 0:
		return nil, err
	case err == nil:
		return g.noUpstream(), nil
	}
	return apierr.Unavailable("upstream service", 0, err), nil
}

// headerDeadline is w for an upstream whose header is due by a deadline
// (runSettled): of the upstream's header and the deadline, the first wins.
// Past the deadline, whatever the upstream still writes is dropped, so
// that the gate's answer goes out instead and nothing counts as delivered:
// reverse_proxy, its context cancelled, writes a 499 of its own, and a
// handler that ignored its context may write its answer late. A
// reverse_proxy that had the upstream's header in hand at the deadline
// finds its body unwritable and aborts (http.ErrAbortHandler): nothing
// reached the buyer (reached), so runUpstream makes that an error and the
// gate still answers.
//
// The upstream's headers go to a map of its own (header), whose entries
// become the answer's when its header wins. reverse_proxy sets the
// upstream's headers before it writes its header: were they set on w's
// map, a deadline falling in between would send the gate's answer with
// them, a Content-Length or Content-Encoding not of its body (cut short,
// or unreadable) and the upstream's cookies, to a buyer already charged.
type headerDeadline struct {
	http.ResponseWriter
	header http.Header  // the upstream's (Header)
	sent   bool         // header's entries went out as the answer's (WriteHeader)
	state  atomic.Int32 // headerDue, headerBegun or headerLate
	timer  *time.Timer
}

// Header is the upstream's own map, before its header and after: a
// handler may keep the map it was handed and set trailers on it after its
// body, as net/http allows, and one that asks again must see them too.
// Past the header net/http reads nothing of a map but trailers, which
// trailers carries over once the upstream is done.
func (d *headerDeadline) Header() http.Header { return d.header }

// trailers carries into the answer's map the trailers the upstream set on
// its own after its header went out (carryTrailers). An x402 or allowance
// trailer of the upstream's is never carried (gateHeaders): only the gate
// speaks them.
func (d *headerDeadline) trailers() {
	if d.sent {
		carryTrailers(d.ResponseWriter.Header(), d.header, isGateHeader)
	}
}

// carryTrailers copies into dst, the header map of an answer under way,
// the trailers a handler set on src, the map it writes to, after the
// header went out: the values of the keys dst's Trailer announced, and any
// under http.TrailerPrefix, which net/http sends once the handler returns.
// One whose name (canonical) foreign reports is not the handler's to send,
// and is not carried.
func carryTrailers(dst, src http.Header, foreign func(string) bool) {
	for _, list := range dst["Trailer"] {
		for k := range strings.SplitSeq(list, ",") {
			k = http.CanonicalHeaderKey(strings.TrimSpace(k))
			if v, ok := src[k]; ok && !foreign(k) {
				dst[k] = v
			}
		}
	}
	for k, v := range src {
		if name, ok := strings.CutPrefix(k, http.TrailerPrefix); ok && !foreign(http.CanonicalHeaderKey(name)) {
			dst[k] = v
		}
	}
}

const (
	headerDue int32 = iota
	headerBegun
	headerLate
)

// errHeaderLate is the cause of the gate's answer when the deadline came
// first, and what the upstream's writes after it return.
var errHeaderLate = errors.New("x402: the upstream sent no header within upstream_timeout")

// begin is called as the upstream's header is about to go out: it reports
// whether it came before the deadline, which then no longer applies.
func (d *headerDeadline) begin() bool {
	if d.state.CompareAndSwap(headerDue, headerBegun) {
		d.timer.Stop()
		return true
	}
	return d.state.Load() == headerBegun
}

// reached reports whether the upstream's header went out (runUpstream).
func (d *headerDeadline) reached() bool { return d.state.Load() == headerBegun }

// WriteHeader writes a header that starts the answer (startsAnswer) only
// if it came before the deadline, with the upstream's map's entries as the
// answer's.
// Any other 1xx goes before the answer while it is still due (inform).
func (d *headerDeadline) WriteHeader(code int) {
	switch {
	case !startsAnswer(code):
		if d.state.Load() == headerDue {
			d.inform(code)
		}
	case d.begin():
		if !d.sent {
			refill(d.ResponseWriter.Header(), d.header)
			d.sent = true
		}
		d.ResponseWriter.WriteHeader(code)
	}
}

// inform writes an informational header (103 Early Hints) with the
// upstream's map: net/http sends a 1xx with the header map as it stands,
// so w's map holds the upstream's for that write and is put back after,
// for the answer the deadline may still leave to the gate. It is the one
// place a gate sends an upstream's 1xx (a held answer drops them:
// bufferedWriter), and it goes out without the gate's headers: neither
// the upstream's (dropGateHeaders) nor the gate's, which belong to the
// answer.
func (d *headerDeadline) inform(code int) {
	h := d.ResponseWriter.Header()
	gate := h.Clone()
	refill(h, d.header)
	dropGateHeaders(h)
	d.ResponseWriter.WriteHeader(code)
	refill(h, gate)
}

// refill makes dst, a writer's header map, hold exactly src's entries:
// net/http writes the map it handed out, so it is refilled, not replaced.
func refill(dst, src http.Header) {
	clear(dst)
	copyHeader(dst, src)
}

func (d *headerDeadline) Write(p []byte) (int, error) {
	if d.state.Load() == headerDue {
		d.WriteHeader(http.StatusOK)
	}
	if d.state.Load() == headerLate {
		return 0, errHeaderLate
	}
	return d.ResponseWriter.Write(p)
}

// FlushError flushes only an answer under way: a flush before the header
// would send one that nothing decided (begin).
func (d *headerDeadline) FlushError() error {
	switch d.state.Load() {
	case headerLate:
		return errHeaderLate
	case headerDue:
		return nil
	}
	return http.NewResponseController(d.ResponseWriter).Flush()
}

// Hijack starts the answer, as a header that wins does: a handler that
// switches protocols by hijacking the connection and writing its 101
// itself (gorilla/websocket's Upgrader) never calls WriteHeader, and the
// deadline, left armed, would cut the tunnel of a buyer already charged,
// and count a run again as never started (runSettled). The deadline is
// settled first (begin), so that it cannot fall on the tunnel; once it
// has fallen the connection stays the gate's, for its 503. The writers
// below mark the start on a successful hijack (statusWriter.Hijack). Once
// begun, the deadline no longer applies, even to a handler whose hijack
// failed (it answers with its error).
func (d *headerDeadline) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if !d.begin() {
		return nil, nil, errHeaderLate
	}
	return http.NewResponseController(d.ResponseWriter).Hijack()
}

// Unwrap lets http.ResponseController reach the real writer.
func (d *headerDeadline) Unwrap() http.ResponseWriter { return d.ResponseWriter }

// keyPaymentResponse is PAYMENT-RESPONSE's key in an http.Header
// (canonical: x402 spells it in capitals).
var keyPaymentResponse = http.CanonicalHeaderKey(x402.HeaderPaymentResponse)

// gateHeaders are the keys (canonical) of the answer headers only the gate
// speaks: x402's, of both versions (an x402 client such as @x402/core
// reads X-PAYMENT-RESPONSE when PAYMENT-RESPONSE is absent), and the free
// allowance's. An upstream's own (a seller's agent that is itself an x402
// client, or that runs behind another gate) would be read by the buyer's
// client as the gate's: a settlement of the agent's reported as the
// buyer's on an answer nothing was charged for, an allowance that is not
// the buyer's. They are dropped wherever the gate hands on an upstream's
// header (dropGateHeaders: replay, paidStream, and a streamed answer's 1xx,
// headerDeadline.inform), before the gate sets its own.
var gateHeaders = [...]string{
	keyPaymentResponse,
	http.CanonicalHeaderKey(x402.HeaderPaymentRequired),
	"X-Payment-Response",
	HeaderFreeRemaining, HeaderFreeLimit, HeaderFreeResets,
}

// dropGateHeaders removes gateHeaders from h, an upstream's header.
func dropGateHeaders(h http.Header) {
	for _, k := range gateHeaders {
		delete(h, k)
	}
}

// isGateHeader reports whether k, a canonical key, is one of gateHeaders.
func isGateHeader(k string) bool { return slices.Contains(gateHeaders[:], k) }

// reasonPaymentInFlight refuses a payment that another request is using
// right now.
const reasonPaymentInFlight = "payment_in_flight"

// statusOverride replaces the status of the response written through it.
type statusOverride struct {
	http.ResponseWriter
	status int
}

func (s *statusOverride) WriteHeader(int) { s.ResponseWriter.WriteHeader(s.status) }

// Unwrap lets http.ResponseController and the paywall (bufferedInFront)
// reach the writers in front.
func (s *statusOverride) Unwrap() http.ResponseWriter { return s.ResponseWriter }

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

// readPayment reads a payment for an offer on network once, as every
// facilitator will read it, before it is claimed or forwarded. On EVM:
// plain EIP-3009 (the official facilitator takes a payload with
// permit2Authorization for Permit2, which our offers never advertise and
// its claim could not name) with canonical decimal numbers (the only
// spelling BigInt and our readers agree on). On Solana: the transaction's
// canonical base64 (readSVMPayment). On any other network nothing is read
// (warnUnreadOffers). The claim is named and timed by what was read
// (claimKeys).
func readPayment(pay x402.Payment, network string) (*x402.AuthorizationValues, *svmfacilitator.Transaction, error) {
	switch {
	case x402.IsEVM(network):
		v, err := pay.ExactEVMValues()
		if err != nil {
			return nil, nil, err
		}
		return &v, nil, nil
	case x402.IsSolana(network):
		tx, err := readSVMPayment(pay.PaymentPayload)
		return nil, tx, err
	}
	return nil, nil, nil
}

// claimKeys names an authorization twice: by what it authorizes, as
// servePaid read it (for EVM, auth: payer and nonce on the asset's
// network; for Solana, svmTx: its message), so a re-encoded copy is caught,
// and by the exact header, so any scheme is covered. until is when the
// claim may lapse: after the authorization can no longer settle (auth's
// validBefore, the very number the token will judge; svmClaimHold).
func claimKeys(header string, offer x402.PaymentRequirements, auth *x402.AuthorizationValues, svmTx *svmfacilitator.Transaction) ([]string, time.Time) {
	sum := sha256.Sum256([]byte(header))
	keys := make([]string, 1, 2)
	keys[0] = string(hex.AppendEncode([]byte(claimPayloadPrefix), sum[:]))
	t := now()
	until := t.Add(time.Duration(offer.MaxTimeoutSeconds)*time.Second + claimGrace)
	if auth != nil {
		keys = append(keys, evmClaimKey(offer, auth))
		if vb := auth.ValidBefore; !vb.IsInt64() {
			until = t.Add(maxClaimHold) // beyond any date: capped below
		} else if exp := time.Unix(vb.Int64(), 0).Add(claimGrace); exp.After(until) {
			until = exp
		}
	}
	if svmTx != nil {
		keys = append(keys, svmClaimKey(offer.Network, svmTx))
		if hold := t.Add(svmClaimHold); hold.After(until) {
			until = hold
		}
	}
	if until.After(t.Add(maxClaimHold)) {
		until = t.Add(maxClaimHold)
	}
	return keys, until
}

// evmClaimKey names an EIP-3009 authorization by payer and nonce on the
// offer's asset: "x402/auth/<network>/<asset>/<from>/<nonce>", all in lower
// case, addresses and nonce as 0x hex (the key claims made before the gate
// read payments with Values had, so a claim survives an upgrade).
func evmClaimKey(offer x402.PaymentRequirements, auth *x402.AuthorizationValues) string {
	b := make([]byte, 0, len("x402/auth/")+len(offer.Network)+1+len(offer.Asset)+len("/0x")+40+len("/0x")+64)
	b = append(b, "x402/auth/"...)
	b = append(b, offer.Network...)
	b = append(b, '/')
	b = append(b, offer.Asset...)
	b = append(b, "/0x"...)
	b = hex.AppendEncode(b, auth.From[:])
	b = append(b, "/0x"...)
	b = hex.AppendEncode(b, auth.Nonce[:])
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + ('a' - 'A')
		}
	}
	return string(b)
}

// claimPayloadPrefix starts the claim key of an exact header.
const claimPayloadPrefix = "x402/payload/"

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

// bufferedWriter is the gateway's one bounded response writer: it holds an
// upstream answer until the gate (or verify_response) decides what to
// release. Past limit it drops the body and fails writes, so a runaway
// upstream cannot exhaust memory.
//
// By default it holds every answer and never writes to the client. With
// through set it can let answers go: choose decides, at the status, which
// answers are held (the others are written straight to through), and spill,
// when set, lets a held answer that grows past limit go to through after
// all (spill adjusts its headers) instead of failing it.
type bufferedWriter struct {
	header   http.Header
	code     int
	buf      *bytes.Buffer
	limit    int64
	overflow bool // held, then over limit: body dropped

	through http.ResponseWriter
	choose  func(status int, h http.Header) bool
	spill   func(h http.Header)
	held    bool        // the answer is (or was) held
	passing bool        // the answer is going straight to through
	late    http.Header // trailers a held answer announced, dropped (Header)
}

// Header is the header of the answer. An answer that goes straight to
// through keeps its trailers: set on this map after its header went out,
// they are carried to through's when the handler is done (passTrailers).
// A held answer is released whole and sized, so trailers cannot follow it
// as trailers, and released as headers they would be headers no one
// checked when the answer was judged (a Verification-Receipt, a second
// Content-Type): they are dropped.
// reverse_proxy copies an upstream's trailers into the header map after the
// body, as the keys it announced in Trailer before the header was written,
// or, when the upstream sent others, every one under http.TrailerPrefix. So
// a held answer that announced trailers gets, once written, a map nobody
// reads for them (made only then: the common answer costs nothing), and
// prefixed keys are dropped when it is released (dropTrailers).
func (b *bufferedWriter) Header() http.Header {
	if b.late != nil {
		return b.late
	}
	return b.header
}

func (b *bufferedWriter) WriteHeader(code int) {
	if b.code != 0 || code < 200 {
		return
	}
	b.code = code
	if b.choose != nil && !b.choose(code, b.header) {
		b.passing = true
		copyHeader(b.through.Header(), b.header)
		b.through.WriteHeader(code)
		return
	}
	b.held = true
	if _, announced := b.header["Trailer"]; announced {
		b.late = make(http.Header)
	}
	dropTrailers(b.header)
}

// passTrailers carries to through the trailers of an answer that went
// straight to it (not held), as its handler set them (carryTrailers), but
// those foreign names. Called once the handler is done.
func (b *bufferedWriter) passTrailers(foreign func(string) bool) {
	if b.passing && !b.held {
		carryTrailers(b.through.Header(), b.header, foreign)
	}
}

// dropTrailers removes from h, the header of a held answer, the
// announcement of trailers and any trailer set under http.TrailerPrefix:
// no trailers follow a held answer (bufferedWriter.Header).
func dropTrailers(h http.Header) {
	delete(h, "Trailer")
	for k := range h {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			delete(h, k)
		}
	}
}

func (b *bufferedWriter) Write(p []byte) (int, error) {
	if b.code == 0 {
		b.WriteHeader(http.StatusOK)
	}
	switch {
	case b.passing:
		return b.through.Write(p)
	case b.overflow:
		return 0, errBufferFull
	case int64(b.buf.Len()+len(p)) > b.limit:
		if b.spill != nil {
			b.passing = true
			dst := b.through.Header()
			copyHeader(dst, b.header)
			b.spill(dst)
			b.through.WriteHeader(b.code)
			if _, err := b.through.Write(b.buf.Bytes()); err != nil {
				return 0, err
			}
			b.buf.Reset()
			return b.through.Write(p)
		}
		b.overflow = true
		b.buf.Reset()
		return 0, errBufferFull
	}
	return b.buf.Write(p)
}

// Flush passes a flush through for an answer that is not held; a held
// answer leaves nothing before the decision.
func (b *bufferedWriter) Flush() {
	if b.passing {
		http.NewResponseController(b.through).Flush()
	}
}

// reached reports whether bytes have already gone to the client.
func (b *bufferedWriter) reached() bool { return b.passing }

// spilled reports whether a held answer grew past limit and was let go.
func (b *bufferedWriter) spilled() bool { return b.held && b.passing }

func (b *bufferedWriter) status() int {
	if b.code == 0 {
		return http.StatusOK
	}
	return b.code
}

// replay writes the held response to w (whose headers the gate may already
// have set). The upstream's own x402 and free allowance headers
// (gateHeaders) never go out: the client is told of payments and
// allowances by the gate alone (see paidStream), which set its own on w
// before, or none.
func (b *bufferedWriter) replay(w http.ResponseWriter) {
	h := w.Header()
	dropTrailers(b.header)
	dropGateHeaders(b.header)
	if _, set := h["Cache-Control"]; set {
		dropTargetedCaching(b.header) // the gate's Cache-Control rules alone
	}
	for k, v := range b.header {
		if _, set := h[k]; set && (k == "Cache-Control" || k == "Access-Control-Expose-Headers") {
			continue
		}
		h[k] = v
	}
	// The held body is the whole answer, so it goes out sized, not chunked
	// (net/http chunks a body over 2 KiB whose length it is not told),
	// whatever the upstream sent and whatever the gate rewrote. Nothing
	// held: the upstream's own length stands (an answer to HEAD carries
	// the length of the GET's body).
	if b.buf.Len() > 0 {
		h["Content-Length"] = []string{strconv.Itoa(b.buf.Len())}
	}
	w.WriteHeader(b.status())
	w.Write(b.buf.Bytes())
}

var errBufferFull = errors.New("upstream response larger than the gateway buffer")

// runUpstream runs next into w, a writer that holds the answer back (a
// bufferedWriter, the gate's or verify_response's). A proxy that cannot finish a
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

// runCallUpstream is runUpstream for the gate's run of the call itself
// (serveCharged, runSettled), not of a report made from it, which may run
// on another goroutine: the nonces wallet_auth claimed for the request are
// kept from here (keepClaims), since the upstream may serve it, so no
// refusal after this gives its wallet proofs back.
func runCallUpstream(next caddyhttp.Handler, w http.ResponseWriter, r *http.Request, reached func() bool) error {
	credentialsOf(r).keepClaims()
	return runUpstream(next, w, r, reached)
}

var errUpstreamAborted = caddyhttp.Error(http.StatusBadGateway, errors.New("upstream response aborted"))

// errUpstreamTimedOut is an upstream answer cut off by upstream_timeout
// after its headers came (serveCharged).
var errUpstreamTimedOut = caddyhttp.Error(http.StatusGatewayTimeout, errors.New("upstream answer not finished within upstream_timeout"))

// neverReached is the reached of a writer that releases nothing itself.
func neverReached() bool { return false }

// noteIfClientLeft counts a payment the facilitator was asked about
// against the client's rate limit when the call ends unsettled because the
// client went away meanwhile (its request's context cancelled, not the
// facilitator's deadline). Such an end is answered as the facilitator's
// outage (503, which counts nothing: the buyer retries as told), yet the
// client caused it and the facilitator did the work: a client that hangs
// up during every /verify would otherwise have it work without bound.
func (g *Gate) noteIfClientLeft(r *http.Request) {
	if r.Context().Err() != nil {
		g.noteRefusal(r)
	}
}

// facilitatorUnavailable is the gate's 503 when the facilitator could not
// verify or settle (nothing was charged): retry after 2 seconds, or after
// the facilitator's own Retry-After when it refused with one (its rate
// limit, say), up to x402.MaxRetryAfter. A buyer told 2 s by a facilitator
// that said 30 would only be refused again.
func facilitatorUnavailable(err error) *apierr.Error {
	wait := 2
	var fe *x402.FacilitatorError
	if errors.As(err, &fe) && fe.RetryAfter > 0 {
		wait = max(wait, x402.RetryAfterSeconds(fe.RetryAfter))
	}
	return apierr.Unavailable("payment facilitator", wait, err)
}
