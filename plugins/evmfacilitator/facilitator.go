package evmfacilitator

import (
	"context"
	"crypto/ecdsa"
	"errors"
	"fmt"
	"log"
	"math/big"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/accounts/abi"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/aovhq/aov/x402"
)

// Chain is the part of an Ethereum JSON-RPC client the facilitator uses.
// *ethclient.Client (any endpoint) and the devnet's in-process client both
// satisfy it.
type Chain interface {
	ethereum.ChainIDReader
	ethereum.ContractCaller
	ethereum.GasEstimator
	ethereum.GasPricer
	ethereum.GasPricer1559
	ethereum.TransactionSender
	ethereum.TransactionReader
	ethereum.PendingStateReader
	CodeAt(ctx context.Context, account common.Address, blockNumber *big.Int) ([]byte, error)
	// FilterLogs finds the transaction that used an authorization's nonce
	// (status.go).
	FilterLogs(ctx context.Context, q ethereum.FilterQuery) ([]types.Log, error)
	HeaderByNumber(ctx context.Context, number *big.Int) (*types.Header, error)
	// NonceAt reads the relayer's confirmed nonce: past a lost
	// transaction's, that transaction can no longer execute (settle.go).
	NonceAt(ctx context.Context, account common.Address, blockNumber *big.Int) (uint64, error)
}

// Config configures a Facilitator.
type Config struct {
	// Chain is the connection to the chain settlements go to.
	Chain Chain
	// Network is the chain's CAIP-2 id ("eip155:8453"). The facilitator
	// verifies and settles payments for this network only.
	Network string
	// RelayerKey signs the settlement transactions and pays their gas.
	RelayerKey *ecdsa.PrivateKey
	// ReceiptTimeout bounds the wait for a settlement's receipt; after it
	// the outcome is resolved from the chain (the token's
	// authorizationState and the transaction that used the nonce). Default
	// 2 minutes.
	ReceiptTimeout time.Duration
	// PollInterval is how often the receipt is polled. Default 1s.
	PollInterval time.Duration
	// DomainCacheTTL is how long a token's name() and version() are
	// remembered. Default 10 minutes.
	DomainCacheTTL time.Duration
	// The failure budget (budget.go). A settlement that passed its gas
	// estimate and then reverts on chain still costs the relayer its gas,
	// and a payer can make its own revert at will.
	//
	// MaxFailedPerPayer: a payer (authorization.from) with this many
	// reverted settlements within FailureWindow is refused; a payer whose
	// account has code (a contract, or an EOA delegating under EIP-7702),
	// with this many reverted or in flight (its code can make each revert
	// once mined). Default DefaultMaxFailedPerPayer.
	MaxFailedPerPayer int
	// MaxInFlightPerPayer caps a payer's settlements sent and not yet
	// resolved. Default DefaultMaxInFlightPerPayer.
	MaxInFlightPerPayer int
	// FailureWindow is how long a reverted settlement counts. Default
	// DefaultFailureWindow.
	FailureWindow time.Duration
	// MaxSettlementGas is the most gas a settlement may use: its
	// transaction's gas limit never exceeds it, and a payment whose
	// simulation, EIP-1271 check or gas estimate needs more is refused
	// before anything is sent. A payer whose account is a contract runs
	// its own code (isValidSignature) inside the settlement, at the
	// relayer's gas. Default DefaultMaxSettlementGas; at least
	// MinSettlementGas.
	MaxSettlementGas uint64
}

// DefaultMaxSettlementGas is the default Config.MaxSettlementGas: several
// times what an EOA's transferWithAuthorization uses (60,000 to 90,000
// gas), enough for a smart wallet whose isValidSignature verifies a
// passkey (P-256) signature in Solidity (300,000 to 400,000 gas, as
// Coinbase Smart Wallet's do), and a bound on what any contract payer can
// make the relayer spend on one settlement.
const DefaultMaxSettlementGas = 500_000

// Facilitator verifies and settles x402 "exact" EVM payments (EIP-3009
// transferWithAuthorization) on one chain, submitting settlements from its
// own relayer key. It implements x402.Facilitator.
//
// Every Facilitator of one relayer key on one chain in the process draws
// its transaction nonces from one sequence, whatever its RPC endpoint or
// receipt timeout; other processes sending from the key make it re-read the
// nonce and retry once, and may still make a settlement fail.
type Facilitator struct {
	chain   Chain
	network string
	chainID *big.Int
	relayer common.Address
	key     *ecdsa.PrivateKey
	signer  types.Signer
	cfg     Config

	// nonces is the relayer's nonce manager on this chain, shared by every
	// facilitator of the key on it (chainNonces): nil until the chain is
	// identified, another once the endpoint reaches another chain
	// (confirmChain) or, f closed, once its chain's set was released and
	// made again, under idMu. Code that reads it plainly runs
	// after a relayerNonces that returned it, or before the facilitator
	// is shared (tests).
	nonces *nonceManager
	idMu   sync.Mutex
	// fixed: nonces are a devnet's own, given at New, whose in-process
	// chain is never another (newFacilitator).
	fixed bool
	// confirmed is when the latest reading of the genesis block that found
	// nonces' chain began (confirmChain), ident is that chain's identity,
	// and former are the chains the endpoint reached before, the oldest
	// first, at most maxChainsPerKey-1 (rememberFormer), all under idMu;
	// varies is set once one was forgotten (under identifying).
	confirmed time.Time
	ident     chainIdentity
	former    []formerChain
	varies    bool
	// identifying is held (full) while the chain's genesis is read: a
	// channel, so that the wait for it ends with the waiter's context.
	identifying chan struct{}
	// life ends at Close, and with it the identification in the
	// background (identifyInBackground).
	life    context.Context
	endLife context.CancelFunc

	domainMu sync.Mutex
	domains  map[common.Address]tokenDomain

	inflightMu sync.Mutex
	inflight   map[[32]byte]*settleCall // by the authorization's EIP-712 digest (Settle)

	budget *budget

	usedCache usedCache // alreadyUsed's answers
	// withinValidity is what usedStatus's searches of an authorization's
	// validity window (no attempt known) learned: apart from usedCache,
	// whose searches cover the last sentSlack only, so that neither takes
	// the other's "not found" over blocks it did not search.
	withinValidity validityCache
	// senders is what status reads learned of the senders of the
	// transactions they read (senderCache), for ownTransfer.
	senders senderCache

	prepareTimeout time.Duration // the const prepareTimeout; tests shorten it

	// closed stops the relayer's look-after of the settlements it sent
	// (Close).
	closed atomic.Bool
}

// prepareTimeout bounds the reads of a Verify, and of a Settle before its
// send (the checks, the gas estimate, the fee reads and the wait for the
// relayer's turn), whatever the caller's deadline: the x402_facilitator
// handler's requests have none, and ethclient's HTTP client no timeout of
// its own, so a stalled RPC endpoint would otherwise hold a settle, the
// payer's reservation and the authorization's place in flight for as long
// as the caller's connection stays open. It is the facilitator call
// timeout x402 clients use (as submitTimeout is): nobody still waits for a
// settle that took longer. Past it nothing was sent, and the error is
// retryable.
const prepareTimeout = x402.DefaultFacilitatorTimeout

// Timeouts are how long a Verify and a Settle take at most, whatever the
// caller's deadline: a Verify's reads end after prepareTimeout; a Settle's
// reads before its send after prepareTimeout, the send after
// submitTimeout and the wait for its receipt after ReceiptTimeout (the
// resolution of an unknown outcome after that runs on a context of its
// own). A caller that bounds a Settle by less cuts short the receipt wait
// its operator configured: the settlement it then completes is reported
// to that caller as unknown.
func (f *Facilitator) Timeouts() (verify, settle time.Duration) {
	return f.prepareTimeout, f.prepareTimeout + submitTimeout + f.cfg.ReceiptTimeout
}

type tokenDomain struct {
	name, version string
	notEIP3009    bool
	at            time.Time
}

// settleCall is one settlement in flight; concurrent settles of the same
// authorization wait for its outcome, and are answered from it (joined).
type settleCall struct {
	done chan struct{}
	resp x402.SettleResponse
	err  error
	// sent is set once its transaction may have reached the node: a
	// waiter that gives up before is told nothing was sent, after, that
	// the outcome is unknown.
	sent atomic.Bool
	// waiters counts the settles that joined it (under inflightMu), so
	// that tests can tell a joined settle from one that came after.
	waiters int
}

// now is the wall clock; tests move it.
var now = time.Now

// ErrRelayerUnfunded reports that the relayer cannot pay for gas. Nothing
// was sent; the payment can be retried once the relayer is funded.
var ErrRelayerUnfunded = errors.New("relayer account cannot pay for gas")

// New returns a facilitator for cfg.Network over cfg.Chain. It makes no
// network call: the chain's genesis block, which tells it from other
// chains with its chain ID (chainIdentity), is read in the background
// (identifyInBackground), so that a node that does not answer holds no
// configuration load; until it is read the facilitator sends nothing (a
// settle reads it itself, within its deadline, and is an error, nothing
// sent, when it cannot), and it takes over no settlement of a closed
// facilitator of its key (nonceManager.open).
func New(cfg Config) (*Facilitator, error) { return newFacilitator(cfg, nil) }

// newFacilitator is New with the nonce managers of a devnet's chain; nil:
// the process's of the chain cfg.Chain reaches (relayerNonces).
func newFacilitator(cfg Config, nonces *nonceSet) (*Facilitator, error) {
	if cfg.Chain == nil {
		return nil, errors.New("evm facilitator: no chain client")
	}
	if cfg.RelayerKey == nil {
		return nil, errors.New("evm facilitator: no relayer key")
	}
	chainID, err := x402.ChainID(cfg.Network)
	if err != nil {
		return nil, fmt.Errorf("evm facilitator: network %q: %w", cfg.Network, err)
	}
	if cfg.ReceiptTimeout <= 0 {
		cfg.ReceiptTimeout = 2 * time.Minute
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = time.Second
	}
	if cfg.DomainCacheTTL <= 0 {
		cfg.DomainCacheTTL = 10 * time.Minute
	}
	if cfg.MaxFailedPerPayer <= 0 {
		cfg.MaxFailedPerPayer = DefaultMaxFailedPerPayer
	}
	if cfg.MaxInFlightPerPayer <= 0 {
		cfg.MaxInFlightPerPayer = DefaultMaxInFlightPerPayer
	}
	if cfg.FailureWindow <= 0 {
		cfg.FailureWindow = DefaultFailureWindow
	}
	if cfg.MaxSettlementGas == 0 {
		cfg.MaxSettlementGas = DefaultMaxSettlementGas
	}
	if cfg.MaxSettlementGas < MinSettlementGas {
		return nil, fmt.Errorf("evm facilitator: a settlement gas ceiling of %d is below %d, what an ordinary account's transferWithAuthorization to a new payee needs with its gas limit's headroom: such payments would be refused", cfg.MaxSettlementGas, MinSettlementGas)
	}
	f := &Facilitator{
		chain:    cfg.Chain,
		network:  cfg.Network,
		chainID:  chainID,
		relayer:  crypto.PubkeyToAddress(cfg.RelayerKey.PublicKey),
		key:      cfg.RelayerKey,
		signer:   types.LatestSignerForChainID(chainID),
		cfg:      cfg,
		domains:  map[common.Address]tokenDomain{},
		inflight: map[[32]byte]*settleCall{},
		budget:   newBudget(cfg),

		prepareTimeout: prepareTimeout,
		identifying:    make(chan struct{}, 1),
	}
	f.life, f.endLife = context.WithCancel(context.Background())
	if nonces != nil {
		f.nonces, f.fixed = nonces.of(f.relayer), true
		f.nonces.open(f)
	} else {
		go f.identifyInBackground()
	}
	return f, nil
}

// The retries of identifyInBackground: the first after identifyFirstRetry,
// each later one after twice the wait before, at most identifyMaxRetry,
// identifyAttempts reads in all (about six and a half minutes): long enough to
// outlast a node's restart or a provider's blip during a reload, bounded
// so that a facilitator whose endpoint never answers does not poll it for
// good (its first settle or status read tries again).
const (
	identifyFirstRetry = 250 * time.Millisecond
	identifyMaxRetry   = 30 * time.Second
	identifyAttempts   = 20
)

// identifyInBackground reads the chain's genesis block (confirmChain) until it
// can, retrying with growing waits (identifyAttempts), or until Close.
// Once it has, the facilitator is open on the chain's nonce manager: it
// takes over the settlements closed facilitators of its key left there,
// as the successor of a reload. A panic (a chain client's bug) is logged:
// the goroutine is the gateway's own, and its panic would end the process.
func (f *Facilitator) identifyInBackground() {
	defer func() {
		if rec := recover(); rec != nil {
			log.Printf("evm facilitator: identifying the chain panicked: %v", rec)
		}
	}()
	wait := identifyFirstRetry
	for range identifyAttempts {
		if n, err := f.confirmChain(f.life, anyAge); err == nil {
			n.unhold()
			return
		}
		t := time.NewTimer(wait)
		select {
		case <-f.life.Done():
			t.Stop()
			return
		case <-t.C:
		}
		wait = min(2*wait, identifyMaxRetry)
	}
}

// relayerNonces returns the relayer's nonce manager on the chain f's
// endpoint reaches, the one of every facilitator of the key on that chain
// (chainNonces), from a reading of the chain's genesis block that began at
// most sharedReadLead before this call (confirmChain): a settle calls it
// before its checks, to take the nonce sequence and find what is kept of
// the chain it reaches, so that it never takes another chain's with this
// chain ID, the chain before on a node restarted as a fresh one among
// them. The send itself is not read for again (README says what a
// restart in between costs, and why). An error means the chain could not
// be asked; nothing was sent. The manager is held (nonceManager.hold): the
// settle lets go of it (unhold) once it has answered, so that a set a
// facilitator forgets meanwhile still keeps what this settle sends.
func (f *Facilitator) relayerNonces(ctx context.Context) (*nonceManager, error) {
	return f.confirmChain(ctx, sharedReadLead)
}

// sharedReadLead is how long before a settle asked a reading of the
// genesis block may have begun and still serve it (relayerNonces): a
// settle arriving while a read runs shares it, one round trip, instead of
// waiting for it and reading again, as long as that read began this
// shortly before. It is well below the fastest restart of a node as
// another chain (a devnet's, about a tenth of a second).
const sharedReadLead = 50 * time.Millisecond

// anyAge, as confirmChain's maxAge, takes any reading of the genesis block.
const anyAge = time.Duration(-1)

// confirmChain returns the relayer's nonce manager on the chain f's
// endpoint reaches, reading that chain's genesis block (within ctx and
// identifyTimeout) unless a reading of it began within maxAge before this
// call (0: one that began after it; anyAge: any), one still running among
// them. A devnet's own facilitator's chain
// is in process and never changes (fixed). The genesis block tells the
// chain from others of its chain ID: a node behind the endpoint restarted
// as a fresh chain (a devnet or a dev node started again) has another.
// When it is another chain than before, f leaves that chain's nonce
// manager, whose newest facilitator of the key still on it takes f's kept
// settlements over (nonceManager.close), f keeps it among its former
// chains, a bounded few (rememberFormer), and logs the change; either
// way f is then open on the chain's manager (nonceManager.open). An error means the chain could not be
// asked: nothing may be sent on what it says. The manager returned is
// held (nonceManager.hold), from before f is open on it, so that no
// release of its set comes in between; the caller lets go of it (unhold).
// A reading whose chain's set was released since (f closed, and the chain
// forgotten by the others) serves no more: the genesis is read again.
func (f *Facilitator) confirmChain(ctx context.Context, maxAge time.Duration) (*nonceManager, error) {
	asked := time.Now()
	if n := f.confirmedSince(asked, maxAge); n != nil && n.hold() {
		return n, nil
	}
	select {
	case f.identifying <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting to read the chain's genesis block: %w", ctx.Err())
	}
	defer func() { <-f.identifying }()
	if n := f.confirmedSince(asked, maxAge); n != nil && n.hold() { // read while this one waited
		return n, nil
	}
	readAt := time.Now()
	ctx, cancel := context.WithTimeout(ctx, identifyTimeout)
	defer cancel()
	genesis, err := f.chain.HeaderByNumber(ctx, big.NewInt(0))
	if err != nil {
		return nil, fmt.Errorf("reading the chain's genesis block (which tells it from other chains of chain ID %s): %w", f.chainID, err)
	}
	id := chainIdentity{id: f.chainID.String(), genesis: genesis.Hash()}
	s, _ := chainSet(id)
	n := s.of(f.relayer)
	f.idMu.Lock()
	old, oldID := f.nonces, f.ident
	f.nonces, f.ident, f.confirmed = n, id, readAt
	former := f.former
	f.idMu.Unlock()
	if old == n {
		return n, nil
	}
	// f.former changes here only, under identifying; so the trim, which
	// reads the managers under their sentMu (taken before idMu by
	// nonceManager.open), runs outside idMu.
	former = slices.DeleteFunc(slices.Clone(former), func(c formerChain) bool { return c.n == n || c.n == old })
	var dropped []*nonceSet
	if old != nil && oldID != id { // not the same chain, whose set was released (f closed) and made again
		former, dropped = rememberFormer(append(former, formerChain{n: old}))
	}
	f.idMu.Lock()
	f.former = former
	f.idMu.Unlock()
	switch {
	case old == nil || oldID == id || f.varies:
	case len(dropped) > 0:
		f.varies = true
		log.Printf("evm facilitator: the endpoint of relayer %s on %s has answered more than %d different genesis blocks (a node restarted as new chains, or an endpoint whose answers vary); its oldest chains, those with nothing kept first, are forgotten, and its further changes of chain are not logged", f.relayer.Hex(), f.network, maxChainsPerKey)
	default:
		log.Printf("evm facilitator: the endpoint of relayer %s on %s now reaches another chain of its chain ID (genesis %s, before %s): it settles with that chain's nonces, and leaves what it kept of the chain before to that chain's facilitators", f.relayer.Hex(), f.network, id.genesis.Hex(), oldID.genesis.Hex())
	}
	if old != nil {
		old.close(f)
	}
	n.open(f)
	for _, d := range dropped {
		releaseChainSet(d)
	}
	return n, nil
}

// maxChainsPerKey bounds the chains a facilitator remembers its endpoint
// reached (its current one and former), and so the nonce sets the process
// makes for them: an endpoint whose genesis answer varies (a lying RPC, a
// load balancer over different chains) would otherwise add one of each per
// read, never dropped, and every settle would scan them. Four outlasts a
// node restarted as a new chain a few times between two reads.
const maxChainsPerKey = 4

// formerChain is a chain f's endpoint reached before: the relayer's nonce
// manager on it.
type formerChain struct {
	n *nonceManager
}

// rememberFormer trims former, the oldest first, to maxChainsPerKey-1
// chains, forgetting the oldest whose manager keeps nothing first, and
// else the oldest: its settlements stay kept in the process's set of that
// chain, looked after by that chain's facilitators of the key, and a retry
// of one through f is still an unknown outcome (keptOnAnyChain). It
// returns the chains remembered and the nonce sets of those forgotten.
func rememberFormer(former []formerChain) ([]formerChain, []*nonceSet) {
	var dropped []*nonceSet
	for len(former) > maxChainsPerKey-1 {
		i := slices.IndexFunc(former, func(c formerChain) bool { return !c.n.keepsAny() })
		if i < 0 {
			i = 0
		}
		dropped = append(dropped, former[i].n.set)
		former = slices.Delete(former, i, i+1)
	}
	return former, dropped
}

// confirmedSince returns f.nonces when a reading of the genesis block that
// began within maxAge before asked vouches for it (confirmChain), else nil.
func (f *Facilitator) confirmedSince(asked time.Time, maxAge time.Duration) *nonceManager {
	f.idMu.Lock()
	defer f.idMu.Unlock()
	if f.nonces != nil && (f.fixed || maxAge < 0 || !f.confirmed.Before(asked.Add(-maxAge))) {
		return f.nonces
	}
	return nil
}

// errOtherChain is the answer about a settlement sent on a chain that f's
// endpoint no longer reaches (onChainOf).
var errOtherChain = errors.New("the node behind this facilitator's endpoint now serves another chain of its chain ID (another genesis block) than the one the settlement was sent on; it is neither resolved nor sent again on this one")

// onChainOf reads the chain's genesis block afresh (confirmChain) and
// reports whether f's endpoint still reaches the chain s was kept on: an
// error when it cannot tell, errOtherChain when it reaches another.
// Anything of s resolved or sent on another chain of the chain ID would be
// wrong: its authorization looks unused there, and its transactions,
// signed for the chain ID, are valid there and would move the payer's
// tokens a second time. A settlement kept on no manager (made by a test)
// is any chain's.
func (f *Facilitator) onChainOf(ctx context.Context, s *sentSettlement) error {
	n, err := f.confirmChain(ctx, 0)
	if err != nil {
		return err
	}
	n.unhold()
	if k := s.kept.Load(); k != nil && k != n {
		return errOtherChain
	}
	return nil
}

// keptOnFormerChain returns the settlement of authorization k kept on
// another chain of f's chain ID than n's, if any: one f's endpoint reached
// before (confirmChain), remembered by f or not (rememberFormer). A
// devnet's own facilitator (fixed) has no chain before.
func (f *Facilitator) keptOnFormerChain(k usedKey, t time.Time, n *nonceManager) (*sentSettlement, bool) {
	if f.fixed {
		return nil, false
	}
	return keptOnAnyChain(f.chainID, f.relayer, k, t, n)
}

// knownNonces returns f.nonces, nil while the chain is not identified.
func (f *Facilitator) knownNonces() *nonceManager {
	f.idMu.Lock()
	defer f.idMu.Unlock()
	return f.nonces
}

// serves reports whether f is open and its endpoint last reached n's
// chain: whether it looks after n's settlements (sentSettlement.watched).
func (f *Facilitator) serves(n *nonceManager) bool {
	return !f.closed.Load() && f.knownNonces() == n
}

// Close ends this facilitator's look-after of the settlements it sent
// (watch.go): the newest facilitator of the key on its chain still open
// takes them over, and its look-after goes on with them (Caddy provisions a
// reloaded configuration before it closes the old one, so a reload that
// changes the facilitator's settings hands them to the new one); with none
// open, the next one to identify the chain takes them over
// (nonceManager.open). It ends the identification in the background, sends
// nothing and waits for nothing; Settle and the status calls keep working
// (a request of the unloaded configuration may still run), and what a
// settle keeps after Close is handed over the same way at once
// (nonceManager.keepLocked).
func (f *Facilitator) Close() error {
	f.closed.Store(true)
	if f.endLife != nil { // a StatusReader's has none
		f.endLife()
	}
	if n := f.knownNonces(); n != nil {
		n.close(f)
	}
	return nil
}

// Relayer returns the address that submits settlements and pays their gas.
func (f *Facilitator) Relayer() common.Address { return f.relayer }

// Network returns the CAIP-2 network the facilitator settles on.
func (f *Facilitator) Network() string { return f.network }

// Supported reports the one kind this facilitator handles: x402 v2 "exact"
// on its network, with the relayer as the eip155 signer.
func (f *Facilitator) Supported(context.Context) (x402.SupportedResponse, error) {
	return x402.SupportedResponse{
		Kinds:      []x402.SupportedKind{{X402Version: x402.Version, Scheme: x402.SchemeExact, Network: f.network}},
		Extensions: []string{},
		Signers:    map[string][]string{"eip155:*": {f.relayer.Hex()}},
	}, nil
}

// checked is a payment that passed every check, ready to submit; between
// checkOwn and checkChain, one that passed the checks needing no chain.
type checked struct {
	auth  x402.AuthorizationValues
	sig   []byte
	token common.Address
	payer string
	// The EIP-712 domain the requirements name (extra.name, extra.version),
	// and the digest the authorization is signed over in it.
	name, version string
	digest        [32]byte
	recovered     bool // sig is an EOA signature that recovers to auth.From
	// tooSoon is the refusal of a payment that passed every check but
	// validBefore (checkOwn): in the last x402.ValidBeforeMargin before
	// it, or past it. Settle answers a kept settlement of it from what is
	// kept; otherwise Verify and Settle answer it (refuseTooSoon) unless
	// the chain reports its nonce used.
	tooSoon *checked
	// keptAt is the chain's time when checkOwn ran (checkTime): what is
	// kept of the authorization is looked up as of it (settle).
	keptAt time.Time
	// hasCode: auth.From has code, once read (codeRead; payerCode).
	hasCode, codeRead bool
	txData            []byte
	// fees are the settlement transaction's, read once (quote): the
	// simulations run at them, and send pays them.
	fees    *fees
	resp    x402.VerifyResponse
	invalid bool
	// spent: refused because the token reports the nonce used (auth,
	// token and digest are set); Settle then tells whether this authorization's own
	// transfer used it.
	spent bool
	// settling: checkChain runs for Settle, and holds the settlement's
	// amount in flight (flight) before it reads the balance; a valid
	// answer keeps it held, for the caller to release.
	settling bool
	flight   *flight
	// failed: the settlement was sent and reverted in a way its payer's
	// failure budget counts (reverted), recorded as its flight ends.
	failed bool
}

// Verify checks a payment against the server's requirements, in the order
// and with the reason codes of the reference facilitator: scheme, network,
// payload, recipient, exact value, time window (wall clock), EIP-712
// domain, signature (ecrecover, or EIP-1271 for contract accounts), the
// token's on-chain name and version, the authorization nonce, the payer's
// balance, and finally an eth_call simulation of the transfer from the
// relayer; last, the payer's failure budget (budget.go). A payment that
// misses only validBefore is refused for it once its signature passed,
// unless a settlement of its nonce is kept (keptRefusal: its own is
// settlement_pending, as its settle's retry answers it) or the chain
// reports its nonce used (refuseTooSoon). The EIP-1271 call
// and the transfer's simulation run as the settlement will (simulate):
// what needs more than MaxSettlementGas is refused here, not after the
// relayer paid for it. An error means
// the chain could not be asked (retryable), or did not answer within
// prepareTimeout.
func (f *Facilitator) Verify(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements) (x402.VerifyResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, f.prepareTimeout)
	defer cancel()
	c, err := f.check(ctx, p, req)
	if err != nil {
		return x402.VerifyResponse{}, err
	}
	return c.resp, nil
}

func refuse(reason, payer, msg string) *checked {
	return &checked{invalid: true, resp: x402.VerifyResponse{IsValid: false, InvalidReason: reason, InvalidMessage: msg, Payer: payer}}
}

func (f *Facilitator) check(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements) (*checked, error) {
	c := f.checkOwn(ctx, p, req)
	if c.invalid {
		return c, nil
	}
	if r, err := f.checkSigner(ctx, c); err != nil || r != nil {
		return r, err
	}
	if c.tooSoon != nil {
		if r := f.keptRefusal(c); r != nil {
			return r, nil
		}
		return f.refuseTooSoon(ctx, c)
	}
	return f.checkChain(ctx, c)
}

// keptRefusal is Verify's answer to c, which misses only validBefore
// (checked.tooSoon), when a settlement of its token, payer and nonce is
// kept (its outcome unknown when its settle answered), looked up as
// Settle's retry looks it up, reading nothing; nil when none is. A retry
// of c's own settle sends nothing and answers that settlement's outcome,
// unknown while its transaction may still land, so Verify answers
// settlement_pending (do not sign a new payment), never the margin's
// refusal, which tells a resource server that verifies before it settles
// to ask its buyer for a new payment, a second charge once the first
// lands. A kept settlement of another authorization of the nonce answers
// as its settle would (nonceTaken): nonce_already_used, naming nothing.
// All the chains of the chain ID are looked at, as Settle does when its
// endpoint's chain cannot be identified: what is kept on one the endpoint
// no longer reaches is not sent again either.
func (f *Facilitator) keptRefusal(c *checked) *checked {
	s, ok := keptOnAnyChain(f.chainID, f.relayer, usedKey{token: c.token, from: c.auth.From, nonce: c.auth.Nonce}, c.keptAt, nil)
	switch {
	case !ok:
		return nil
	case !s.sentFor(c):
		return refuse(x402.ReasonExactEVMNonceAlreadyUsed, c.payer, "the authorization nonce is taken by another authorization of it, whose settlement was sent earlier")
	}
	return refuse(x402.ReasonSettlementPending, c.payer, "a settlement of this payment was sent earlier, in transaction "+s.last().Hash().Hex()+", and its outcome is not known yet: do not sign a new payment; settle this one again for its outcome")
}

// refuseTooSoon is the refusal of c, which misses only validBefore
// (checked.tooSoon), and nothing of which is kept: nonce_already_used
// (spentRefusal) when the chain reports its nonce used, the margin's
// refusal otherwise. The margin is time to mine a transaction sent now;
// it refuses sending one, and says nothing of a payment the chain already
// took: a payer whose settlement landed and whose answer was lost, told
// valid_before ("sign a new one"), would pay twice. Only a payment that
// misses validBefore pays for this read, so a fresh settle's checks read
// the nonce once (checkChain). An error means the nonce could not be read.
func (f *Facilitator) refuseTooSoon(ctx context.Context, c *checked) (*checked, error) {
	used, err := f.authorizationState(ctx, c.token, c.auth.From, c.auth.Nonce, nil)
	var ce *contractError
	switch {
	case errors.As(err, &ce):
		// No authorizationState: no nonce of it was used either.
	case err != nil:
		return nil, fmt.Errorf("reading the authorization's nonce: %w", err)
	case used:
		return spentRefusal(c), nil
	}
	return c.tooSoon, nil
}

// spentRefusal refuses c because the token reports its nonce used; Settle
// then tells whether c's own transfer used it (alreadyUsed).
func spentRefusal(c *checked) *checked {
	r := refuse(x402.ReasonExactEVMNonceAlreadyUsed, c.payer, "the authorization nonce is already used")
	r.auth, r.token, r.digest, r.spent = c.auth, c.token, c.digest, true
	return r
}

// checkOwn runs the checks that need no contract call: x402.CheckExactEVM,
// in the reference order (its time window judged at checkTime), and the
// network. They are what ties the payment to the caller's own
// requirements: a payment that passes moves exactly the amount they ask,
// to their payTo, in their asset, on this network, and digest is its
// authorization signed over their EIP-712 domain. Settle runs them before
// it lets a caller join a settlement in flight.
func (f *Facilitator) checkOwn(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements) *checked {
	t, chain := f.checkTime(ctx)
	chk, err := x402.CheckExactEVM(p, req, t)
	var tooSoon error
	if x402.ReasonOf(err) == x402.ReasonExactEVMValidBefore {
		// The margin is time for a transaction sent now to be mined, and
		// refuses only sending one. A retry of a settlement already sent
		// sends nothing new: Settle answers it from what is kept while the
		// chain may still include it, and from the chain's nonce state
		// once the settlement landed or is no longer kept, in the margin
		// or past validBefore (refuseTooSoon). So every other check runs
		// as at the last instant the margin is met (validBefore, below
		// t + ValidBeforeMargin, fits an int64), and the margin's refusal
		// answers the rest.
		last := time.Unix(chk.Values.ValidBefore.Int64(), 0).Add(-x402.ValidBeforeMargin)
		kchk, kerr := x402.CheckExactEVM(p, req, last)
		if r := x402.ReasonOf(kerr); r != x402.ReasonExactEVMValidBefore && r != x402.ReasonExactEVMValidAfter {
			tooSoon, chk, err = err, kchk, kerr
		}
	}
	if req.Network != f.network && !earlyRefusal(err) {
		return refuse(x402.ReasonInvalidNetwork, "", "this facilitator settles on "+f.network+" only")
	}
	auth := chk.Values
	payer := ""
	if auth.From != (common.Address{}) {
		payer = auth.From.Hex()
	}
	// A 65-byte signature that does not recover to from may still be a
	// contract account's (EIP-1271): only the chain can tell.
	maybeContract := x402.ReasonOf(err) == x402.ReasonExactEVMSignature && chk.Signature != nil
	if err != nil && !maybeContract {
		return refuse(x402.ReasonOf(err), payer, err.Error())
	}
	_, name, version, token, _ := x402.ExactEVMDomain(req) // checked by CheckExactEVM
	digest := x402.TypedDataDigest(x402.DomainSeparator(f.chainID, name, version, token), auth.StructHash())
	c := &checked{auth: auth, sig: chk.Signature, token: token, payer: payer,
		name: name, version: version, digest: digest, recovered: chk.Recovered, keptAt: chain}
	if tooSoon != nil {
		c.tooSoon = refuse(x402.ReasonOf(tooSoon), payer, tooSoon.Error())
	}
	return c
}

// checkSigner runs, on a payment checkOwn passed, the first check that
// reads the chain: a signature that does not recover to
// authorization.from (an EOA's) must be accepted by from's contract
// (EIP-1271). nil when the signature passes; its
// refusal otherwise. With checkOwn it is all of the caller's own part of a
// payment: once it passes, the caller may share a settlement of the same
// authorization in flight, whatever encoding of a signature it carries
// (Settle).
func (f *Facilitator) checkSigner(ctx context.Context, c *checked) (*checked, error) {
	if c.recovered {
		return nil, nil
	}
	hasCode, err := f.payerCode(ctx, c)
	if err != nil {
		return nil, err
	}
	switch {
	case hasCode && isERC6492(c.sig):
		// A deployed wallet needs no factory: ERC-6492 asks its
		// isValidSignature with the inner signature, and the token's
		// SignatureChecker, which knows no envelope, is given that one
		// too (transferCallData).
		inner, ok := unwrapERC6492(c.sig)
		if !ok {
			return refuse(x402.ReasonExactEVMSignature, c.payer, "the ERC-6492 signature's envelope does not decode as (address, bytes, bytes)"), nil
		}
		c.sig = inner
		return f.erc1271Check(ctx, c)
	case hasCode:
		return f.erc1271Check(ctx, c)
	case isERC6492(c.sig):
		return refuse(x402.ReasonExactEVMUndeployedSmartWallet, c.payer, "the payer is an undeployed smart wallet; deploy it first"), nil
	}
	return refuse(x402.ReasonExactEVMSignature, c.payer, "the signature is not authorization.from's"), nil
}

// checkChain runs, on a payment checkOwn and checkSigner passed, the
// checks that read the token, in the reference order.
func (f *Facilitator) checkChain(ctx context.Context, c *checked) (res *checked, err error) {
	auth, sig, token, payer := c.auth, c.sig, c.token, c.payer
	defer func() {
		// res is nil when a read panicked: the flight is released all the
		// same.
		if c.flight != nil && (err != nil || res == nil || res.invalid) {
			f.budget.release(c.flight)
			c.flight = nil
		}
	}()

	// The token's own view: its EIP-712 domain, the nonce, the balance.
	dom, err := f.tokenDomain(ctx, token)
	if err != nil {
		return nil, err
	}
	if dom.notEIP3009 {
		return refuse(x402.ReasonExactEVMEIP3009NotSupported, payer, "the asset is not an EIP-3009 token"), nil
	}
	if dom.name != c.name {
		return refuse(x402.ReasonExactEVMTokenNameMismatch, payer, "extra.name is not the token's name()"), nil
	}
	if dom.version != c.version {
		return refuse(x402.ReasonExactEVMTokenVersionMismatch, payer, "extra.version is not the token's version()"), nil
	}
	used, err := f.authorizationState(ctx, token, auth.From, auth.Nonce, nil)
	if err != nil {
		var ce *contractError
		if errors.As(err, &ce) {
			return refuse(x402.ReasonExactEVMEIP3009NotSupported, payer, "the asset has no authorizationState"), nil
		}
		return nil, err
	}
	if used {
		return spentRefusal(c), nil
	}
	if c.settling {
		// Held before the balance is read: a settlement of this payer
		// that reads it later counts this one, whenever this one lands.
		c.flight = f.budget.hold(token, auth.From, auth.Value)
	}
	bal, err := f.balanceOf(ctx, token, auth.From)
	if err != nil {
		var ce *contractError
		if errors.As(err, &ce) {
			return refuse(x402.ReasonExactEVMEIP3009NotSupported, payer, "the asset has no balanceOf"), nil
		}
		return nil, err
	}
	if bal.Cmp(auth.Value) < 0 {
		return refuse(x402.ReasonExactEVMInsufficientBalance, payer, "the payer's balance is below the amount"), nil
	}
	if inFlight, n := f.budget.committed(token, auth.From, c.flight); inFlight != nil && bal.Cmp(inFlight.Add(inFlight, auth.Value)) < 0 {
		return refuse(x402.ReasonExactEVMInsufficientBalance, payer, fmt.Sprintf(
			"the payer's balance does not cover the amount on top of its %d settlements of this asset in flight; pay again once they are confirmed", n)), nil
	}

	// Simulate the exact call Settle will send.
	if c.txData, err = transferCallData(auth, sig, !c.recovered); err != nil {
		return refuse(x402.ReasonInvalidPayload, payer, "the authorization cannot be encoded"), nil
	}
	if _, err := f.simulate(ctx, c, token, c.txData); err != nil {
		var ce *contractError
		switch {
		case errors.As(err, &ce):
			return refuse(revertReason(ce.reason, x402.ReasonExactEVMSimulationFailed), payer, "simulation failed: "+ce.reason), nil
		case errors.Is(err, errGasCeiling):
			return f.refuseGas(payer, "the transfer", err), nil
		}
		return nil, err
	}
	// Last, the failure budget: every earlier refusal names what is wrong
	// with the payment itself.
	reason, msg, err := f.budgetRefusal(ctx, c)
	if err != nil {
		return nil, err
	}
	if reason != "" {
		return refuse(reason, payer, msg), nil
	}
	c.resp = x402.VerifyResponse{IsValid: true, Payer: payer}
	return c, nil
}

// payerCode reports whether authorization.from has code, read once per
// payment (eth_getCode): a contract account, or an EOA that delegates its
// code (EIP-7702: its code is the designator 0xef0100 and the delegate's
// address). Either way the payer's code runs inside its settlement, at the
// relayer's gas, whatever its signature: USDC (from v2.2, as
// OpenZeppelin's SignatureChecker) asks from's isValidSignature whenever
// from has code, an ECDSA signature that recovers to from included.
func (f *Facilitator) payerCode(ctx context.Context, c *checked) (bool, error) {
	if !c.codeRead {
		code, err := f.chain.CodeAt(ctx, c.auth.From, nil)
		if err != nil {
			return false, fmt.Errorf("reading payer code: %w", err)
		}
		c.hasCode, c.codeRead = len(code) > 0, true
	}
	return c.hasCode, nil
}

// budgetRefusal is the payer's failure budget's answer to c (budget.check;
// "" when it may be settled). Whether the payer has code decides which
// rule holds, and a payer with code is held to the stricter one, so its
// code is read (payerCode) only when that changes the answer: a payment
// whose signature recovers to a payer with nothing in flight and no
// recent revert costs no eth_getCode.
func (f *Facilitator) budgetRefusal(ctx context.Context, c *checked) (reason, msg string, err error) {
	if !c.codeRead {
		if reason, _ := f.budget.check(c.auth.From, c.flight, true); reason == "" {
			return "", "", nil
		}
	}
	hasCode, err := f.payerCode(ctx, c)
	if err != nil {
		return "", "", err
	}
	reason, msg = f.budget.check(c.auth.From, c.flight, hasCode)
	return reason, msg, nil
}

// earlyRefusal reports whether err is one of the refusals the reference
// makes before it looks at the network (version, scheme, network mismatch).
func earlyRefusal(err error) bool {
	switch x402.ReasonOf(err) {
	case x402.ReasonInvalidX402Version, x402.ReasonExactEVMScheme, x402.ReasonExactEVMNetworkMismatch:
		return err != nil
	}
	return false
}

// transferCallData encodes transferWithAuthorization: the v,r,s overload for
// a 65-byte EOA signature (v as 27/28), the bytes overload otherwise.
func transferCallData(a x402.AuthorizationValues, sig []byte, contractSigner bool) ([]byte, error) {
	if len(sig) == 65 && !contractSigner {
		v := sig[64]
		if v < 27 {
			v += 27
		}
		var r, s [32]byte
		copy(r[:], sig[:32])
		copy(s[:], sig[32:64])
		return tokenABI.Pack(methodTransferVRS, a.From, a.To, a.Value, a.ValidAfter, a.ValidBefore, a.Nonce, v, r, s)
	}
	return tokenABI.Pack(methodTransferBytes, a.From, a.To, a.Value, a.ValidAfter, a.ValidBefore, a.Nonce, sig)
}

// erc6492Magic ends an ERC-6492 signature of a not-yet-deployed wallet.
var erc6492Magic = common.FromHex("0x6492649264926492649264926492649264926492649264926492649264926492")

func isERC6492(sig []byte) bool {
	return len(sig) > 32 && string(sig[len(sig)-32:]) == string(erc6492Magic)
}

// erc6492Envelope is what precedes erc6492Magic: abi.encode(factory,
// factoryCalldata, innerSignature).
var erc6492Envelope = func() abi.Arguments {
	addrT, _ := abi.NewType("address", "", nil)
	bytesT, _ := abi.NewType("bytes", "", nil)
	return abi.Arguments{{Type: addrT}, {Type: bytesT}, {Type: bytesT}}
}()

// unwrapERC6492 returns the inner signature of an ERC-6492 signature sig
// (isERC6492), false when its envelope does not decode.
func unwrapERC6492(sig []byte) ([]byte, bool) {
	v, err := erc6492Envelope.Unpack(sig[:len(sig)-32])
	if err != nil || len(v) != 3 {
		return nil, false
	}
	inner, ok := v[2].([]byte)
	return inner, ok
}

func sameAddress(a, b string) bool {
	return common.IsHexAddress(a) && common.IsHexAddress(b) && common.HexToAddress(a) == common.HexToAddress(b)
}

// contractError is a call the node executed and the contract refused (a
// revert), or whose successful result does not decode (no contract, or not
// the method): an answer about the payment, not an outage.
type contractError struct{ reason string }

func (e *contractError) Error() string { return "contract call reverted: " + e.reason }

// call runs eth_call from the relayer. A revert becomes *contractError;
// anything else, including every other JSON-RPC error, is returned wrapped
// as is (classify).
func (f *Facilitator) call(ctx context.Context, to common.Address, data []byte, block *big.Int) ([]byte, error) {
	out, err := f.chain.CallContract(ctx, ethereum.CallMsg{From: f.relayer, To: &to, Data: data}, block)
	if err != nil {
		if kind, reason := classify(err); kind == answerReverted {
			return nil, &contractError{reason: reason}
		}
		return nil, fmt.Errorf("calling %s: %w", to.Hex(), err)
	}
	return out, nil
}

// answer is what an error from the node says about the request.
type answer int

const (
	// answerNone: no JSON-RPC answer (the connection failed, an HTTP
	// error status, a timeout): the request may or may not have reached
	// the node.
	answerNone answer = iota
	// answerNodeError: the node answered with a JSON-RPC error that is
	// neither a revert nor a failure to execute. For reads it is the node's trouble, not the payment's: a
	// provider's rate limit (-32005 "limit exceeded"), a node behind the
	// block asked for (-32000 "header not found"), an internal error
	// (-32603), "execution aborted (timeout)". To a send it proves nothing
	// by itself: only the refusals sendAnswer names mean it was not taken.
	answerNodeError
	// answerFailed: the node executed the call and it failed without a
	// revert (the INVALID opcode, out of gas, a stack or jump error). It
	// is the called code's doing, not the node's: a refusal when the payer
	// controls that code (its wallet's isValidSignature), or when it ran
	// out of the gas a simulation bounds it to (simulate); an outage
	// anywhere else.
	answerFailed
	// answerReverted: the node executed the call and the contract
	// reverted: an answer about the payment, whoever's code it is.
	answerReverted
)

// vmFailures begin the messages geth (and the clients that word their
// errors as it does) answers eth_call with when the code failed without a
// revert: core/vm's errors, code -32000.
var vmFailures = []string{
	"invalid opcode",
	"out of gas",
	"stack underflow",
	"stack limit reached",
	"invalid jump destination",
	"write protection",
	"return data out of bounds",
	"max call depth exceeded",
	"gas uint64 overflow",
}

// classify is the one reading of the node's errors: whether err is a
// revert, with its reason (the decoded Error(string) when the data
// carries one, else the message without its "execution reverted: "
// prefix), a call that failed to execute, another JSON-RPC error with its
// message, or no answer at all. A revert is code 3 (EIP-1474, what geth,
// Erigon, Reth and Anvil send with revert data), a message starting
// "execution reverted" in any case (geth's revert without data; Besu's
// -32000 "Execution reverted"), or Nethermind's -32015 "VM execution
// error." whose data starts "revert" ("Reverted 0x<data>", "revert:
// <reason>"). A failure without a revert is geth's -32000 with a core/vm
// error (vmFailures), or Nethermind's -32015 with any other data. Nothing
// else is taken for either, so an overloaded or lagging node (a limit,
// "header not found", a timeout, -32603) can never refuse a payment (or
// mark its asset as not EIP-3009) on the buyer's account: it is an
// outage, retried.
func classify(err error) (answer, string) {
	var re rpc.Error
	if !errors.As(err, &re) {
		return answerNone, ""
	}
	msg := re.Error()
	var data string
	var de rpc.DataError
	if errors.As(err, &de) {
		data, _ = de.ErrorData().(string)
	}
	switch {
	case re.ErrorCode() == 3 || hasPrefixFold(msg, "execution reverted"):
		if r, ok := unpackRevert(data); ok {
			return answerReverted, r
		}
		if hasPrefixFold(msg, "execution reverted: ") {
			return answerReverted, msg[len("execution reverted: "):]
		}
		return answerReverted, msg
	case re.ErrorCode() == -32015 && hasPrefixFold(msg, "vm execution error"):
		switch {
		case hasPrefixFold(data, "reverted "):
			if r, ok := unpackRevert(strings.TrimSpace(data[len("reverted "):])); ok {
				return answerReverted, r
			}
			return answerReverted, data
		case hasPrefixFold(data, "revert: "):
			return answerReverted, data[len("revert: "):]
		case hasPrefixFold(data, "revert"):
			return answerReverted, data
		}
		return answerFailed, msg + ": " + data
	}
	for _, f := range vmFailures {
		if hasPrefixFold(msg, f) {
			return answerFailed, msg
		}
	}
	return answerNodeError, msg
}

// unpackRevert decodes hex revert data carrying Error(string).
func unpackRevert(data string) (string, bool) {
	if data == "" {
		return "", false
	}
	r, err := abi.UnpackRevert(common.FromHex(data))
	return r, err == nil
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// revertReason maps the token's revert strings (USDC's, with or without
// its "FiatTokenV2: " prefix) to reason codes.
func revertReason(msg, fallback string) string {
	switch {
	case strings.Contains(msg, "authorization is used"):
		return x402.ReasonExactEVMNonceAlreadyUsed
	case strings.Contains(msg, "exceeds balance"):
		return x402.ReasonExactEVMInsufficientBalance
	case strings.Contains(msg, "authorization is expired"):
		return x402.ReasonExactEVMValidBefore
	case strings.Contains(msg, "authorization is not yet valid"):
		return x402.ReasonExactEVMValidAfter
	case strings.Contains(msg, "invalid signature"):
		return x402.ReasonExactEVMSignature
	}
	return fallback
}

// erc1271Check asks the payer's wallet, which has code (checkSigner read
// it), whether c.sig is its signature over c.digest: only EIP-1271's exact
// answer is a yes (x402.ERC1271Accepts). nil when it is; its refusal
// otherwise. The call is a simulation (simulate): bounded by
// MaxSettlementGas and run at the settlement's gas price, as the wallet's
// code will run inside the settlement.
func (f *Facilitator) erc1271Check(ctx context.Context, c *checked) (*checked, error) {
	data, err := erc1271ABI.Pack("isValidSignature", c.digest, c.sig)
	if err != nil {
		return refuse(x402.ReasonExactEVMSignature, c.payer, "the signature cannot be encoded for EIP-1271"), nil
	}
	out, err := f.simulate(ctx, c, c.auth.From, data)
	if err != nil {
		// The wallet's code is the payer's: its revert, or its failure to
		// execute, refuses the signature. Only the node's own trouble is an
		// outage.
		var ce *contractError
		kind, _ := classify(err)
		switch {
		case errors.Is(err, errGasCeiling):
			return f.refuseGas(c.payer, "the payer contract's isValidSignature (EIP-1271)", err), nil
		case errors.As(err, &ce) || kind == answerFailed:
		default:
			return nil, err
		}
	} else if x402.ERC1271Accepts(out) {
		return nil, nil
	}
	return refuse(x402.ReasonExactEVMSignature, c.payer, "the payer contract rejects the signature (EIP-1271)"), nil
}

// refuseGas refuses a payment whose what needs more gas than
// MaxSettlementGas; the message ends with why (err, an errGasCeiling), so
// that a payer whose calldata alone is too long is told so.
func (f *Facilitator) refuseGas(payer, what string, err error) *checked {
	return refuse(x402.ReasonExactEVMSimulationFailed, payer, fmt.Sprintf(
		"%s needs more gas than this facilitator spends on a settlement (%d): %v", what, f.cfg.MaxSettlementGas, err))
}

// tokenDomain reads (and caches) the token's name() and version().
func (f *Facilitator) tokenDomain(ctx context.Context, token common.Address) (tokenDomain, error) {
	f.domainMu.Lock()
	d, ok := f.domains[token]
	f.domainMu.Unlock()
	if ok && now().Sub(d.at) < f.cfg.DomainCacheTTL {
		return d, nil
	}
	d = tokenDomain{at: now()}
	var err error
	if d.name, err = f.callString(ctx, token, "name"); err == nil {
		d.version, err = f.callString(ctx, token, "version")
	}
	if err != nil {
		var ce *contractError
		if !errors.As(err, &ce) {
			return d, err
		}
		d.notEIP3009 = true
	}
	f.domainMu.Lock()
	f.domains[token] = d
	f.domainMu.Unlock()
	return d, nil
}

func (f *Facilitator) callString(ctx context.Context, token common.Address, method string) (string, error) {
	data, _ := tokenABI.Pack(method)
	out, err := f.call(ctx, token, data, nil)
	if err != nil {
		return "", err
	}
	res, err := tokenABI.Unpack(method, out)
	if err != nil || len(res) != 1 {
		return "", &contractError{reason: method + "() returned no string"}
	}
	s, _ := res[0].(string)
	return s, nil
}

// authorizationState reads whether the token has used from's nonce, at
// block (nil: the latest).
func (f *Facilitator) authorizationState(ctx context.Context, token, from common.Address, nonce [32]byte, block *big.Int) (bool, error) {
	data, _ := tokenABI.Pack("authorizationState", from, nonce)
	out, err := f.call(ctx, token, data, block)
	if err != nil {
		return false, err
	}
	res, err := tokenABI.Unpack("authorizationState", out)
	if err != nil || len(res) != 1 {
		return false, &contractError{reason: "authorizationState() returned no bool"}
	}
	used, _ := res[0].(bool)
	return used, nil
}

func (f *Facilitator) balanceOf(ctx context.Context, token, who common.Address) (*big.Int, error) {
	data, _ := tokenABI.Pack("balanceOf", who)
	out, err := f.call(ctx, token, data, nil)
	if err != nil {
		return nil, err
	}
	res, err := tokenABI.Unpack("balanceOf", out)
	if err != nil || len(res) != 1 {
		return nil, &contractError{reason: "balanceOf() returned no uint256"}
	}
	b, _ := res[0].(*big.Int)
	return b, nil
}

// Interface guard.
var _ x402.Facilitator = (*Facilitator)(nil)
