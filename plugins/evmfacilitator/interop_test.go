package evmfacilitator

import (
	"bytes"
	"context"
	"encoding/json"
	"math/big"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/crypto"

	"github.com/aovhq/aov/internal/interop"
	"github.com/aovhq/aov/x402"
)

func TestDevAccountsMatchTheMnemonic(t *testing.T) {
	var derived []struct{ Address, PrivateKey string }
	interop.Run(t, "derive-accounts.mjs", nil, nil, &derived)
	accts := DevAccounts()
	if len(derived) != len(accts) {
		t.Fatalf("viem derived %d accounts", len(derived))
	}
	for i, a := range accts {
		if derived[i].Address != a.Address.Hex() || derived[i].PrivateKey != a.PrivateKeyHex {
			t.Errorf("account %d: viem derives %s / %s, devnet documents %s / %s", i, derived[i].Address, derived[i].PrivateKey, a.Address.Hex(), a.PrivateKeyHex)
		}
	}
}

// officialSign has the official x402 client pay for req with key.
func officialSign(t testing.TB, keyHex string, req x402.PaymentRequirements) (string, x402.PaymentPayload) {
	t.Helper()
	pr := x402.PaymentRequired{X402Version: 2, Resource: x402.Resource{URL: "https://example.com/verify/schema", MimeType: "application/json"}, Accepts: []x402.PaymentRequirements{req}}
	var out struct {
		Header  string          `json:"header"`
		Payload json.RawMessage `json:"payload"`
	}
	interop.Run(t, "x402-client-sign.mjs", nil, map[string]any{"privateKey": keyHex, "paymentRequired": pr}, &out)
	p, err := x402.DecodePaymentSignature(out.Header)
	if err != nil {
		t.Fatalf("decoding the official client's PAYMENT-SIGNATURE: %v", err)
	}
	return out.Header, p
}

// TestOfficialClientPaymentVerifiesAndSettles: a payment signed by the
// official @x402/core + @x402/evm client is valid for our facilitator and
// settles on the devnet.
func TestOfficialClientPaymentVerifiesAndSettles(t *testing.T) {
	interop.Dir(t)
	e := newEnv(t)
	req := e.requirements(payee, amount)
	_, p := officialSign(t, DevAccounts()[1].PrivateKeyHex, req)
	from := DevAccounts()[1].Address
	before := usdcBalance(t, e.d, from)

	v, err := e.f.Verify(context.Background(), p, req)
	if err != nil || !v.IsValid || v.Payer != from.Hex() {
		t.Fatalf("verify = %+v, %v", v, err)
	}
	s, err := e.f.Settle(context.Background(), p, req)
	if err != nil || !s.Success {
		t.Fatalf("settle = %+v, %v", s, err)
	}
	if d := new(big.Int).Sub(before, usdcBalance(t, e.d, from)); d.String() != amount {
		t.Errorf("payer paid %v, want %s", d, amount)
	}
}

// TestOfficialFacilitatorClientAcceptsOurAnswers: the official
// HTTPFacilitatorClient (what @x402/express and other resource servers use)
// talks to our facilitator HTTP API and reads its answers.
func TestOfficialFacilitatorClientAcceptsOurAnswers(t *testing.T) {
	interop.Dir(t)
	e := newEnv(t)
	srv := httptest.NewServer(x402.NewFacilitatorHandler(e.f))
	defer srv.Close()
	req := e.requirements(payee, amount)
	_, p := officialSign(t, DevAccounts()[3].PrivateKeyHex, req)

	type result struct {
		Supported *x402.SupportedResponse `json:"supported"`
		Verify    json.RawMessage         `json:"verify"`
		Settle    json.RawMessage         `json:"settle"`
	}
	var out result
	interop.Run(t, "facilitator-client.mjs", nil, map[string]any{"url": srv.URL, "paymentPayload": p, "paymentRequirements": req,
		"ops": []string{"supported", "verify", "settle"}}, &out)
	if out.Supported == nil || len(out.Supported.Kinds) != 1 || out.Supported.Kinds[0].Network != DevnetNetwork {
		t.Errorf("supported = %+v", out.Supported)
	}
	var v x402.VerifyResponse
	if err := json.Unmarshal(out.Verify, &v); err != nil || !v.IsValid {
		t.Errorf("verify = %s", out.Verify)
	}
	var s x402.SettleResponse
	if err := json.Unmarshal(out.Settle, &s); err != nil || !s.Success || s.Network != DevnetNetwork || len(s.Transaction) != 66 {
		t.Errorf("settle = %s", out.Settle)
	}

	t.Run("a refused payment reaches the official client as an answer with its reason", func(t *testing.T) {
		bad := req
		bad.Amount = "30000"
		var out result
		interop.Run(t, "facilitator-client.mjs", nil, map[string]any{"url": srv.URL, "paymentPayload": p, "paymentRequirements": bad,
			"ops": []string{"verify", "settle"}}, &out)
		var v x402.VerifyResponse
		if err := json.Unmarshal(out.Verify, &v); err != nil || v.IsValid || v.InvalidReason != x402.ReasonExactEVMValueMismatch {
			t.Errorf("verify = %s", out.Verify)
		}
		// The official client throws a SettleError for success:false; either
		// way the reason must reach it.
		if !strings.Contains(string(out.Settle), x402.ReasonExactEVMValueMismatch) {
			t.Errorf("settle = %s", out.Settle)
		}
	})
}

// TestOfficialFacilitatorSettlesOnDevnet: the official x402Facilitator, with
// viem pointed at the devnet's JSON-RPC port, verifies and settles a payment
// our Go client signed, asked through our HTTP facilitator client.
func TestOfficialFacilitatorSettlesOnDevnet(t *testing.T) {
	interop.Dir(t)
	d := startDevnet(t, DevnetConfig{RPCListen: "127.0.0.1:0"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var started struct{ URL string }
	stderr := interop.Start(t, "facilitator-server.mjs", []string{"RPC_URL=" + d.RPCURL(), "PRIVATE_KEY=" + DevAccounts()[0].PrivateKeyHex, "NETWORK=" + DevnetNetwork}, &started)

	remote := x402.NewHTTPFacilitator(x402.HTTPFacilitatorConfig{URL: started.URL, Timeout: 60 * time.Second})
	req := x402.PaymentRequirements{Scheme: x402.SchemeExact, Network: DevnetNetwork, Amount: amount,
		Asset: d.Token().Hex(), PayTo: payee.Hex(), MaxTimeoutSeconds: 60, Extra: map[string]any{"name": "USD Coin", "version": "2"}}
	key := DevKey(5)
	from := crypto.PubkeyToAddress(key.PublicKey)
	p := mustSignExact(t, key, req)
	before := usdcBalance(t, d, from)

	sup, err := remote.Supported(ctx)
	if err != nil || len(sup.Kinds) == 0 {
		t.Fatalf("supported = %+v, %v", sup, err)
	}
	v, err := remote.Verify(ctx, p, req)
	if err != nil || !v.IsValid {
		t.Fatalf("official verify = %+v, %v\n%s", v, err, stderr())
	}
	s, err := remote.Settle(ctx, p, req)
	if err != nil || !s.Success {
		t.Fatalf("official settle = %+v, %v\n%s", s, err, stderr())
	}
	if got := new(big.Int).Sub(before, usdcBalance(t, d, from)); got.String() != amount {
		t.Errorf("payer paid %v, want %s", got, amount)
	}
	t.Run("the official facilitator refuses a replay on the devnet", func(t *testing.T) {
		s, err := remote.Settle(ctx, p, req)
		if err == nil && s.Success {
			t.Fatalf("replay settled: %+v", s)
		}
		if usdcBalance(t, d, from).Cmp(new(big.Int).Sub(before, big.NewInt(20000))) != 0 {
			t.Error("the replay moved test USDC")
		}
	})
}

// TestCompiledContractsMatchSource recompiles contracts/*.sol with the
// pinned solc-js and compares with the committed ABI and bytecode.
func TestCompiledContractsMatchSource(t *testing.T) {
	dir := interop.Dir(t)
	out := t.TempDir()
	cmd := exec.Command("node", filepath.Join(dir, "..", "contracts", "build.mjs"), "--out", out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build.mjs: %v\n%s", err, b)
	}
	for _, f := range []string{"TestUSDC.abi.json", "TestUSDC.bin", "TestSmartWallet.abi.json", "TestSmartWallet.bin"} {
		fresh, err := os.ReadFile(filepath.Join(out, f))
		if err != nil {
			t.Fatal(err)
		}
		committed, err := os.ReadFile(filepath.Join("devnet", f))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(fresh, committed) {
			t.Errorf("devnet/%s differs from a fresh compile of contracts/: run `node contracts/build.mjs` and commit", f)
		}
	}
}
