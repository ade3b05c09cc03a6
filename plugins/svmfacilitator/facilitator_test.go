package svmfacilitator

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/internal/solanachain"
	"github.com/aovhq/aov/x402"
)

func testKey(name string) ed25519.PrivateKey {
	seed := sha256.Sum256([]byte("svmfacilitator test " + name))
	return ed25519.NewKeyFromSeed(seed[:])
}

func pub(k ed25519.PrivateKey) PublicKey {
	var p PublicKey
	copy(p[:], k.Public().(ed25519.PublicKey))
	return p
}

// env is a chain with a facilitator, a funded payer and a payee.
type env struct {
	chain *solanachain.Chain
	f     *Facilitator
	fee   ed25519.PrivateKey
	payer ed25519.PrivateKey
	payTo PublicKey
	req   x402.PaymentRequirements
}

func newEnv(t testing.TB, cfg Config) *env {
	t.Helper()
	fee := testKey("fee payer")
	chain := solanachain.Start(t, pub(fee).String())
	payer := testKey("payer")
	payTo := pub(testKey("payee"))
	chain.Airdrop(pub(payer).String(), 1_000_000_000)
	chain.SetTokenBalance(pub(payer).String(), solanachain.USDC, 1_000_000, "")
	chain.SetTokenBalance(payTo.String(), solanachain.USDC, 0, "")
	if cfg.RPC == nil {
		cfg.RPC = &RPC{URL: chain.URL}
	}
	cfg.Network = x402.NetworkSolanaDevnet
	cfg.FeePayer = fee
	f, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Closed when t ends: its resolver would outlive the test and poll
	// the chain's address, which a later test's server may be given.
	t.Cleanup(func() { f.Close() })
	return &env{chain: chain, f: f, fee: fee, payer: payer, payTo: payTo, req: x402.PaymentRequirements{
		Scheme: "exact", Network: x402.NetworkSolanaDevnet, Amount: "20000", Asset: solanachain.USDC,
		PayTo: payTo.String(), MaxTimeoutSeconds: 60, Extra: map[string]any{"feePayer": pub(fee).String()},
	}}
}

func (e *env) payment(t testing.TB) Payment {
	t.Helper()
	bh, err := ParsePublicKey(e.chain.LatestBlockhash())
	if err != nil {
		t.Fatal(err)
	}
	return Payment{FeePayer: pub(e.fee), Authority: e.payer, Mint: mustKey(solanachain.USDC), Program: TokenProgram,
		PayTo: e.payTo, Amount: 20000, Decimals: 6, Blockhash: bh}
}

func (e *env) balances(t *testing.T) (payer, payee int64) {
	t.Helper()
	usdc := mustKey(solanachain.USDC)
	return e.chain.TokenBalance(AssociatedTokenAddress(pub(e.payer), usdc, TokenProgram).String()),
		e.chain.TokenBalance(AssociatedTokenAddress(e.payTo, usdc, TokenProgram).String())
}

// TestVerifyRefusals has one case per check, each with the reference's
// reason code, and shows that nothing moves.
func TestVerifyRefusals(t *testing.T) {
	e := newEnv(t, Config{})
	p := e.payment(t)
	auth := p.AuthorityKey()
	fee := pub(e.fee)
	usdc := mustKey(solanachain.USDC)
	srcATA := AssociatedTokenAddress(auth, usdc, TokenProgram)
	dstATA := AssociatedTokenAddress(e.payTo, usdc, TokenProgram)
	good := p.Instructions()
	with := func(i int, ix Ix) []Ix {
		out := append([]Ix(nil), good...)
		out[i] = ix
		return out
	}
	tokenIx := func(source, dest, authority PublicKey, amount uint64) Ix {
		return TransferCheckedIx(TokenProgram, source, usdc, dest, authority, amount, 6)
	}
	// The identity point: crypto/ed25519 accepts (R = identity, S = 0) as
	// its signature over anything.
	var identity PublicKey
	identity[0] = 1
	forged := func() []byte {
		ixs := with(2, tokenIx(AssociatedTokenAddress(identity, usdc, TokenProgram), dstATA, identity, 20000))
		raw := Compile(fee, p.Blockhash, ixs)
		tx, err := DecodeTransaction(raw)
		if err != nil {
			t.Fatal(err)
		}
		copy(tx.Signatures[1], append(identity[:], make([]byte, 32)...))
		if !ed25519.Verify(ed25519.PublicKey(identity[:]), tx.Message, tx.Signatures[1]) {
			t.Fatal("crypto/ed25519 no longer accepts the small-order forgery; the case below proves nothing")
		}
		return raw
	}
	tampered := func() []byte {
		raw := p.Build(good)
		raw[1+64+5] ^= 1 // a byte of the authority's signature
		return raw
	}
	third := testKey("third signer")
	stale := p
	stale.Blockhash = sha256.Sum256([]byte("not a blockhash of this chain"))
	unfunded := p
	unfunded.Authority = testKey("unfunded")
	lookup := func() []byte {
		tx, err := DecodeTransaction(p.Build(good))
		if err != nil {
			t.Fatal(err)
		}
		return signAgain(withLookupTable(tx), e.payer)
	}

	type tc struct {
		name   string
		raw    []byte
		mutate func(*x402.PaymentPayload, *x402.PaymentRequirements)
		reason string
	}
	cases := []tc{
		{name: "version", raw: p.Build(good), mutate: func(pp *x402.PaymentPayload, _ *x402.PaymentRequirements) { pp.X402Version = 1 }, reason: x402.ReasonInvalidX402Version},
		{name: "scheme", raw: p.Build(good), mutate: func(pp *x402.PaymentPayload, r *x402.PaymentRequirements) {
			pp.Accepted.Scheme, r.Scheme = "upto", "upto"
		}, reason: ReasonUnsupportedScheme},
		{name: "accepted network differs", raw: p.Build(good), mutate: func(pp *x402.PaymentPayload, _ *x402.PaymentRequirements) { pp.Accepted.Network = x402.NetworkSolana }, reason: ReasonNetworkMismatch},
		{name: "network not ours", raw: p.Build(good), mutate: func(pp *x402.PaymentPayload, r *x402.PaymentRequirements) {
			pp.Accepted.Network, r.Network = x402.NetworkSolana, x402.NetworkSolana
		}, reason: x402.ReasonInvalidNetwork},
		{name: "no feePayer", raw: p.Build(good), mutate: func(_ *x402.PaymentPayload, r *x402.PaymentRequirements) { r.Extra = nil }, reason: ReasonMissingFeePayer},
		{name: "feePayer not ours", raw: p.Build(good), mutate: func(_ *x402.PaymentPayload, r *x402.PaymentRequirements) {
			r.Extra = map[string]any{"feePayer": auth.String()}
		}, reason: ReasonFeePayerNotManaged},
		{name: "not base64", mutate: func(pp *x402.PaymentPayload, _ *x402.PaymentRequirements) {
			pp.Payload = json.RawMessage(`{"transaction":"!!"}`)
		}, reason: ReasonTransactionCouldNotBeDecoded},
		{name: "not a transaction", raw: []byte{1, 2, 3}, reason: ReasonTransactionCouldNotBeDecoded},
		{name: "three signers", raw: Compile(fee, p.Blockhash, append(append([]Ix(nil), good...), MemoIx("x", pub(third))), e.payer, third), reason: ReasonExcessiveSigners},
		{name: "fee payer not account 0", raw: Compile(pub(third), p.Blockhash, good, e.payer), reason: ReasonFeePayerMismatch},
		{name: "bad signature", raw: tampered(), reason: ReasonSignatureInvalid},
		{name: "missing signature", raw: Compile(fee, p.Blockhash, good), reason: ReasonSignatureInvalid},
		{name: "small-order signer", raw: forged(), reason: ReasonSignatureInvalid},
		{name: "lookup tables", raw: lookup(), reason: ReasonLookupTables},
		{name: "two instructions", raw: p.Build(good[:2]), reason: ReasonInstructionsLength},
		{name: "eight instructions", raw: p.Build(append(append([]Ix(nil), good...), MemoIx("a"), MemoIx("b"), MemoIx("c"), MemoIx("d"))), reason: ReasonInstructionsLength},
		{name: "limit not first", raw: p.Build(with(0, ComputePriceIx(1))), reason: ReasonComputeLimitInstruction},
		{name: "limit too high", raw: p.Build(with(0, ComputeLimitIx(1_400_000))), reason: ReasonComputeLimitTooHigh},
		{name: "price not second", raw: p.Build(with(1, ComputeLimitIx(1))), reason: ReasonComputePriceInstruction},
		{name: "price too high", raw: p.Build(with(1, ComputePriceIx(5_000_001))), reason: ReasonComputePriceTooHigh},
		{name: "plain Transfer", raw: p.Build(with(2, Ix{program: TokenProgram, data: []byte{3, 1, 0, 0, 0, 0, 0, 0, 0}, accounts: good[2].accounts})), reason: ReasonNoTransferInstruction},
		{name: "fee payer is authority", raw: Compile(fee, p.Blockhash, with(2, tokenIx(AssociatedTokenAddress(fee, usdc, TokenProgram), dstATA, fee, 20000))), reason: ReasonFeePayerTransferringFunds},
		{name: "fee payer is source", raw: p.Build(with(2, tokenIx(fee, dstATA, auth, 20000))), reason: ReasonFeePayerTransferringFunds},
		{name: "fee payer in a memo", raw: p.Build(with(3, Ix{program: MemoProgram, data: []byte("m"), accounts: []meta{{key: fee, signer: true}}})), reason: ReasonFeePayerTransferringFunds},
		{name: "mint", mutate: func(_ *x402.PaymentPayload, r *x402.PaymentRequirements) {
			r.Asset = "EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v"
		}, raw: p.Build(good), reason: ReasonMintMismatch},
		{name: "destination not payTo's ATA", raw: p.Build(with(2, tokenIx(srcATA, AssociatedTokenAddress(pub(third), usdc, TokenProgram), auth, 20000))), reason: ReasonRecipientMismatch},
		{name: "destination is payTo itself", raw: p.Build(with(2, tokenIx(srcATA, e.payTo, auth, 20000))), reason: ReasonRecipientMismatch},
		{name: "amount", raw: p.Build(with(2, tokenIx(srcATA, dstATA, auth, 19999))), reason: ReasonAmountMismatch},
		{name: "unknown fourth", raw: p.Build(with(3, Ix{program: AssociatedTokenProg})), reason: ReasonUnknownFourthInstruction},
		{name: "unknown fifth", raw: p.Build(append(append([]Ix(nil), good...), Ix{program: TokenProgram, data: []byte{9}})), reason: ReasonUnknownFifthInstruction},
		{name: "memo required, none", raw: p.Build(good[:3]), mutate: func(_ *x402.PaymentPayload, r *x402.PaymentRequirements) { r.Extra["memo"] = "order-7" }, reason: ReasonMemoCount},
		{name: "memo differs", raw: p.Build(with(3, MemoIx("order-8"))), mutate: func(_ *x402.PaymentPayload, r *x402.PaymentRequirements) { r.Extra["memo"] = "order-7" }, reason: ReasonMemoMismatch},
		{name: "stale blockhash", raw: stale.Build(stale.Instructions()), reason: ReasonSimulationFailed},
		{name: "payer has no token account", raw: unfunded.Build(unfunded.Instructions()), reason: ReasonSimulationFailed},
		{name: "wrong decimals", raw: p.Build(with(2, TransferCheckedIx(TokenProgram, srcATA, usdc, dstATA, auth, 20000, 9))), reason: ReasonSimulationFailed},
	}
	beforePayer, beforePayee := e.balances(t)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req := e.req
			req.Extra = map[string]any{"feePayer": fee.String()}
			pp := Payload(c.raw, req)
			if c.mutate != nil {
				c.mutate(&pp, &req)
			}
			v, err := e.f.Verify(context.Background(), pp, req)
			if err != nil {
				t.Fatal(err)
			}
			if v.IsValid || v.InvalidReason != c.reason {
				t.Fatalf("verify: %+v, want %s", v, c.reason)
			}
			// A gate's CheckPays refuses a transfer that does not pay for
			// the same reason.
			if paysReasons[c.reason] {
				tx, err := DecodePayload(pp.Payload)
				if err != nil {
					t.Fatal(err)
				}
				if err := tx.CheckPays(req); x402.ReasonOf(err) != c.reason {
					t.Fatalf("CheckPays: %v, want %s", err, c.reason)
				}
			}
			s, err := e.f.Settle(context.Background(), pp, req)
			if err != nil {
				t.Fatal(err)
			}
			if s.Success || s.ErrorReason != c.reason || s.Transaction != "" {
				t.Fatalf("settle: %+v, want %s", s, c.reason)
			}
		})
	}
	if a, b := e.balances(t); a != beforePayer || b != beforePayee {
		t.Fatalf("balances moved: payer %d→%d, payee %d→%d", beforePayer, a, beforePayee, b)
	}
	if got := e.chain.Lamports(fee.String()); got != 100_000_000_000 {
		t.Fatalf("fee payer spent lamports on refused payments: %d", got)
	}
}

// paysReasons are the refusals of Transaction.CheckPays.
var paysReasons = map[string]bool{ReasonNoTransferInstruction: true, ReasonMintMismatch: true, ReasonRecipientMismatch: true, ReasonAmountMismatch: true}

func TestSettlePaysOnceAndRefusesReplays(t *testing.T) {
	e := newEnv(t, Config{})
	p := e.payment(t)
	raw := p.Build(p.Instructions())
	pp := Payload(raw, e.req)
	if tx, err := DecodePayload(pp.Payload); err != nil || tx.CheckPays(e.req) != nil {
		t.Fatalf("a payment that pays: %v; CheckPays refuses it", err)
	}

	v, err := e.f.Verify(context.Background(), pp, e.req)
	if err != nil || !v.IsValid || v.Payer != pub(e.payer).String() {
		t.Fatalf("verify: %+v %v", v, err)
	}
	feeBefore := e.chain.Lamports(pub(e.fee).String())
	s, err := e.f.Settle(context.Background(), pp, e.req)
	if err != nil || !s.Success || s.Payer != pub(e.payer).String() || s.Network != x402.NetworkSolanaDevnet {
		t.Fatalf("settle: %+v %v", s, err)
	}
	tx, _ := DecodeTransaction(raw)
	if want := base58.Encode(ed25519.Sign(e.fee, tx.Message)); s.Transaction != want {
		t.Fatalf("transaction %s, want the fee payer's signature %s", s.Transaction, want)
	}
	if a, b := e.balances(t); a != 1_000_000-20000 || b != 20000 {
		t.Fatalf("balances payer %d payee %d", a, b)
	}
	if cost := feeBefore - e.chain.Lamports(pub(e.fee).String()); cost == 0 || cost > 20_000 {
		t.Fatalf("the fee payer paid %d lamports", cost)
	}

	// The same message again, with other bytes in the fee payer's slot:
	// the same transaction, never a second payment, and never a second
	// success (it would buy a second service): duplicate_settlement naming
	// that transaction, from the record.
	replay := append([]byte(nil), raw...)
	copy(replay[1:65], []byte(strings.Repeat("x", 64)))
	for _, r := range [][]byte{raw, replay} {
		again, err := e.f.Settle(context.Background(), Payload(r, e.req), e.req)
		if err != nil || again.Success || again.ErrorReason != ReasonDuplicateSettlement || again.Transaction != s.Transaction {
			t.Fatalf("replay: %+v %v", again, err)
		}
	}
	// Past the duplicate window, and the record swept, the chain still
	// holds the same transaction: the look-up finds it, a duplicate again,
	// and a replay against requirements it does not pay is refused for
	// those first.
	now = func() time.Time { return time.Now().Add(DuplicateWindow + sweepEvery + time.Second) }
	defer func() { now = time.Now }()
	other := e.req
	other.Amount = "10000"
	if again, err := e.f.Settle(context.Background(), Payload(raw, other), other); err != nil || again.Success || again.ErrorReason != ReasonAmountMismatch {
		t.Fatalf("replay against other requirements: %+v %v", again, err)
	}
	again, err := e.f.Settle(context.Background(), pp, e.req)
	if err != nil || again.Success || again.ErrorReason != ReasonDuplicateSettlement || again.Transaction != s.Transaction {
		t.Fatalf("replay after the window: %+v %v", again, err)
	}
	if a, b := e.balances(t); a != 1_000_000-20000 || b != 20000 {
		t.Fatalf("after replays: balances payer %d payee %d", a, b)
	}
}

func TestConcurrentSettlesPayOnce(t *testing.T) {
	e := newEnv(t, Config{})
	p := e.payment(t)
	pp := Payload(p.Build(p.Instructions()), e.req)
	var wg sync.WaitGroup
	results := make([]x402.SettleResponse, 8)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := e.f.Settle(context.Background(), pp, e.req)
			if err != nil {
				t.Error(err)
			}
			results[i] = s
		}()
	}
	wg.Wait()
	ok := 0
	for _, r := range results {
		switch {
		case r.Success:
			ok++
		case r.ErrorReason != ReasonDuplicateSettlement:
			t.Errorf("unexpected refusal %+v", r)
		}
	}
	if ok != 1 {
		t.Fatalf("%d settlements succeeded, want 1", ok)
	}
	if a, b := e.balances(t); a != 1_000_000-20000 || b != 20000 {
		t.Fatalf("balances payer %d payee %d", a, b)
	}
}

func TestToken2022(t *testing.T) {
	e := newEnv(t, Config{})
	mint := pub(testKey("token-2022 mint"))
	e.chain.CreateMint(mint.String(), 6, Token2022Program.String())
	e.chain.SetTokenBalance(pub(e.payer).String(), mint.String(), 500_000, Token2022Program.String())
	dst := e.chain.SetTokenBalance(e.payTo.String(), mint.String(), 0, Token2022Program.String())
	if dst != AssociatedTokenAddress(e.payTo, mint, Token2022Program).String() {
		t.Fatalf("ATA derivation disagrees with the chain's: %s", dst)
	}
	p := e.payment(t)
	p.Mint, p.Program = mint, Token2022Program
	req := e.req
	req.Asset = mint.String()
	s, err := e.f.Settle(context.Background(), Payload(p.Build(p.Instructions()), req), req)
	if err != nil || !s.Success {
		t.Fatalf("settle: %+v %v", s, err)
	}
	if got := e.chain.TokenBalance(dst); got != 20000 {
		t.Fatalf("payee has %d", got)
	}
}

// faultyRPC is a fake for faults the chain cannot be made to produce: it
// forwards to the real chain but can drop sendTransaction (the reply is
// lost, as when a connection breaks) and hide signature statuses (the node
// has not seen the transaction yet).
type faultyRPC struct {
	mu         sync.Mutex
	target     string
	dropSend   bool
	forwardOK  bool // forward a dropped send before losing its reply
	hideStatus bool
	// errorAfterSend forwards a send, then answers it as a proxy whose
	// upstream broke might: HTTP 502 with a JSON-RPC internal error.
	errorAfterSend bool
	// beforeSend, when set, runs before a sendTransaction is handled: a
	// test does there what the chain must see between the facilitator's
	// simulation and its send.
	beforeSend func()
	// beforeSimulate is beforeSend for simulateTransaction, and
	// beforeStatus for getSignatureStatuses.
	beforeSimulate, beforeStatus func()
	// confirmedValid answers isBlockhashValid at the confirmed commitment
	// "valid" whatever the chain says (the local chain has one bank for
	// every commitment): a confirmed bank behind the processed tip, or a
	// pool of nodes some of which lag.
	confirmedValid bool
	calls          map[string]int // by method
}

func (f *faultyRPC) set(fn func(*faultyRPC)) {
	f.mu.Lock()
	fn(f)
	f.mu.Unlock()
}

func TestUnknownOutcomeIsPendingThenResolves(t *testing.T) {
	fr := &faultyRPC{}
	srv := fr.serve(t)
	e := newEnv(t, Config{RPC: &RPC{URL: srv}, ConfirmTimeout: 300 * time.Millisecond, PollInterval: 20 * time.Millisecond})
	fr.set(func(f *faultyRPC) { f.target, f.dropSend, f.forwardOK, f.hideStatus = e.chain.URL, true, true, true })
	p := e.payment(t)
	pp := Payload(p.Build(p.Instructions()), e.req)

	_, err := e.f.Settle(context.Background(), pp, e.req)
	var unknown *x402.UnknownOutcomeError
	if !errors.As(err, &unknown) || unknown.Reply == nil || unknown.Reply.ErrorReason != ReasonSettlementPending || unknown.Reply.Transaction == "" {
		t.Fatalf("want an unknown outcome with the signature, got %v", err)
	}
	if _, b := e.balances(t); b != 20000 {
		t.Fatalf("the transfer did land on chain (payee %d); the test needs it to", b)
	}
	// A retry of the same payment asks about the same signature and sends
	// nothing new.
	fr.set(func(f *faultyRPC) { f.dropSend, f.hideStatus = false, false })
	s, err := e.f.Settle(context.Background(), pp, e.req)
	if err != nil || !s.Success || s.Transaction != unknown.Reply.Transaction {
		t.Fatalf("retry: %+v %v", s, err)
	}
	// The pending answer's promise is kept once: a Settle after that
	// success is a replay.
	if again, err := e.f.Settle(context.Background(), pp, e.req); err != nil || again.Success || again.ErrorReason != ReasonDuplicateSettlement || again.Transaction != s.Transaction {
		t.Fatalf("settle after the retry's success: %+v %v; want %s naming %s", again, err, ReasonDuplicateSettlement, s.Transaction)
	}
	if a, b := e.balances(t); a != 1_000_000-20000 || b != 20000 {
		t.Fatalf("balances payer %d payee %d", a, b)
	}
}

// A retry of a payment answered pending whose transaction never reached
// the chain, once its blockhash expired, is a failure (nothing moved), and
// the payment is released rather than held as a duplicate.
func TestPendingRetryFailsOnceTheBlockhashExpires(t *testing.T) {
	fr := &faultyRPC{}
	srv := fr.serve(t)
	e := newEnv(t, Config{RPC: &RPC{URL: srv}, ConfirmTimeout: 2 * time.Second, PollInterval: 20 * time.Millisecond})
	fr.set(func(f *faultyRPC) { f.target, f.dropSend = e.chain.URL, true })
	p := e.payment(t)
	pp := Payload(p.Build(p.Instructions()), e.req)
	_, err := e.f.Settle(context.Background(), pp, e.req)
	var unknown *x402.UnknownOutcomeError
	if !errors.As(err, &unknown) || unknown.Reply == nil || unknown.Reply.ErrorReason != ReasonSettlementPending {
		t.Fatalf("want an unknown outcome, got %v", err)
	}
	e.chain.ExpireBlockhash()
	sends := fr.count("sendTransaction")
	s, err := e.f.Settle(context.Background(), pp, e.req)
	if err != nil || s.Success || s.ErrorReason != ReasonTransactionFailed || fr.count("sendTransaction") != sends {
		t.Fatalf("retry once expired: %+v %v; want %s, nothing sent", s, err, ReasonTransactionFailed)
	}
	if a, b := e.balances(t); a != 1_000_000 || b != 0 {
		t.Fatalf("balances payer %d payee %d", a, b)
	}
	if s, err := e.f.Settle(context.Background(), pp, e.req); err != nil || s.ErrorReason == ReasonDuplicateSettlement {
		t.Fatalf("after release: %+v %v", s, err)
	}
}

// An error reply to a send that may have come after the transaction was
// forwarded (here a proxy's 502 carrying a JSON-RPC internal error, the
// transaction on chain) is no refusal: the chain is asked, and the payment
// that landed is reported settled, not failed and released.
func TestAnErrorAfterForwardingIsNoRefusal(t *testing.T) {
	fr := &faultyRPC{}
	srv := fr.serve(t)
	e := newEnv(t, Config{RPC: &RPC{URL: srv}, ConfirmTimeout: 2 * time.Second, PollInterval: 20 * time.Millisecond})
	fr.set(func(f *faultyRPC) { f.target, f.errorAfterSend = e.chain.URL, true })
	p := e.payment(t)
	pp := Payload(p.Build(p.Instructions()), e.req)
	s, err := e.f.Settle(context.Background(), pp, e.req)
	if err != nil || !s.Success || s.Transaction == "" {
		t.Fatalf("settle: %+v, %v; want success, the transaction having landed", s, err)
	}
	if a, b := e.balances(t); a != 1_000_000-20000 || b != 20000 {
		t.Fatalf("balances payer %d payee %d", a, b)
	}
}

func TestLostSendFailsOnceTheBlockhashExpires(t *testing.T) {
	fr := &faultyRPC{}
	srv := fr.serve(t)
	e := newEnv(t, Config{RPC: &RPC{URL: srv}, ConfirmTimeout: 5 * time.Second, PollInterval: 20 * time.Millisecond})
	fr.set(func(f *faultyRPC) { f.target, f.dropSend = e.chain.URL, true })
	p := e.payment(t)
	pp := Payload(p.Build(p.Instructions()), e.req)
	go func() {
		time.Sleep(200 * time.Millisecond)
		e.chain.ExpireBlockhash()
	}()
	s, err := e.f.Settle(context.Background(), pp, e.req)
	if err != nil || s.Success || s.ErrorReason != ReasonTransactionFailed {
		t.Fatalf("settle: %+v %v", s, err)
	}
	if a, b := e.balances(t); a != 1_000_000 || b != 0 {
		t.Fatalf("balances payer %d payee %d", a, b)
	}
	// Released: the payer may pay again with a fresh transaction, and the
	// same one is not held as a duplicate.
	s, err = e.f.Settle(context.Background(), pp, e.req)
	if err != nil || s.ErrorReason == ReasonDuplicateSettlement {
		t.Fatalf("after release: %+v %v", s, err)
	}
}

func TestPayloadDecodeRefusesOversizedInput(t *testing.T) {
	big := base64.StdEncoding.EncodeToString(make([]byte, MaxTransactionSize+1))
	if _, err := DecodePayload(json.RawMessage(`{"transaction":"` + big + `"}`)); err == nil {
		t.Fatal("decoded an oversized transaction")
	}
}

// A payment's transaction has one spelling: the standard padded base64 of
// its bytes, with zero trailing bits and nothing else. Go's decoder, strict
// as it is, skips line breaks; this reading does not, so no other text
// decodes to the same transaction.
func TestPayloadDecodeTakesOnlyTheCanonicalBase64(t *testing.T) {
	raw := []byte{1}
	raw = append(raw, make([]byte, 64)...) // the fee payer's signature slot
	raw = append(raw, 1, 0, 0, 1)          // header; one account key
	raw = append(raw, make([]byte, 32)...) // the key
	raw = append(raw, make([]byte, 32)...) // recent blockhash
	raw = append(raw, 0)                   // no instruction
	canon := base64.StdEncoding.EncodeToString(raw)
	payload := func(s string) json.RawMessage {
		b, _ := json.Marshal(map[string]string{"transaction": s})
		return b
	}
	if _, err := DecodePayload(payload(canon)); err != nil {
		t.Fatalf("the canonical spelling: %v", err)
	}
	if !strings.HasSuffix(canon, "=") {
		t.Fatalf("the test needs a padded spelling, got %q", canon)
	}
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	pad := strings.TrimRight(canon, "=")
	last := strings.IndexByte(alphabet, pad[len(pad)-1])
	for what, s := range map[string]string{
		"unpadded":               pad,
		"an extra '='":           canon + "=",
		"non-zero trailing bits": pad[:len(pad)-1] + string(alphabet[last|1]) + canon[len(pad):],
		"a line break":           canon[:8] + "\n" + canon[8:],
		"a carriage return":      canon[:8] + "\r\n" + canon[8:],
		"a final line break":     canon + "\n",
	} {
		if _, err := DecodePayload(payload(s)); err == nil {
			t.Errorf("%s: decoded", what)
		}
	}
}
