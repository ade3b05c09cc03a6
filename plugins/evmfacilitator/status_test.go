package evmfacilitator

import (
	"cmp"
	"context"
	"crypto/ecdsa"
	"errors"
	"fmt"
	"math/big"
	"math/bits"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/aovhq/aov/x402"
)

// SettlementStatus reads the chain: undecided while an authorization is
// unused and valid, done once it settled, never once it expired unused. A
// StatusReader (no key, the chain alone) judges every case alike.
func TestSettlementStatus(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	req := e.requirements(payee, amount)
	reader := statusReader(t, e.d.Client())
	state := func(p x402.PaymentPayload) x402.SettlementState {
		t.Helper()
		st, err := e.f.SettlementStatus(ctx, p, req)
		if err != nil {
			t.Fatal(err)
		}
		rst, err := reader.SettlementStatus(ctx, p, req)
		if err != nil || rst != st {
			t.Fatalf("the status reader says %+v (%v), the facilitator %+v", rst, err, st)
		}
		return st.State
	}
	p := mustSignExact(t, payer, req)
	if got := state(p); got != x402.SettlementUndecided {
		t.Fatalf("unused and valid: %v", got)
	}
	r, err := e.f.Settle(ctx, p, req)
	if err != nil || !r.Success {
		t.Fatalf("settle: %+v %v", r, err)
	}
	if got := state(p); got != x402.SettlementDone {
		t.Fatalf("settled: %v", got)
	}
	// Done names the transaction that paid, found from the nonce's log.
	if st, err := reader.SentSettlementStatus(ctx, p, req, x402.SentSettlement{After: time.Now().Add(-time.Minute)}); err != nil || st.Transaction != r.Transaction {
		t.Fatalf("settled, with the attempt's time: %+v (%v), want the transaction %s", st, err, r.Transaction)
	}
	short := req
	short.MaxTimeoutSeconds = 1
	expiring := mustSignExact(t, payer, short)
	if err := e.d.backend.AdjustTime(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if got := state(expiring); got != x402.SettlementNever {
		t.Fatalf("expired unused: %v", got)
	}
	other := req
	other.PayTo = "0x0000000000000000000000000000000000000001"
	if _, err := e.f.SettlementStatus(ctx, p, other); err == nil {
		t.Fatal("an authorization was judged against requirements it does not pay")
	}
	if _, err := reader.SettlementStatus(ctx, p, other); err == nil {
		t.Fatal("the status reader judged an authorization against requirements it does not pay")
	}
	if _, err := NewStatusReader(e.d.Client(), "solana-devnet"); err == nil {
		t.Fatal("a status reader was made for a network that is not EVM")
	}
}

// The devnet's token is where x402 expects it before any devnet runs, so a
// gateway whose facilitator is another process prices devnet routes right.
func TestDefaultDevnetAssetIsTheDevnetsToken(t *testing.T) {
	if got := (&Devnet{token: devnetToken()}).Asset(); got != x402.DefaultDevnetAsset {
		t.Fatalf("the devnet deploys %+v, x402 expects %+v", got, x402.DefaultDevnetAsset)
	}
}

// statusReader is a StatusReader of the devnet's network over chain: a
// devnet's client, or a wrapper of it that records or fakes some of its
// answers. The tests of the status reader all start with one, and a
// reader that cannot be made leaves them nothing to test.
func statusReader(t testing.TB, chain Chain) *StatusReader {
	t.Helper()
	reader, err := NewStatusReader(chain, DevnetNetwork)
	if err != nil {
		t.Fatal(err)
	}
	return reader
}

// settledPayment is a payment settleOne settled, with what the tests that
// ask about it afterwards use: the requirements and payload to ask with,
// the authorization (to sign others of its nonce), the settlement's
// response (its transaction) and the facilitator that settled it (itself
// a settlement checker).
type settledPayment struct {
	f   *Facilitator
	req x402.PaymentRequirements
	a   x402.Authorization
	p   x402.PaymentPayload
	r   x402.SettleResponse
}

// settleOne settles a payment of amount from payer to payee on d, which
// is how the tests of a used nonce's status begin; a refusal or an error
// stops the test. f settles it, or, when f is nil, a facilitator of d's
// own (d.NewFacilitator). edit, when not nil, changes the authorization
// before it is signed (its validity window). It does nothing on the chain
// but the settlement, so a test's own block commits and head reads keep
// their place around it.
func settleOne(t testing.TB, d *Devnet, f *Facilitator, edit func(*x402.Authorization)) settledPayment {
	t.Helper()
	if f == nil {
		var err error
		if f, err = d.NewFacilitator(); err != nil {
			t.Fatal(err)
		}
	}
	req := (&testEnv{d: d, f: f}).requirements(payee, amount)
	a := auth(payer, req)
	if edit != nil {
		edit(&a)
	}
	p := sign(t, payer, a, req, req)
	r, err := f.Settle(context.Background(), p, req)
	if err != nil || !r.Success {
		t.Fatalf("settle = %+v, %v", r, err)
	}
	return settledPayment{f: f, req: req, a: a, p: p, r: r}
}

// spendNonce marks p's nonce used on chain the way its payer can without
// paying, in a transaction the payer sends: "burn" executes a worthless
// authorization of the same nonce (0 units, to the payer itself); "cancel"
// calls the token's cancelAuthorization.
func spendNonce(t testing.TB, d *Devnet, how string, key *ecdsa.PrivateKey, p x402.PaymentPayload, req x402.PaymentRequirements) {
	t.Helper()
	pl, err := x402.ParseExactEVMPayload(p.Payload)
	if err != nil {
		t.Fatal(err)
	}
	from := crypto.PubkeyToAddress(key.PublicKey)
	chainID, name, version, token, err := x402.ExactEVMDomain(req)
	if err != nil {
		t.Fatal(err)
	}
	nonce := common.HexToHash(pl.Authorization.Nonce)
	var data []byte
	switch how {
	case "burn":
		a := x402.Authorization{From: from.Hex(), To: from.Hex(), Value: "0", ValidAfter: "0",
			ValidBefore: fmt.Sprint(time.Now().Unix() + 3600), Nonce: pl.Authorization.Nonce}
		digest, err := x402.TransferWithAuthorizationDigest(chainID, name, version, token, a)
		if err != nil {
			t.Fatal(err)
		}
		sig, err := crypto.Sign(digest[:], key)
		if err != nil {
			t.Fatal(err)
		}
		v, _ := a.Values()
		data, _ = transferCallData(v, sig, false)
	case "cancel":
		typeHash := crypto.Keccak256Hash([]byte("CancelAuthorization(address authorizer,bytes32 nonce)"))
		structHash := crypto.Keccak256Hash(typeHash[:], common.LeftPadBytes(from.Bytes(), 32), nonce[:])
		digest := x402.TypedDataDigest(x402.DomainSeparator(chainID, name, version, token), structHash)
		sig, err := crypto.Sign(digest[:], key)
		if err != nil {
			t.Fatal(err)
		}
		var r, s [32]byte
		copy(r[:], sig[:32])
		copy(s[:], sig[32:64])
		data, _ = tokenABI.Pack(findMethod("cancelAuthorization", 5), from, [32]byte(nonce), sig[64]+27, r, s)
	default:
		t.Fatalf("spendNonce %q", how)
	}
	if r := sendTx(t, d, key, &token, data); r.Status != types.ReceiptStatusSuccessful {
		t.Fatalf("%s the nonce: the transaction reverted", how)
	}
}

// A used nonce is no payment: the payer can cancel it or spend it on a
// worthless authorization of its own, and then nothing reaches payTo. The
// status is then "never" (the authorization can no longer execute) with
// the reason nonce_already_used, whether the attempt's time is known or
// not, for the facilitator and the status reader alike; it is never done.
func TestSpentNonceIsNeverSettled(t *testing.T) {
	e := newEnv(t)
	reader := statusReader(t, e.d.Client())
	req := e.requirements(payee, amount)
	for _, how := range []string{"burn", "cancel"} {
		t.Run(how, func(t *testing.T) {
			ctx := context.Background()
			p := mustSignExact(t, payer, req)
			sent := x402.SentSettlement{After: time.Now().Add(-time.Minute)}
			before := usdcBalance(t, e.d, payee)
			spendNonce(t, e.d, how, payer, p, req)
			for name, check := range map[string]func() (x402.SettlementStatus, error){
				"facilitator":                  func() (x402.SettlementStatus, error) { return e.f.SentSettlementStatus(ctx, p, req, sent) },
				"facilitator, attempt unknown": func() (x402.SettlementStatus, error) { return e.f.SettlementStatus(ctx, p, req) },
				"reader":                       func() (x402.SettlementStatus, error) { return reader.SentSettlementStatus(ctx, p, req, sent) },
				"reader, attempt unknown":      func() (x402.SettlementStatus, error) { return reader.SettlementStatus(ctx, p, req) },
			} {
				st, err := check()
				if err != nil || st.State != x402.SettlementNever || st.Reason != x402.ReasonExactEVMNonceAlreadyUsed || st.Transaction != "" {
					t.Errorf("%s: %+v, %v; want never, nonce_already_used", name, st, err)
				}
			}
			if got := usdcBalance(t, e.d, payee); got.Cmp(before) != 0 {
				t.Fatalf("payTo's balance moved from %v to %v", before, got)
			}
		})
	}
}

// When the embedded facilitator's own send is lost and the payer spends the
// nonce meanwhile, the unknown outcome resolves to a refusal (nothing was
// transferred to payTo), not to a success because the nonce is used.
func TestUnknownOutcomeWithTheNonceSpentElsewhereIsARefusal(t *testing.T) {
	for _, how := range []string{"burn", "cancel"} {
		t.Run(how, func(t *testing.T) {
			e := newEnv(t)
			req := e.requirements(payee, amount)
			p := mustSignExact(t, payer, req)
			lc := &lossyChain{Chain: e.d.Client(), dropSends: true, errConnection: errors.New("connection reset by peer (fake)"),
				onSend: func() { spendNonce(t, e.d, how, payer, p, req) }}
			f, err := New(Config{Chain: lc, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 500 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			before := usdcBalance(t, e.d, payee)
			r, err := f.Settle(context.Background(), p, req)
			if err != nil || r.Success || r.ErrorReason != x402.ReasonExactEVMNonceAlreadyUsed || r.Transaction != "" {
				t.Fatalf("settle = %+v, %v; want a refusal for the spent nonce", r, err)
			}
			if got := usdcBalance(t, e.d, payee); got.Cmp(before) != 0 {
				t.Fatalf("payTo's balance moved from %v to %v", before, got)
			}
		})
	}
}

// logSpy wraps a real chain client and records what the nonce search asks
// of it (no fault: every answer is the chain's).
type logSpy struct {
	Chain
	mu      sync.Mutex
	headers int
	ranges  [][2]uint64
	// noDeadline counts the reads only a search makes (eth_getLogs, a
	// header by number) asked with a context without a deadline.
	noDeadline int
}

func (s *logSpy) HeaderByNumber(ctx context.Context, n *big.Int) (*types.Header, error) {
	s.mu.Lock()
	s.headers++
	if _, ok := ctx.Deadline(); !ok && n != nil {
		s.noDeadline++
	}
	s.mu.Unlock()
	return s.Chain.HeaderByNumber(ctx, n)
}

func (s *logSpy) FilterLogs(ctx context.Context, q ethereum.FilterQuery) ([]types.Log, error) {
	s.mu.Lock()
	if q.BlockHash == nil { // not the read of the nonce's transaction's Transfers, by its block
		s.ranges = append(s.ranges, [2]uint64{q.FromBlock.Uint64(), q.ToBlock.Uint64()})
	}
	if _, ok := ctx.Deadline(); !ok {
		s.noDeadline++
	}
	s.mu.Unlock()
	return s.Chain.FilterLogs(ctx, q)
}

func (s *logSpy) reset() (headers int, ranges [][2]uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	headers, ranges = s.headers, s.ranges
	s.headers, s.ranges = 0, nil
	return headers, ranges
}

// The search for the transaction that used a nonce is bounded: it starts
// at the first block at or after the attempt's time (found in about
// 2·log2(distance) header reads), asks for at most logChunkBlocks blocks
// per eth_getLogs and maxLogBlocks in all. A nonce used beyond the bound
// is not found, and not found is an error, never a settlement.
func TestNonceSearchIsBounded(t *testing.T) {
	oldChunk, oldMax, oldSlack := logChunkBlocks, maxLogBlocks, sentSlack
	logChunkBlocks, maxLogBlocks, sentSlack = 2, 6, 0
	t.Cleanup(func() { logChunkBlocks, maxLogBlocks, sentSlack = oldChunk, oldMax, oldSlack })

	d := startDevnet(t, DevnetConfig{MaxClockLead: time.Hour})
	ctx := context.Background()
	for range 12 {
		d.backend.Commit()
	}
	spy := &logSpy{Chain: d.Client()}
	f, err := New(Config{Chain: spy, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	head, err := d.Client().HeaderByNumber(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	// validAfter 0: without the attempt's time the search starts at genesis.
	paid := settleOne(t, d, f, func(a *x402.Authorization) { a.ValidAfter = "0" })
	for range 40 {
		d.backend.Commit()
	}
	spy.reset()

	within := func(ranges [][2]uint64, lo uint64) {
		t.Helper()
		var total uint64
		for _, rg := range ranges {
			if rg[1] < rg[0] || rg[1]-rg[0]+1 > logChunkBlocks || rg[0] < lo {
				t.Errorf("eth_getLogs over blocks %d to %d", rg[0], rg[1])
			}
			total += rg[1] - rg[0] + 1
		}
		if total > maxLogBlocks {
			t.Errorf("%d blocks searched, more than %d", total, maxLogBlocks)
		}
	}

	// From the attempt's time: found near the start, with its transaction.
	st, err := f.SentSettlementStatus(ctx, paid.p, paid.req, x402.SentSettlement{After: time.Unix(int64(head.Time), 0)})
	if err != nil || st.State != x402.SettlementDone || st.Transaction != paid.r.Transaction {
		t.Fatalf("with the attempt's time: %+v, %v; want done by %s", st, err, paid.r.Transaction)
	}
	headers, ranges := spy.reset()
	within(ranges, head.Number.Uint64())
	if max := 2*bits.Len(40+2) + 3; headers > max {
		t.Errorf("%d header reads to find the first block, want at most %d", headers, max)
	}

	// Without it: the validity window is searched, longer than the bound:
	// its first blocks (from validAfter 0: block 1) and its last (to the
	// head, validBefore being ahead), maxLogBlocks in all; the nonce was
	// used in between: not found in a search cut short, an error, never
	// done and never "never".
	st, err = f.SettlementStatus(ctx, paid.p, paid.req)
	if err == nil || st.State != x402.SettlementUndecided {
		t.Fatalf("beyond the bound: %+v, %v; want an error", st, err)
	}
	_, ranges = spy.reset()
	now, err := d.Client().HeaderByNumber(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	within(ranges, 1)
	front := maxLogBlocks / logChunkBlocks / 2 * logChunkBlocks
	want := [][2]uint64{{1, front}}
	for end := now.Number.Uint64(); end > now.Number.Uint64()-(maxLogBlocks-front); end -= logChunkBlocks {
		want = append(want, [2]uint64{end - logChunkBlocks + 1, end})
	}
	slices.SortFunc(want, func(a, b [2]uint64) int { return cmp.Compare(a[0], b[0]) })
	if !slices.Equal(ranges, want) {
		t.Errorf("searched %v, want %v: the window's first %d blocks and its last %d to the head %d, in chunks of %d", ranges, want, front, maxLogBlocks-front, now.Number, logChunkBlocks)
	}
}

// shortSearch bounds the nonce search to a few blocks for one test, so
// that a devnet's short chain is longer than the bound.
func shortSearch(t *testing.T) {
	oldChunk, oldMax := logChunkBlocks, maxLogBlocks
	logChunkBlocks, maxLogBlocks = 2, 6
	t.Cleanup(func() { logChunkBlocks, maxLogBlocks = oldChunk, oldMax })
}

// A payment signed with validAfter far in the past (0, as some clients
// sign on Base) that settled recently is found by a caller that knows
// nothing of the attempt: its transfer can only have executed before
// validBefore, so the search covers the last blocks of the validity
// window, not its first.
func TestSettledWithValidAfterZeroIsFound(t *testing.T) {
	shortSearch(t)
	d := startDevnet(t, DevnetConfig{MaxClockLead: time.Hour})
	for range 20 {
		d.backend.Commit()
	}
	reader := statusReader(t, d.Client())
	paid := settleOne(t, d, nil, func(a *x402.Authorization) { a.ValidAfter = "0" })
	d.backend.Commit()
	st, err := reader.SettlementStatus(context.Background(), paid.p, paid.req)
	if err != nil || st.State != x402.SettlementDone || st.Transaction != paid.r.Transaction {
		t.Fatalf("settled with validAfter 0: %+v, %v; want done by %s", st, err, paid.r.Transaction)
	}
}

// An authorization whose nonce was spent before its validAfter can never
// execute: a complete search of its validity window that finds no log of
// the nonce is the plain refusal (never, nonce_already_used), not an
// unknown outcome. That "not found" is remembered only for the window
// searched: right after, the payment that did spend the nonce (another
// window) is still found settled.
func TestNonceSpentBeforeValidAfterIsNever(t *testing.T) {
	d := startDevnet(t, DevnetConfig{MaxClockLead: time.Hour})
	ctx := context.Background()
	reader := statusReader(t, d.Client())
	paid := settleOne(t, d, nil, nil)
	head, err := d.Client().HeaderByNumber(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		d.backend.Commit()
	}
	if now, err := d.Client().HeaderByNumber(ctx, nil); err != nil || now.Time <= head.Time+3 {
		t.Fatalf("the head's time is %v (%v); want past %d", now, err, head.Time+3)
	}
	late := paid.a
	late.ValidAfter = fmt.Sprint(head.Time + 1) // after the settlement's block
	spentBefore := func(when string) {
		t.Helper()
		for name, vb := range map[string]uint64{"validBefore passed": head.Time + 3, "validBefore ahead": head.Time + 3600} {
			late.ValidBefore = fmt.Sprint(vb)
			q := sign(t, payer, late, paid.req, paid.req)
			for _, c := range []x402.SettlementChecker{reader, paid.f} {
				st, err := c.SettlementStatus(ctx, q, paid.req)
				if err != nil || st.State != x402.SettlementNever || st.Reason != x402.ReasonExactEVMNonceAlreadyUsed || st.Transaction != "" {
					t.Errorf("%s, %s, nonce spent before validAfter (%T): %+v, %v; want never, nonce_already_used", when, name, c, st, err)
				}
			}
		}
	}
	spentBefore("searched")
	for _, c := range []x402.SettlementChecker{reader, paid.f} {
		st, err := c.SettlementStatus(ctx, paid.p, paid.req)
		if err != nil || st.State != x402.SettlementDone || st.Transaction != paid.r.Transaction {
			t.Errorf("the settled payment right after (%T): %+v, %v; want done by %s", c, st, err, paid.r.Transaction)
		}
	}
	// The settled payment's log is now remembered for the nonce; the
	// authorizations whose window it is not in are still never.
	spentBefore("with the nonce's log remembered")
}

// The status of an authorization whose nonce another authorization of it
// (the same payer, payTo and value) used after it expired is never,
// whatever the caller knows of its attempt: nothing, the attempt's time
// (a gate's held payment: the search runs from it), or that time and the
// other's transaction as a hint (a gate that was told it). Through the
// facilitator that settled the other and through one that keeps nothing
// of it, as its settle is refused (nonceUse.within). (Before: given the
// attempt's time, it was done by the other's transaction, so one transfer
// answered two payments.)
func TestExpiredAuthorizationIsNotSettledByAnotherAuthorizationsTransaction(t *testing.T) {
	d := startDevnet(t, DevnetConfig{})
	e := &testEnv{d: d}
	open := func(key int) *Facilitator {
		t.Helper()
		f, err := New(Config{Chain: d.Client(), Network: DevnetNetwork, RelayerKey: DevKey(key), PollInterval: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		identified(t, f)
		return f
	}
	f := open(0)
	req := e.requirements(payee, amount)
	attempt := time.Now().Add(-2 * time.Second) // A's attempt began before B landed
	b, rb, pa := expiredBeforeAnother(t, d, f, req)
	for _, c := range []struct {
		who string
		f   *Facilitator
	}{{"the facilitator that settled B", f}, {"another relayer's facilitator", open(1)}} {
		for _, sent := range []x402.SentSettlement{{}, {After: attempt}, {After: attempt, Transaction: rb.Transaction}} {
			st, err := c.f.SentSettlementStatus(context.Background(), pa, req, sent)
			if err != nil || st.State != x402.SettlementNever || st.Reason != x402.ReasonExactEVMNonceAlreadyUsed || st.Transaction != "" {
				t.Errorf("%s: status of A, expired before B's block, given %+v = %+v, %v; want never, nonce_already_used (B's %s never executed A)", c.who, sent, st, err, rb.Transaction)
			}
		}
	}
	// B's own status still names its transaction, whatever is given.
	for _, sent := range []x402.SentSettlement{{}, {After: attempt}, {After: attempt, Transaction: rb.Transaction}} {
		if st, err := f.SentSettlementStatus(context.Background(), sign(t, payer, b, req, req), req, sent); err != nil || st.State != x402.SettlementDone || st.Transaction != rb.Transaction {
			t.Errorf("status of B given %+v = %+v, %v; want done by %s", sent, st, err, rb.Transaction)
		}
	}
}

// firstBlockAt finds, for any time, the first block at or after it.
func TestFirstBlockAt(t *testing.T) {
	d := startDevnet(t, DevnetConfig{MaxClockLead: time.Hour})
	for range 20 {
		d.backend.Commit()
	}
	ctx := context.Background()
	spy := &logSpy{Chain: d.Client()}
	f := &Facilitator{chain: spy}
	head, err := d.Client().HeaderByNumber(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	n := head.Number.Uint64()
	for i := uint64(0); i <= n; i++ {
		h, err := d.Client().HeaderByNumber(ctx, new(big.Int).SetUint64(i))
		if err != nil {
			t.Fatal(err)
		}
		spy.reset()
		got, err := f.firstBlockAt(ctx, time.Unix(int64(h.Time), 0), head)
		if err != nil || got != i {
			t.Errorf("block %d's time: got block %d (%v)", i, got, err)
		}
		if reads, _ := spy.reset(); reads > 2*bits.Len64(n-i+1)+2 {
			t.Errorf("block %d: %d header reads", i, reads)
		}
	}
	if got, _ := f.firstBlockAt(ctx, time.Unix(int64(head.Time)+1, 0), head); got != n+1 {
		t.Errorf("after the head: got %d, want %d", got, n+1)
	}
	if got, _ := f.firstBlockAt(ctx, time.Unix(0, 0), head); got != 0 {
		t.Errorf("before genesis: got %d, want 0", got)
	}
}

// The event ids the search filters by are USDC's (FiatTokenV2) and
// EIP-3009's, which the test token declares alike.
func TestAuthorizationEventsAreUSDCs(t *testing.T) {
	for id, sig := range map[common.Hash]string{
		authorizationUsedEventID:     "AuthorizationUsed(address,bytes32)",
		authorizationCanceledEventID: "AuthorizationCanceled(address,bytes32)",
		transferEventID:              "Transfer(address,address,uint256)",
	} {
		if id != crypto.Keccak256Hash([]byte(sig)) {
			t.Errorf("the event id of %s is %s", sig, id.Hex())
		}
	}
}

// A used nonce's transaction is judged by one judge, whether from its
// receipt (judgeReceipt) or from the token's logs (findNonceUse keeps the
// nonce's log and the Transfers from the payer in its transaction): it paid
// only with the Transfer its authorization made, the token's next log,
// and only when the transaction's call executed that authorization itself;
// a matching Transfer elsewhere in the transaction may pay another
// authorization, and one transfer must not settle two payments, so it is an
// error, never a refusal. From the logs, a transaction with more Transfers
// from the payer than are kept, none the authorization's own, is undecided
// too; its receipt, read whole, decides it. A call of the token executing
// another authorization of the nonce (another validity window, which
// overlaps: the same logs in a block both windows hold), or receiving one,
// is never, by either; a contract's call that reached the token inside is
// unknown, never done. (Before: the logs alone, and the block in the
// window, answered done for another authorization's transfer.)
func TestOneJudgeOfAUsedNonce(t *testing.T) {
	token := common.HexToAddress("0x5FbDB2315678afecb367f032d93F642f64180aa3")
	from := crypto.PubkeyToAddress(payer.PublicKey)
	a := x402.AuthorizationValues{From: from, To: payee, Value: big.NewInt(20000), Nonce: [32]byte{1},
		ValidAfter: big.NewInt(0), ValidBefore: big.NewInt(1000)}
	other := a
	other.ValidBefore = big.NewInt(1120)
	sig := make([]byte, 65)
	sig[64] = 27
	call := func(to common.Address, method string, x x402.AuthorizationValues) *types.Transaction {
		args := []any{x.From, x.To, x.Value, x.ValidAfter, x.ValidBefore, x.Nonce}
		if m := tokenABI.Methods[method]; len(m.Inputs) == 9 {
			args = append(args, uint8(27), [32]byte{}, [32]byte{})
		} else {
			args = append(args, sig)
		}
		data, err := tokenABI.Pack(method, args...)
		if err != nil {
			t.Fatal(err)
		}
		return types.NewTx(&types.LegacyTx{To: &to, Data: data})
	}
	receiveBytes := findMethod("receiveWithAuthorization", 7)
	own, ownBytes := call(token, methodTransferVRS, a), call(token, methodTransferBytes, a)
	otherWindow, received := call(token, methodTransferVRS, other), call(token, receiveBytes, a)
	relayed := call(common.HexToAddress("0x00000000000000000000000000000000000000aa"), methodTransferVRS, a)
	addr := func(x common.Address) common.Hash { return common.BytesToHash(x.Bytes()) }
	used := types.Log{Address: token, Topics: []common.Hash{authorizationUsedEventID, addr(from), common.Hash(a.Nonce)}}
	otherUsed := types.Log{Address: token, Topics: []common.Hash{authorizationUsedEventID, addr(from), {2}}}
	canceled := types.Log{Address: token, Topics: []common.Hash{authorizationCanceledEventID, addr(from), common.Hash(a.Nonce)}}
	transfer := func(to common.Address, v int64) types.Log {
		return types.Log{Address: token, Topics: []common.Hash{transferEventID, addr(from), addr(to)}, Data: common.LeftPadBytes(big.NewInt(v).Bytes(), 32)}
	}
	pays := transfer(payee, 20000)
	many := []types.Log{used, transfer(from, 0)}
	for range maxOtherTransfers + 1 {
		many = append(many, transfer(from, 0))
	}
	const (
		never = x402.SettlementNever
		done  = x402.SettlementDone
		fails = x402.SettlementState(-1) // an error, no judgement
		none  = x402.SettlementState(-2) // the receipt is not the nonce's
		nolog = x402.SettlementState(-3) // no nonce log for eth_getLogs to find
	)
	for _, tc := range []struct {
		desc          string
		failed        bool // the transaction failed
		call          *types.Transaction
		logs          []types.Log // one transaction's, in order
		receipt, gets x402.SettlementState
	}{
		{"its own transfer", false, own, []types.Log{used, pays}, done, done},
		{"its own transfer, its signature as bytes", false, ownBytes, []types.Log{used, pays}, done, done},
		{"cancelled", false, own, []types.Log{canceled}, never, never},
		{"spent on a worthless transfer", false, own, []types.Log{used, transfer(from, 0)}, never, never},
		{"spent paying less", false, own, []types.Log{used, transfer(payee, 1)}, never, never},
		{"spent, with another authorization's payment beside", false, relayed, []types.Log{used, transfer(from, 0), otherUsed, pays}, fails, fails},
		{"spent, with more transfers from the payer than are kept", false, relayed, many, never, fails},
		{"spent, with as many transfers as are kept", false, relayed, many[:len(many)-1], never, never},
		{"a failed transaction", true, own, []types.Log{used, pays}, fails, nolog},
		{"not the nonce's transaction", false, own, []types.Log{otherUsed, pays}, none, nolog},
		{"another authorization's of the nonce, its window overlapping", false, otherWindow, []types.Log{used, pays}, never, never},
		{"received by payTo under another signed type", false, received, []types.Log{used, pays}, never, never},
		{"a relayer contract's call that reached the token", false, relayed, []types.Log{used, pays}, fails, fails},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			tx := common.Hash{9}
			f := &Facilitator{chain: txByHash{txs: map[common.Hash]*types.Transaction{tx: tc.call}}, signer: types.LatestSignerForChainID(big.NewInt(1337))}
			logs := make([]*types.Log, len(tc.logs))
			var block []types.Log // the block's Transfers from the payer, as eth_getLogs answers
			for i, l := range tc.logs {
				l.TxHash, l.Index, l.BlockNumber = tx, uint(10+i), 7
				logs[i] = &l
				if l.Topics[0] == transferEventID {
					block = append(block, l)
				}
			}
			block = append(block, types.Log{Address: token, Topics: pays.Topics, Data: pays.Data, TxHash: common.Hash{8}, Index: 11}) // another transaction's
			check := func(judge string, want x402.SettlementState, st x402.SettlementStatus, found bool, err error) {
				t.Helper()
				var got x402.SettlementState
				switch {
				case !found:
					got = none
				case err != nil:
					got = fails
				default:
					got = st.State
				}
				if got != want || (got == done && st.Transaction != tx.Hex()) {
					t.Errorf("by its %s: got %+v found %v err %v", judge, st, found, err)
				}
			}
			status := types.ReceiptStatusSuccessful
			if tc.failed {
				status = types.ReceiptStatusFailed
			}
			st, found, err := f.judgeReceipt(context.Background(), nil, &types.Receipt{Status: status, Logs: logs, TxHash: tx}, token, a)
			check("receipt", tc.receipt, st, found, err)
			if tc.gets != nolog {
				u := keepTransfers(logs[0], block)
				u.call = callOf(tc.call, token)
				st, err := u.judge(token, a)
				check("logs", tc.gets, st, true, err)
			}
		})
	}
}

// txByHash is a chain whose transactions, by hash, are txs: all
// judgeReceipt reads of a transaction (a fake: the judge's cases are logs
// no token emits together).
type txByHash struct {
	Chain
	txs map[common.Hash]*types.Transaction
}

func (c txByHash) TransactionByHash(_ context.Context, h common.Hash) (*types.Transaction, bool, error) {
	tx, ok := c.txs[h]
	if !ok {
		return nil, false, ethereum.NotFound
	}
	return tx, false, nil
}

// staleHead is a real chain client whose head block is an older one, as a
// load-balanced provider's node behind the one that answered a contract
// call may give (a fake: one devnet cannot be two nodes apart).
type staleHead struct {
	Chain
	head *big.Int
}

func (s staleHead) HeaderByNumber(ctx context.Context, n *big.Int) (*types.Header, error) {
	if n == nil {
		n = s.head
	}
	return s.Chain.HeaderByNumber(ctx, n)
}

// A nonce found used by one read, and not in the validity window up to a
// head read from a node behind, is not called spent otherwise: the use may
// be in the blocks that node has not seen. The outcome is unknown, never
// "never".
func TestNonceUseBeyondAStaleHeadIsUnknown(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	req := e.requirements(payee, amount)
	before, err := e.d.Client().HeaderByNumber(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := mustSignExact(t, payer, req)
	if r, err := e.f.Settle(ctx, p, req); err != nil || !r.Success {
		t.Fatalf("settle = %+v, %v", r, err)
	}
	reader := statusReader(t, staleHead{Chain: e.d.Client(), head: before.Number})
	st, err := reader.SettlementStatus(ctx, p, req)
	var ue *x402.UnknownOutcomeError
	if !errors.As(err, &ue) || st.State != x402.SettlementUndecided {
		t.Fatalf("settled after the head read: %+v, %v; want an unknown outcome", st, err)
	}
}

// A search cut short by maxLogBlocks (a validity window longer than the
// bound, validAfter 0, the nonce used in the blocks left out) is an
// unknown outcome, and it is remembered for its window like a finished
// one: the payer chooses the window, and asking about the very same
// payment again within the minute costs no header read and no eth_getLogs
// (the one authorizationState read only).
func TestCutNonceSearchIsRemembered(t *testing.T) {
	shortSearch(t)
	d := startDevnet(t, DevnetConfig{MaxClockLead: time.Hour})
	ctx := context.Background()
	for range 12 {
		d.backend.Commit()
	}
	spy := &logSpy{Chain: d.Client()}
	reader := statusReader(t, spy)
	paid := settleOne(t, d, nil, func(a *x402.Authorization) { a.ValidAfter = "0" })
	for range 40 {
		d.backend.Commit()
	}
	spy.reset()
	var cost [][2]int
	for i := 0; i < 4; i++ {
		st, err := reader.SettlementStatus(ctx, paid.p, paid.req)
		h, rg := spy.reset()
		cost = append(cost, [2]int{h, len(rg)})
		var ue *x402.UnknownOutcomeError
		if !errors.As(err, &ue) || st.State != x402.SettlementUndecided {
			t.Errorf("ask %d: %+v, %v; want an unknown outcome (the nonce was used in blocks left out)", i+1, st, err)
		}
	}
	for i, c := range cost[1:] {
		if c[0]+c[1] > 0 {
			t.Errorf("ask %d of the same payment cost %d header reads and %d eth_getLogs (all %v); want the search remembered", i+2, c[0], c[1], cost)
			break
		}
	}
}

// A payment signed as x402 clients sign it (validAfter now - 10 min,
// validBefore now + maxTimeoutSeconds) settles at the start of its window,
// right after it is signed. Asked about by a caller that knows nothing of
// the attempt once the window holds more than maxLogBlocks blocks
// (max_timeout beyond about 2 h 37 min on Base's 2 s blocks) and has
// closed, it is found settled: the search covers both ends of a window
// longer than the bound, not its last blocks only. Real constants (5,000
// blocks, 500 per eth_getLogs); the devnet's blocks are 1 s.
func TestLongWindowSettledAtItsStartIsFound(t *testing.T) {
	d := startDevnet(t, DevnetConfig{MaxClockLead: 3 * time.Hour})
	ctx := context.Background()
	reader := statusReader(t, d.Client())
	head, err := d.Client().HeaderByNumber(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	paid := settleOne(t, d, nil, func(a *x402.Authorization) {
		a.ValidAfter = fmt.Sprint(head.Time - 600)
		a.ValidBefore = fmt.Sprint(head.Time + 5100)
	})
	for range 5200 {
		d.backend.Commit()
	}
	now, _ := d.Client().HeaderByNumber(ctx, nil)
	t.Logf("head %d at %d; window closed at %s", now.Number, now.Time, paid.a.ValidBefore)
	for i := 0; i < 2; i++ {
		st, err := reader.SettlementStatus(ctx, paid.p, paid.req)
		if err != nil || st.State != x402.SettlementDone {
			t.Errorf("the buyer's settled payment, asked after its window closed (try %d): %+v, %v; want done by %s", i+1, st, err, paid.r.Transaction)
		}
	}
}

// The payer of a used nonce can sign any number of authorizations of it,
// each with its own validity window. The blocks a search of one window
// covered without finding the nonce's log are remembered for the nonce: a
// window within them costs no header read and no eth_getLogs, a window
// reaching past them has only the blocks not searched yet searched, and
// the payment that did use the nonce is still found settled (its window
// holds blocks never searched).
func TestNewWindowsOfAUsedNonceSearchOnlyNewBlocks(t *testing.T) {
	d := startDevnet(t, DevnetConfig{MaxClockLead: time.Hour})
	ctx := context.Background()
	for range 10 {
		d.backend.Commit()
	}
	spy := &logSpy{Chain: d.Client()}
	reader := statusReader(t, spy)
	paid := settleOne(t, d, nil, nil)
	settled, err := d.Client().HeaderByNumber(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 30 {
		d.backend.Commit()
	}
	head, err := d.Client().HeaderByNumber(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	// ask asks about an authorization of the spent nonce valid after
	// validAfter and before validBefore (block times): its window holds
	// blocks after the settlement's only, so it never executed.
	ask := func(name string, validAfter, validBefore uint64) (headers int, blocks uint64) {
		t.Helper()
		o := paid.a
		o.ValidAfter, o.ValidBefore = fmt.Sprint(validAfter), fmt.Sprint(validBefore)
		spy.reset()
		st, err := reader.SettlementStatus(ctx, sign(t, payer, o, paid.req, paid.req), paid.req)
		if err != nil || st.State != x402.SettlementNever {
			t.Errorf("%s: %+v, %v; want never", name, st, err)
		}
		headers, ranges := spy.reset()
		for _, rg := range ranges {
			blocks += rg[1] - rg[0] + 1
		}
		return headers, blocks
	}
	if _, blocks := ask("the first window", settled.Time, head.Time-5); blocks < 20 {
		t.Fatalf("the first window searched %d blocks; want its 25 or so", blocks)
	}
	if headers, blocks := ask("a window within it", settled.Time+3, head.Time-10); headers+int(blocks) != 0 {
		t.Errorf("a window within one searched: %d header reads, %d blocks searched; want none", headers, blocks)
	}
	if _, blocks := ask("a window reaching past it", settled.Time+2, head.Time+3600); blocks == 0 || blocks > 6 {
		t.Errorf("a window reaching from within one searched to the head searched %d blocks; want those after it only (6)", blocks)
	}
	if headers, blocks := ask("a window after the settlement, to the head", settled.Time+1, head.Time+600); headers+int(blocks) != 0 {
		t.Errorf("a window all searched (the nonce read used as of the head): %d header reads, %d blocks searched; want none", headers, blocks)
	}
	st, err := reader.SettlementStatus(ctx, paid.p, paid.req)
	if err != nil || st.State != x402.SettlementDone || st.Transaction != paid.r.Transaction {
		t.Errorf("the settled payment after: %+v, %v; want done by %s", st, err, paid.r.Transaction)
	}
}
