package caddymodule

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// Settlements the store did not record.
//
// When the facilitator reports a transfer done and every try of the write
// that marks the claim settled fails (recordSettled), nothing is delivered
// on that request: a record left unsettled would be resolved from the chain
// later and delivered a second time (paid.go). But the write may have
// landed all the same (Redis ran the script and its reply was lost while
// the link stayed down, or a replica did not acknowledge in time): the
// claim is then settled under the bare transaction, which is what a
// delivered payment looks like, and no retry would ever be served. And
// while the store is down, nothing can be written to say otherwise.
//
// So the gateway keeps, in memory, what the buyer's retry needs (the
// settlement, and the answer held back or the name of the request paid
// for) and writes it to the store as soon as it can, as the settled record
// a resolution from the chain writes: the retry, on any gateway sharing the
// store, then gets the held answer, or the upstream runs again once
// (resolveOnRetry). The write is a compare-and-swap from the note the claim
// carries when it is the payment's own, whichever it is: the record written
// with the claim (the settling write never landed) or the bare transaction
// (it did). A claim settled under another record moved on without it
// (resolved from the chain, maybe delivered): that record is what the
// retry gets, since a second delivery is worse than none. A claim the
// store lost (a restart without its data, a failover to a replica it had
// not reached) is written again with the record; while a retry of the
// payment holds its keys afresh, that retry decides first, and nothing
// is overwritten (land). It is tried at once
// and then in the background (unrecordedWaits) until the claim lapses; a
// retry on this gateway meanwhile makes the write itself before it is
// answered, so it is never told payment_already_used for an answer this
// gateway holds; a retry through another gateway sharing the store is
// settlement_pending while the attempt span runs (mayBeUnrecordedElsewhere),
// however long this gateway alone is cut off from the store.
//
// None of this costs the normal paid path anything: it starts only once
// the settling write has failed for good. The kept settlements are bounded
// (maxUnrecorded of them, each answer at most maxHeldAnswer bytes); past
// that, a settlement is kept as an unknown outcome only, as before. Each
// holds its config's store and facilitator open (g.uses), so once the
// config is unloaded (a reload, often one that points the gateway at a
// new store because the old one died; a stop) it keeps trying for
// unrecordedAfterUnload only, not until its claim lapses (up to
// maxClaimHold). A gateway that stops before the store is back loses what
// it kept: if the settling write had landed, the retry is
// payment_already_used (README: "What each failure costs"). Whenever a
// kept settlement is dropped unwritten (given up after an unload, its
// claim lapsed, or none could be kept) an Error names the
// transaction, payer, amount and network, for the operator to make it
// good by hand (refund, or deliver).
type unrecorded struct {
	g     *Gate
	claim store.Claim
	rec   heldRecord // the settled record to write (Transaction, answer or request)

	// who names the settlement in the logs (settlementFields).
	who []zap.Field

	mu   sync.Mutex    // one write at a time: the background, or a retry
	done chan struct{} // closed once written, or moved on without it: nothing left to do

	kept bool // in unrecordedSettlements (guarded by its lock)
}

// maxUnrecorded bounds the settlements kept in memory for a store that
// failed to record them (each with an answer of at most maxHeldAnswer).
const maxUnrecorded = 64

// unrecordedWaits are the waits between the background tries to write a
// kept settlement; the last repeats until the claim lapses. Short next to
// the 30 s the buyer is told to wait, so that once the store is back the
// record is written before the retry comes, whichever gateway it reaches.
// Tests shorten or lengthen them.
var unrecordedWaits = []time.Duration{time.Second, 2 * time.Second, 5 * time.Second}

// unrecordedAfterUnload is how long a kept settlement keeps trying once
// its config is unloaded: the gate's attempt span, the longest a request
// of the old config may hold its store after a reload anyway, so a kept
// settlement holds it no longer than a slow call would. Once the reload
// has pointed the gateway at another store, the retry is served by that
// one, where the old store's record is of no use, and the old store may
// be gone for good; a reload that keeps the store gives a short outage
// the span to end. Tests shorten it.
var unrecordedAfterUnload = (*Gate).attemptSpan

// unrecordedSettlements holds the kept settlements by each of their claim
// keys (a retry names its payment by whichever key it finds claimed).
// Process-wide, like liveClaims: it outlives a reload.
var unrecordedSettlements = struct {
	sync.Mutex
	byKey map[string]*unrecorded
	n     int
}{byKey: map[string]*unrecorded{}}

// keepUnrecorded keeps p's settlement sr, which the store did not record,
// with the answer held back (held; nil in settle before mode) and starts
// writing it. It returns nil when it cannot be kept (too many are).
func (p *paidCharge) keepUnrecorded(r *http.Request, sr x402.SettleResponse, held *bufferedWriter) *unrecorded {
	g := p.g
	if _, ok := g.state.Claims().(store.HeldClaims); !ok {
		return nil // never: recordSettled's write was a Swap
	}
	u := &unrecorded{g: g, claim: p.claim, done: make(chan struct{}), who: p.settlementFields(sr)}
	u.rec = g.newHeldRecord(r, p.claim, p.pay.JSON, p.offerJS, p.sentAfter(), p.pid)
	u.rec.Transaction, u.rec.Sent = sr.Transaction, sr.Transaction
	g.holdAnswer(&u.rec, r, held)

	unrecordedSettlements.Lock()
	if unrecordedSettlements.n >= maxUnrecorded {
		unrecordedSettlements.Unlock()
		g.logger.Error(unrecordedDropped+": too many are kept already", u.who...)
		return nil
	}
	unrecordedSettlements.n++
	u.kept = true
	for _, k := range p.claim.Keys {
		unrecordedSettlements.byKey[k] = u
	}
	unrecordedKept.Store(int32(len(unrecordedSettlements.byKey)))
	unrecordedSettlements.Unlock()
	// The config's store and facilitator stay open until the record is
	// written (a reload closes them after the last use): the write goes to
	// the store the claim is in.
	entered := g.uses.Enter() // the request holds a use: never refused
	go func() {
		defer func() {
			if entered {
				g.uses.Leave()
			}
		}()
		u.keepTrying()
	}()
	return u
}

// unrecordedDropped starts the Error logged when a kept settlement is
// dropped unwritten: the buyer paid, and no retry may be served.
const unrecordedDropped = "a settlement the store did not record is given up: its retry may not be served; make it good by hand (refund, or deliver)"

// settlementFields name settlement sr of p in the logs: what an operator
// needs to make it good by hand (sr's payer is the payment's: settledAs).
func (p *paidCharge) settlementFields(sr x402.SettleResponse) []zap.Field {
	return []zap.Field{zap.String("transaction", sr.Transaction), zap.String("payer", sr.Payer),
		zap.String("amount", p.offer.Amount), zap.String("asset", p.offer.Asset), zap.String("network", p.offer.Network)}
}

// keepTrying writes u's record, waiting unrecordedWaits between tries,
// until it is done, the claim lapses, or unrecordedAfterUnload has passed
// since u's config was unloaded.
func (u *unrecorded) keepTrying() {
	defer u.forget()
	var unloaded <-chan struct{} // closed when u's config is unloaded
	if u.g.ctx.Context != nil {
		unloaded = u.g.ctx.Done()
	}
	var giveUp <-chan time.Time // runs from the unload
	for i := 0; ; i++ {
		_, err := u.land(context.Background())
		if err == nil {
			return
		}
		if !now().Before(u.claim.Until) {
			u.drop("its claim lapsed", err)
			return
		}
		u.logger().Warn("writing a settlement the store did not record; trying again", u.fields(zap.Error(err))...)
		select {
		case <-time.After(unrecordedWaits[min(i, len(unrecordedWaits)-1)]):
		case <-u.done: // a retry wrote it
			return
		case <-unloaded:
			unloaded = nil
			d := unrecordedAfterUnload(u.g)
			giveUp = time.After(d)
			u.logger().Warn("the configuration was unloaded while keeping a settlement the store did not record; trying to write it for a bounded time",
				u.fields(zap.Duration("for", d))...)
		case <-giveUp:
			u.drop("its configuration was unloaded and the store did not take it in time", err)
			return
		}
	}
}

// fields are u.who and then more.
func (u *unrecorded) fields(more ...zap.Field) []zap.Field {
	return append(slices.Clip(u.who), more...)
}

// logger is where u logs: its gate's logger while its config is loaded,
// then Caddy's default one, since the reload that unloaded it may have
// closed the old config's log writers and it is then the operator's only
// word of a settlement given up.
func (u *unrecorded) logger() *zap.Logger {
	if u.g.ctx.Context != nil && u.g.ctx.Err() != nil {
		return caddy.Log().Named(u.g.logger.Name())
	}
	return u.g.logger
}

// drop ends u unwritten, for why (err: the last write's), logging it
// (finish) unless it already ended.
func (u *unrecorded) drop(why string, err error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.finish(why, err)
}

// forget drops u from the kept settlements (once).
func (u *unrecorded) forget() {
	unrecordedSettlements.Lock()
	defer unrecordedSettlements.Unlock()
	if !u.kept {
		return
	}
	u.kept = false
	unrecordedSettlements.n--
	for _, k := range u.claim.Keys {
		if unrecordedSettlements.byKey[k] == u {
			delete(unrecordedSettlements.byKey, k)
		}
	}
	unrecordedKept.Store(int32(len(unrecordedSettlements.byKey)))
}

// findUnrecorded is the kept settlement of the payment claimed by keys,
// if any. Every paid call asks, so with none kept (the rule) it is an
// atomic load, without the lock.
func findUnrecorded(keys ...string) *unrecorded {
	if unrecordedKept.Load() == 0 {
		return nil
	}
	unrecordedSettlements.Lock()
	defer unrecordedSettlements.Unlock()
	for _, k := range keys {
		if u := unrecordedSettlements.byKey[k]; u != nil {
			return u
		}
	}
	return nil
}

// unrecordedKept is len(unrecordedSettlements.byKey), written under its
// lock, read without it (findUnrecorded).
var unrecordedKept atomic.Int32

// land makes one try at writing u's record. nil: it is written (now or by
// an earlier try), or the claim moved on without it (settled under another
// record); st is then the claim's state. Any error: try again (the store
// failed, or lost the claim and a retry of the payment holds its keys
// meanwhile: errClaimedMeanwhile).
func (u *unrecorded) land(ctx context.Context) (store.ClaimState, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	ctx = context.WithoutCancel(ctx)
	cl := u.g.state.Claims()
	hc := cl.(store.HeldClaims)
	for range 3 { // a note that changes under the write is read again
		st, err := cl.Lookup(ctx, u.claim.Keys[0])
		switch {
		case errors.Is(err, store.ErrNotFound):
			// The store lost the claim (a restart without its data, a
			// failover to a replica the claim had not reached): the
			// settlement and its answer are this gateway's alone, and a
			// new claim of the spent payment can only fail to verify.
			// The claim is written again, with its record.
			if err := u.reclaim(ctx, hc); err != nil {
				return st, err
			}
			continue
		case err != nil:
			return st, err
		}
		h, ours := decodeHeld(st.Note)
		switch {
		case st.Settled && st.Note == u.rec.Transaction:
			// The settling write landed; its reply did not.
		case ours && h.Token != u.claim.Token, !ours && !st.Settled:
			// Before the claim lapses, its keys are another claim's only
			// if the store lost it: a retry of the payment claimed them
			// afresh. That request decides: it fails to verify the
			// spent payment and releases them (written here then), or
			// resolves it from the chain as settled (its record is then
			// what the retry gets). Never overwritten meanwhile.
			return st, errClaimedMeanwhile
		case st.Settled:
			// Written by an earlier try, or resolved from the chain
			// meanwhile: whatever it says is what the retry gets.
			u.finish("", nil)
			return st, nil
		}
		// Unsettled under the payment's own record: the write never
		// landed (or settled under the bare transaction: it did).
		note, err := encodeHeld(&u.rec)
		if err != nil {
			return st, err
		}
		switch err := hc.Swap(ctx, u.claim, st.Note, note); {
		case err == nil:
			u.finish("", nil)
			metrics.outcomes.WithLabelValues("settled_unrecorded_written").Inc()
			return store.ClaimState{Settled: true, Note: note, Until: st.Until}, nil
		case errors.Is(err, store.ErrClaimLost):
			// Lost (or claimed afresh) under the write: read again.
		case !errors.Is(err, store.ErrNoteChanged):
			return st, err
		}
	}
	return store.ClaimState{}, errors.New("the claim's note kept changing under the write")
}

// errClaimedMeanwhile: the store lost a kept settlement's claim and
// another request has claimed its keys since; try again once it ends.
var errClaimedMeanwhile = errors.New("the store lost the claim, and another request of the payment holds its keys: waiting for it to end")

// reclaim writes u's claim again, unsettled, with u's record (the state
// of a claim whose settling write never landed, which land then settles):
// the store lost it. ClaimHeld writes nothing when any key is claimed
// meanwhile (errClaimedMeanwhile: another request's, or another gateway's
// record). Called with u.mu held.
func (u *unrecorded) reclaim(ctx context.Context, hc store.HeldClaims) error {
	rec := u.rec
	c, err := hc.ClaimHeld(ctx, u.claim.Keys, u.claim.Until, u.g.attemptSpan(), func(c store.Claim) (string, error) {
		rec.Token = c.Token
		return encodeHeld(&rec)
	})
	var ce *store.ClaimedError
	switch {
	case errors.As(err, &ce):
		return errClaimedMeanwhile
	case err != nil:
		return err
	}
	u.claim.Token, u.rec.Token = c.Token, c.Token // the keys stay as kept (forget reads them)
	u.logger().Warn("the store lost the claim of a settlement it did not record; written again", u.who...)
	return nil
}

// finish records that nothing is left to do for u; called with u.mu held.
// lost says why it ends unwritten ("": written, or the claim settled under
// a record its retry is served by), logged once, with err.
func (u *unrecorded) finish(lost string, err error) {
	select {
	case <-u.done:
		return
	default:
		close(u.done)
	}
	if lost != "" {
		u.logger().Error(unrecordedDropped+": "+lost, u.fields(zap.Error(err))...)
	}
}

// serveUnrecorded answers the retry of a payment (claimed by keys) whose
// settlement this gateway keeps unrecorded (handled false: it keeps none):
// it writes the record first, then answers as the retry of any resolved
// payment (resolveOnRetry). While the store still fails the write, the
// retry is settlement_pending again. It is asked before the retry claims
// anything: a store that lost the claim would let the retry claim the
// payment afresh, and the facilitator then refuses the spent payment.
//
// keys name the payment by its authorization, which the settled transfer
// made public: whoever presents it, resolveOnRetry serves only the
// buyer's payment and request (paidFor).
func (g *Gate) serveUnrecorded(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, ex exchange, pid *paymentIDCall, keys []string, pay x402.PaymentPayload) (bool, error) {
	u := findUnrecorded(keys...)
	if u == nil {
		return false, nil
	}
	ex = pid.resolving(ex)
	st, err := u.land(r.Context())
	if err != nil {
		return true, ex.refuse(w, r, errSettledUnrecorded(err))
	}
	u.forget()
	return g.resolveOnRetry(w, r, next, ex, st, pay)
}

// mayBeUnrecordedElsewhere reports whether a claim found settled (st, as
// the store read it for a retry this gateway keeps nothing of) may be one
// whose settling write landed unacknowledged on another gateway, which
// keeps its answer and writes it as soon as its own link to the store
// answers (keepUnrecorded): settled under the bare transaction, the note
// of the settling write (a record a gateway wrote is served by
// resolveOnRetry), while the attempt span of the request that claimed it
// still runs by the store's clock (store.AttemptRunning). That other
// gateway may be cut off from a store this one reaches, for as long as a
// partition lasts: answered payment_already_used, the buyer would sign a
// new payment for the answer the first one bought.
//
// A payment delivered the usual way looks the same (its settling write
// is the same write, acknowledged), and telling them apart would cost the
// paid path a third durable write: so a replay of a delivered payment,
// on any gateway, is settlement_pending too until the span ends, then
// payment_already_used as before. Neither serves nor charges anything.
// A store with a Session (the embedded one) reports no span: its one
// process knows what it keeps, and serveUnrecorded has answered.
func mayBeUnrecordedElsewhere(st store.ClaimState) bool {
	if !st.Settled || st.Attempt != store.AttemptRunning {
		return false
	}
	_, held := decodeHeld(st.Note)
	return !held
}

// errSettledElsewhere is the answer to a retry of a payment that settled
// and may not be recorded yet by the gateway that settled it
// (mayBeUnrecordedElsewhere): settlement_pending, charged, as that
// gateway's own answer (errSettledUnrecorded).
func errSettledElsewhere() *apierr.Error {
	e := errSettlementPending(nil)
	e.Message = "The payment settled (you were charged once) and its answer may not be recorded yet, so no content was released: do not sign a new payment, retry the same request later. If its answer was already delivered, the retry is refused as payment_already_used within a few minutes."
	e.Charged = true
	return e
}

// errSettledUnrecorded is the answer while a settlement that went through
// is not yet recorded: settlement_pending, as it is retried like one, but
// charged, since the transfer was made.
func errSettledUnrecorded(cause error) *apierr.Error {
	e := errSettlementPending(cause)
	e.Message = "The payment settled but could not be recorded yet, so no content was released; you were charged once: do not sign a new payment, retry the same request later to get the answer."
	e.Charged = true
	return e
}
