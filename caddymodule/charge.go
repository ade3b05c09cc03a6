package caddymodule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// The money path. Every call the gate lets through is paid for by a charge
// (a verified payment or a reserved free unit) and goes through serveCharged:
// the upstream runs into one bounded hold, its answer is judged in one place
// (outcomeOf), and the charge is then settled and the answer delivered, or
// released and the answer handed over uncharged. REST and MCP, paid and free,
// differ only in their exchange (how x402 is carried) and their charge.

// charge is what pays for one call.
type charge interface {
	// settle makes the charge final for a billable answer. When it returns
	// false it has answered the client itself (the payment failed) and the
	// held answer must not be released.
	// held is the answer it pays for, kept with an unknown settlement.
	settle(w http.ResponseWriter, r *http.Request, held *bufferedWriter) bool
	// release gives the charge back: nothing was taken, and the same
	// payment or free unit can be used again.
	release(r *http.Request)
	// deliver writes the held answer with what the charge adds to it
	// (PAYMENT-RESPONSE, the Free-Allowance-* headers).
	deliver(w http.ResponseWriter, bw *bufferedWriter)
	// switchWriter returns the writer through which the 101 of a protocol
	// switch the charge settled goes out, with what the charge adds to it
	// (upgrade.go).
	switchWriter(w http.ResponseWriter, r *http.Request) http.ResponseWriter
}

// outcome is what the upstream's held answer is worth.
type outcome int

const (
	outcomeBillable   outcome = iota // a success the buyer pays for
	outcomeNotBilled                 // an error answer: handed over, never charged
	outcomeNotPassed                 // settle_on pass, and the output did not pass: handed over uncharged
	outcomeWithheld                  // settle_on pass, and content no verify_response checked: withheld, never charged
	outcomeOverflow                  // larger than max_buffer: withheld, never charged
	outcomeUnreadable                // not an answer the client takes: replaced, never charged
	outcomeOutage                    // verify_response withheld it for the operator's outage: handed over, never charged
	outcomeInterim                   // a round of a multi-round-trip MCP call, not its answer: handed over, never charged
	outcomeFailed                    // the upstream failed before answering
)

// serveCharged runs the upstream for a call paid by c, and settles or
// releases c by what it answered. It is the only place a call is charged.
func (g *Gate) serveCharged(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, ex exchange, c charge) error {
	buf := getBuffer()
	defer putBuffer(buf)
	bw := &bufferedWriter{header: make(http.Header), buf: buf, limit: g.MaxBuffer}
	// One deadline for the whole upstream call; the request that settles
	// and reports afterwards keeps its own context. A protocol switch
	// settles at its 101, and its tunnel outlives the deadline (upgrade.go).
	wait := time.Duration(g.UpstreamTimeout)
	by := time.Now().Add(wait)
	tellAnswerBy(r, by)
	var held http.ResponseWriter = bw
	reached := neverReached
	var ctx context.Context
	var cancel context.CancelFunc
	ps := newProtocolSwitch(w, r, ex, c, bw)
	if ps != nil {
		held, reached = ps, ps.reached
		ctx, cancel = ps.bound(r.Context(), wait)
	} else {
		ctx, cancel = context.WithTimeout(r.Context(), wait)
	}
	tr := getWroteTrace()
	err := runCallUpstream(next, held, r.WithContext(httptrace.WithClientTrace(ctx, &tr.trace)), reached)
	if err == errUpstreamAborted && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		// The answer's body ran past upstream_timeout: reverse_proxy
		// aborts it as it would a broken one (502), but the call failed
		// by the deadline, as a stall before the headers does (504).
		err = errUpstreamTimedOut
	}
	if err == nil && verificationOutage(r) && !time.Now().Before(by) {
		// verify_response's check ran into the same deadline (answerBy:
		// by itself, which its call's context fires at, maybe before
		// ctx's own timer) and withheld the answer as an outage: the call
		// failed by the deadline, whose answer is 504, as for an upstream
		// that did.
		err = errUpstreamTimedOut
	}
	cancel()
	wrote := tr.wrote.Load()
	if ps != nil {
		if ps.answered {
			// Settled and switched, or its settlement failed and was
			// answered (settle released or kept the charge).
			return err
		}
		if late := ps.late(); late != nil {
			err = late
		}
	}
	if err == nil {
		putWroteTrace(tr)
	}
	ex.upstreamRan()
	o := g.outcomeOf(ex, bw, err, r)
	if o != outcomeBillable {
		g.unsettled(r, c, bw, workRan(o, err, wrote))
	}
	// Each case below counts as workRan says; the comments say why.
	switch o {
	case outcomeFailed:
		// The upstream failed before answering: it worked until the
		// deadline or until its answer broke off, and the call counts,
		// unless it could not be connected to at all.
		return ex.upstreamFailed(w, r, err)
	case outcomeOverflow:
		// The upstream answered, more than the hold takes: it worked, and
		// the call counts (a buyer can ask for a large answer).
		return ex.refuse(w, r, &apierr.Error{
			Code:        "upstream_response_too_large",
			Message:     fmt.Sprintf("The upstream answer exceeded the gateway's %d-byte buffer and nothing was charged; ask the operator to raise max_buffer.", g.MaxBuffer),
			Status:      http.StatusBadGateway,
			NextActions: []apierr.Action{{Action: "contact_operator"}},
		})
	case outcomeNotBilled:
		// An error is never charged: hand it over as it is. The upstream
		// answered it, a 4xx or a 5xx, so the call counts: a client that
		// can make the upstream fail would otherwise have it work without
		// end, uncharged.
		metrics.outcomes.WithLabelValues("upstream_error_not_settled").Inc()
		bw.replay(w)
		return nil
	case outcomeUnreadable:
		// The upstream answered what the buyer's client cannot take, and
		// the exchange replaced it with its refusal. The tool ran, so the
		// call counts: a misconfigured tool server leaves its buyers
		// bounded by rate_limit with Retry-After (back-pressure until the
		// operator, told by the error log, fixes it), and a tool a buyer
		// can steer to such answers gives it no unbounded work.
		metrics.outcomes.WithLabelValues(codeAnswerUnreadable).Inc()
		bw.replay(w)
		return nil
	case outcomeOutage:
		// verify_response could not verify the answer for a fault on the
		// operator's side and withheld it with a retryable 503. It asks
		// verifierd only once the upstream answered, so the agent worked
		// for the call whatever became of verifierd or the agent card, and
		// the call counts: were an unreachable verifier not counted, a
		// client could have the agent work without bound, free, for as
		// long as verifierd is down.
		metrics.outcomes.WithLabelValues("verification_unavailable_not_settled").Inc()
		bw.replay(w)
		return nil
	case outcomeInterim:
		// The tool needs the client's input (an MCP multi-round-trip
		// call, SEP-2322): the SDK's client never returns this round to
		// its caller, it answers the tool's input requests and retries
		// the call with the same payment, which pays for the answer. A
		// round served nothing the buyer pays for and ran the tool, so
		// it counts (workRan), which is what bounds a client's rounds. No
		// count per payment or free client would: a payer signs a fresh
		// authorization for each round at no cost, and one kept per free
		// client is shared by its parallel calls and by every client
		// behind its address.
		metrics.outcomes.WithLabelValues("input_required_not_settled").Inc()
		bw.replay(w)
		return nil
	case outcomeWithheld:
		// The agent ran, and nothing verified its answer: it counts.
		metrics.outcomes.WithLabelValues("unchecked_answer_withheld").Inc()
		return ex.refuse(w, r, uncheckedAnswer(r, bw))
	case outcomeNotPassed:
		// The agent ran, and settle_on let nothing settle: it counts.
		metrics.outcomes.WithLabelValues("verification_not_passed_not_settled").Inc()
		if unchecked(r) {
			keepEmptyAnswerHeaders(bw.header)
		}
		setChargedHeaders(w.Header())
		bw.replay(w)
		return nil
	}
	if r.Context().Err() != nil {
		// The client left (its request's context is done) after the
		// upstream answered, while verify_response checked the answer
		// (its check runs on, recorded either way) or in the instant
		// before this: nobody is there to take the answer, so the charge
		// is given back, as when the client leaves while the upstream
		// works (reverse_proxy's 499), and the same payment or free unit
		// can be used again. The upstream worked, so the call counts. A
		// settlement once begun is never cut short: c.settle runs on a
		// context without the client's cancellation.
		g.unsettled(r, c, bw, true)
		metrics.outcomes.WithLabelValues("client_gone_not_settled").Inc()
		w.WriteHeader(statusClientClosedRequest) // for the access log; nobody reads it
		return nil
	}
	if !c.settle(w, r, bw) {
		return nil
	}
	c.deliver(w, bw)
	return nil
}

// statusClientClosedRequest is the status logged for a call whose client
// left before its answer, as reverse_proxy logs it.
const statusClientClosedRequest = 499

// tellAnswerBy tells the upstream of r when the gate stops waiting for its
// answer (HeaderUpstreamAnswerBy), and a verify_response between them
// (answerByVar).
func tellAnswerBy(r *http.Request, by time.Time) {
	r.Header.Set(HeaderUpstreamAnswerBy, strconv.FormatInt(by.UnixMilli(), 10))
	caddyhttp.SetVar(r.Context(), answerByVar, by)
}

// answerByVar holds the time.Time by which the gate in front stops waiting
// for the answer (tellAnswerBy). A verify_response behind it holds the
// answer until checked, so its check is bounded by it too (answerBy): the
// upstream's context carries the deadline only with settle after, and the
// check runs on one without the buyer's cancellation (VerifyResponse.call),
// which drops it. Past it the gate has given up on the answer (504, or with
// settle before its charged 503), and a check still running would hold
// that answer back and, with settle after, settle an answer past
// upstream_timeout. A variable of the request, not the header, which a
// client sends as it likes where no gate is in front.
const answerByVar = "aov.x402.answer_by"

// answerBy is the deadline of the gate in front of r (answerByVar), zero
// when there is none.
func answerBy(r *http.Request) time.Time {
	by, _ := caddyhttp.GetVar(r.Context(), answerByVar).(time.Time)
	return by
}

// unsettled gives back the charge of a call that settled nothing (the
// same payment or free unit can be used again) and counts the call, once,
// by the work it made run (ran: workRan). The charge is given back, so
// without a count one signed authorization that never settles, or one
// free unit, would have the upstream work without end, through answers
// the client can cause (an error, a timeout, an answer too large or
// unreadable, an output that does not pass). A paid call something worked
// for counts against the client's rate limit as a refusal does. A free
// one keeps the event of the free budget it took (serveFree), and counts
// nowhere else: that budget bounds it (past it, a call that would be free
// is refused 402, which counts as a refusal), and a refusal counted as
// well would spend the budget a payment must pass on free calls. A call
// nothing ran for counts in neither, and a free one gives its free
// budget's event back: the operator's outage is no refusal of the buyer,
// who retries as told.
//
// An upstream that recorded a paid call pending and asked for its outcome
// (bw, the answer held, or a verify_response in between: reportRequest)
// is told it ended unpaid, as for a settlement refused, whatever kept it
// from settling: an error, an output that did not pass, an answer
// withheld, a deadline, a client gone. The buyer's retry with the same
// payment is another call, recorded anew, and nothing else would ever
// resolve this one. This is the one place a call that settled nothing is
// reported; a settlement's own outcome is reported by settle. The report
// goes in the background (reportUnpaid): the buyer's answer does not wait
// for it, since the upstream it goes to may be the one that failed the call.
func (g *Gate) unsettled(r *http.Request, c charge, bw *bufferedWriter, ran bool) {
	c.release(r)
	fc, free := c.(*freeCharge)
	switch {
	case free && !ran:
		fc.budget.refund()
	case !free && ran:
		g.noteRefusal(r)
	}
	if p, ok := c.(*paidCharge); ok {
		p.reportOutcome(r, bw, settleRefused)
	}
}

// workRan reports whether a call that settled nothing made work run for
// it: the one rule by which such a call counts (unsettled). The upstream
// ran for it when it answered anything (an error, a 5xx, an answer too
// large or unreadable, one verify_response then withheld, whatever became
// of verifierd) or ran until a deadline (upstream_timeout): a client that
// can make it do so can repeat it. A call that failed ran nothing only
// when no attempt wrote its request to any upstream (wrote: wroteTrace)
// and its error is a failure to connect (unreached): the operator's
// outage, which no buyer causes and every buyer is told to retry through.
// Neither alone would do: reverse_proxy keeps only its last attempt's
// error, so a retry ending in a dial error hides an upstream that worked
// before it; and an upstream reached by other means than Go's HTTP client
// (a fastcgi transport, a handler of its own) writes nothing the trace
// sees, so its failures other than a dial count.
func workRan(o outcome, err error, wrote bool) bool {
	return o != outcomeFailed || wrote || !unreached(err)
}

// wroteTrace observes, through the request context the gate hands to the
// upstream, whether any attempt of a call wrote its request headers to an
// upstream (reverse_proxy composes its own trace with it, and calls it on
// every attempt, retries included). Once the headers are out the upstream
// may be working, so the call counts whatever error ends it (workRan).
// One is pooled with its hook bound, so the hot path allocates only the
// context value that carries it.
type wroteTrace struct {
	trace httptrace.ClientTrace
	wrote atomic.Bool
	hook  func() // sets wrote; bound once, when the pool makes it
}

var wroteTracePool = sync.Pool{New: func() any {
	t := new(wroteTrace)
	t.hook = func() { t.wrote.Store(true) }
	return t
}}

// getWroteTrace takes a wroteTrace that has seen nothing yet. Its trace is
// set afresh: WithClientTrace composes into it any trace already in the
// context.
func getWroteTrace() *wroteTrace {
	t := wroteTracePool.Get().(*wroteTrace)
	t.wrote.Store(false)
	t.trace = httptrace.ClientTrace{WroteHeaders: t.hook}
	return t
}

// putWroteTrace gives t back after a call whose upstream answered. After
// a failure (a deadline, a canceled call) the transport may still be
// writing an attempt's request and call the hook late, which would mark
// another call's trace: such a t is left to the garbage collector.
func putWroteTrace(t *wroteTrace) { wroteTracePool.Put(t) }

// unreached reports whether err is a failure to connect at all (connection
// refused, no route, a dial that timed out): a dial error of Caddy's
// reverse_proxy, which answers it 502 (reverseproxy.DialError, inside its
// caddyhttp.HandlerError), or of another transport (a *net.OpError of the
// dial). Nothing past that dial ran; an earlier attempt may have (workRan).
func unreached(err error) bool {
	if errors.As(err, new(reverseproxy.DialError)) {
		return true
	}
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}

// outcomeOf judges the upstream's held answer: the one place where what a
// call costs is decided.
func (g *Gate) outcomeOf(ex exchange, bw *bufferedWriter, err error, r *http.Request) outcome {
	if err == nil && bw.code == 0 {
		apierr.Write(bw, g.noUpstream()) // now an error answer, judged as any other
	}
	switch {
	case bw.overflow:
		return outcomeOverflow
	case err != nil:
		return outcomeFailed
	case verificationOutage(r):
		return outcomeOutage
	case !ex.billable(bw):
		return ex.unbilled()
	case g.settleAllowed(r):
		return outcomeBillable
	case uncheckedContent(r, bw):
		return outcomeWithheld
	}
	return outcomeNotPassed
}

// codeNoUpstream: the gate's handler chain ended with nothing written.
const codeNoUpstream = "no_upstream"

// noUpstream is the answer to a call no handler answered (no status, no
// body byte: the end of Caddy's handler chain, whose empty 200 is no
// answer): 502 no_upstream, which outcomeOf judges as an error, never
// charged (serveSettled: charged before, and said so). It is a
// configuration error, logged once per gate: nothing follows the gate in
// its handle or route block (the proxy written in another, exclusive
// block, or forgotten), or only verify_response, which checks an answer
// and makes none.
func (g *Gate) noUpstream() *apierr.Error {
	if g.unanswered != nil && g.unanswered.CompareAndSwap(false, true) {
		g.logger.Error("configuration error: nothing after this x402 gate answered the call (no reverse_proxy or other handler in its handle or route block); its calls are refused 502 no_upstream")
	}
	return &apierr.Error{
		Code:        codeNoUpstream,
		Message:     "This paid route has nothing behind its payment gate to answer the call (a configuration error of this server); nothing was charged. Tell the operator.",
		Status:      http.StatusBadGateway,
		NextActions: []apierr.Action{{Action: "contact_operator"}},
	}
}

// verificationOutage reports whether verify_response withheld the answer
// as upstream_unavailable: the verification could not be done for a fault
// on the operator's side (verifierd or the agent card unreachable, failing
// or too slow, a receipt whose signature does not hold), not for anything
// in the answer. What the answer itself makes unverifiable (prose
// labelled JSON, member names twinned by letter case, more than
// max_response) is response_unverifiable, and an output that failed
// verification is what it is: the buyer's request produced those.
func verificationOutage(r *http.Request) bool {
	code, _ := caddyhttp.GetVar(r.Context(), verificationErrorVar).(string)
	return code == apierr.CodeUpstreamUnavailable
}

// uncheckedContent reports whether the held answer is content no
// verify_response checked: one it let through unchecked (a status or a
// content type it does not check), or one no verify_response saw at all
// (none in the route, or its matcher did not match this request: a
// matcher on a client's header is the client's to steer). It is an answer
// below 400 (outcomeOf asks only about those) with a body, or with a
// Location (any of its values): a redirect, or a 201, points the buyer to
// the result, which may be all the work. Under settle_on pass such an
// answer can be neither charged (nothing verified it) nor handed over
// free: a buyer who can steer the agent to it (an Accept header asking for
// CSV instead of JSON, a header the matcher reads, a request the agent
// answers with 302 to where the result is) would get the work for nothing.
// An answer with nothing in it (HEAD, 204, 304) is still handed over, with
// only the headers that cannot point to a result (emptyAnswerHeaders).
// outcomeOf asks only once settleAllowed refused, so under the default
// settle_on an answer no verify_response saw has already settled.
func uncheckedContent(r *http.Request, bw *bufferedWriter) bool {
	return unchecked(r) && (bw.buf.Len() > 0 || len(bw.header.Values("Location")) > 0)
}

// unchecked reports whether no verify_response checked the call's answer.
func unchecked(r *http.Request) bool {
	outcome, _ := caddyhttp.GetVar(r.Context(), VerificationVar).(string)
	return outcome == "" || outcome == outcomeUnchecked
}

// emptyAnswerHeaders are the upstream headers an unchecked answer with
// nothing in it keeps when it is handed over free under settle_on pass.
// Any other header may carry the result or point to it (Content-Location,
// Link, Refresh, Set-Cookie, an agent's own X-Result), so an allowlist,
// not a list of the dangerous ones: a header nobody thought of is dropped,
// not given away.
// The upstream's own CORS headers stay, or a browser could not read the
// answer when the gate has no cors of its own; Content-Encoding stays with
// Content-Length, which it qualifies.
var emptyAnswerHeaders = map[string]bool{
	"Accept-Ranges": true, "Age": true, "Allow": true, "Cache-Control": true,
	"Content-Encoding": true, "Content-Language": true, "Content-Length": true,
	"Content-Type": true, "Date": true, "Etag": true, "Expires": true,
	"Last-Modified": true, "Pragma": true, "Retry-After": true, "Server": true,
	"Strict-Transport-Security": true, "Vary": true, "X-Content-Type-Options": true,
	"Access-Control-Allow-Origin": true, "Access-Control-Allow-Credentials": true,
	"Access-Control-Allow-Headers": true, "Access-Control-Allow-Methods": true,
	"Access-Control-Expose-Headers": true, "Access-Control-Max-Age": true,
}

// keepEmptyAnswerHeaders drops from an unchecked answer with nothing in it
// every header outside emptyAnswerHeaders.
func keepEmptyAnswerHeaders(h http.Header) {
	for k := range h {
		if !emptyAnswerHeaders[k] {
			delete(h, k)
		}
	}
}

// uncheckedAnswer is the refusal of an answer withheld by uncheckedContent.
// Its cause, logged at Error level (Gate.refuse), tells the operator which
// of the two it was.
func uncheckedAnswer(r *http.Request, bw *bufferedWriter) *apierr.Error {
	e := &apierr.Error{
		Code:        codeResponseUnverifiable,
		Status:      http.StatusServiceUnavailable,
		Retryable:   true,
		RetryAfter:  1,
		NextActions: []apierr.Action{{Action: "retry", After: 1}},
	}
	if outcome, _ := caddyhttp.GetVar(r.Context(), VerificationVar).(string); outcome == "" {
		e.Message = "The answer could not be verified because no verification ran for this request; it was withheld and nothing was charged; retry later."
		e.Cause = errNoVerification
		return e
	}
	ct := headerValueShort(bw.header.Get("Content-Type"))
	if ct == "" {
		ct = "none"
	}
	e.Message = fmt.Sprintf("The answer could not be verified because it is not one verify_response checks (status %d, content type %s); "+
		"it was withheld and nothing was charged; ask for JSON, or retry later.", bw.status(), ct)
	e.Cause = fmt.Errorf("settle_on pass: verify_response did not check this answer (status %d, content type %s): withheld", bw.status(), ct)
	return e
}

// errNoVerification is why an answer no verify_response saw is withheld
// under settle_on pass.
var errNoVerification = errors.New("settle_on pass, but no verify_response handled this request (none in the route, or its matcher did not match): its answer was withheld; write verify_response after x402 for every request of the route, or use settle_on any to sell unverified answers")

// paidCharge is a verified, claimed payment.
type paidCharge struct {
	g       *Gate
	ex      exchange
	next    caddyhttp.Handler // the upstream, told the settlement's outcome
	pay     x402.Payment      // its JSON kept for the record of an unknown outcome (heldRecord)
	offer   x402.PaymentRequirements
	offerJS json.RawMessage // offer's JSON (Gate.offerJSON)
	claim   store.Claim
	claimed time.Time           // when the claim was asked for (sentAfter)
	payer   string              // the payment's payer (paymentPayer)
	note    string              // the record written with the claim ("" if none: claimPaid)
	sr      x402.SettleResponse // set by a successful settle
	pid     *paymentIDCall      // the call's payment identifier, if any (idempotency.go)
	// unrecorded: the settlement went through and the store did not
	// record it; it is kept in memory meanwhile (unrecorded.go) with the
	// answer for the buyer's retry, or none (an answer over
	// maxHeldAnswer): reportOutcome reports it as heldPayment tells. nil
	// otherwise, also when it could not be kept (an unknown outcome then).
	unrecorded *unrecorded
	// settleAsked is when its Settle was asked for (sentAfter); zero
	// before.
	settleAsked time.Time
}

func (p *paidCharge) release(r *http.Request) {
	p.pid.unbind() // before the claim: see idempotency.go
	if err := p.g.state.Claims().Release(context.WithoutCancel(r.Context()), p.claim); err != nil {
		p.g.logger.Warn("releasing payment claim", zap.Error(err))
	}
}

func (p *paidCharge) deliver(w http.ResponseWriter, bw *bufferedWriter) {
	p.pid.save(bw, p.sr)
	p.ex.deliver(w, bw, p.sr)
}

// freeCharge is one reserved unit of a client's daily allowance.
type freeCharge struct {
	g      *Gate
	res    store.Reservation
	at     time.Time
	budget rateSpend // the free budget's event it took (serveFree)
}

// release gives the unit back. The free budget's event the call took is
// given back or kept by the work the call made run (Gate.unsettled).
func (f *freeCharge) release(r *http.Request) {
	if err := f.g.state.Allowance().Release(context.WithoutCancel(r.Context()), f.res); err != nil {
		f.g.logger.Warn("releasing free allowance unit", zap.Error(err))
	}
}

// settle commits the free unit. The call was counted against the client's
// free budget when it was served (serveFree).
func (f *freeCharge) settle(w http.ResponseWriter, r *http.Request, _ *bufferedWriter) bool {
	if err := f.g.state.Allowance().Commit(context.WithoutCancel(r.Context()), f.res); err != nil {
		f.g.logger.Warn("committing free allowance unit", zap.Error(err))
	}
	outcomeFree.Inc()
	return true
}

func (f *freeCharge) deliver(w http.ResponseWriter, bw *bufferedWriter) {
	f.setHeaders(w.Header())
	bw.replay(w)
}

// setHeaders sets the headers of an answer served from the unit.
func (f *freeCharge) setHeaders(h http.Header) {
	f.g.Free.setHeaders(h, f.res, f.at)
	setChargedHeaders(h)
}

// setChargedHeaders sets the headers every answer of a priced route the
// gate decides on carries, whatever the upstream said (replay keeps them):
// a paid or free answer, a demand for payment, a verdict that did not
// pass. Each is one buyer's answer under one payment or allowance, so no
// shared cache may keep it: a CDN in front of the gateway storing a free
// answer the upstream marked public would serve the paid content to every
// later buyer of the URL, unpaid. Pages may read the gate's headers on it.
// Each answer gets values of its own: Caddy's `header` replace edits an
// answer's values in place, so values shared between answers would be
// rewritten by one route's replace for every answer of every priced route
// (a no-store made public), and written while other answers are being
// sent. They share one array (one allocation, as the free allowance's
// setHeaders does); each slice is capped at its one value, so an Add to
// one appends to a copy and never writes over the other.
func setChargedHeaders(h http.Header) {
	v := [...]string{"no-store", exposedHeaders}
	h["Cache-Control"] = v[0:1:1]
	h["Access-Control-Expose-Headers"] = v[1:2:2]
}

// dropTargetedCaching removes from h, the upstream's header of an answer
// that goes out with the gate's Cache-Control (setChargedHeaders), the
// fields targetedCacheControl names: a CDN honours its own field instead
// of Cache-Control (RFC 9213), so the upstream's CDN-Cache-Control:
// public beside the gate's no-store would have a CDN in front keep one
// buyer's paid answer and serve it to everyone, unpaid.
func dropTargetedCaching(h http.Header) {
	for k := range h {
		if targetedCacheControl(k) {
			delete(h, k)
		}
	}
}

// targetedCacheControl reports whether k is a header a cache in front
// reads instead of, or beside, Cache-Control: RFC 9213's targeted fields
// (CDN-Cache-Control, Cloudflare-CDN-Cache-Control, any field named
// *-Cache-Control), Surrogate-Control (Fastly, Varnish, Akamai),
// Akamai's Edge-Control and nginx's X-Accel-Expires (which proxy_cache
// obeys before Cache-Control). Any letter case.
func targetedCacheControl(k string) bool {
	const suffix = "-cache-control"
	return len(k) > len(suffix) && strings.EqualFold(k[len(k)-len(suffix):], suffix) ||
		strings.EqualFold(k, "Surrogate-Control") || strings.EqualFold(k, "Edge-Control") ||
		strings.EqualFold(k, "X-Accel-Expires")
}
