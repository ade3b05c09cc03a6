package svmfacilitator

import (
	"context"
	"crypto/ed25519"
	"strings"
	"testing"

	"github.com/aovhq/aov/internal/solanachain"
	"github.com/aovhq/aov/x402"
)

// withFeePayer returns a facilitator on e's chain whose fee payer is key,
// and e's requirements naming it.
func withFeePayer(t *testing.T, e *env, key ed25519.PrivateKey) (*Facilitator, x402.PaymentRequirements) {
	t.Helper()
	cfg := e.f.cfg
	cfg.FeePayer = key
	f, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	req := e.req
	req.Extra = map[string]any{"feePayer": pub(key).String()}
	return f, req
}

// A fee payer with no account (never funded, or drained to zero), or too
// few lamports for the fee, makes every simulation fail. That is the
// operator's outage, not the buyer's payment: Verify and Settle return an
// error naming the fee payer (the gateway answers 503, nothing charged,
// the same payment can be sent again once it is funded), and nothing moves.
// (Before: invalid_exact_svm_transaction_simulation_failed, telling the
// buyer to sign a new payment, which would fail the same way.)
func TestFeePayerOutOfFundsIsAnError(t *testing.T) {
	for _, tc := range []struct {
		name     string
		lamports uint64
		owner    string
	}{
		{name: "no account", lamports: 0},
		{name: "fewer lamports than the fee", lamports: 1000},
		// Paying the fee would leave it below rent exemption (890,880
		// lamports for an empty account).
		{name: "fee would leave it below rent", lamports: 890_880 + 1000},
		// A program owns it (it holds data): it cannot pay fees.
		{name: "owned by a program", owner: TokenProgram.String()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, Config{})
			ctx := context.Background()
			key := testKey("fee payer out of funds " + tc.name)
			if tc.lamports > 0 {
				e.chain.Airdrop(pub(key).String(), tc.lamports)
			}
			if tc.owner != "" {
				e.chain.SetAccount(pub(key).String(), tc.owner, make([]byte, 165))
			}
			f, req := withFeePayer(t, e, key)
			p := e.payment(t)
			p.FeePayer = pub(key)
			pp := Payload(p.Transaction(), req)
			v, err := f.Verify(ctx, pp, req)
			if err == nil || !strings.Contains(err.Error(), "fee payer "+pub(key).String()) {
				t.Errorf("verify: %+v, err %v; want an error naming the fee payer", v, err)
			}
			s, err := f.Settle(ctx, pp, req)
			if err == nil || !strings.Contains(err.Error(), "fee payer "+pub(key).String()) {
				t.Errorf("settle: %+v, err %v; want an error naming the fee payer", s, err)
			}
			if a, b := e.balances(t); a != 1_000_000 || b != 0 {
				t.Errorf("balances payer %d payee %d; want nothing moved", a, b)
			}
			if tc.owner != "" {
				return
			}
			// Funded, the same payment settles: nothing about it was wrong.
			e.chain.Airdrop(pub(key).String(), 1_000_000_000)
			if s, err := f.Settle(ctx, pp, req); err != nil || !s.Success {
				t.Fatalf("settle once funded: %+v %v", s, err)
			}
		})
	}
}

// The payer's side of a failed simulation stays the payment's fault,
// whatever the fee payer's state: a payer whose token account holds too
// little, or who has no token account at all, is refused as
// invalid_exact_svm_transaction_simulation_failed.
func TestPayerShortOfTokensIsThePaymentsFault(t *testing.T) {
	e := newEnv(t, Config{})
	ctx := context.Background()
	short := testKey("payer short of tokens")
	e.chain.SetTokenBalance(pub(short).String(), solanachain.USDC, 19999, "")
	for _, tc := range []struct {
		name      string
		authority ed25519.PrivateKey
	}{
		{name: "token account too low", authority: short},
		{name: "no token account", authority: testKey("payer with no token account")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := e.payment(t)
			p.Authority = tc.authority
			v, err := e.f.Verify(ctx, Payload(p.Transaction(), e.req), e.req)
			if err != nil || v.IsValid || v.InvalidReason != ReasonSimulationFailed {
				t.Fatalf("verify: %+v, err %v; want %s", v, err, ReasonSimulationFailed)
			}
			t.Logf("%s: %s", tc.name, v.InvalidMessage)
		})
	}
}

// A node carrying the fee payer's failure in a preflight refusal (-32002
// with the transaction error in its data, as some providers answer a
// simulation) is the same outage; a refusal naming another account's
// shortfall is still the payment's fault.
func TestFeePayerFailureInAPreflightRefusal(t *testing.T) {
	e := newEnv(t, Config{})
	ctx := context.Background()
	for _, c := range []struct {
		name, err string
		feePayers bool
	}{
		{"no fee payer account", `"AccountNotFound"`, true},
		{"fee payer short of the fee", `"InsufficientFundsForFee"`, true},
		{"fee payer below rent", `{"InsufficientFundsForRent":{"account_index":0}}`, true},
		{"another account below rent", `{"InsufficientFundsForRent":{"account_index":2}}`, false},
		{"a token program error", `{"InstructionError":[2,{"Custom":1}]}`, false},
		{"stale blockhash", `"BlockhashNotFound"`, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := e.f.cfg
			cfg.RPC = &RPC{URL: troubledNode(t, e.chain.URL, 200,
				`{"jsonrpc":"2.0","id":1,"error":{"code":-32002,"message":"Transaction simulation failed","data":{"err":`+c.err+`,"logs":[]}}}`)}
			f, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			p := e.payment(t)
			v, err := f.Verify(ctx, Payload(p.withMemo(c.name), e.req), e.req)
			if c.feePayers {
				if err == nil || !strings.Contains(err.Error(), "fee payer "+pub(e.fee).String()) {
					t.Fatalf("verify: %+v, err %v; want an error naming the fee payer", v, err)
				}
				return
			}
			if err != nil || v.IsValid || v.InvalidReason != ReasonSimulationFailed {
				t.Fatalf("verify: %+v, err %v; want %s", v, err, ReasonSimulationFailed)
			}
		})
	}
}
