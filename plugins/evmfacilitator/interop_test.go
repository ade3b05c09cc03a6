package evmfacilitator

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math/big"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/crypto"

	"github.com/aovhq/aov/x402"
)

// interopDir returns the npm peer folder. Without its node_modules the test
// is skipped with the command that installs them, except under CI (CI set),
// where missing peers are a failure.
func interopDir(t testing.TB) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", "..", "interop"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@x402", "core")); err != nil {
		msg := "npm peers not installed: run `npm ci` in interop/ (make test does) to run the real-peer tests"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	if _, err := exec.LookPath("node"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("node is not on PATH")
		}
		t.Skip("node is not on PATH; the real-peer tests need Node 20")
	}
	return dir
}

// runNode runs an interop script with input as JSON on stdin and decodes
// its JSON stdout into out.
func runNode(t testing.TB, script string, input, out any) {
	t.Helper()
	dir := interopDir(t)
	in, err := json.Marshal(input)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", script)
	cmd.Dir = dir
	cmd.Stdin = bytes.NewReader(in)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("node %s: %v\n%s", script, err, stderr.String())
	}
	if err := json.Unmarshal(stdout.Bytes(), out); err != nil {
		t.Fatalf("node %s printed %q: %v", script, stdout.String(), err)
	}
}

func TestDevAccountsMatchTheMnemonic(t *testing.T) {
	var derived []struct{ Address, PrivateKey string }
	runNode(t, "derive-accounts.mjs", nil, &derived)
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
	runNode(t, "x402-client-sign.mjs", map[string]any{"privateKey": keyHex, "paymentRequired": pr}, &out)
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
	interopDir(t)
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
	interopDir(t)
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
	runNode(t, "facilitator-client.mjs", map[string]any{"url": srv.URL, "paymentPayload": p, "paymentRequirements": req,
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
		runNode(t, "facilitator-client.mjs", map[string]any{"url": srv.URL, "paymentPayload": p, "paymentRequirements": bad,
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
	dir := interopDir(t)
	d := startDevnet(t, DevnetConfig{RPCListen: "127.0.0.1:0"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "facilitator-server.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "RPC_URL="+d.RPCURL(), "PRIVATE_KEY="+DevAccounts()[0].PrivateKeyHex, "NETWORK="+DevnetNetwork)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cancel()
			<-done
		}
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("official facilitator did not start: %v\n%s", err, stderr.String())
	}
	go io.Copy(io.Discard, stdout)
	var started struct{ URL string }
	if err := json.Unmarshal([]byte(line), &started); err != nil {
		t.Fatalf("official facilitator said %q", line)
	}

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
		t.Fatalf("official verify = %+v, %v\n%s", v, err, stderr.String())
	}
	s, err := remote.Settle(ctx, p, req)
	if err != nil || !s.Success {
		t.Fatalf("official settle = %+v, %v\n%s", s, err, stderr.String())
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
	dir := interopDir(t)
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
