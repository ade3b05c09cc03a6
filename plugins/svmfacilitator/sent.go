package svmfacilitator

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"strings"
	"time"

	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// SentRecordHold is how long the record of a sent transaction
// (Config.Sent) lasts unmarked: the transaction can land until its
// blockhash expires, 150 slots after the blockhash (60 to 90 s at usual
// slot times, longer when slots slow down), and a replay must find the
// record as long as a node behind the one it landed on could still
// simulate and accept it. Ten minutes outlive that expiry with a wide
// margin; past them a replay finds the transaction on chain by its id, or
// fails to simulate.
//
// A record outlives every memory of its send, so that a memory that finds
// it gone knows it lapsed unmarked (markedBy): its mark (answerSent) keeps
// it SentRecordHold past its hold (Claim.Until), and a facilitator's
// memory of a send whose record it holds (settlement.sent) lasts until
// then, however often a retry or a read renews it, and no shorter.
const SentRecordHold = 10 * time.Minute

// sentKey names key's transaction in Config.Sent: under a prefix of its
// own (no other claim is written there), per network.
func (f *Facilitator) sentKey(key [32]byte) string {
	return "x402/svm-sent/" + f.network + "/" + hex.EncodeToString(key[:])
}

// sentStore holds a SentStore for Facilitator.sent (an atomic pointer
// needs a type of its own to point at).
type sentStore struct{ SentStore }

// UseSent makes st the store of the transactions sent (Config.Sent) from
// now on; nil keeps them in memory only. It is for a facilitator that
// outlives the configuration it was made with (the Caddy module keeps one
// across reloads naming the same store, so that the budgets and records in
// memory survive): each configuration hands it its own connection to that
// store, which the previous one may close once it is unloaded. A record
// already written is updated in the store in use when its send is
// answered; so st should hold the same records as the store it replaces
// (a new connection to it): one st does not hold stays where it was until
// it expires, and a replay after a restart through the old store only
// would not find the send.
func (f *Facilitator) UseSent(st SentStore) {
	if st == nil {
		f.sent.Store(nil)
		return
	}
	f.sent.Store(&sentStore{st})
}

// sentIn returns the store in use (UseSent), or nil for none.
func (f *Facilitator) sentIn() SentStore {
	if h := f.sent.Load(); h != nil {
		return h.SentStore
	}
	return nil
}

// remember writes, before s's transaction is sent, the record that this
// process sends it (Config.Sent), and keeps the claim on s. The record's
// note is its claim's token while no Settle answered it: whoever finds it
// unanswered (a facilitator of this process after a reload changing its
// settings, this process after a restart, another instance sharing the
// store) can mark it answered (answerSent) as its writer can, once.
// prior is the record found instead, when one lives: the transaction was
// sent before, and prior.Settled tells that a Settle answered it success.
// An error means nothing is known of the record: the caller must not send,
// since a replay could then be answered success a second time.
func (f *Facilitator) remember(ctx context.Context, key [32]byte, s *settlement) (prior *store.ClaimState, err error) {
	st := f.sentIn()
	if st == nil {
		return nil, nil
	}
	c, err := st.ClaimHeld(ctx, []string{f.sentKey(key)}, time.Now().Add(SentRecordHold), f.cfg.ConfirmTimeout,
		func(c store.Claim) (string, error) { return c.Token, nil })
	var claimed *store.ClaimedError
	if errors.As(err, &claimed) {
		return &claimed.State, nil
	}
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	s.sent, s.sender = &c, true
	f.mu.Unlock()
	return nil, nil
}

// recorded reads key's record in Config.Sent, for a Settle that found the
// transaction sent before it (on chain, or by its record): nil when there
// is none (or no store). An error means the record could not be read.
func (f *Facilitator) recorded(ctx context.Context, key [32]byte) (*store.ClaimState, error) {
	st := f.sentIn()
	if st == nil {
		return nil, nil
	}
	rec, err := st.Lookup(ctx, f.sentKey(key))
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, nil
	case err != nil:
		return nil, err
	}
	return &rec, nil
}

// adopt makes rec, key's record found unanswered, s's own: its note is its
// claim's token (remember), so this Settle marks it answered once the
// transaction landed (answerSent), or drops it once it can no longer land,
// as the Settle that wrote it would. It reports false for a record that
// names no token (written before records kept it), answered as a
// transaction sent by another.
func (f *Facilitator) adopt(key [32]byte, s *settlement, rec *store.ClaimState) bool {
	if rec.Settled || rec.Note == "" {
		return false
	}
	f.mu.Lock()
	s.sent = &store.Claim{Keys: []string{f.sentKey(key)}, Token: rec.Note, Until: rec.Until}
	f.mu.Unlock()
	return true
}

// answerSent marks s's record answered, naming sig, for a Settle about to
// answer success: the mark moves the record's note from its token to
// markNote(sig, s.mark) (store.HeldClaims.Swap), so of the Settles of every
// facilitator and instance sharing the store that find the transaction
// landed, exactly one marks it and answers success. store.ErrNoteChanged:
// another did, and this one must answer duplicate_settlement; a record
// marked by s itself is nil, and one that lapsed is nil only for its
// sender (markedBy). Any other
// error leaves the record as it was, or marked by s with the answer lost:
// the outcome stays unknown to the caller (settlement_pending), whose
// retry marks it then. nil, too, with no store or no record (a library
// user without Config.Sent).
//
// s.mark is drawn once per record in memory, so the mark is s's alone: a
// Swap whose write landed but whose answer was lost (a Redis timeout or
// dropped connection; go-redis resends the script on another connection)
// finds on its resend, or on the retry's Swap, the note it wrote itself,
// which markedBy tells apart from another's mark. Without it the Settle
// that moved the money would take its own mark for another's and answer
// duplicate_settlement for ever.
//
// Success is answered only once the mark also keeps the record
// SentRecordHold past its hold (keepMarked), so that no memory of the send,
// here or in another facilitator, outlives the mark and reads the record
// gone as lapsed unmarked: an error there leaves the caller
// settlement_pending, and the retry finds its own mark and keeps it then.
//
// The mark is bounded by ctx, its caller's, as well as ConfirmTimeout: a
// store that stalls holds no status read or /settle past its caller's
// deadline, and a mark cut short is an error like any other (undecided,
// settlement_pending), never a decided answer.
func (f *Facilitator) answerSent(ctx context.Context, s *settlement, sig string) error {
	st := f.sentIn()
	f.mu.Lock()
	c := s.sent
	if c != nil && s.mark == "" {
		s.mark = newMark()
	}
	mark, sender := s.mark, s.sender
	f.mu.Unlock()
	if c == nil || st == nil {
		return nil
	}
	note := markNote(sig, mark)
	ctx, cancel := context.WithTimeout(ctx, f.cfg.ConfirmTimeout)
	defer cancel()
	err := st.Swap(ctx, *c, c.Token, note)
	if errors.Is(err, store.ErrNoteChanged) || errors.Is(err, store.ErrClaimLost) {
		err = markedBy(ctx, st, c.Keys[0], note, sender)
	}
	if err == nil {
		err = keepMarked(ctx, st, *c, note)
	}
	if err == nil || errors.Is(err, store.ErrNoteChanged) {
		f.mu.Lock()
		s.sent = nil
		f.mu.Unlock()
	}
	return err
}

// markedBy reads what a Swap to note that found key's record moved on, or
// gone (store.ErrClaimLost), means:
//   - nil when the record carries note (the mark is this Settle's own, its
//     first answer lost);
//   - when no record is left (it lapsed: a marked one outlives every
//     memory of its send, SentRecordHold, unless its keep failed), nil for
//     the sender (a memory that wrote the record before sending: sender),
//     store.ErrNoteChanged for a memory that adopted it. The rule: after a
//     lapse only the facilitator that sent the transaction answers it as
//     its own; every other answers it settled by another settlement, as a
//     facilitator with no memory of the send does (answerRecorded). One
//     sender per transaction, so at most one success, whoever marked the
//     record before it lapsed. Answered undecided instead, every retry
//     would pend for ever for a payment whose tokens moved;
//   - store.ErrNoteChanged when another marked it;
//   - an error when a new record not yet answered holds the key (another
//     Settle wrote it after the lapse: its own mark or drop decides), or
//     the record cannot be read: the outcome stays unknown, and a retry
//     asks again.
func markedBy(ctx context.Context, st SentStore, key, note string, sender bool) error {
	rec, err := st.Lookup(ctx, key)
	switch {
	case errors.Is(err, store.ErrNotFound) && sender:
		return nil
	case errors.Is(err, store.ErrNotFound):
		return store.ErrNoteChanged
	case err != nil:
		return fmt.Errorf("reading the record after its mark found it moved: %w", err)
	case !rec.Settled:
		return errors.New("the record lapsed and another settlement's record, not yet answered, took its place")
	case rec.Note == note:
		return nil
	}
	return store.ErrNoteChanged
}

// keepMarked keeps c's record, which carries note (this Settle's mark),
// SentRecordHold past its hold (store.Claims.Settle with the same note
// keeps it at least until then): a record marked lasts longer than any
// memory of its send (SentRecordHold). A record already gone
// (store.ErrClaimLost) has nothing left to keep: it lapsed unmarked
// (markedBy), or at its hold's end just after this mark.
func keepMarked(ctx context.Context, st SentStore, c store.Claim, note string) error {
	err := st.Settle(ctx, c, note, c.Until.Add(SentRecordHold))
	if err != nil && !errors.Is(err, store.ErrClaimLost) {
		return fmt.Errorf("keeping the marked record: %w", err)
	}
	return nil
}

// markNote is the note of a record marked answered: the transaction's
// signature, then the mark of the one record in memory that marked it
// (answerSent). It is the one place the note is built; markedSig reads it.
func markNote(sig, mark string) string { return sig + " " + mark }

// markedSig is the signature a marked record's note names (markNote).
func markedSig(note string) string {
	sig, _, _ := strings.Cut(note, " ")
	return sig
}

// newMark draws a settlement's mark: 16 random bytes, so no two records in
// memory, of any process sharing the store, mark alike.
func newMark() string {
	var b [16]byte
	rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// forgetSent drops s's record of the send: the transaction was refused or
// can no longer land, or the chain had it before this send (an answer
// AlreadyProcessed). The drop runs on a context of its own, bounded by
// ConfirmTimeout, never by its caller's deadline, because the record of a
// send that never happened must go whenever the answer that says so comes:
// left unanswered, a Settle elsewhere adopts it, polls its signature and
// answers success for a transaction another sent, or a retry of a refused
// payment polls a signature the chain never got until its blockhash
// expires. Its caller waits for it only until its own deadline (a store
// that stalls holds nobody past it); the drop goes on in the background,
// and Close waits for it. then, unless nil, runs once the drop ended (at
// once with nothing to drop): release, for a caller that forgets the
// payment (forgetAndRelease). A store error is only logged: a record left
// in place of a transaction that can no longer land refuses nothing that
// could settle, and lapses after SentRecordHold.
func (f *Facilitator) forgetSent(ctx context.Context, s *settlement, sig string, then func()) {
	f.mu.Lock()
	c := s.sent
	s.sent = nil
	f.mu.Unlock()
	st := f.sentIn()
	if c == nil || st == nil {
		if then != nil {
			then()
		}
		return
	}
	done := make(chan struct{})
	f.enter()
	go func() {
		defer f.leave()
		defer close(done)
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.cfg.ConfirmTimeout)
		defer cancel()
		if err := st.Release(dctx, *c); err != nil {
			log.Printf("svm facilitator: dropping the record of sent transaction %s: %v", sig, err)
		}
		if then != nil {
			then()
		}
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// forgetAndRelease drops s's record (forgetSent) and forgets key only once
// the drop ended: until then the payment stays a settlement in progress
// (s.inflight), which a retry is answered as (claim), because a retry
// that found no memory while the record still lived would adopt it and
// poll a signature the chain never got until its blockhash expired.
func (f *Facilitator) forgetAndRelease(ctx context.Context, key [32]byte, s *settlement, sig string) {
	f.mu.Lock()
	s.inflight = true
	f.mu.Unlock()
	f.forgetSent(ctx, s, sig, func() {
		f.mu.Lock()
		if f.settled[key] == s {
			delete(f.settled, key)
		}
		f.mu.Unlock()
	})
}

// sent is a transaction this process sent whose outcome it has not learned
// (Facilitator.unlearned). It holds its payer's places in flight in the
// budget until the outcome is known: a payer whose settlements are pending
// cannot send more than MaxInFlightPerPayer of them by having its callers
// hang up or time out, since each would fail at once with one move of its
// tokens.
type sent struct {
	exposure       exposure
	sig, blockhash string
	slot           uint64    // as settlement.slot
	at             time.Time // when it was sent (monotonic: resolve bounds by it)
	// waiting: the Settle that sent it stopped waiting (its caller went
	// away, or ConfirmTimeout passed) before the outcome was known; the
	// resolver polls it from then on.
	waiting bool
	// rec is the record of the Settle that sent it, which holds its claim
	// in Config.Sent: the resolver that learns it can no longer land drops
	// that claim as the Settle would have, even once the sweep forgot rec.
	rec *settlement
	// raw is the signed transaction as sent: the bytes a send again
	// repeats (resendDue), never another transaction. lastSend is when it
	// was last sent, which bounds how often (resendEvery).
	raw      []byte
	lastSend time.Time
}

// hold takes key's places in flight for c's send, recorded by s, unless
// the budget refuses it (reason, msg). fresh is false when this process
// already sent this very transaction and has not learned its outcome (its
// record was swept): the send is the same transaction, which lands or
// fails once, so it holds no second place, and its earlier hold stays.
func (f *Facilitator) hold(key [32]byte, c *checked, s *settlement) (fresh bool, reason, msg string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.unlearned[key] != nil {
		return false, "", ""
	}
	// Atomically with the budget check: concurrent settlements of one
	// payer, all simulated against the same balance, must not all pass a
	// check made before any of them failed.
	if reason, msg = f.budget.reserve(c.exposure); reason != "" {
		return false, reason, msg
	}
	f.unlearned[key] = &sent{exposure: c.exposure, sig: s.sig, blockhash: s.blockhash, slot: c.slot, at: time.Now(), rec: s, raw: c.signed}
	return true, "", ""
}

// resendEvery is the least time between two sends of one transaction
// (resendDue): a node that accepted a send and dropped it (a leader's queue
// full, a fork switch; the facilitator asks the node not to retry, so that
// every send is its own) loses nothing by the wait, and two status reads,
// a Settle retry and the resolver asking at once send it once.
const resendEvery = 2 * time.Second

// pollOwn is poll for key's transaction (sig, built on blockhash, accepted
// at slot floor), followed by resendDue when the chain does not know it
// while its blockhash is valid. Every look at a send of this process goes
// through it (a Settle and its retries, SettlementStatus, the resolver),
// so whichever asks gets it onto the chain; a peer's read does not (it is
// not this process's send).
func (f *Facilitator) pollOwn(ctx context.Context, key [32]byte, sig, blockhash string, floor uint64) (polled, error) {
	o, err := f.poll(ctx, sig, blockhash, floor)
	if err == nil && o.unseen {
		f.resendDue(ctx, key)
	}
	return o, err
}

// resendDue sends key's transaction again, the same bytes (so the same
// signatures: it lands once whatever the number of sends), when this
// process sent it and has not learned its outcome (unlearned), its last
// send is resendEvery old, and the facilitator is open (a closed one sends
// nothing). Its caller saw the chain not know it while its blockhash was
// valid: a send the node accepted and dropped would otherwise wait for
// that expiry, and the buyer sign again. The send is made as the first
// (RPC.Send: without preflight, the node not retrying), and its answer is
// only logged: the first send was accepted, so no refusal of a later one
// is a verdict, and the next look tells whether it landed.
func (f *Facilitator) resendDue(ctx context.Context, key [32]byte) {
	f.mu.Lock()
	e := f.unlearned[key]
	if e == nil || e.raw == nil || time.Since(e.lastSend) < resendEvery || f.closed.Load() {
		f.mu.Unlock()
		return
	}
	e.lastSend = time.Now()
	raw, sig := e.raw, e.sig
	f.mu.Unlock()
	sctx, cancel := context.WithTimeout(ctx, f.cfg.ConfirmTimeout)
	defer cancel()
	if _, err := f.rpc.Send(sctx, raw); err != nil {
		log.Printf("svm facilitator: sending transaction %s again: %v", sig, err)
	}
}

// sending records that key's transaction is being sent now (resendDue
// counts from it).
func (f *Facilitator) sending(key [32]byte) {
	f.mu.Lock()
	if e := f.unlearned[key]; e != nil {
		e.lastSend = time.Now()
	}
	f.mu.Unlock()
}

// learned records the outcome of key's transaction, if this process sent
// it and has not learned it yet: its places in flight are given back and,
// when it failed on chain (failed), the fee the fee payer paid is charged
// to its payer and the overall budget. It is the only place a failure is
// charged; taking the entry under f.mu makes it once per transaction,
// however many of Settle, its retries, SettlementStatus, a lookup and the
// resolver learn it, in whatever order with the sweep. A transaction this
// process did not send (another instance's, or one sent before a restart)
// cost it nothing and is not charged.
func (f *Facilitator) learned(key [32]byte, failed bool) {
	f.mu.Lock()
	e := f.unlearned[key]
	delete(f.unlearned, key)
	f.mu.Unlock()
	if e == nil {
		return
	}
	f.budget.release(e.exposure)
	if failed {
		f.budget.fail(e.exposure)
	}
}

// await hands key's transaction to the resolver: the Settle that sent it
// stops waiting for its outcome.
func (f *Facilitator) await(key [32]byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e := f.unlearned[key]
	if e == nil {
		return
	}
	e.waiting = true
	if !f.resolving && !f.closed.Load() {
		f.resolving = true
		go f.resolve()
	}
}

// resolveMaxWait bounds the resolver's wait between rounds while its
// polls fail (resolve): a send waiting on an endpoint that keeps failing is
// asked about at most this seldom, and its outcome is learned at most this
// long after the endpoint answers again. A variable so that tests shorten
// it.
var resolveMaxWait = 30 * time.Second

// resolve is the background resolver: one goroutine per facilitator, while
// any transaction waits. Every PollInterval it polls each waiting
// transaction once, in turn (so it asks the chain one thing at a time),
// and records what it learns (learned). The outcome of a transaction this
// process sent is thus learned by the process, never left to a caller who
// may not ask again (a payer calling /settle itself and hanging up, or a
// gateway whose own deadline passed): its failure is charged, and its
// places in flight are held until then. A round in which no poll was
// answered (the endpoint down, refusing, stalled, or not speaking
// JSON-RPC: a provider's endpoint retired, its port taken by another
// server) doubles the wait before the next, up to resolveMaxWait, and the
// first round answered brings it back to PollInterval: a send whose
// outcome stays unknown is polled for up to FailureWindow (1 h by
// default), and at a fixed pace that would be thousands of requests per
// waiting send to an endpoint that fails every one. It ends when none
// waits, or once the facilitator is closed (Close), which wakes it from
// its wait and waits for the round under way (resolveRound).
func (f *Facilitator) resolve() {
	defer func() {
		if rec := recover(); rec != nil {
			log.Printf("svm facilitator: the resolver of sent settlements panicked: %v", rec)
			f.mu.Lock()
			f.resolving = false // the next pending answer starts another
			f.mu.Unlock()
		}
	}()
	wait := f.cfg.PollInterval
	for {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-f.stop:
			t.Stop()
		}
		f.mu.Lock()
		if f.closed.Load() {
			f.resolving = false
			f.mu.Unlock()
			return
		}
		var keys [][32]byte
		var waiting []*sent
		for k, e := range f.unlearned {
			if e.waiting {
				keys, waiting = append(keys, k), append(waiting, e)
			}
		}
		if len(keys) == 0 {
			f.resolving = false
			f.mu.Unlock()
			return
		}
		f.enterLocked() // under the lock Close reads busy with: see resolveRound
		f.mu.Unlock()
		if f.resolveRound(keys, waiting) {
			wait = f.cfg.PollInterval
		} else {
			wait = max(min(2*wait, resolveMaxWait), f.cfg.PollInterval)
		}
	}
}

// resolveRound polls each of keys' transactions (waiting) once, and stops
// at the first once the facilitator is closed. It runs counted in busy
// (its caller entered, under f.mu, having found the facilitator open), so
// Close waits for the transaction it is polling: one learned to have
// expired has its record dropped before the configuration closes its store
// handle, within Close's bound (the poll's ConfirmTimeout, then the
// drop's). It reports whether any poll was answered (resolveOne): none
// answered, resolve waits longer before the next round.
func (f *Facilitator) resolveRound(keys [][32]byte, waiting []*sent) (answered bool) {
	defer f.leave()
	for i, k := range keys {
		if f.closed.Load() {
			return answered
		}
		answered = f.resolveOne(k, waiting[i]) || answered
	}
	return answered
}

// resolveOne polls e, key's transaction, once, bounded by ConfirmTimeout. A
// transaction still undecided FailureWindow after it was sent (the chain
// could not be read all that time: a blockhash expires within about 90
// seconds) is given up and counted as failed, since the fee payer paid its
// fee whatever became of it and a failure is what the budget must not
// miss. One learned to have expired unlanded has its record in Config.Sent
// dropped, as a retry would (confirm). A panic is recovered: the
// transaction stays waiting, and the others are polled. It reports whether
// the poll was answered (undecided counts: the endpoint works, the
// transaction is on its way), or nothing needed asking; false is an error
// or a panic, which resolve backs off from.
func (f *Facilitator) resolveOne(key [32]byte, e *sent) (answered bool) {
	defer func() {
		if rec := recover(); rec != nil {
			log.Printf("svm facilitator: resolving a sent settlement panicked: %v", rec)
		}
	}()
	if time.Since(e.at) >= f.cfg.FailureWindow {
		f.learned(key, true)
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), f.cfg.ConfirmTimeout)
	defer cancel()
	o, err := f.pollOwn(ctx, key, e.sig, e.blockhash, e.slot)
	if err == nil && o.state != x402.SettlementUndecided {
		f.learned(key, o.failed != "")
		if o.state == x402.SettlementNever && o.failed == "" {
			// Its blockhash expired: it can no longer land, and its
			// record goes now, as a retry's confirm would drop it.
			f.forgetSent(ctx, e.rec, e.sig, nil)
		}
	}
	return err == nil
}
