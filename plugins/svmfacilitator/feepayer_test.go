package svmfacilitator

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
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
// operator's outage, not the buyer's payment: Verify returns an error
// naming the fee payer (the gateway answers 503, nothing charged, the same
// payment can be sent again once it is funded), Settle an unknown outcome
// naming the transaction and caused by it (no verdict on the payment, and
// only the record would tell a send before a restart), and nothing moves.
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
			var unknown *x402.UnknownOutcomeError
			if !errors.As(err, &unknown) || unknown.Reply == nil || unknown.Reply.Transaction == "" || !strings.Contains(err.Error(), "fee payer "+pub(key).String()) {
				t.Errorf("settle: %+v, err %v; want an unknown outcome naming the transaction, caused by the fee payer", s, err)
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
// simulation) is judged as a failed simulation: a missing fee payer is the
// outage, a fee payer short of the fee is the outage only when it cannot
// pay a base fee and stay rent-exempt (else the payment's priority fee is
// what it cannot pay), and a refusal naming another account's shortfall is
// the payment's fault.
func TestFeePayerFailureInAPreflightRefusal(t *testing.T) {
	e := newEnv(t, Config{})
	ctx := context.Background()
	low := testKey("preflight fee payer short of a base fee")
	e.chain.Airdrop(pub(low).String(), 890_880+1000)
	for _, c := range []struct {
		name, err string
		low       bool // the fee payer holds less than rent and a base fee
		feePayers bool
	}{
		{"no fee payer account", `"AccountNotFound"`, false, true},
		{"fee payer short of the fee", `"InsufficientFundsForFee"`, true, true},
		{"fee payer below rent", `{"InsufficientFundsForRent":{"account_index":0}}`, true, true},
		{"funded fee payer short of the fee", `"InsufficientFundsForFee"`, false, false},
		{"funded fee payer below rent", `{"InsufficientFundsForRent":{"account_index":0}}`, false, false},
		{"another account below rent", `{"InsufficientFundsForRent":{"account_index":2}}`, false, false},
		{"a token program error", `{"InstructionError":[2,{"Custom":1}]}`, false, false},
		{"stale blockhash", `"BlockhashNotFound"`, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := e.f.cfg
			cfg.RPC = &RPC{URL: troubledNode(t, e.chain.URL, 200,
				`{"jsonrpc":"2.0","id":1,"error":{"code":-32002,"message":"Transaction simulation failed","data":{"err":`+c.err+`,"logs":[]}}}`)}
			p, req, fee := e.payment(t), e.req, e.fee
			if c.low {
				fee = low
				p.FeePayer = pub(low)
				req.Extra = map[string]any{"feePayer": pub(low).String()}
			}
			cfg.FeePayer = fee
			f, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			v, err := f.Verify(ctx, Payload(p.withMemo(c.name), req), req)
			if c.feePayers {
				if err == nil || !strings.Contains(err.Error(), "fee payer "+pub(fee).String()) {
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

// The buyer chooses the priority fee the fee payer pays (within the
// facilitator's caps). A fee payer funded for every ordinary payment
// (rent exemption and 100,000 lamports) cannot pay the largest priority
// fee the caps allow (50,000 units × 5,000,000 micro-lamports: 250,000
// lamports), and the simulation fails on account 0; that payment is
// refused as invalid_exact_svm_transaction_simulation_failed, told to
// lower its priority fee, while an ordinary one from the same buyer
// verifies. (Before: the fee payer's outage, an error: the gateway's 503,
// uncounted, "send the same payment again", at the buyer's will.)
func TestBuyersPriorityFeeBeyondTheFeePayerIsThePaymentsFault(t *testing.T) {
	e := newEnv(t, Config{})
	ctx := context.Background()
	key := testKey("fee payer funded for ordinary payments")
	e.chain.Airdrop(pub(key).String(), 890_880+100_000)
	f, req := withFeePayer(t, e, key)

	p := e.payment(t)
	p.FeePayer = pub(key)
	if v, err := f.Verify(ctx, Payload(p.Transaction(), req), req); err != nil || !v.IsValid {
		t.Fatalf("ordinary payment: %+v, err %v; want valid", v, err)
	}

	ixs := p.Instructions()
	ixs[0] = ComputeLimitIx(uint32(f.cfg.MaxComputeUnits))
	ixs[1] = ComputePriceIx(f.cfg.MaxComputeUnitPrice)
	p.Memo = "priority fee at the caps"
	v, err := f.Verify(ctx, Payload(p.Build(ixs), req), req)
	if err != nil || v.IsValid || v.InvalidReason != ReasonSimulationFailed || !strings.Contains(v.InvalidMessage, "lower priority fee") {
		t.Fatalf("payment at the fee caps: %+v, err %v; want %s telling to lower the priority fee", v, err, ReasonSimulationFailed)
	}
	t.Logf("%s", v.InvalidMessage)
}

// A fee payer's shortfall with the balance unreadable (the node fails
// getBalance) is an error, never a refusal nor a pass: nothing is known of
// whose fault it is, so nothing is charged and the same payment can be
// sent again.
func TestFeePayerShortfallWithTheBalanceUnreadableIsAnError(t *testing.T) {
	e := newEnv(t, Config{})
	node := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var req struct {
			Method string `json:"method"`
		}
		json.Unmarshal(b, &req)
		switch req.Method {
		case "simulateTransaction":
			io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{"context":{"slot":1},"value":{"err":"InsufficientFundsForFee","logs":[]}}}`)
			return
		case "getBalance":
			w.WriteHeader(http.StatusBadGateway)
			io.WriteString(w, `{"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"upstream down"}}`)
			return
		}
		resp, err := http.Post(e.chain.URL, "application/json", bytes.NewReader(b))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		io.Copy(w, resp.Body)
	}))
	t.Cleanup(node.Close)
	cfg := e.f.cfg
	cfg.RPC = &RPC{URL: node.URL}
	f, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	v, err := f.Verify(context.Background(), Payload(e.payment(t).Transaction(), e.req), e.req)
	if err == nil || !strings.Contains(err.Error(), "reading its balance") {
		t.Fatalf("verify: %+v, err %v; want an error reading the fee payer's balance", v, err)
	}
}
