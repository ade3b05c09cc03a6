package evmfacilitator

import (
	"context"
	"crypto/ecdsa"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/ethclient"

	"github.com/aovhq/aov/x402"
)

// testEnv is a devnet with a facilitator whose relayer is account 0.
type testEnv struct {
	d *Devnet
	f *Facilitator
}

func newEnv(t testing.TB) *testEnv {
	t.Helper()
	d := startDevnet(t, DevnetConfig{})
	f, err := d.NewFacilitator()
	if err != nil {
		t.Fatal(err)
	}
	return &testEnv{d: d, f: f}
}

// requirements is the server's offer: amount test-USDC units to payTo.
func (e *testEnv) requirements(payTo common.Address, amount string) x402.PaymentRequirements {
	return x402.PaymentRequirements{
		Scheme: x402.SchemeExact, Network: DevnetNetwork, Amount: amount,
		Asset: e.d.Token().Hex(), PayTo: payTo.Hex(), MaxTimeoutSeconds: 60,
		Extra: map[string]any{"name": "USD Coin", "version": "2"},
	}
}

// expiringPayment is a payment from payer of amount to payee signed now,
// valid for validFor seconds: its requirements, the payment and its
// validBefore (whole seconds, as signed), for the tests of the time
// around validBefore.
func (e *testEnv) expiringPayment(t *testing.T, validFor int) (x402.PaymentRequirements, x402.PaymentPayload, time.Time) {
	t.Helper()
	req := e.requirements(payee, amount)
	req.MaxTimeoutSeconds = validFor
	signedAt := time.Now()
	pay := mustSignExact(t, payer, req)
	return req, pay, time.Unix(signedAt.Unix()+int64(validFor), 0)
}

// relayerOn is a facilitator of relayer key DevKey(key) on chain, polling
// every 20ms and waiting receiptTimeout for a receipt (0: the default),
// that has identified its chain, and is closed when t ends.
func relayerOn(t *testing.T, chain Chain, key int, receiptTimeout time.Duration) *Facilitator {
	t.Helper()
	f, err := New(Config{Chain: chain, Network: DevnetNetwork, RelayerKey: DevKey(key), PollInterval: 20 * time.Millisecond, ReceiptTimeout: receiptTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	identified(t, f)
	return f
}

// auth is an authorization from key's address for req, valid now.
func auth(key *ecdsa.PrivateKey, req x402.PaymentRequirements) x402.Authorization {
	var n [32]byte
	if _, err := crand.Read(n[:]); err != nil {
		panic(err)
	}
	t := time.Now().Unix()
	return x402.Authorization{
		From: crypto.PubkeyToAddress(key.PublicKey).Hex(), To: req.PayTo, Value: req.Amount,
		ValidAfter: fmt.Sprint(t - 600), ValidBefore: fmt.Sprint(t + 60), Nonce: "0x" + hex.EncodeToString(n[:]),
	}
}

// sign signs a for the EIP-712 domain of signReq (which may differ from the
// requirements the payment is checked against) and builds the payload
// accepting req.
func sign(t testing.TB, key *ecdsa.PrivateKey, a x402.Authorization, signReq, req x402.PaymentRequirements) x402.PaymentPayload {
	t.Helper()
	chainID, name, version, token, err := x402.ExactEVMDomain(signReq)
	if err != nil {
		t.Fatal(err)
	}
	digest, err := x402.TransferWithAuthorizationDigest(chainID, name, version, token, a)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := crypto.Sign(digest[:], key)
	if err != nil {
		t.Fatal(err)
	}
	sig[64] += 27
	return payload(t, "0x"+hex.EncodeToString(sig), a, req)
}

func payload(t testing.TB, sig string, a x402.Authorization, req x402.PaymentRequirements) x402.PaymentPayload {
	t.Helper()
	raw, err := json.Marshal(x402.ExactEVMPayload{Signature: sig, Authorization: a})
	if err != nil {
		t.Fatal(err)
	}
	return x402.PaymentPayload{X402Version: x402.Version, Accepted: req, Payload: raw}
}

var (
	payer  = DevKey(1)
	payee  = DevAccounts()[2].Address
	other  = DevAccounts()[3].Address
	amount = "20000" // $0.02
)

func TestVerify(t *testing.T) {
	e := newEnv(t)
	req := e.requirements(payee, amount)
	stranger, _ := crypto.GenerateKey()
	nowUnix := time.Now().Unix()
	mod := func(f func(*x402.Authorization)) x402.Authorization {
		a := auth(payer, req)
		f(&a)
		return a
	}
	withReq := func(f func(*x402.PaymentRequirements)) x402.PaymentRequirements {
		r := req
		r.Extra = map[string]any{"name": "USD Coin", "version": "2"}
		f(&r)
		return r
	}
	used := auth(payer, req)
	usedPayment := sign(t, payer, used, req, req)
	if r, err := e.f.Settle(context.Background(), usedPayment, req); err != nil || !r.Success {
		t.Fatalf("settling the payment used by the replay case: %+v, %v", r, err)
	}

	cases := []struct {
		desc   string
		p      x402.PaymentPayload
		req    x402.PaymentRequirements
		reason string // "" = valid
	}{
		{desc: "a payment signed by the payer for the exact requirements is valid",
			p: sign(t, payer, auth(payer, req), req, req), req: req},
		{desc: "a payment signed by the official Go client helper is valid",
			p: mustSignExact(t, payer, req), req: req},
		{desc: "a payment to another payTo is refused as recipient mismatch",
			p: sign(t, payer, mod(func(a *x402.Authorization) { a.To = other.Hex() }), req, req), req: req,
			reason: x402.ReasonExactEVMRecipientMismatch},
		{desc: "a payment of a different amount is refused as value mismatch",
			p: sign(t, payer, mod(func(a *x402.Authorization) { a.Value = "19999" }), req, req), req: req,
			reason: x402.ReasonExactEVMValueMismatch},
		{desc: "a payment that expires within six seconds is refused as valid_before",
			p: sign(t, payer, mod(func(a *x402.Authorization) { a.ValidBefore = fmt.Sprint(nowUnix + 3) }), req, req), req: req,
			reason: x402.ReasonExactEVMValidBefore},
		{desc: "an expired payment is refused as valid_before",
			p: sign(t, payer, mod(func(a *x402.Authorization) { a.ValidBefore = fmt.Sprint(nowUnix - 1) }), req, req), req: req,
			reason: x402.ReasonExactEVMValidBefore},
		{desc: "a payment not yet valid is refused as valid_after",
			p: sign(t, payer, mod(func(a *x402.Authorization) { a.ValidAfter = fmt.Sprint(nowUnix + 60) }), req, req), req: req,
			reason: x402.ReasonExactEVMValidAfter},
		{desc: "a payment whose signature bytes were altered is refused as a bad signature",
			p: tamper(t, sign(t, payer, auth(payer, req), req, req)), req: req,
			reason: x402.ReasonExactEVMSignature},
		{desc: "a payment from the payer signed by another key is refused as a bad signature",
			p: func() x402.PaymentPayload {
				a := auth(payer, req)
				return sign(t, stranger, a, req, req)
			}(), req: req,
			reason: x402.ReasonExactEVMSignature},
		{desc: "a payment signed for another token contract is refused as a bad signature (domain mismatch)",
			p: sign(t, payer, auth(payer, req), withReq(func(r *x402.PaymentRequirements) { r.Asset = other.Hex() }), req), req: req,
			reason: x402.ReasonExactEVMSignature},
		{desc: "requirements naming a token name the token does not have are refused as token name mismatch",
			p:   sign(t, payer, auth(payer, req), withReq(func(r *x402.PaymentRequirements) { r.Extra["name"] = "USDC" }), withReq(func(r *x402.PaymentRequirements) { r.Extra["name"] = "USDC" })),
			req: withReq(func(r *x402.PaymentRequirements) { r.Extra["name"] = "USDC" }), reason: x402.ReasonExactEVMTokenNameMismatch},
		{desc: "requirements naming a token version the token does not have are refused as token version mismatch",
			p:   sign(t, payer, auth(payer, req), withReq(func(r *x402.PaymentRequirements) { r.Extra["version"] = "1" }), withReq(func(r *x402.PaymentRequirements) { r.Extra["version"] = "1" })),
			req: withReq(func(r *x402.PaymentRequirements) { r.Extra["version"] = "1" }), reason: x402.ReasonExactEVMTokenVersionMismatch},
		{desc: "an asset that is not a contract is refused as not supporting EIP-3009",
			p:   sign(t, payer, auth(payer, req), withReq(func(r *x402.PaymentRequirements) { r.Asset = other.Hex() }), withReq(func(r *x402.PaymentRequirements) { r.Asset = other.Hex() })),
			req: withReq(func(r *x402.PaymentRequirements) { r.Asset = other.Hex() }), reason: x402.ReasonExactEVMEIP3009NotSupported},
		{desc: "requirements without the EIP-712 name and version are refused as missing domain",
			p:   sign(t, payer, auth(payer, req), req, withReq(func(r *x402.PaymentRequirements) { r.Extra = nil })),
			req: withReq(func(r *x402.PaymentRequirements) { r.Extra = nil }), reason: x402.ReasonExactEVMMissingEIP712Domain},
		{desc: "a payment accepted for another network than the requirements' is refused as network mismatch",
			p: func() x402.PaymentPayload {
				p := sign(t, payer, auth(payer, req), req, req)
				p.Accepted.Network = "eip155:8453"
				return p
			}(), req: req, reason: x402.ReasonExactEVMNetworkMismatch},
		{desc: "requirements on a network this facilitator does not settle are refused as invalid network",
			p:   sign(t, payer, auth(payer, req), req, withReq(func(r *x402.PaymentRequirements) { r.Network = "eip155:8453" })),
			req: withReq(func(r *x402.PaymentRequirements) { r.Network = "eip155:8453" }), reason: x402.ReasonInvalidNetwork},
		{desc: "a scheme other than exact is refused",
			p:   sign(t, payer, auth(payer, req), req, withReq(func(r *x402.PaymentRequirements) { r.Scheme = "upto" })),
			req: withReq(func(r *x402.PaymentRequirements) { r.Scheme = "upto" }), reason: x402.ReasonExactEVMScheme},
		{desc: "a version 1 payment is refused as invalid x402 version",
			p: func() x402.PaymentPayload {
				p := sign(t, payer, auth(payer, req), req, req)
				p.X402Version = 1
				return p
			}(), req: req, reason: x402.ReasonInvalidX402Version},
		{desc: "a payload that is not an EIP-3009 authorization is refused as invalid payload",
			p: func() x402.PaymentPayload {
				p := sign(t, payer, auth(payer, req), req, req)
				p.Payload = json.RawMessage(`{"signature":"0x00"}`)
				return p
			}(), req: req, reason: x402.ReasonInvalidPayload},
		{desc: "a payer without enough test USDC is refused as insufficient balance",
			p: sign(t, stranger, auth(stranger, req), req, req), req: req,
			reason: x402.ReasonExactEVMInsufficientBalance},
		{desc: "an authorization whose nonce was already used is refused as nonce already used",
			p: usedPayment, req: req, reason: x402.ReasonExactEVMNonceAlreadyUsed},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			r, err := e.f.Verify(context.Background(), tc.p, tc.req)
			if err != nil {
				t.Fatalf("Verify error: %v", err)
			}
			if tc.reason == "" {
				if !r.IsValid || r.InvalidReason != "" {
					t.Fatalf("got %+v, want valid", r)
				}
				if r.Payer != crypto.PubkeyToAddress(payer.PublicKey).Hex() {
					t.Errorf("payer = %q", r.Payer)
				}
				return
			}
			if r.IsValid || r.InvalidReason != tc.reason {
				t.Fatalf("got isValid=%v reason %q (%s), want reason %q", r.IsValid, r.InvalidReason, r.InvalidMessage, tc.reason)
			}
		})
	}
}

func mustSignExact(t testing.TB, key *ecdsa.PrivateKey, req x402.PaymentRequirements) x402.PaymentPayload {
	t.Helper()
	p, err := x402.SignExactEVM(key, req, &x402.Resource{URL: "https://example.com/paid"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// tamper flips a bit of the signature's r.
func tamper(t testing.TB, p x402.PaymentPayload) x402.PaymentPayload {
	t.Helper()
	var pl x402.ExactEVMPayload
	if err := json.Unmarshal(p.Payload, &pl); err != nil {
		t.Fatal(err)
	}
	b := common.FromHex(pl.Signature)
	b[5] ^= 0x01
	pl.Signature = "0x" + hex.EncodeToString(b)
	return payload(t, pl.Signature, pl.Authorization, p.Accepted)
}

func TestSettleMovesTestUSDC(t *testing.T) {
	e := newEnv(t)
	req := e.requirements(payee, amount)
	from := crypto.PubkeyToAddress(payer.PublicKey)
	before, beforeTo := usdcBalance(t, e.d, from), usdcBalance(t, e.d, payee)
	p := mustSignExact(t, payer, req)
	r, err := e.f.Settle(context.Background(), p, req)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Success || r.ErrorReason != "" || r.Network != DevnetNetwork || r.Payer != from.Hex() || len(r.Transaction) != 66 {
		t.Fatalf("settle = %+v", r)
	}
	if d := new(big.Int).Sub(before, usdcBalance(t, e.d, from)); d.String() != amount {
		t.Errorf("payer paid %v, want %s", d, amount)
	}
	if d := new(big.Int).Sub(usdcBalance(t, e.d, payee), beforeTo); d.String() != amount {
		t.Errorf("payee received %v, want %s", d, amount)
	}
	rcpt, err := e.d.Client().TransactionReceipt(context.Background(), common.HexToHash(r.Transaction))
	if err != nil || rcpt.Status != types.ReceiptStatusSuccessful {
		t.Fatalf("receipt of %s: %v, %v", r.Transaction, rcpt, err)
	}

	t.Run("a replay of a settled authorization is refused, names the settlement and moves nothing", func(t *testing.T) {
		settled := r.Transaction
		r, err := e.f.Settle(context.Background(), p, req)
		if err != nil {
			t.Fatal(err)
		}
		if r.Success || r.ErrorReason != x402.ReasonExactEVMNonceAlreadyUsed || r.Transaction != settled || r.Payer != from.Hex() {
			t.Fatalf("replay settle = %+v", r)
		}
		if d := new(big.Int).Sub(before, usdcBalance(t, e.d, from)); d.String() != amount {
			t.Errorf("payer paid %v in total, want %s once", d, amount)
		}
	})
}

func TestSettleRefusesWhatVerifyRefuses(t *testing.T) {
	e := newEnv(t)
	req := e.requirements(payee, amount)
	a := auth(payer, req)
	a.To = other.Hex()
	from := crypto.PubkeyToAddress(payer.PublicKey)
	before := usdcBalance(t, e.d, from)
	r, err := e.f.Settle(context.Background(), sign(t, payer, a, req, req), req)
	if err != nil {
		t.Fatal(err)
	}
	if r.Success || r.ErrorReason != x402.ReasonExactEVMRecipientMismatch || r.Network != DevnetNetwork || r.Transaction != "" {
		t.Fatalf("settle = %+v", r)
	}
	if usdcBalance(t, e.d, from).Cmp(before) != 0 {
		t.Error("a refused settlement moved test USDC")
	}
}

func TestConcurrentSettlesOfOneAuthorizationTransferOnce(t *testing.T) {
	e := newEnv(t)
	req := e.requirements(payee, amount)
	from := crypto.PubkeyToAddress(payer.PublicKey)
	before := usdcBalance(t, e.d, from)
	relayerNonce, _ := e.d.Client().NonceAt(context.Background(), e.f.Relayer(), nil)
	p := mustSignExact(t, payer, req)

	const n = 8
	results := make([]x402.SettleResponse, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = e.f.Settle(context.Background(), p, req)
		}()
	}
	wg.Wait()
	// One payment, one success: the others, whether they joined it in
	// flight or came after it landed, name its transaction.
	successes, hashes := 0, map[string]bool{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("settle %d: %v", i, errs[i])
		}
		if results[i].Success {
			successes++
		} else if results[i].ErrorReason != x402.ReasonExactEVMNonceAlreadyUsed {
			t.Errorf("settle %d failed with %q; want success or nonce already used", i, results[i].ErrorReason)
		}
		hashes[results[i].Transaction] = true
	}
	if successes != 1 {
		t.Errorf("%d of %d settles of one payment succeeded, want 1", successes, n)
	}
	if len(hashes) != 1 {
		t.Errorf("the settles name %d distinct transactions, want 1: %v", len(hashes), hashes)
	}
	if d := new(big.Int).Sub(before, usdcBalance(t, e.d, from)); d.String() != amount {
		t.Errorf("payer paid %v, want %s exactly once", d, amount)
	}
	after, _ := e.d.Client().NonceAt(context.Background(), e.f.Relayer(), nil)
	if after != relayerNonce+1 {
		t.Errorf("relayer sent %d transactions, want 1", after-relayerNonce)
	}
}

func TestConcurrentSettlementsOfDistinctPaymentsAllLand(t *testing.T) {
	e := newEnv(t)
	req := e.requirements(payee, amount)
	const n = 12
	var wg sync.WaitGroup
	errs := make(chan error, n)
	beforeTo := usdcBalance(t, e.d, payee)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := DevKey(1 + i%8)
			if i%8 == 1 {
				key = DevKey(9) // never the payee (account 2)
			}
			r, err := e.f.Settle(context.Background(), mustSignExact(t, key, req), req)
			if err == nil && !r.Success {
				err = fmt.Errorf("settle refused: %s %s", r.ErrorReason, r.ErrorMessage)
			}
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	want := new(big.Int).Mul(big.NewInt(20000), big.NewInt(n))
	if got := new(big.Int).Sub(usdcBalance(t, e.d, payee), beforeTo); got.Cmp(want) != 0 {
		t.Errorf("payee received %v, want %v", got, want)
	}
}

func TestSettleWithUnfundedRelayerIsAnErrorAndMovesNothing(t *testing.T) {
	e := newEnv(t)
	broke, _ := crypto.GenerateKey()
	f, err := New(Config{Chain: e.d.Client(), Network: DevnetNetwork, RelayerKey: broke, PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	req := e.requirements(payee, amount)
	p := mustSignExact(t, payer, req)
	from := crypto.PubkeyToAddress(payer.PublicKey)
	before := usdcBalance(t, e.d, from)
	r, err := f.Settle(context.Background(), p, req)
	if !errors.Is(err, ErrRelayerUnfunded) {
		t.Fatalf("settle = %+v, %v; want ErrRelayerUnfunded", r, err)
	}
	var unknown *x402.UnknownOutcomeError
	if errors.As(err, &unknown) {
		t.Error("an unfunded relayer is reported as an unknown outcome; nothing was sent")
	}
	if usdcBalance(t, e.d, from).Cmp(before) != 0 {
		t.Error("test USDC moved")
	}
	// The authorization is still good: a funded facilitator settles it.
	if r, err := e.f.Settle(context.Background(), p, req); err != nil || !r.Success {
		t.Fatalf("settling afterwards with a funded relayer: %+v, %v", r, err)
	}
}

func TestUnreachableChainIsAnErrorNotARefusal(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + l.Addr().String()
	l.Close() // nothing listens there now
	c, err := ethclient.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f, err := New(Config{Chain: c, Network: DevnetNetwork, RelayerKey: DevKey(0)})
	if err != nil {
		t.Fatal(err)
	}
	req := x402.PaymentRequirements{Scheme: x402.SchemeExact, Network: DevnetNetwork, Amount: amount,
		Asset: "0x5FbDB2315678afecb367f032d93F642f64180aa3", PayTo: payee.Hex(), MaxTimeoutSeconds: 60,
		Extra: map[string]any{"name": "USD Coin", "version": "2"}}
	p := mustSignExact(t, payer, req)
	ctx := context.Background()
	if r, err := f.Verify(ctx, p, req); err == nil {
		t.Errorf("verify = %+v with the chain down; want an error (no answer)", r)
	}
	r, err := f.Settle(ctx, p, req)
	if err == nil {
		t.Fatalf("settle = %+v with the chain down; want an error", r)
	}
	var unknown *x402.UnknownOutcomeError
	if errors.As(err, &unknown) {
		t.Errorf("settle error %v is an unknown outcome; nothing was sent", err)
	}
	if s, err := f.Supported(ctx); err != nil || len(s.Kinds) != 1 {
		t.Errorf("supported needs no chain: %+v, %v", s, err)
	}
}

func TestSupported(t *testing.T) {
	e := newEnv(t)
	s, err := e.f.Supported(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := x402.SupportedKind{X402Version: 2, Scheme: "exact", Network: DevnetNetwork}
	if len(s.Kinds) != 1 || s.Kinds[0].Network != want.Network || s.Kinds[0].Scheme != want.Scheme || s.Kinds[0].X402Version != 2 {
		t.Errorf("kinds = %+v", s.Kinds)
	}
	if got := s.Signers["eip155:*"]; len(got) != 1 || got[0] != DevAccounts()[0].Address.Hex() {
		t.Errorf("signers = %v", s.Signers)
	}
}

// TestSmartWalletPayer pays from an EIP-1271 contract account: the
// facilitator asks the wallet, and settles through the bytes overload.
func TestSmartWalletPayer(t *testing.T) {
	e := newEnv(t)
	owner := DevKey(4)
	wallet := deployWallet(t, e.d, crypto.PubkeyToAddress(owner.PublicKey))
	fundUSDC(t, e.d, DevKey(5), wallet, 1_000_000)
	req := e.requirements(payee, amount)
	a := auth(owner, req)
	a.From = wallet.Hex()

	t.Run("a signature by the wallet's owner is valid and settles", func(t *testing.T) {
		p := sign(t, owner, a, req, req)
		v, err := e.f.Verify(context.Background(), p, req)
		if err != nil || !v.IsValid || v.Payer != wallet.Hex() {
			t.Fatalf("verify = %+v, %v", v, err)
		}
		before := usdcBalance(t, e.d, wallet)
		s, err := e.f.Settle(context.Background(), p, req)
		if err != nil || !s.Success {
			t.Fatalf("settle = %+v, %v", s, err)
		}
		if d := new(big.Int).Sub(before, usdcBalance(t, e.d, wallet)); d.String() != amount {
			t.Errorf("wallet paid %v", d)
		}
	})
	t.Run("a signature by another key is refused by the wallet", func(t *testing.T) {
		b := auth(owner, req)
		b.From = wallet.Hex()
		v, err := e.f.Verify(context.Background(), sign(t, DevKey(6), b, req, req), req)
		if err != nil || v.IsValid || v.InvalidReason != x402.ReasonExactEVMSignature {
			t.Fatalf("verify = %+v, %v", v, err)
		}
	})
}

// sendTx signs data from key to `to` on the devnet and waits for its receipt.
func sendTx(t testing.TB, d *Devnet, key *ecdsa.PrivateKey, to *common.Address, data []byte) *types.Receipt {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := d.SendTx(ctx, key, to, data)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func deployWallet(t testing.TB, d *Devnet, owner common.Address) common.Address {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	wallet, err := d.DeployTestWallet(ctx, owner)
	if err != nil {
		t.Fatal(err)
	}
	return wallet
}

func fundUSDC(t testing.TB, d *Devnet, from *ecdsa.PrivateKey, to common.Address, units int64) {
	t.Helper()
	data, err := tokenABI.Pack("transfer", to, big.NewInt(units))
	if err != nil {
		t.Fatal(err)
	}
	tok := d.Token()
	sendTx(t, d, from, &tok, data)
}

// lossyChain is a fake for faults that cannot be caused on a real chain on
// demand: it wraps the devnet client and loses receipts (until the outcome
// is being resolved, or for good), or drops sends while pretending the
// connection broke (onSend then runs in their place), or breaks reads after
// a send.
type lossyChain struct {
	Chain
	loseReceipts  bool // until the facilitator reads the chain again after the send
	neverReceipts bool
	dropSends     bool
	onSend        func()
	breakAfterTx  bool
	mu            sync.Mutex
	sent          bool
	resolving     bool
	sentTxs       map[common.Hash]bool // the transactions sent, each once or more
	errConnection error
}

func (c *lossyChain) SendTransaction(ctx context.Context, tx *types.Transaction) error {
	c.mu.Lock()
	c.sent = true
	if c.sentTxs == nil {
		c.sentTxs = map[common.Hash]bool{}
	}
	c.sentTxs[tx.Hash()] = true
	c.mu.Unlock()
	if c.dropSends {
		if c.onSend != nil {
			c.onSend()
		}
		return c.errConnection
	}
	if err := c.Chain.SendTransaction(ctx, tx); err != nil {
		return err
	}
	if c.breakAfterTx {
		return c.errConnection
	}
	return nil
}

func (c *lossyChain) TransactionReceipt(ctx context.Context, h common.Hash) (*types.Receipt, error) {
	c.mu.Lock()
	lost := c.neverReceipts || c.loseReceipts && !c.resolving
	c.mu.Unlock()
	if lost {
		return nil, ethereum.NotFound
	}
	return c.Chain.TransactionReceipt(ctx, h)
}

func (c *lossyChain) CallContract(ctx context.Context, msg ethereum.CallMsg, block *big.Int) ([]byte, error) {
	c.mu.Lock()
	broken := c.breakAfterTx && c.sent
	c.resolving = c.resolving || c.sent // after the send, only the resolution reads state
	c.mu.Unlock()
	if broken {
		return nil, c.errConnection
	}
	return c.Chain.CallContract(ctx, msg, block)
}

func TestUnknownOutcomesAreResolvedFromTheChain(t *testing.T) {
	connErr := errors.New("connection reset by peer (fake)")
	cases := []struct {
		desc        string
		chain       func(Chain) *lossyChain
		wantSuccess bool
		wantUnknown bool
		wantMoved   bool
	}{
		{desc: "a settlement whose receipt comes too late is a success, proven by that receipt",
			chain: func(c Chain) *lossyChain { return &lossyChain{Chain: c, loseReceipts: true} }, wantSuccess: true, wantMoved: true},
		{desc: "a used authorization whose transaction's receipt cannot be read is judged by the token's logs: a success, proven by them",
			chain:       func(c Chain) *lossyChain { return &lossyChain{Chain: c, neverReceipts: true} },
			wantSuccess: true, wantMoved: true},
		{desc: "a send lost before reaching the node leaves the authorization unused and valid: an unknown outcome until it can no longer execute",
			chain:       func(c Chain) *lossyChain { return &lossyChain{Chain: c, dropSends: true, errConnection: connErr} },
			wantUnknown: true},
		{desc: "a send whose connection broke and whose state cannot be read is an unknown outcome, never a failure",
			chain:       func(c Chain) *lossyChain { return &lossyChain{Chain: c, breakAfterTx: true, errConnection: connErr} },
			wantUnknown: true, wantMoved: true},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			e := newEnv(t)
			lc := tc.chain(e.d.Client())
			f, err := New(Config{Chain: lc, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 500 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			req := e.requirements(payee, amount)
			from := crypto.PubkeyToAddress(payer.PublicKey)
			before := usdcBalance(t, e.d, from)
			r, err := f.Settle(context.Background(), mustSignExact(t, payer, req), req)
			var unknown *x402.UnknownOutcomeError
			switch {
			case tc.wantUnknown:
				if !errors.As(err, &unknown) {
					t.Fatalf("settle = %+v, %v; want *x402.UnknownOutcomeError", r, err)
				}
			case err != nil:
				t.Fatalf("settle error %v; want an answer", err)
			case r.Success != tc.wantSuccess:
				t.Fatalf("settle = %+v; want success %v", r, tc.wantSuccess)
			case !r.Success && r.ErrorReason == "":
				t.Fatalf("failure without a reason: %+v", r)
			case r.Success && len(common.FromHex(r.Transaction)) != common.HashLength:
				t.Fatalf("success without the transaction: %+v", r)
			}
			if len(lc.sentTxs) != 1 {
				t.Errorf("%d transactions sent, want 1", len(lc.sentTxs))
			}
			// Let the chain seal whatever was sent, then compare balances.
			deadline := time.Now().Add(5 * time.Second)
			for {
				moved := usdcBalance(t, e.d, from).Cmp(before) != 0
				if moved == tc.wantMoved || time.Now().After(deadline) {
					if moved != tc.wantMoved {
						t.Errorf("test USDC moved = %v, want %v", moved, tc.wantMoved)
					}
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
}

func TestRelayerNonceResyncsAfterAnOutsideTransaction(t *testing.T) {
	e := newEnv(t)
	req := e.requirements(payee, amount)
	if r, err := e.f.Settle(context.Background(), mustSignExact(t, payer, req), req); err != nil || !r.Success {
		t.Fatalf("first settle = %+v, %v", r, err)
	}
	// Another process uses the relayer key: the facilitator's next nonce is
	// stale. (Devnet.SendTx would take the nonce from the shared manager.)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	relayer := e.f.Relayer()
	nonce, err := e.d.Client().PendingNonceAt(ctx, relayer)
	if err != nil {
		t.Fatal(err)
	}
	to := DevAccounts()[7].Address
	tx, err := e.d.signTx(ctx, DevKey(0), nonce, &to, nil, 21_000)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.d.Client().SendTransaction(ctx, tx); err != nil {
		t.Fatal(err)
	}
	for {
		if after, err := e.d.Client().NonceAt(ctx, relayer, nil); err == nil && after > nonce {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the outside transaction was not mined")
		}
		time.Sleep(20 * time.Millisecond)
	}
	r, err := e.f.Settle(context.Background(), mustSignExact(t, payer, req), req)
	if err != nil || !r.Success {
		t.Fatalf("settle after an outside transaction = %+v, %v", r, err)
	}
}

// preLondonChain is a fake that hides the base fee, as a chain without
// EIP-1559 reports its blocks; the devnet still accepts the legacy
// transactions the facilitator then sends.
type preLondonChain struct{ Chain }

func (c preLondonChain) HeaderByNumber(ctx context.Context, n *big.Int) (*types.Header, error) {
	h, err := c.Chain.HeaderByNumber(ctx, n)
	if h != nil {
		h = types.CopyHeader(h)
		h.BaseFee = nil
	}
	return h, err
}

func TestSettleSendsLegacyTransactionsWithoutEIP1559(t *testing.T) {
	e := newEnv(t)
	f, err := New(Config{Chain: preLondonChain{e.d.Client()}, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	req := e.requirements(payee, amount)
	r, err := f.Settle(context.Background(), mustSignExact(t, payer, req), req)
	if err != nil || !r.Success {
		t.Fatalf("settle = %+v, %v", r, err)
	}
	tx, _, err := e.d.Client().TransactionByHash(context.Background(), common.HexToHash(r.Transaction))
	if err != nil {
		t.Fatal(err)
	}
	if tx.Type() != types.LegacyTxType {
		t.Errorf("transaction type %d, want legacy", tx.Type())
	}
}

func TestRevertStringsMapToReasons(t *testing.T) {
	cases := []struct{ desc, msg, want string }{
		{"a used nonce", "authorization is used or canceled", x402.ReasonExactEVMNonceAlreadyUsed},
		{"USDC's prefixed used nonce", "FiatTokenV2: authorization is used or canceled", x402.ReasonExactEVMNonceAlreadyUsed},
		{"a short balance", "ERC20: transfer amount exceeds balance", x402.ReasonExactEVMInsufficientBalance},
		{"an expired authorization", "FiatTokenV2: authorization is expired", x402.ReasonExactEVMValidBefore},
		{"an early authorization", "FiatTokenV2: authorization is not yet valid", x402.ReasonExactEVMValidAfter},
		{"a bad signature", "FiatTokenV2: invalid signature", x402.ReasonExactEVMSignature},
		{"anything else falls back", "Pausable: paused", "fallback"},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			if got := revertReason(tc.msg, "fallback"); got != tc.want {
				t.Errorf("revertReason(%q) = %q, want %q", tc.msg, got, tc.want)
			}
		})
	}
}

// TestFacilitatorsOfOneRelayerShareItsNonces runs two facilitators of one
// relayer key in one process (a gate's and an x402_facilitator's, or one
// configuration and the next while it drains) together with the devnet's
// own sends from that key: they must draw from one nonce sequence, or
// concurrent transactions take the same nonce and settlements of good
// payments fail or never land.
func TestFacilitatorsOfOneRelayerShareItsNonces(t *testing.T) {
	e := newEnv(t)
	// Another receipt timeout: the Caddy pool keeps it a separate facilitator.
	f2, err := New(Config{Chain: e.d.Client(), Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 31 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	relayer := e.f.Relayer()
	first, err := e.d.Client().NonceAt(ctx, relayer, nil)
	if err != nil {
		t.Fatal(err)
	}
	beforeTo := usdcBalance(t, e.d, payee)
	req := e.requirements(payee, amount)
	const n, sends = 12, 2
	payments := make([]x402.PaymentPayload, n)
	for i := range payments {
		key := DevKey(1 + i%8)
		if i%8 == 1 {
			key = DevKey(9) // never the payee (account 2)
		}
		payments[i] = mustSignExact(t, key, req)
	}
	facs := []*Facilitator{e.f, f2}
	hashes := make([]common.Hash, n+sends)
	errs := make([]error, n+sends)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			r, err := facs[i%2].Settle(ctx, payments[i], req)
			if err == nil && !r.Success {
				err = fmt.Errorf("refused: %s %s", r.ErrorReason, r.ErrorMessage)
			}
			hashes[i], errs[i] = common.HexToHash(r.Transaction), err
		})
	}
	to := DevAccounts()[7].Address
	for i := range sends {
		wg.Go(func() {
			<-start
			r, err := e.d.SendTx(ctx, DevKey(0), &to, nil)
			if err == nil {
				hashes[n+i] = r.TxHash
			}
			errs[n+i] = err
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		switch {
		case err == nil:
		case i < n:
			t.Errorf("settlement %d by facilitator %d: %v", i, i%2+1, err)
		default:
			t.Errorf("devnet send %d from the relayer's account: %v", i-n, err)
		}
	}
	if t.Failed() {
		return
	}
	want := new(big.Int).Mul(big.NewInt(20000), big.NewInt(n))
	if got := new(big.Int).Sub(usdcBalance(t, e.d, payee), beforeTo); got.Cmp(want) != 0 {
		t.Errorf("payee received %v, want %v: every settlement exactly once", got, want)
	}
	used := map[uint64]bool{}
	for _, h := range hashes {
		tx, pending, err := e.d.Client().TransactionByHash(ctx, h)
		if err != nil || pending {
			t.Fatalf("transaction %s: pending %v, %v", h.Hex(), pending, err)
		}
		if used[tx.Nonce()] {
			t.Errorf("nonce %d used twice", tx.Nonce())
		}
		used[tx.Nonce()] = true
	}
	for nonce := first; nonce < first+n+sends; nonce++ {
		if !used[nonce] {
			t.Errorf("relayer nonce %d not among the transactions: nonces are not consecutive from %d", nonce, first)
		}
	}
	if after, _ := e.d.Client().NonceAt(ctx, relayer, nil); after != first+n+sends {
		t.Errorf("relayer sent %d transactions, want %d", after-first, n+sends)
	}
}
