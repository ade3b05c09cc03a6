package svmfacilitator

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// Defaults of Config.
const (
	// DefaultMaxComputeUnitPrice is the reference's cap: 5 lamports per
	// compute unit, in micro-lamports.
	DefaultMaxComputeUnitPrice = 5_000_000
	// DefaultMaxComputeUnits caps the compute unit limit. A TransferChecked
	// with a memo uses well under 20,000 units (the official client asks
	// for 20,000); at the price cap 50,000 units cost the fee payer at most
	// 0.00025 SOL in priority fees, against about 0.007 SOL for the 1.4M
	// units the price cap alone allows.
	DefaultMaxComputeUnits = 50_000
	// DefaultMaxSigners is the fee payer and the transfer authority: every
	// further signature costs the fee payer 5,000 lamports.
	DefaultMaxSigners = 2
	// DuplicateWindow is how long a settled message is remembered and a
	// repeat refused as duplicate_settlement (the reference's 120 s). A
	// blockhash lives about 60-90 s, so after the window the chain itself
	// can no longer include the transaction.
	DuplicateWindow = 120 * time.Second
	// SimulationReuse is how long a successful simulation in Verify stands
	// for the Settle of the same transaction: a gateway verifies, runs the
	// call it sells (milliseconds) and settles, and a second
	// simulateTransaction of the very same bytes then costs the chain and
	// the facilitator as much as the first and tells nothing new. Past it,
	// Settle simulates again. What the reuse risks is bounded: a transfer
	// that no longer succeeds (the buyer spent the tokens in between) fails
	// on chain, is reported as failed (nothing is served) and costs the fee
	// payer the fee, as a spend between Settle's own simulation and its send
	// always could.
	SimulationReuse = 2 * time.Second
	// maxSimulations bounds the simulations kept for reuse (a verify that
	// is never settled leaves one until the sweep); past it nothing more is
	// kept and Settle simulates.
	maxSimulations = 1 << 14
	// sweepEvery is how often the records of settled (or pending) messages
	// past DuplicateWindow (and simulations past SimulationReuse) are
	// dropped.
	// Between sweeps an expired record found by a lookup counts as gone, so
	// the windows are exact; only the memory is freed in batches, and a
	// Settle costs a map lookup instead of a walk over every payment of the
	// last two minutes.
	sweepEvery = DuplicateWindow / 8
)

// Config configures a Facilitator.
type Config struct {
	// RPC is the chain's JSON-RPC endpoint.
	RPC *RPC
	// Network is the chain's CAIP-2 id (solana:<genesis hash prefix>).
	Network string
	// FeePayer signs slot 0 of every settled transaction and pays its fees;
	// it must hold SOL.
	FeePayer ed25519.PrivateKey
	// MaxComputeUnitPrice caps SetComputeUnitPrice, in micro-lamports per
	// unit. Default DefaultMaxComputeUnitPrice.
	MaxComputeUnitPrice uint64
	// MaxComputeUnits caps SetComputeUnitLimit. Default
	// DefaultMaxComputeUnits.
	MaxComputeUnits uint32
	// MaxSigners caps the transaction's required signatures. Default
	// DefaultMaxSigners.
	MaxSigners int
	// ConfirmTimeout bounds the wait for a sent transaction's confirmation;
	// after it (or the caller's deadline) the outcome is reported as
	// unknown (settlement_pending), and learned in the background.
	// Default 30s, as the reference SDKs poll.
	ConfirmTimeout time.Duration
	// PollInterval is how often the signature's status is asked. Default
	// 400ms (one slot). The background resolver of a send whose outcome
	// Settle did not learn waits longer while its polls fail, doubling up
	// to 30 s (resolve).
	PollInterval time.Duration
	// The failure budgets (budget.go). A settlement that simulated and then
	// fails on chain still costs the fee payer its fee, and a payer can
	// make its own fail at will (moving its tokens between simulation and
	// landing, or a Lighthouse assertion on state it changes), so the fee
	// payer would pay for failures without end.
	//
	// MaxFailedPerPayer: a payer (its authority or its source token
	// account) with this many failures within FailureWindow is refused.
	// Default DefaultMaxFailedPerPayer.
	MaxFailedPerPayer int
	// MaxInFlightPerPayer caps a payer's settlements sent and not yet
	// confirmed. Default DefaultMaxInFlightPerPayer.
	MaxInFlightPerPayer int
	// MaxFailedLamports: once failures within FailureWindow (and the
	// settlements in flight that ask for more than MaxPriorityFeePastBudget)
	// cost the fee payer this much, payments asking for a priority fee
	// above MaxPriorityFeePastBudget are refused; the others are not.
	// Default DefaultMaxFailedLamports.
	MaxFailedLamports uint64
	// MaxPriorityFeePastBudget is the priority fee, in lamports (compute
	// unit limit × price / 10⁶, rounded up), a payment may ask for once
	// MaxFailedLamports is used. Default DefaultMaxPriorityFeePastBudget.
	MaxPriorityFeePastBudget uint64
	// FailureWindow is how long a failure counts. Default
	// DefaultFailureWindow.
	FailureWindow time.Duration
	// Sent remembers, outside the process, the transactions this
	// facilitator sends (SentStore). Nil keeps everything in memory, as
	// before it existed, for a library user who gives none: after a
	// restart a replay is then told from a first settlement only by the
	// chain, and a node a slot or two behind the one the transaction
	// landed on (a load-balanced pool) can have it answered success a
	// second time. The Caddy module always gives one. UseSent replaces it
	// while the facilitator runs.
	Sent SentStore
}

// SentStore is what the facilitator needs of a store of claims (the
// store.Claims of Badger or Redis, which are store.HeldClaims too,
// implement it) to remember the transactions it sends: a claim on the
// message's key (sentKey) written before the send, so that a process
// stopped mid-send leaves it, lasting until the transaction can no longer
// land (SentRecordHold), its note the claim's token while no Settle
// answered it, and marked answered (Swap: settled, the note now the
// transaction's signature) by the one Settle that answers success, which
// then keeps it longer (Settle with the same note: SentRecordHold). A
// Settle that finds such a claim sends nothing (remember); one that finds
// it unanswered can mark it (adopt), so a payment whose first Settle was
// answered settlement_pending is answered success once, by whichever
// facilitator sharing the store is asked again. Shared by several
// instances (Redis), the claim also keeps two of them from sending one
// payment at the same moment.
type SentStore interface {
	ClaimHeld(ctx context.Context, keys []string, until time.Time, span time.Duration, note func(store.Claim) (string, error)) (store.Claim, error)
	Swap(ctx context.Context, c store.Claim, old, note string) error
	Settle(ctx context.Context, c store.Claim, note string, keepUntil time.Time) error
	Release(ctx context.Context, c store.Claim) error
	Lookup(ctx context.Context, key string) (store.ClaimState, error)
}

// Facilitator verifies and settles x402 "exact" Solana payments on one
// network from one fee payer. It implements x402.Facilitator.
type Facilitator struct {
	rpc      *RPC
	network  string
	key      ed25519.PrivateKey
	feePayer PublicKey
	cfg      Config
	// sent is the store in use for Config.Sent (UseSent): swapped whole,
	// so that a facilitator kept across a server's reloads writes to the
	// store of the config now running, never to one it has closed.
	sent atomic.Pointer[sentStore]

	mu      sync.Mutex
	settled map[[32]byte]*settlement
	// simulated holds the payments Verify simulated successfully, by the
	// SHA-256 of the buyer's wire transaction, for Settle (SimulationReuse).
	simulated map[[32]byte]simulation
	sweptAt   time.Time
	// mints holds, per Token-2022 mint read, why a payment in it is
	// refused ("" for none): mint.go.
	mints map[PublicKey]string
	// unlearned holds the transactions this process sent whose outcome it
	// has not learned yet, by message (sent.go). It is the one place a
	// failure on chain is charged from: whoever learns the outcome first
	// takes the entry (learned), so a failure is charged once however many
	// callers, retries, sweeps and lookups see it. It outlives the records
	// in settled: a pending one is resolved by the facilitator itself in
	// the background (resolve), whether or not anyone asks again.
	unlearned map[[32]byte]*sent
	// unsent holds, until when, the payments a Settle of this process was
	// asked to send and left without a verdict before sending (maySent):
	// the only ones a status read settles (settleUnsent). A payment no
	// Settle asked for (a gateway that died before settling, a read after
	// a restart) is never sent by a read: its caller may not have decided
	// to settle it at all (an upstream's error under settle after).
	unsent map[[32]byte]time.Time
	// peerValid holds, per blockhash, the slot at which a read of a peer's
	// send saw it valid (peer.go): the floor of that read's judgement of
	// expiry.
	peerValid map[string]peerSight
	// resolving: the background resolver runs.
	resolving bool
	// closed: Close was called; no resolver runs from then on. stop is
	// closed with it, to wake a resolver from its wait (resolve).
	closed atomic.Bool
	stop   chan struct{}
	// busy counts the work that may still write, mark or drop a record in
	// Config.Sent: each Settle and status read while it runs, each
	// round of the background resolver (resolveRound), and each drop
	// running in the background (forgetSent); idle is closed when it
	// falls to zero. Close waits for it: a send in flight may be answered
	// after Close, and its record must be marked or dropped through the
	// store handle before its configuration closes it. One count for all,
	// because a Settle's drop starts before the Settle ends: the count
	// never falls to zero between them.
	busy int
	idle chan struct{}

	budget *budget
}

// simulation is a co-signed payment that simulated successfully.
type simulation struct {
	signed []byte
	at     time.Time
	slot   uint64 // the simulation's bank (SimulateResult.Slot)
}

// settlement is what the facilitator remembers of a message it settles.
type settlement struct {
	inflight bool   // a Settle call is working on it
	sig      string // set once sent
	pending  bool   // sent, outcome unknown: a retry re-polls sig
	// elsewhere: the chain had the transaction before a Settle of this
	// process sent it (confirmElsewhere). Kept on the record, not passed
	// along, because a retry after a pending answer must answer as the
	// Settle that found it would have (duplicate_settlement once landed,
	// never a second success for one payment).
	elsewhere bool
	// lost: it landed, and another Settle answers for the payment: one
	// (of any facilitator sharing Config.Sent) marked its record answered
	// first (answerSent's store.ErrNoteChanged), or another process sent
	// it (elsewhere), or this Settle found its record answered
	// (sentBefore). A status read from memory then answers it settled by
	// another settlement (statusLanded), as a fresh read of the record
	// does, never settled as its own caller's.
	lost      bool
	failed    string // failed on chain with this error (counted once)
	blockhash string
	// slot is the confirmed slot of the simulation that accepted the
	// transaction: only a bank at least as new can tell that its
	// blockhash expired (blockhashExpired). 0 when not known.
	slot  uint64
	payer string
	// sent is the claim (Config.Sent) this process wrote before sending
	// the transaction, or the unanswered one of an earlier send it adopted
	// (adopt), until a Settle answered it or it could no longer land; nil
	// without a store, or when the send was another's.
	sent *store.Claim
	// sender: this record wrote its claim before sending the transaction
	// (remember), so it is the one memory that may answer the send as its
	// own once the claim lapsed (markedBy).
	sender bool
	// mark tells this record's mark of its claim in Config.Sent from any
	// other's (markNote): drawn at its first mark, kept for its retries.
	mark string
	// at is when the record was made, settled, or found pending: it
	// lives DuplicateWindow from then, unless it holds its send's record
	// in Config.Sent (expired).
	at time.Time
}

// expired reports whether a record no Settle is working on is past its
// DuplicateWindow at t: it no longer refuses a repeat, and the sweep drops
// it. A pending one (sent, outcome unknown) too, counted from when its
// Settle gave up waiting: until the sweep, a retry still polls its
// signature (claim); after it, the chain is asked by the transaction's id,
// which is signed again rather than remembered: SettlementStatus answers
// its outcome, and Settle answers as for a payment it holds no record of
// (duplicate_settlement once it landed). Kept until asked again, the
// records of callers who never ask again would grow without bound.
//
// One that holds its send's record (sent) lasts instead exactly as long as
// that record marked can (SentRecordHold): not longer, or it would take a
// record another marked for one lapsed unmarked, and not shorter, or it
// would take its own mark for another's.
func (s *settlement) expired(t time.Time) bool {
	switch {
	case s.inflight:
		return false
	case s.sent != nil:
		return t.After(s.sent.Until.Add(SentRecordHold))
	}
	return t.Sub(s.at) > DuplicateWindow
}

// now is the wall clock; tests move it.
var now = time.Now

// New returns a facilitator for cfg.Network. It makes no network call.
func New(cfg Config) (*Facilitator, error) {
	if cfg.RPC == nil || cfg.RPC.URL == "" {
		return nil, errors.New("svm facilitator: no rpc endpoint")
	}
	if len(cfg.FeePayer) != ed25519.PrivateKeySize {
		return nil, errors.New("svm facilitator: no fee payer key")
	}
	if !strings.HasPrefix(cfg.Network, "solana:") || !x402.ValidCAIP2(cfg.Network) {
		return nil, fmt.Errorf("svm facilitator: network %q is not a solana CAIP-2 id", truncate(cfg.Network))
	}
	if cfg.MaxComputeUnitPrice == 0 {
		cfg.MaxComputeUnitPrice = DefaultMaxComputeUnitPrice
	}
	if cfg.MaxComputeUnits == 0 {
		cfg.MaxComputeUnits = DefaultMaxComputeUnits
	}
	if cfg.MaxSigners <= 0 {
		cfg.MaxSigners = DefaultMaxSigners
	}
	if cfg.ConfirmTimeout <= 0 {
		cfg.ConfirmTimeout = 30 * time.Second
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 400 * time.Millisecond
	}
	if cfg.MaxFailedPerPayer <= 0 {
		cfg.MaxFailedPerPayer = DefaultMaxFailedPerPayer
	}
	if cfg.MaxInFlightPerPayer <= 0 {
		cfg.MaxInFlightPerPayer = DefaultMaxInFlightPerPayer
	}
	if cfg.MaxFailedLamports == 0 {
		cfg.MaxFailedLamports = DefaultMaxFailedLamports
	}
	if cfg.MaxPriorityFeePastBudget == 0 {
		cfg.MaxPriorityFeePastBudget = DefaultMaxPriorityFeePastBudget
	}
	if cfg.FailureWindow <= 0 {
		cfg.FailureWindow = DefaultFailureWindow
	}
	f := &Facilitator{rpc: cfg.RPC, network: cfg.Network, key: cfg.FeePayer, cfg: cfg, settled: map[[32]byte]*settlement{}, simulated: map[[32]byte]simulation{}, mints: map[PublicKey]string{}, unlearned: map[[32]byte]*sent{}, unsent: map[[32]byte]time.Time{}, stop: make(chan struct{}),
		budget: &budget{perPayer: cfg.MaxFailedPerPayer, inFlight: cfg.MaxInFlightPerPayer, lamports: cfg.MaxFailedLamports,
			maxPriority: cfg.MaxPriorityFeePastBudget, window: cfg.FailureWindow, ids: map[PublicKey]*identity{}}}
	copy(f.feePayer[:], cfg.FeePayer.Public().(ed25519.PublicKey))
	f.UseSent(cfg.Sent)
	return f, nil
}

// ErrClosed is the cause of Settle's error for a payment it would have to
// send anew once the facilitator is closed (Close): nothing was written
// or sent by it, but its record, which alone tells a send before a
// restart through a node that lags, was not read either, so the error is
// an *x402.UnknownOutcomeError naming the transaction (maySent). The
// gateway holds the payment and polls that signature: a transaction never
// sent is answered never once its blockhash expired, and the same payment
// can then be sent again, to the facilitator of the configuration now
// running.
var ErrClosed = errors.New("svm facilitator: closed (its configuration was unloaded): it sends nothing new")

// Close stops the background resolver (resolve), waking it from its wait,
// and starts none later: a facilitator whose configuration is unloaded (a
// reload that changed its settings gets another) polls nothing more
// through its RPC endpoint and writes nothing more through its store
// handle, which its configuration closes. Its pending sends are answered
// by whichever facilitator a retry reaches, from their records
// (Config.Sent). Settle and the status calls keep working for what needs
// no new send (a payment remembered, or found recorded or on chain); a
// Settle that would send anew answers an unknown outcome caused by
// ErrClosed, having written and sent
// nothing, because no bound Close could wait for covers a send begun after
// it (a Settle still in its reads before the send at Close).
//
// It waits for every Settle, status read, resolver round and drop of a
// send record running (busy), bounded by twice ConfirmTimeout: a send in
// flight (or begun by a Settle that found the facilitator open just
// before: open), like the resolver's poll, is answered within
// ConfirmTimeout, and its record's drop (or a landed send's mark) takes
// at most ConfirmTimeout more. Else its configuration
// would close the store under them: a send the node refuses after Close
// (or answers AlreadyProcessed) would leave the record of a send that
// never happened, which a Settle elsewhere adopts, polling a signature
// the chain never got (or answering success beside the transaction's
// real sender). The bound keeps a store or node that stalls from holding
// a reload longer; what is cut off then is at worst a record left
// unanswered, as a process stopped mid-send leaves one.
func (f *Facilitator) Close() error {
	f.mu.Lock()
	if !f.closed.Swap(true) { // under f.mu: see open
		close(f.stop)
	}
	busy, idle := f.busy, f.idle
	f.mu.Unlock()
	if busy == 0 {
		return nil
	}
	bound := time.NewTimer(2 * f.cfg.ConfirmTimeout)
	defer bound.Stop()
	select {
	case <-idle:
	case <-bound.C:
	}
	return nil
}

// open reports whether the facilitator is not closed, for a Settle about
// to write its send's record and send. It reads under f.mu, where Close
// sets closed and reads busy, so a Settle (counted in busy since it began)
// that finds it open did so before Close read busy: Close waits for its
// send; one that comes later finds it closed and sends nothing.
func (f *Facilitator) open() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.closed.Load()
}

// enter counts work that may write or drop a record in Config.Sent (busy)
// until its leave.
func (f *Facilitator) enter() {
	f.mu.Lock()
	f.enterLocked()
	f.mu.Unlock()
}

// enterLocked is enter with f.mu held.
func (f *Facilitator) enterLocked() {
	if f.busy == 0 {
		f.idle = make(chan struct{})
	}
	f.busy++
}

// leave ends an enter.
func (f *Facilitator) leave() {
	f.mu.Lock()
	if f.busy--; f.busy == 0 {
		close(f.idle)
	}
	f.mu.Unlock()
}

// FeePayer returns the account that co-signs and pays for settlements.
func (f *Facilitator) FeePayer() PublicKey { return f.feePayer }

// Network returns the CAIP-2 network the facilitator settles on.
func (f *Facilitator) Network() string { return f.network }

// Supported reports x402 v2 "exact" on the facilitator's network with its
// fee payer in extra.feePayer (clients build the transaction around it) and
// under signers["solana:*"].
func (f *Facilitator) Supported(context.Context) (x402.SupportedResponse, error) {
	fp := f.feePayer.String()
	return x402.SupportedResponse{
		Kinds:      []x402.SupportedKind{{X402Version: x402.Version, Scheme: x402.SchemeExact, Network: f.network, Extra: map[string]any{"feePayer": fp}}},
		Extensions: []string{},
		Signers:    map[string][]string{"solana:*": {fp}},
	}, nil
}

// checked is the outcome of the checks: a refusal, or a payment co-signed
// and simulated, ready to send.
type checked struct {
	resp     x402.VerifyResponse
	tx       *Transaction
	signed   []byte // the wire transaction with the fee payer's signature
	payer    string
	exposure exposure
	// mint and program are the transfer's (checkMint).
	mint, program PublicKey
	// reused: Verify simulated these very bytes within SimulationReuse
	// (takeSimulation); the chain checks are not run again.
	reused bool
	// landed: the chain answered that it already processed this very
	// transaction (AlreadyProcessed); it is no refusal, the transfer may
	// well have happened.
	landed bool
	// slot is the confirmed slot of the simulation (its own, or the one
	// reused): a node at that slot knew the blockhash.
	slot uint64
}

func refuse(reason, payer, msg string) *checked {
	return &checked{resp: x402.VerifyResponse{IsValid: false, InvalidReason: reason, InvalidMessage: msg, Payer: payer}}
}

// Verify checks a payment against the server's requirements, in the
// reference facilitator's order and with its reason codes, and simulates
// the co-signed transaction. An error means the chain could not be asked,
// or the fee payer cannot pay the network fee (the operator's to fix).
// A payment the chain already processed is refused as
// duplicate_settlement: it can never be settled again.
func (f *Facilitator) Verify(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements) (x402.VerifyResponse, error) {
	c := f.checkStatic(p, req, false)
	if c.resp.InvalidReason == "" {
		f.refuseOverBudget(c)
	}
	if c.resp.InvalidReason != "" {
		return c.resp, nil
	}
	f.cosign(c)
	if err := f.checkChain(ctx, c); err != nil {
		return x402.VerifyResponse{}, err
	}
	if c.landed {
		return refuse(ReasonDuplicateSettlement, c.payer, "the chain already processed this transaction").resp, nil
	}
	if c.resp.IsValid {
		f.keepSimulation(c)
	}
	return c.resp, nil
}

// DecodePayload decodes an exact SVM payload, {"transaction": base64}: the
// one reading of a Solana payment, for the gate's claim and payer and for
// this facilitator alike. The transaction must be its bytes' canonical
// spelling, standard base64 with "=" padding and zero trailing bits
// (StdEncoding.Strict) and no line break (which Go's decoder skips): other
// decoders read other texts as the same bytes (the official facilitator's
// ignores what follows an "=", missing padding and trailing bits), so a
// payment that had two spellings could be claimed twice.
func DecodePayload(raw json.RawMessage) (*Transaction, error) {
	var pl struct {
		Transaction string `json:"transaction"`
	}
	if err := json.Unmarshal(raw, &pl); err != nil {
		return nil, errors.New("payload is not {\"transaction\": string}")
	}
	if len(pl.Transaction) > base64.StdEncoding.EncodedLen(MaxTransactionSize) {
		return nil, errors.New("transaction is over Solana's size limit")
	}
	b, err := base64.StdEncoding.Strict().DecodeString(pl.Transaction)
	if err != nil || len(pl.Transaction) != base64.StdEncoding.EncodedLen(len(b)) {
		return nil, errors.New("transaction is not standard padded base64")
	}
	return DecodeTransaction(b)
}

// checkChain runs the checks that need the chain on c, which passed the
// static ones: it refuses a Token-2022 mint with a transfer fee or hook
// (checkMint), and simulates exactly what Settle will send (the chain checks
// every signature, the blockhash, the accounts, the balance and the
// decimals) and sets c.resp, or c.landed when the chain already processed
// the transaction. An error means the chain could not be asked, or the fee
// payer cannot pay any payment's fee (simulationFailed).
func (f *Facilitator) checkChain(ctx context.Context, c *checked) error {
	if err := f.checkMint(ctx, c); err != nil || c.resp.InvalidReason != "" {
		return err
	}
	sim, err := f.rpc.Simulate(ctx, c.signed)
	c.slot = sim.Slot
	var re *RPCError
	switch {
	case errors.As(err, &re) && re.AlreadyProcessed(), err == nil && sim.AlreadyProcessed():
		c.landed = true
		return nil
	case errors.As(err, &re) && re.Rejects():
		return f.simulationFailed(ctx, c, re.TxErr(), "simulation refused: "+truncate(re.Message))
	case err != nil:
		// The node could not be asked (overloaded, behind, a proxy's
		// error): nothing is known of the payment.
		return fmt.Errorf("simulating: %w", err)
	case sim.Failed():
		return f.simulationFailed(ctx, c, sim.Err, "simulation failed: "+truncate(string(sim.Err)))
	}
	c.resp = x402.VerifyResponse{IsValid: true, Payer: c.payer}
	return nil
}

// simulationFailed judges c's simulation that failed with txErr (msg
// tells how): a refusal of the payment (ReasonSimulationFailed, which the
// gateway counts), or an error when the fee payer cannot pay any payment's
// fee (feePayerFault). The fee payer pays the priority fee the buyer chose
// (up to the caps), so its shortfall (feePayerShort) is the operator's only
// when it cannot pay even this payment's base fee and stay rent-exempt:
// else any buyer could have its own payment answered as the operator's
// outage (503, uncounted, "send it again") at will by asking for the
// largest priority fee. The balance is asked only on such a failure; an
// error asking it is an error (nothing is known).
func (f *Facilitator) simulationFailed(ctx context.Context, c *checked, txErr json.RawMessage, msg string) error {
	switch feePayerError(txErr) {
	case feePayerUnusable:
		return f.feePayerFault(txErr)
	case feePayerShort:
		base := feeOf(int(c.tx.NumSigners), 0)
		short, err := f.shortOfBaseFee(ctx, base)
		if err != nil {
			return fmt.Errorf("fee payer %s: reading its balance after %s: %w", f.feePayer, msg, err)
		}
		if short {
			return f.feePayerFault(txErr)
		}
		msg += fmt.Sprintf("; the fee payer cannot pay this payment's priority fee of %d lamports: sign one with a lower priority fee (compute unit limit × price)", c.exposure.priority)
	}
	c.resp = refuse(ReasonSimulationFailed, c.payer, msg).resp
	return nil
}

// shortOfBaseFee reports whether the fee payer holds less than a base fee
// of base lamports plus what keeps it rent-exempt: then no payment's fee
// can be paid, whatever its priority fee. Each call has the RPC's timeout.
func (f *Facilitator) shortOfBaseFee(ctx context.Context, base uint64) (bool, error) {
	held, err := f.rpc.Balance(ctx, f.feePayer.String())
	if err != nil {
		return false, err
	}
	rent, err := f.rpc.RentExemptMinimum(ctx, 0)
	if err != nil {
		return false, err
	}
	return held < sat(base, rent), nil
}

// feePayerFault is the error for a simulation that failed on the fee
// payer's side when it cannot pay any payment's fee (simulationFailed):
// the operator's outage, which every payment meets alike until the fee
// payer is funded, so it is no refusal of the buyer's payment (a new one
// would fail the same way) but an error naming the account to fund: at
// Verify the gateway answers 503, nothing charged, the same payment can be
// sent again; at Settle (the fee payer drained since) it is an unknown
// outcome like any Settle without a verdict (maySent).
func (f *Facilitator) feePayerFault(txErr json.RawMessage) error {
	return fmt.Errorf("fee payer %s cannot pay the network fee (simulation failed: %s): it must be a system account holding enough SOL", f.feePayer, truncate(string(txErr)))
}

// refuseOverBudget refuses c when its payer, or the overall budget, is past
// the failure budgets (budget.go). It runs after the static checks, so
// every earlier refusal names what is wrong with the payment itself, and
// before anything is simulated or sent.
func (f *Facilitator) refuseOverBudget(c *checked) {
	if reason, msg := f.budget.check(c.exposure); reason != "" {
		c.resp = refuse(reason, c.payer, msg).resp
	}
}

// keepSimulation keeps c's successful simulation for its Settle.
func (f *Facilitator) keepSimulation(c *checked) {
	t := now()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sweep(t)
	if len(f.simulated) < maxSimulations {
		f.simulated[sha256.Sum256(c.tx.Raw)] = simulation{signed: c.signed, at: t, slot: c.slot}
	}
}

// takeSimulation returns (and forgets) the co-signed bytes of tx, and the
// simulation's slot, when Verify simulated tx, byte for byte, within
// SimulationReuse; nil if not.
func (f *Facilitator) takeSimulation(tx *Transaction) ([]byte, uint64) {
	key := sha256.Sum256(tx.Raw)
	t := now()
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.simulated[key]
	if !ok {
		return nil, 0
	}
	delete(f.simulated, key)
	if d := t.Sub(s.at); d < 0 || d > SimulationReuse {
		return nil, 0
	}
	return s.signed, s.slot
}

// sweep drops, at most once per sweepEvery, the settled and pending
// records past DuplicateWindow and the simulations past SimulationReuse.
// The transactions sent and not learned stay in unlearned, whatever
// becomes of their records: the resolver learns them. f.mu is held.
func (f *Facilitator) sweep(t time.Time) {
	if d := t.Sub(f.sweptAt); d >= 0 && d < sweepEvery {
		return
	}
	f.sweptAt = t
	for k, e := range f.settled {
		if e.expired(t) {
			delete(f.settled, k)
		}
	}
	for k, s := range f.simulated {
		if t.Sub(s.at) > SimulationReuse {
			delete(f.simulated, k)
		}
	}
	for k, until := range f.unsent {
		if !t.Before(until) {
			delete(f.unsent, k)
		}
	}
}

// checkStatic runs every check that needs no chain: a refusal, or the
// decoded transaction and its payer. With reuse, a
// simulation Verify kept for the same bytes (takeSimulation) is taken: the
// signatures it verified are not verified again, and the result carries
// its co-signed bytes (reused). The failure budgets are not checked here
// (refuseOverBudget).
func (f *Facilitator) checkStatic(p x402.PaymentPayload, req x402.PaymentRequirements, reuse bool) *checked {
	if p.X402Version != x402.Version {
		return refuse(x402.ReasonInvalidX402Version, "", "x402Version must be 2")
	}
	if p.Accepted.Scheme != x402.SchemeExact || req.Scheme != x402.SchemeExact {
		return refuse(ReasonUnsupportedScheme, "", "only the exact scheme is supported")
	}
	if p.Accepted.Network != req.Network {
		return refuse(ReasonNetworkMismatch, "", "accepted.network is not the requirements' network")
	}
	if req.Network != f.network {
		return refuse(x402.ReasonInvalidNetwork, "", "this facilitator settles on "+f.network+" only")
	}
	fp, _ := req.Extra["feePayer"].(string)
	if fp == "" {
		return refuse(ReasonMissingFeePayer, "", "extra.feePayer is required")
	}
	if fp != f.feePayer.String() {
		return refuse(ReasonFeePayerNotManaged, "", "extra.feePayer is not this facilitator's fee payer")
	}
	tx, err := DecodePayload(p.Payload)
	if err != nil {
		return refuse(ReasonTransactionCouldNotBeDecoded, "", err.Error())
	}
	if int(tx.NumSigners) > f.cfg.MaxSigners {
		return refuse(ReasonExcessiveSigners, "", fmt.Sprintf("%d required signatures, at most %d", tx.NumSigners, f.cfg.MaxSigners))
	}
	if tx.AccountKeys[0] != f.feePayer {
		return refuse(ReasonFeePayerMismatch, "", "account 0 (the fee payer) is not extra.feePayer")
	}
	var signed []byte
	var slot uint64
	if reuse {
		signed, slot = f.takeSimulation(tx)
	}
	for i := 1; i < int(tx.NumSigners) && signed == nil; i++ {
		if !verifySignature(tx.AccountKeys[i], tx.Message, tx.Signatures[i]) {
			return refuse(ReasonSignatureInvalid, "", fmt.Sprintf("signature %d is not a valid signature of its signer", i))
		}
	}
	if tx.LookupTables > 0 {
		return refuse(ReasonLookupTables, "", noLookupTables)
	}
	ixs := tx.Instructions
	if len(ixs) < 3 || len(ixs) > 7 {
		return refuse(ReasonInstructionsLength, "", fmt.Sprintf("%d instructions, want 3 to 7", len(ixs)))
	}

	// 1: SetComputeUnitLimit (discriminator 2, u32 units).
	if ix := ixs[0]; tx.Program(ix) != ComputeBudgetProgram || len(ix.Data) != 5 || ix.Data[0] != 2 {
		return refuse(ReasonComputeLimitInstruction, "", "instruction 1 must be SetComputeUnitLimit")
	}
	units := binary.LittleEndian.Uint32(ixs[0].Data[1:])
	if units > f.cfg.MaxComputeUnits {
		return refuse(ReasonComputeLimitTooHigh, "", fmt.Sprintf("compute unit limit %d is over %d", units, f.cfg.MaxComputeUnits))
	}
	// 2: SetComputeUnitPrice (discriminator 3, u64 micro-lamports).
	if ix := ixs[1]; tx.Program(ix) != ComputeBudgetProgram || len(ix.Data) != 9 || ix.Data[0] != 3 {
		return refuse(ReasonComputePriceInstruction, "", "instruction 2 must be SetComputeUnitPrice")
	}
	price := binary.LittleEndian.Uint64(ixs[1].Data[1:])
	if price > f.cfg.MaxComputeUnitPrice {
		return refuse(ReasonComputePriceTooHigh, "", fmt.Sprintf("compute unit price %d micro-lamports is over %d", price, f.cfg.MaxComputeUnitPrice))
	}
	xfer, ok := transferOf(tx)
	if !ok {
		return refuse(ReasonNoTransferInstruction, "", noTransfer)
	}
	source, mint, authority, program := xfer.source, xfer.mint, xfer.authority, xfer.program
	payer := authority.String()
	// The fee payer signs everything it appears in: it must be neither the
	// authority nor the source, nor any account of any instruction (nor a
	// program), or a payment could move the fee payer's own funds.
	if authority == f.feePayer || source == f.feePayer {
		return refuse(ReasonFeePayerTransferringFunds, payer, "the fee payer is the transfer's authority or source")
	}
	for _, ix := range ixs {
		if ix.ProgramIndex == 0 || bytes.IndexByte(ix.Accounts, 0) >= 0 {
			return refuse(ReasonFeePayerTransferringFunds, payer, "the fee payer appears in an instruction")
		}
	}
	if reason, msg := xfer.pays(req); reason != "" {
		return refuse(reason, payer, msg)
	}
	// 4-7: only Memo or Lighthouse.
	unknown := []string{ReasonUnknownFourthInstruction, ReasonUnknownFifthInstruction, ReasonUnknownSixthInstruction, ReasonUnknownSeventhInstruction}
	var memos [][]byte
	for i, ix := range ixs[3:] {
		switch tx.Program(ix) {
		case MemoProgram:
			memos = append(memos, ix.Data)
		case LighthouseProgram:
			// A wallet's assertion (Phantom adds them): allowed, and
			// nothing of ours depends on it.
		default:
			return refuse(unknown[i], payer, fmt.Sprintf("instruction %d may only be a Memo or Lighthouse", i+4))
		}
	}
	if want, _ := req.Extra["memo"].(string); want != "" {
		if len(memos) != 1 {
			return refuse(ReasonMemoCount, payer, "extra.memo requires exactly one Memo instruction")
		}
		if string(memos[0]) != want {
			return refuse(ReasonMemoMismatch, payer, "the memo is not extra.memo")
		}
	}
	// What a failure would cost; the budgets are checked by the caller
	// (refuseOverBudget), Settle's only after it looked the transaction up.
	x := exposureOf(int(tx.NumSigners), units, price, authority, source)
	return &checked{tx: tx, payer: payer, signed: signed, reused: signed != nil, slot: slot, exposure: x, mint: mint, program: program}
}

// transfer is a payment's token transfer, its instruction 3.
type transfer struct {
	source, mint, dest, authority PublicKey
	program                       PublicKey // SPL Token or Token-2022
	amount                        uint64
}

// noTransfer is the refusal of a transaction transferOf finds no transfer in.
const noTransfer = "instruction 3 must be TransferChecked of SPL Token or Token-2022"

// noLookupTables is the refusal of a transaction that uses address lookup
// tables.
const noLookupTables = "a payment uses no address lookup tables"

// transferOf reads tx's instruction 3, which must be TransferChecked (tag
// 12; source, mint, destination, authority; u64 amount, u8 decimals) on
// SPL Token or Token-2022. tx must use no lookup tables, which its callers
// refuse first: only then has DecodeTransaction checked that its indexes
// name its keys.
func transferOf(tx *Transaction) (transfer, bool) {
	if len(tx.Instructions) < 3 {
		return transfer{}, false
	}
	ix := tx.Instructions[2]
	program := tx.Program(ix)
	if (program != TokenProgram && program != Token2022Program) || len(ix.Data) != 10 || ix.Data[0] != 12 || len(ix.Accounts) < 4 {
		return transfer{}, false
	}
	return transfer{source: tx.Account(ix, 0), mint: tx.Account(ix, 1), dest: tx.Account(ix, 2), authority: tx.Account(ix, 3),
		program: program, amount: binary.LittleEndian.Uint64(ix.Data[1:9])}, true
}

// pays reports why t does not pay req (a reason and a message), or "":
// the mint is the asset, the destination payTo's associated token account
// of it, the amount exactly req's.
func (t transfer) pays(req x402.PaymentRequirements) (reason, msg string) {
	if t.mint.String() != req.Asset {
		return ReasonMintMismatch, "the transfer's mint is not the asset"
	}
	payTo, err := ParsePublicKey(req.PayTo)
	if err != nil || t.dest != AssociatedTokenAddress(payTo, t.mint, t.program) {
		return ReasonRecipientMismatch, "the destination is not payTo's associated token account"
	}
	if strconv.FormatUint(t.amount, 10) != req.Amount {
		return ReasonAmountMismatch, "the transfer amount is not the required amount"
	}
	return "", ""
}

// CheckPays checks that tx pays req: it uses no lookup tables (Verify
// refuses them; the accounts they name are not in tx) and its instruction 3
// transfers exactly req's amount of req's asset to payTo's associated token
// account, the checks of Verify that need neither the chain nor the
// facilitator. A gate runs it on the transaction it read before it claims
// the payment: a facilitator that judged the transaction by itself would
// settle, and report success for, a payment of another amount or to
// another account. A refusal is a *x402.PaymentError with the
// facilitator's reason.
func (tx *Transaction) CheckPays(req x402.PaymentRequirements) error {
	reason, msg := ReasonLookupTables, noLookupTables
	if tx.LookupTables == 0 {
		reason, msg = ReasonNoTransferInstruction, noTransfer
		if t, ok := transferOf(tx); ok {
			reason, msg = t.pays(req)
		}
	}
	if reason == "" {
		return nil
	}
	return &x402.PaymentError{Kind: x402.ErrInvalidPayment, Reason: reason, Field: "payload.transaction", Problem: msg}
}

// exposureOf is what a failure on chain of a payment of signers
// signatures, with a compute unit limit of units at price, costs the fee
// payer, charged to its authority and source.
func exposureOf(signers int, units uint32, price uint64, authority, source PublicKey) exposure {
	pf := priorityFee(units, price)
	return exposure{fee: feeOf(signers, pf), priority: pf, ids: [2]PublicKey{authority, source}}
}

// cosign fills c.signed, unless a reused simulation did: a copy of the
// buyer's bytes with the fee payer's signature in slot 0. What is simulated
// is what Settle sends, and that signature is the transaction's id.
func (f *Facilitator) cosign(c *checked) {
	if c.signed == nil {
		c.signed = bytes.Clone(c.tx.Raw)
		copy(c.signed[1:65], ed25519.Sign(f.key, c.tx.Message))
	}
}

// Interface guard.
var _ x402.Facilitator = (*Facilitator)(nil)
