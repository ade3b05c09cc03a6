package caddymodule

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	neturl "net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/internal/interop"
	"github.com/aovhq/aov/internal/solanachain"
	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/plugins/svmfacilitator"
	"github.com/aovhq/aov/x402"
)

// solanaEnv is a local Solana chain with the facilitator's fee payer
// funded and its key in a 0600 file.
type solanaEnv struct {
	chain   *solanachain.Chain
	keyFile string
	feePay  string
	payer   solanachain.Wallet // pays (1,000 USDC)
	payee   solanachain.Wallet // receives
}

func newSolanaEnv(t *testing.T) *solanaEnv {
	t.Helper()
	seed := sha256.Sum256([]byte("caddymodule svm fee payer"))
	key := ed25519.NewKeyFromSeed(seed[:])
	fee := base58.Encode(key.Public().(ed25519.PublicKey))
	chain := solanachain.Start(t, fee)
	keyFile := filepath.Join(t.TempDir(), "fee-payer.key")
	if err := os.WriteFile(keyFile, []byte(base58.Encode(key)), 0o600); err != nil {
		t.Fatal(err)
	}
	return &solanaEnv{chain: chain, keyFile: keyFile, feePay: fee, payer: chain.Wallets[0], payee: chain.Wallets[1]}
}

func (e *solanaEnv) svmBlock() string {
	return fmt.Sprintf("svm {\n\t\t\t\t\tnetwork solana-devnet\n\t\t\t\t\trpc_url %s\n\t\t\t\t\tfee_payer_key_file %s\n\t\t\t\t}", e.chain.URL, e.keyFile)
}

func (e *solanaEnv) usdc(t *testing.T, owner string) int64 {
	t.Helper()
	o, _ := svmfacilitator.ParsePublicKey(owner)
	m, _ := svmfacilitator.ParsePublicKey(solanachain.USDC)
	return e.chain.TokenBalance(svmfacilitator.AssociatedTokenAddress(o, m, svmfacilitator.TokenProgram).String())
}

func (e *solanaEnv) clientInput() map[string]any {
	return map[string]any{"secretKey": e.payer.SecretKey, "rpcUrl": e.chain.URL}
}

// dualSite offers the EVM devnet and Solana devnet side by side on one
// route, through one multi facilitator, and the same on an MCP tool.
func dualSite(up, mcpUp, evmFac string, e *solanaEnv) string {
	fac := fmt.Sprintf(`facilitator multi {
				http %s
				%s
			}`, evmFac, e.svmBlock())
	return fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept devnet $0.02 %[3]s
			accept solana-devnet $0.02 %[4]s
			%[5]s
			store badger {data}/gate
			validate verify_request
		}
		reverse_proxy %[1]s
	}
	route /mcp {
		x402 {
			mcp_tool verify_schema
			accept devnet $0.02 %[3]s
			accept solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1 $0.02 %[4]s
			%[5]s
			store badger {data}/gate
			validate verify_request
		}
		reverse_proxy %[2]s
	}
}
`, strings.TrimPrefix(up, "http://"), strings.TrimPrefix(mcpUp, "http://"), payTo.Hex(), e.payee.Address, fac)
}

// TestSolanaOfferCarriesTheFacilitatorsFeePayer: the 402 lists both
// networks, the Solana offer with extra.feePayer from /supported.
func TestSolanaOfferCarriesTheFacilitatorsFeePayer(t *testing.T) {
	_, fac := sharedDevnet(t)
	e := newSolanaEnv(t)
	base := startCaddy(t, dualSite(newUpstream(t).URL, newMCPUpstream(t).URL, fac, e))
	resp := post(t, base+"/verify/schema", validRequest, nil)
	if resp.StatusCode != 402 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	pr := paymentRequired(t, resp)
	if len(pr.Accepts) != 2 {
		t.Fatalf("PAYMENT-REQUIRED: %+v", pr)
	}
	sol := pr.Accepts[1]
	if sol.Network != x402.NetworkSolanaDevnet || sol.Asset != solanachain.USDC || sol.Amount != "20000" || sol.PayTo != e.payee.Address || sol.Extra["feePayer"] != e.feePay {
		t.Fatalf("solana offer %+v", sol)
	}
	if pr.Accepts[0].Network != evmfacilitator.DevnetNetwork || pr.Accepts[0].Extra["feePayer"] != nil {
		t.Fatalf("evm offer %+v", pr.Accepts[0])
	}
}

// TestOfficialSolanaClientPaysTheGate: @x402/fetch with @x402/svm pays a
// route that also offers Base; then the EVM client pays the same route.
func TestOfficialSolanaClientPaysTheGate(t *testing.T) {
	d, fac := sharedDevnet(t)
	e := newSolanaEnv(t)
	up := newUpstream(t)
	base := startCaddy(t, dualSite(up.URL, newMCPUpstream(t).URL, fac, e))
	payerBefore, payeeBefore := e.usdc(t, e.payer.Address), e.usdc(t, e.payee.Address)

	var res fetchResult
	interop.Run(t, "x402-fetch-pay.mjs", nil, map[string]any{
		"solana": e.clientInput(), "url": base + "/verify/schema", "method": "POST", "body": validRequest,
	}, &res)
	if res.Status != 200 || res.PaymentResponse == nil || !res.PaymentResponse.Success || res.PaymentResponse.Network != x402.NetworkSolanaDevnet || res.PaymentResponse.Payer != e.payer.Address {
		t.Fatalf("status %d, PAYMENT-RESPONSE %+v: %s", res.Status, res.PaymentResponse, res.Body)
	}
	var body map[string]any
	if err := json.Unmarshal([]byte(res.Body), &body); err != nil || body["payment"] != "paid" || body["network"] != x402.NetworkSolanaDevnet || body["payer"] != e.payer.Address {
		t.Fatalf("upstream saw %s", res.Body)
	}
	if got := payerBefore - e.usdc(t, e.payer.Address); got != 20000 {
		t.Fatalf("payer charged %d", got)
	}
	if got := e.usdc(t, e.payee.Address) - payeeBefore; got != 20000 {
		t.Fatalf("payee received %d", got)
	}

	// The same route, paid on the EVM devnet.
	evmPayer := evmfacilitator.DevAccounts()[2]
	before := balance(t, d, evmPayer.Address)
	interop.Run(t, "x402-fetch-pay.mjs", nil, map[string]any{
		"privateKey": evmPayer.PrivateKeyHex, "url": base + "/verify/schema", "method": "POST", "body": validRequest,
	}, &res)
	if res.Status != 200 || res.PaymentResponse == nil || res.PaymentResponse.Network != evmfacilitator.DevnetNetwork {
		t.Fatalf("evm: status %d %+v", res.Status, res.PaymentResponse)
	}
	if got := new(big.Int).Sub(before, balance(t, d, evmPayer.Address)); got.Cmp(big.NewInt(20000)) != 0 {
		t.Fatalf("evm payer charged %v", got)
	}
}

// TestSolanaReplayIsRefused: a paid PAYMENT-SIGNATURE sent again, and the
// same transaction re-encoded with other bytes in the fee payer's slot, are
// refused before any facilitator is asked; the payer pays once.
func TestSolanaReplayIsRefused(t *testing.T) {
	_, fac := sharedDevnet(t)
	e := newSolanaEnv(t)
	base := startCaddy(t, dualSite(newUpstream(t).URL, newMCPUpstream(t).URL, fac, e))
	resp := post(t, base+"/verify/schema", validRequest, nil)
	pr := paymentRequired(t, resp)
	pr.Accepts = pr.Accepts[1:] // the Solana offer
	var signed struct {
		Header  string              `json:"header"`
		Payload x402.PaymentPayload `json:"payload"`
	}
	interop.Run(t, "x402-client-sign.mjs", nil, map[string]any{"solana": e.clientInput(), "paymentRequired": pr}, &signed)
	before := e.usdc(t, e.payer.Address)
	if r := post(t, base+"/verify/schema", validRequest, map[string]string{x402.HeaderPaymentSignature: signed.Header}); r.StatusCode != 200 {
		t.Fatalf("first payment: status %d", r.StatusCode)
	}

	// Re-encode: the same message with a different (still empty-looking)
	// fee payer slot.
	var pl struct {
		Transaction string `json:"transaction"`
	}
	json.Unmarshal(signed.Payload.Payload, &pl)
	raw, _ := base64.StdEncoding.DecodeString(pl.Transaction)
	raw[1] ^= 0xff
	other := signed.Payload
	other.Payload, _ = json.Marshal(map[string]string{"transaction": base64.StdEncoding.EncodeToString(raw)})
	otherHeader, err := x402.EncodeHeader(other)
	if err != nil {
		t.Fatal(err)
	}
	for name, h := range map[string]string{"same header": signed.Header, "re-encoded": otherHeader} {
		r := post(t, base+"/verify/schema", validRequest, map[string]string{x402.HeaderPaymentSignature: h})
		if r.StatusCode == 200 {
			t.Fatalf("%s: replay served", name)
		}
	}
	if got := before - e.usdc(t, e.payer.Address); got != 20000 {
		t.Fatalf("payer charged %d, want one payment", got)
	}
}

// TestOfficialSolanaClientPaysAnMCPTool: the official MCP SDK client pays
// a tool on Solana through _meta["x402/payment"].
func TestOfficialSolanaClientPaysAnMCPTool(t *testing.T) {
	_, fac := sharedDevnet(t)
	e := newSolanaEnv(t)
	mcpUp := newMCPUpstream(t)
	base := startCaddy(t, dualSite(newUpstream(t).URL, mcpUp.URL, fac, e))
	before := e.usdc(t, e.payer.Address)
	var out struct {
		Calls []struct {
			Paid *struct {
				IsError         bool                 `json:"isError"`
				PaymentResponse *x402.SettleResponse `json:"paymentResponse"`
			} `json:"paid"`
		} `json:"calls"`
	}
	interop.Run(t, "mcp-pay.mjs", nil, map[string]any{
		"url": base + "/mcp", "solana": e.clientInput(),
		"calls": []map[string]any{{"name": "verify_schema", "arguments": verifyArgs}},
	}, &out)
	if len(out.Calls) != 1 || out.Calls[0].Paid == nil || out.Calls[0].Paid.IsError {
		t.Fatalf("calls %+v", out.Calls)
	}
	pr := out.Calls[0].Paid.PaymentResponse
	if pr == nil || !pr.Success || pr.Network != x402.NetworkSolanaDevnet || pr.Payer != e.payer.Address {
		t.Fatalf("payment response %+v", pr)
	}
	if got := before - e.usdc(t, e.payer.Address); got != 20000 {
		t.Fatalf("payer charged %d", got)
	}
}

// TestSVMFacilitatorKeyFileMustBePrivate: a key others can read is refused
// at provisioning, without echoing it.
func TestSVMFacilitatorKeyFileMustBePrivate(t *testing.T) {
	dir := t.TempDir()
	seed := sha256.Sum256([]byte("open key"))
	secret := base58.Encode(ed25519.NewKeyFromSeed(seed[:]))
	file := filepath.Join(dir, "k")
	os.WriteFile(file, []byte(secret), 0o644)
	m := &SVMFacilitator{Network: "solana-devnet", RPCURL: "http://127.0.0.1:1", FeePayerKeyFile: file}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	err := m.Provision(ctx)
	if err == nil || !strings.Contains(err.Error(), "readable by others") || strings.Contains(err.Error(), secret) {
		t.Fatalf("err = %v", err)
	}
	os.Chmod(file, 0o600)
	if err := m.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	defer m.Cleanup()
	s, _ := m.Supported(t.Context())
	if len(s.Kinds) != 1 || s.Kinds[0].Extra["feePayer"] == nil || len(s.Signers["solana:*"]) != 1 {
		t.Fatalf("supported %+v", s)
	}
}

// TestSVMDevFeePayerSettlesOnTheLocalChain: with dev_fee_payer the gateway
// settles out of the box on the local chain, which funds that key; it is
// refused on mainnet.
func TestSVMDevFeePayerSettlesOnTheLocalChain(t *testing.T) {
	e := newSolanaEnv(t)
	if dev := base58.Encode(svmfacilitator.DevFeePayer().Public().(ed25519.PublicKey)); dev != e.chain.FeePayer {
		t.Fatalf("the chain funds %s, the facilitator's dev fee payer is %s", e.chain.FeePayer, dev)
	}
	up := newUpstream(t)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /paid {
		x402 {
			accept solana-devnet $0.03 %s
			facilitator svm {
				network solana-devnet
				rpc_url %s
				dev_fee_payer
			}
			store badger {data}/gate
		}
		reverse_proxy %s
	}
}
`, e.payee.Address, e.chain.URL, strings.TrimPrefix(up.URL, "http://")))
	payOnSolana(t, e, base+"/paid", 30000)

	m := &SVMFacilitator{Network: "solana", RPCURL: "http://127.0.0.1:1", DevFeePayer: true}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	if err := m.Provision(ctx); err == nil || !strings.Contains(err.Error(), "solana-devnet only") {
		t.Fatalf("dev_fee_payer on mainnet: %v", err)
	}
}

// TestSolanaOfferWithoutAFeePayerRefusesTheConfig: a Solana offer whose
// facilitator does not list the network (so no fee payer) cannot be paid;
// the config is refused instead of serving an unpayable 402.
func TestSolanaOfferWithoutAFeePayerRefusesTheConfig(t *testing.T) {
	_, fac := sharedDevnet(t) // settles eip155:1337 only
	cfg := fmt.Sprintf(`{
	admin off
	auto_https off
	persist_config off
	storage file_system %s
}
:%d {
	x402 {
		accept solana-devnet $0.02 14KUD4SQBR4pLAkg3VriijtxQdxZSrzYqHhSxtordWsx
		facilitator http %s
		store badger %s
	}
}
`, t.TempDir(), freePort(t), fac, t.TempDir())
	js, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatal(err)
	}
	err = caddy.Load(js, true)
	if err == nil {
		caddy.Stop()
		t.Fatal("a Solana offer without a fee payer was loaded")
	}
	if !strings.Contains(err.Error(), "lists no fee payer") {
		t.Fatalf("err = %v", err)
	}
}

// An accept block names the network's USDC by its address: an EVM address
// in any letter case (checksums are presentation), a Solana mint exactly
// (base58 is case-sensitive, so a mint spelt in another case is another
// mint, or none). Taking a re-cased mint for USDC priced and paid the offer
// in a token the operator did not write.
func TestAcceptNamesUSDCByTheNetworksAddressRule(t *testing.T) {
	sol, _ := x402.USDC(x402.NetworkSolana)
	other := "e" + sol.Address[1:]                               // EPjF… with its first letter in lower case
	const payee = "7a6yHkLKfLk38kRwUydqCpWMHyxDP7b4KFfzayNowk8N" // any account but the mint
	req, _, err := Accept{Network: "solana", Asset: other, Price: "$0.01", PayTo: payee}.requirements()
	if err != nil {
		t.Fatal(err)
	}
	if req.Asset != other {
		t.Errorf("asset %s (a re-cased USDC mint) became %s", other, req.Asset)
	}
	req, _, err = Accept{Network: "solana", Asset: sol.Address, Price: "$0.01", PayTo: payee}.requirements()
	if err != nil || req.Asset != sol.Address {
		t.Errorf("the USDC mint itself: %+v, %v", req, err)
	}

	base, _ := x402.USDC(x402.NetworkBase)
	req, _, err = Accept{Network: "base", Asset: strings.ToLower(base.Address), Price: "$0.01", PayTo: payTo.Hex()}.requirements()
	if err != nil || req.Asset != base.Address || req.Extra["name"] != base.Name {
		t.Errorf("Base USDC in lower case: %+v, %v; want USDC with its domain", req, err)
	}
}

// fakeDownFacilitators are FAKES FOR A FAULT: a remote facilitator that is
// down (a port nothing listens on) and one that is up but overloaded (503
// with Retry-After on every call).
func fakeDownFacilitators(t *testing.T) map[string]string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + l.Addr().String()
	l.Close()
	busy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(busy.Close)
	return map[string]string{"down": dead, "answering 503": busy.URL}
}

// A multi facilitator's Solana offer takes its fee payer from the member
// that settles it, asked on its own: a remote EVM member that is down when
// the config loads is skipped, and the gateway serves, the Solana offer
// with its fee payer. (Before: the multi's combined /supported failed with
// any member, and the whole config was refused: every route down, free
// ones and /health included.)
func TestMultiFacilitatorLoadsWithARemoteMemberDown(t *testing.T) {
	e := newSolanaEnv(t)
	for name, remote := range fakeDownFacilitators(t) {
		t.Run(name, func(t *testing.T) {
			base := startCaddy(t, fmt.Sprintf(`:{port} {
	handle /health {
		respond "ok" 200
	}
	route /paid {
		x402 {
			accept devnet $0.02 %[1]s
			accept solana-devnet $0.02 %[2]s
			facilitator multi {
				http %[3]s
				%[4]s
			}
			store badger {data}/gate
		}
		respond "paid content" 200
	}
}
`, payTo.Hex(), e.payee.Address, remote, e.svmBlock()))
			if resp := post(t, base+"/health", "", nil); resp.StatusCode != http.StatusOK {
				t.Errorf("/health: %d", resp.StatusCode)
			}
			pr := paymentRequired(t, post(t, base+"/paid", "", nil))
			if len(pr.Accepts) != 2 || pr.Accepts[1].Network != x402.NetworkSolanaDevnet || pr.Accepts[1].Extra["feePayer"] != e.feePay {
				t.Errorf("PAYMENT-REQUIRED accepts %+v; want devnet, and solana-devnet with fee payer %s", pr.Accepts, e.feePay)
			}
		})
	}
}

// fakeFlakyFront is a FAKE FOR A FAULT in front of a real facilitator: it
// answers 503 until up is set, then forwards to target.
func fakeFlakyFront(t *testing.T, target string) (*httptest.Server, *atomic.Bool) {
	u, _ := neturl.Parse(target)
	rp := httputil.NewSingleHostReverseProxy(u)
	var up atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !up.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, &up
}

// A remote facilitator that settles a Solana offer and is down when the
// config loads does not refuse the config: the route serves its other
// offers, the Solana one left out of PAYMENT-REQUIRED, discovery and the
// docs (a route or MCP tool with no other offer answers 503
// upstream_unavailable with Retry-After), until a background ask learns the
// fee payer; from then on the Solana offer is listed with it, and paid.
// (Before: the config was refused, every route down until a reload after
// the remote came back.)
func TestSolanaOfferWaitsForARemoteFacilitatorDownAtLoad(t *testing.T) {
	e := newSolanaEnv(t)
	front, up := fakeFlakyFront(t, remoteSVMFacilitator(t, e))
	upstream := newUpstream(t)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	aov_docs
	x402_discovery /.well-known/x402
	route /verify/schema {
		x402 {
			accept devnet $0.02 %[1]s
			accept solana-devnet $0.02 %[2]s
			route "POST /verify/schema"
			facilitator http %[3]s
			store badger {data}/gate
		}
		reverse_proxy %[4]s
	}
	route /solana-only {
		x402 {
			accept solana-devnet $0.02 %[2]s
			facilitator http %[3]s
			store badger {data}/gate2
		}
		respond "paid content" 200
	}
	route /mcp {
		x402 {
			mcp_tool verify_schema
			accept solana-devnet $0.02 %[2]s
			facilitator http %[3]s
			store badger {data}/gate3
		}
		reverse_proxy %[5]s
	}
}
`, payTo.Hex(), e.payee.Address, front.URL, strings.TrimPrefix(upstream.URL, "http://"), strings.TrimPrefix(newMCPUpstream(t).URL, "http://")))
	toolDemand := func() map[string]any {
		res, raw := mcpRawCall(t, base+"/mcp", "verify_schema", verifyArgs, nil, nil)
		sc, _ := res["structuredContent"].(map[string]any)
		if res["isError"] != true || sc == nil {
			t.Fatalf("an unpaid MCP tool call: %.300s; want a tool error", raw)
		}
		return sc
	}
	url := base + "/verify/schema"
	pr := paymentRequired(t, post(t, url, validRequest, nil))
	if len(pr.Accepts) != 1 || pr.Accepts[0].Network != evmfacilitator.DevnetNetwork {
		t.Errorf("PAYMENT-REQUIRED while the fee payer is unknown: %+v; want the devnet offer alone", pr.Accepts)
	}
	listed := func() (docs, discovery bool) {
		for _, p := range []string{"/openapi.json", "/.well-known/x402"} {
			resp, err := http.Get(base + p)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s: %d %.200s", p, resp.StatusCode, b)
			}
			in := strings.Contains(string(b), x402.NetworkSolanaDevnet)
			if p == "/openapi.json" {
				docs = in
			} else {
				discovery = in
			}
		}
		return docs, discovery
	}
	if docs, discovery := listed(); docs || discovery {
		t.Errorf("the Solana offer is listed while its fee payer is unknown: in the docs %v, in discovery %v", docs, discovery)
	}
	if sc := toolDemand(); sc["code"] != "upstream_unavailable" {
		t.Errorf("a Solana-only MCP tool while its fee payer is unknown: %v; want upstream_unavailable", sc)
	}
	resp := post(t, base+"/solana-only", "", nil)
	if body := readJSON(t, resp); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || resp.Header.Get(x402.HeaderPaymentRequired) != "" {
		t.Errorf("a Solana-only route while its fee payer is unknown: %d %v; want 503 with Retry-After, no PAYMENT-REQUIRED", resp.StatusCode, body)
	}
	up.Store(true)
	deadline := time.Now().Add(20 * time.Second)
	for {
		pr = paymentRequired(t, post(t, url, validRequest, nil))
		if len(pr.Accepts) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("PAYMENT-REQUIRED 20 s after the remote came back: %+v; want the Solana offer too", pr.Accepts)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if sol := pr.Accepts[1]; sol.Network != x402.NetworkSolanaDevnet || sol.Extra["feePayer"] != e.feePay {
		t.Fatalf("the Solana offer once learned: %+v; want fee payer %s", sol, e.feePay)
	}
	if docs, discovery := listed(); !docs || !discovery {
		t.Errorf("the Solana offer once learned: in the docs %v, in discovery %v; want both", docs, discovery)
	}
	var signed struct {
		Header string `json:"header"`
	}
	interop.Run(t, "x402-client-sign.mjs", nil, map[string]any{"solana": e.clientInput(), "paymentRequired": pr}, &signed)
	before := e.usdc(t, e.payer.Address)
	if r := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: signed.Header}); r.StatusCode != http.StatusOK {
		t.Fatalf("a Solana payment once the fee payer is learned: %d %v", r.StatusCode, readJSON(t, r))
	}
	if got := before - e.usdc(t, e.payer.Address); got != 20000 {
		t.Fatalf("charged %d, want 20000", got)
	}
	// Each gate learns on its own, within its backoff.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		resp = post(t, base+"/solana-only", "", nil)
		if resp.StatusCode == http.StatusPaymentRequired {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Solana-only route 20 s after the remote came back: %d", resp.StatusCode)
		}
	}
	if pr := paymentRequired(t, resp); len(pr.Accepts) != 1 || pr.Accepts[0].Extra["feePayer"] != e.feePay {
		t.Fatalf("the Solana-only route once learned: %+v", pr.Accepts)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		sc := toolDemand()
		if accepts, _ := sc["accepts"].([]any); len(accepts) == 1 {
			if fp := accepts[0].(map[string]any)["extra"].(map[string]any)["feePayer"]; fp != e.feePay {
				t.Fatalf("the Solana-only MCP tool once learned: fee payer %v, want %s", fp, e.feePay)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Solana-only MCP tool 20 s after the remote came back: %v", sc)
		}
	}
}

// fakeSlowSolanaRPC is a FAKE FOR A FAULT (a slow confirmation) in front of
// the simulated Solana chain: everything is forwarded, but for delay after
// the first sendTransaction, getSignatureStatuses shows no status.
func fakeSlowSolanaRPC(t *testing.T, target string, delay time.Duration) *httptest.Server {
	var mu sync.Mutex
	var sentAt time.Time
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var call struct {
			Method string `json:"method"`
		}
		json.Unmarshal(body, &call)
		mu.Lock()
		if call.Method == "sendTransaction" && sentAt.IsZero() {
			sentAt = time.Now()
		}
		late := call.Method == "getSignatureStatuses" && !sentAt.IsZero() && time.Since(sentAt) < delay
		mu.Unlock()
		resp, err := http.Post(target, "application/json", bytes.NewReader(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if late {
			var m map[string]any
			if json.Unmarshal(out, &m) == nil {
				if res, ok := m["result"].(map[string]any); ok {
					if v, ok := res["value"].([]any); ok {
						for i := range v {
							v[i] = nil
						}
					}
				}
				out, _ = json.Marshal(m)
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(out)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// An embedded svm facilitator's settle still unconfirmed when the gate
// stops waiting (maxFacilitatorWait, here 3s), within its confirm_timeout
// 60s, is 503 settlement_pending, and the same payment's retry is served
// once the confirmation comes (after 10s), charged once: the gate's wait
// is the same for every facilitator, so a paid call fits the server's
// write timeout.
func TestSVMSettlePastTheGatesWaitIsPendingThenServed(t *testing.T) {
	old := maxFacilitatorWait
	maxFacilitatorWait = 3 * time.Second
	t.Cleanup(func() { maxFacilitatorWait = old })
	e := newSolanaEnv(t)
	rpc := fakeSlowSolanaRPC(t, e.chain.URL, 10*time.Second)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /paid {
		x402 {
			accept {
				network solana-devnet
				price $0.02
				pay_to %[1]s
				max_timeout 120s
			}
			facilitator svm {
				network solana-devnet
				rpc_url %[2]s
				fee_payer_key_file %[3]s
				confirm_timeout 60s
			}
			store badger {data}/gate
		}
		respond "paid content" 200
	}
}
`, e.payee.Address, rpc.URL, e.keyFile))
	pr := paymentRequired(t, post(t, base+"/paid", "", nil))
	var signed struct {
		Header string `json:"header"`
	}
	interop.Run(t, "x402-client-sign.mjs", nil, map[string]any{"solana": e.clientInput(), "paymentRequired": pr}, &signed)
	before := e.usdc(t, e.payer.Address)
	pay := map[string]string{x402.HeaderPaymentSignature: signed.Header}
	resp := post(t, base+"/paid", "", pay)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), "settlement_pending") {
		t.Fatalf("a Solana settlement unconfirmed when the gate stops waiting: %d %.200s; want 503 settlement_pending", resp.StatusCode, b)
	}
	for deadline := time.Now().Add(40 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		resp = post(t, base+"/paid", "", pay)
		b, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the retry 30 s after the confirmation: %d %.200s; want the paid answer", resp.StatusCode, b)
		}
	}
	if string(b) != "paid content" || resp.Header.Get(x402.HeaderPaymentResponse) == "" {
		t.Errorf("the retry's answer: %q, %s %q; want the paid content with it", b, x402.HeaderPaymentResponse, resp.Header.Get(x402.HeaderPaymentResponse))
	}
	if got := before - e.usdc(t, e.payer.Address); got != 20000 {
		t.Errorf("charged %d, want 20000", got)
	}
}

// The official paywall states the price of the first offer shown in that
// offer's own decimals: with the first configured offer a Solana one
// waiting for its fee payer (the remote facilitator down at load), the
// first shown is an 18-decimal token's 0.02. (Before: it was stated with
// the first configured offer's 6 decimals, as 20000000000.)
func TestOfficialPaywallPriceIsTheFirstLiveOffersWhileASolanaOfferWaits(t *testing.T) {
	resp, page := paywallBehindAWaitingSolanaOffer(t, "asset_decimals 18")
	pr := paymentRequired(t, resp)
	cfg := officialConfigOf(t, page)
	if len(pr.Accepts) != 1 || pr.Accepts[0].Amount != "20000000000000000" {
		t.Fatalf("accepts %+v; want the 18-decimal offer alone", pr.Accepts)
	}
	if cfg.Amount != "0.02" {
		t.Errorf("the official paywall states the price of an offer of 0.02 (18 decimals) as %q; want 0.02", cfg.Amount)
	}
}

// A first shown offer whose asset's decimals are unknown (amount, no
// asset_decimals) gets the static page, in atomic units, as Validate
// requires of the first configured offer: the official page could only
// state it in whole tokens of guessed decimals. (Before: with the Solana
// offer before it waiting, the official page said "$20000000000000000 Tok".)
func TestOfficialPaywallFallsBackToStaticForAShownOfferWithoutDecimals(t *testing.T) {
	_, page := paywallBehindAWaitingSolanaOffer(t, "")
	if windowX402.MatchString(page) {
		t.Fatalf("the official page for an offer without decimals: %.300s; want the static page", page)
	}
	if !strings.Contains(page, "20000000000000000 units of 0x1111111111111111111111111111111111111111") {
		t.Errorf("the static page does not state the amount in atomic units: %.500s", page)
	}
}

// paywallBehindAWaitingSolanaOffer serves the official paywall of a route
// whose first offer is a Solana one waiting for its fee payer (the remote
// facilitator down at load) and whose second is 20000000000000000 atomic
// units of a custom EVM token, with decimalsLine in its accept block.
func paywallBehindAWaitingSolanaOffer(t *testing.T, decimalsLine string) (*http.Response, string) {
	e := newSolanaEnv(t)
	down := fakeDownFacilitators(t)["down"]
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /paid {
		x402 {
			accept solana-devnet $0.02 %[1]s
			accept {
				network devnet
				amount 20000000000000000
				asset 0x1111111111111111111111111111111111111111
				asset_name Tok
				asset_version 1
				%[4]s
				pay_to %[2]s
			}
			facilitator http %[3]s
			paywall official
			store badger {data}/gate
		}
		respond "paid content" 200
	}
}
`, e.payee.Address, payTo.Hex(), down, decimalsLine))
	return getHTML(t, base+"/paid")
}

// fakeListingFront is a FAKE FOR A FAULT in front of a real facilitator
// (one that lists a network later, as a remote reconfigured): everything
// is forwarded, and once list is set its /supported lists also the
// network as, with the fee payer of its first kind for from.
func fakeListingFront(t *testing.T, target, from, as string) (*httptest.Server, *atomic.Bool) {
	u, _ := neturl.Parse(target)
	rp := httputil.NewSingleHostReverseProxy(u)
	var list atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !list.Load() || !strings.HasSuffix(r.URL.Path, "/supported") {
			rp.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		rp.ServeHTTP(rec, r)
		var s x402.SupportedResponse
		if err := json.Unmarshal(rec.Body.Bytes(), &s); err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		for _, k := range s.Kinds {
			if k.Network == from {
				k.Network = as
				s.Kinds = append(s.Kinds, k)
				break
			}
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(s)
	}))
	t.Cleanup(srv.Close)
	return srv, &list
}

// Two Solana offers wait for their fee payer (the remote facilitator is
// down at load); the remote comes back settling solana-devnet but not
// Solana mainnet. Each offer is asked on its own: the devnet offer is
// offered with the fee payer the remote states, the mainnet one stays out,
// and the remote's refusal of it is logged as an Error once, not every
// round; once the remote lists mainnet too, that is logged once and the
// mainnet offer is offered. (Before: one ask for both failed on the
// mainnet offer and threw away the devnet one's fee payer, so neither was
// offered until a reload, and the Error was logged every round.) The
// background asks run 2 s, 6 s and 14 s after the load.
func TestOneUnlistedSolanaOfferDoesNotKeepAnotherOut(t *testing.T) {
	e := newSolanaEnv(t)
	listing, listMainnet := fakeListingFront(t, remoteSVMFacilitator(t, e), x402.NetworkSolanaDevnet, x402.NetworkSolana)
	front, up := fakeFlakyFront(t, listing.URL)
	logFile := t.TempDir() + "/caddy.log"
	loaded := time.Now()
	base := startCaddyServers(t, "", logFile, fmt.Sprintf(`:{port} {
	route /paid {
		x402 {
			accept devnet $0.02 %[1]s
			accept solana-devnet $0.02 %[2]s
			accept solana $0.02 %[2]s
			facilitator http %[3]s
			store badger {data}/gate
		}
		respond "paid content" 200
	}
}
`, payTo.Hex(), e.payee.Address, front.URL))
	if pr := paymentRequired(t, post(t, base+"/paid", "", nil)); len(pr.Accepts) != 1 {
		t.Fatalf("while the remote is down: %+v; want the devnet offer alone", pr.Accepts)
	}
	up.Store(true)
	offered := func() []string {
		var networks []string
		for _, a := range paymentRequired(t, post(t, base+"/paid", "", nil)).Accepts {
			networks = append(networks, a.Network)
			if x402.IsSolana(a.Network) && a.Extra["feePayer"] != e.feePay {
				t.Fatalf("%s offered with fee payer %v; want %s", a.Network, a.Extra["feePayer"], e.feePay)
			}
		}
		return networks
	}
	for deadline := time.Now().Add(12 * time.Second); ; time.Sleep(300 * time.Millisecond) {
		networks := offered()
		if slices.Contains(networks, x402.NetworkSolanaDevnet) {
			if slices.Contains(networks, x402.NetworkSolana) {
				t.Fatalf("offers %v: the mainnet offer the remote does not list is offered", networks)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("12 s after the remote came back listing solana-devnet: offers %v; want the solana-devnet offer", networks)
		}
	}
	time.Sleep(time.Until(loaded.Add(8 * time.Second))) // the asks at 2 s and 6 s have run
	logs, _ := os.ReadFile(logFile)
	if n := strings.Count(string(logs), "answered without its fee payer"); n != 1 {
		t.Errorf("the remote's refusal of the mainnet offer logged %d times over two rounds; want once", n)
	}
	listMainnet.Store(true)
	for deadline := loaded.Add(20 * time.Second); !slices.Contains(offered(), x402.NetworkSolana); time.Sleep(300 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the mainnet offer is not offered after the remote listed it: %v", offered())
		}
	}
	logs, _ = os.ReadFile(logFile)
	if n := strings.Count(string(logs), "answers for it again"); n != 1 {
		t.Errorf("the remote's answer for the mainnet offer again logged %d times; want once", n)
	}
}

// A multi's Solana offer whose fee payer was learned from its second
// member (an embedded svm) while the first (a remote with another fee
// payer) was down at load: once the first is back, a payment built around
// the offer's fee payer goes to the member that manages it and is served,
// charged once. (Before: it went to the first member that lists the
// network, which refused it as fee_payer_not_managed, every Solana payment
// refused until a reload.)
func TestMultiSendsASolanaPaymentToTheMemberManagingItsFeePayer(t *testing.T) {
	e := newSolanaEnv(t)
	seed := sha256.Sum256([]byte("another fee payer"))
	other := ed25519.NewKeyFromSeed(seed[:])
	f, err := svmfacilitator.New(svmfacilitator.Config{RPC: &svmfacilitator.RPC{URL: e.chain.URL}, Network: x402.NetworkSolanaDevnet, FeePayer: other})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	remote := httptest.NewServer(x402.NewFacilitatorHandler(f))
	t.Cleanup(remote.Close)
	front, upFlag := fakeFlakyFront(t, remote.URL)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /paid {
		x402 {
			accept solana-devnet $0.02 %[1]s
			facilitator multi {
				http %[2]s
				%[3]s
			}
			store badger {data}/gate
		}
		respond "paid content" 200
	}
}
`, e.payee.Address, front.URL, e.svmBlock()))
	pr := paymentRequired(t, post(t, base+"/paid", "", nil))
	if len(pr.Accepts) != 1 || pr.Accepts[0].Extra["feePayer"] != e.feePay {
		t.Fatalf("PAYMENT-REQUIRED with the remote down: %+v; want fee payer %s", pr.Accepts, e.feePay)
	}
	upFlag.Store(true)
	time.Sleep(3 * time.Second) // the multi's 2 s backoff of the first member ends
	var signed struct {
		Header string `json:"header"`
	}
	interop.Run(t, "x402-client-sign.mjs", nil, map[string]any{"solana": e.clientInput(), "paymentRequired": pr}, &signed)
	before := e.usdc(t, e.payer.Address)
	resp := post(t, base+"/paid", "", map[string]string{x402.HeaderPaymentSignature: signed.Header})
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(b) != "paid content" {
		t.Errorf("a Solana payment built around the offer's fee payer %s, the multi's first member back with another: %d %.300s; want the paid content", e.feePay, resp.StatusCode, b)
	}
	if got := before - e.usdc(t, e.payer.Address); got != 20000 {
		t.Errorf("charged %d, want 20000", got)
	}
}
