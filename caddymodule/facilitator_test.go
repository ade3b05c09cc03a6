package caddymodule

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/ethclient"
	"github.com/redis/go-redis/v9"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// TestFacilitatorCaddyfileAdapt checks every x402_facilitator form against
// golden files in testdata/facilitator_adapt.
func TestFacilitatorCaddyfileAdapt(t *testing.T) {
	checkAdaptGoldens(t, "testdata/facilitator_adapt")
}

func TestFacilitatorCaddyfileErrors(t *testing.T) {
	cases := []struct{ desc, caddyfile, want string }{
		{"a handler without a facilitator is refused", "x402_facilitator", "needs a facilitator"},
		{"an empty block is refused", "x402_facilitator {\n}", "needs a facilitator"},
		{"two facilitators are refused", "x402_facilitator {\n\tdevnet\n\thttp http://127.0.0.1:1\n}", "takes one facilitator"},
		{"an unknown facilitator is named", "x402_facilitator {\n\tsolana\n}", "unrecognized x402_facilitator option 'solana'"},
		{"inline arguments are refused", "x402_facilitator devnet", "wrong argument count"},
		{"devnet takes no arguments", "x402_facilitator {\n\tdevnet 8545\n}", "wrong argument count"},
		{"an unknown devnet option is named", "x402_facilitator {\n\tdevnet {\n\t\tport 1\n\t}\n}", "unrecognized devnet option 'port'"},
		{"an unknown evm option is named", "x402_facilitator {\n\tevm {\n\t\tgas 1\n\t}\n}", "unrecognized evm facilitator option 'gas'"},
		{"a bad receipt timeout is refused", "x402_facilitator {\n\tevm {\n\t\treceipt_timeout soon\n\t}\n}", "bad duration"},
		{"a failure budget of no failures is refused", "x402_facilitator {\n\tevm {\n\t\tmax_failed_per_payer 0\n\t}\n}", "at least 1"},
		{"a gas ceiling of no gas is refused", "x402_facilitator {\n\tevm {\n\t\tmax_settlement_gas 0\n\t}\n}", "must be a whole number of at least 1"},
		{"a gas ceiling past uint64 is refused", "x402_facilitator {\n\tevm {\n\t\tmax_settlement_gas 18446744073709551616\n\t}\n}", "must be a whole number of at least 1"},
		{"a gas ceiling below a transfer's need is refused", "x402_facilitator {\n\tevm {\n\t\tmax_settlement_gas 40000\n\t}\n}", "max_settlement_gas 40000 is below"},
		{"an empty failure window is refused", "x402_facilitator {\n\tevm {\n\t\tfailure_window 0s\n\t}\n}", "must be positive"},
		{"the http facilitator needs a url", "x402_facilitator {\n\thttp {\n\t\ttimeout 1s\n\t}\n}", "needs a url"},
		{"a header needs a name and a value", "x402_facilitator {\n\thttp http://x {\n\t\theader Authorization\n\t}\n}", "wrong argument count"},
		{"an unknown http option is named", "x402_facilitator {\n\thttp http://x {\n\t\tretries 3\n\t}\n}", "unrecognized http facilitator option 'retries'"},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			wantErr(t, adaptSiteError(tc.caddyfile), tc.want)
		})
	}
}

// facLoad provisions a module from JSON in a fresh Caddy context, as a
// config load does; the returned cancel cleans it up, as a reload does.
func facLoad(t *testing.T, id, cfg string) (any, func()) {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	mod, err := ctx.LoadModuleByID(id, json.RawMessage(cfg))
	if err != nil {
		cancel()
		t.Fatalf("provisioning %s: %v", id, err)
	}
	return mod, cancel
}

func facServe(t *testing.T, h *FacilitatorHandler, method, path string, body any) (int, []byte) {
	t.Helper()
	var rd *bytes.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	} else {
		rd = bytes.NewReader(nil)
	}
	r := httptest.NewRequest(method, path, rd)
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	if err := h.ServeHTTP(w, r, nil); err != nil {
		t.Fatal(err)
	}
	return w.Code, w.Body.Bytes()
}

// facPayTo is the operator's address in the facilitator tests: development
// account 2.
func facPayTo() string { return evmfacilitator.DevAccounts()[2].Address.Hex() }

func facDevnetRequirements(payTo common.Address) x402.PaymentRequirements {
	a, _ := x402.USDC(evmfacilitator.DevnetNetwork)
	return x402.PaymentRequirements{Scheme: x402.SchemeExact, Network: evmfacilitator.DevnetNetwork, Amount: "20000",
		Asset: a.Address, PayTo: payTo.Hex(), MaxTimeoutSeconds: 60, Extra: a.Extra()}
}

// TestFacilitatorHandlerServesTheAPIOnADevnet provisions
// `x402_facilitator { devnet }` and pays through its API.
func TestFacilitatorHandlerServesTheAPIOnADevnet(t *testing.T) {
	mod, cancel := facLoad(t, "http.handlers.x402_facilitator", `{"pay_to":["`+facPayTo()+`"],"facilitator":{"type":"evm","devnet":{}}}`)
	defer cancel()
	h := mod.(*FacilitatorHandler)
	accts := evmfacilitator.DevAccounts()
	req := facDevnetRequirements(accts[2].Address)
	p, err := x402.SignExactEVM(accts[1].Key(), req, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	body := x402.FacilitatorRequest{X402Version: 2, PaymentPayload: p, PaymentRequirements: req}

	cases := []struct {
		desc, method, path string
		body               any
		status             int
		check              func(t *testing.T, b []byte)
	}{
		{desc: "supported lists exact on the devnet network", method: "GET", path: "/supported", status: 200,
			check: func(t *testing.T, b []byte) {
				var s x402.SupportedResponse
				if json.Unmarshal(b, &s) != nil || len(s.Kinds) != 1 || s.Kinds[0].Network != evmfacilitator.DevnetNetwork {
					t.Errorf("supported = %s", b)
				}
			}},
		{desc: "verify of a good payment answers isValid true", method: "POST", path: "/verify", body: body, status: 200,
			check: func(t *testing.T, b []byte) {
				var v x402.VerifyResponse
				if json.Unmarshal(b, &v) != nil || !v.IsValid || v.Payer != accts[1].Address.Hex() {
					t.Errorf("verify = %s", b)
				}
			}},
		{desc: "settle of the payment succeeds with a transaction hash", method: "POST", path: "/settle", body: body, status: 200,
			check: func(t *testing.T, b []byte) {
				var s x402.SettleResponse
				if json.Unmarshal(b, &s) != nil || !s.Success || len(s.Transaction) != 66 {
					t.Errorf("settle = %s", b)
				}
			}},
		{desc: "a second settle of the same payment is refused as nonce already used", method: "POST", path: "/settle", body: body, status: 200,
			check: func(t *testing.T, b []byte) {
				var s x402.SettleResponse
				if json.Unmarshal(b, &s) != nil || s.Success || s.ErrorReason != x402.ReasonExactEVMNonceAlreadyUsed {
					t.Errorf("settle = %s", b)
				}
			}},
		{desc: "an endpoint under an unstripped prefix is still found", method: "GET", path: "/facilitator/supported", status: 200},
		{desc: "an unknown path is 404", method: "GET", path: "/nope", status: 404},
		{desc: "verify by GET is 405", method: "GET", path: "/verify", status: 405},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			status, b := facServe(t, h, tc.method, tc.path, tc.body)
			if status != tc.status {
				t.Fatalf("status %d, want %d: %s", status, tc.status, b)
			}
			if tc.check != nil {
				tc.check(t, b)
			}
		})
	}
}

func facFreeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestDevnetIsSharedAcrossReloads: Caddy provisions a new config before it
// cleans up the old one; both must use the same devnet, and the devnet
// stops with its last user.
func TestDevnetIsSharedAcrossReloads(t *testing.T) {
	addr := facFreeAddr(t)
	cfg := `{"pay_to":["` + facPayTo() + `"],"facilitator":{"type":"evm","devnet":{"rpc_listen":"` + addr + `"}}}`
	oldMod, cancelOld := facLoad(t, "http.handlers.x402_facilitator", cfg)
	newMod, cancelNew := facLoad(t, "http.handlers.x402_facilitator", cfg)
	_ = oldMod

	c, err := ethclient.Dial("http://" + addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	tokenBefore := facTokenCode(t, c)

	cancelOld() // the old config goes away
	if got := facTokenCode(t, c); !bytes.Equal(got, tokenBefore) {
		t.Fatal("the devnet changed when the old config was cleaned up")
	}
	if status, b := facServe(t, newMod.(*FacilitatorHandler), "GET", "/supported", nil); status != 200 {
		t.Fatalf("new config after reload: %d %s", status, b)
	}
	cancelNew() // the last user: the devnet stops
	ctxT, cancelT := context.WithTimeout(ctx, 2*time.Second)
	defer cancelT()
	if _, err := c.ChainID(ctxT); err == nil {
		t.Error("the devnet still answers after its last user was cleaned up")
	}
}

// TestOneDevnetPerProcess: a second, different devnet setting is refused
// while one runs (the devnet token is registered process-wide).
func TestOneDevnetPerProcess(t *testing.T) {
	_, cancel := facLoad(t, "x402.facilitators.evm", `{"devnet":{}}`)
	defer cancel()
	ctx, cancel2 := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel2()
	_, err := ctx.LoadModuleByID("x402.facilitators.evm", json.RawMessage(`{"devnet":{"rpc_listen":"`+facFreeAddr(t)+`"}}`))
	if err == nil || !strings.Contains(err.Error(), "every devnet setting must be the same") {
		t.Fatalf("error %v", err)
	}
	// The same setting joins the running devnet.
	mod, cancel3 := facLoad(t, "x402.facilitators.evm", `{"devnet":{}}`)
	defer cancel3()
	if s, err := mod.(*EVMFacilitator).Supported(context.Background()); err != nil || len(s.Kinds) != 1 {
		t.Fatalf("supported = %+v, %v", s, err)
	}
}

func facTokenCode(t *testing.T, c *ethclient.Client) []byte {
	t.Helper()
	a, ok := x402.USDC(evmfacilitator.DevnetNetwork)
	if !ok {
		t.Fatal("devnet asset not registered")
	}
	code, err := c.CodeAt(context.Background(), common.HexToAddress(a.Address), nil)
	if err != nil || len(code) == 0 {
		t.Fatalf("token code: %d bytes, %v", len(code), err)
	}
	return code
}

// TestEVMFacilitatorOverJSONRPC settles through the evm module pointed at a
// chain's JSON-RPC URL (the devnet's), with the relayer key from an
// environment placeholder.
func TestEVMFacilitatorOverJSONRPC(t *testing.T) {
	d, err := evmfacilitator.StartDevnet(evmfacilitator.DevnetConfig{RPCListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	accts := evmfacilitator.DevAccounts()
	t.Setenv("FAC_TEST_RELAYER_KEY", accts[9].PrivateKeyHex)
	mod, cancel := facLoad(t, "x402.facilitators.evm", `{"network":"devnet","rpc_url":"`+d.RPCURL()+`","relayer_key":"{env.FAC_TEST_RELAYER_KEY}"}`)
	defer cancel()
	f := mod.(*EVMFacilitator)
	req := facDevnetRequirements(accts[2].Address)
	p, err := x402.SignExactEVM(accts[1].Key(), req, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	s, err := f.Settle(context.Background(), p, req)
	if err != nil || !s.Success {
		t.Fatalf("settle over JSON-RPC = %+v, %v", s, err)
	}
	sup, _ := f.Supported(context.Background())
	if sup.Signers["eip155:*"][0] != accts[9].Address.Hex() {
		t.Errorf("relayer = %v, want account 9 from the env placeholder", sup.Signers)
	}
	// The payee got paid on the chain the RPC URL points at. balance reads
	// at the devnet's settled head: at latest, a read right after the
	// receipt could still see the block before the settlement.
	if got := balance(t, d, accts[2].Address); got.Int64() != evmfacilitator.DevnetUSDCPerAccount+20000 {
		r, rerr := d.Client().TransactionReceipt(context.Background(), common.HexToHash(s.Transaction))
		t.Errorf("payee balance %v after settlement %+v; its receipt on this devnet: %+v, %v", got, s, r, rerr)
	}
}

// TestEVMFacilitatorMaxSettlementGas: max_settlement_gas reaches the
// facilitator (set at its least, evmfacilitator.MinSettlementGas, below
// what the devnet's transferWithAuthorization needs under its later fork, a
// payment is refused at verify and settle, nothing sent; another config
// without it settles the same payment), a written 0 and a value below that
// least are refused, and the devnet, one per process, keeps the default.
func TestEVMFacilitatorMaxSettlementGas(t *testing.T) {
	d, err := evmfacilitator.StartDevnet(evmfacilitator.DevnetConfig{RPCListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	accts := evmfacilitator.DevAccounts()
	t.Setenv("FAC_TEST_RELAYER_KEY", accts[9].PrivateKeyHex)
	cfg := func(gas string) string {
		return `{"network":"devnet","rpc_url":"` + d.RPCURL() + `","relayer_key":"{env.FAC_TEST_RELAYER_KEY}"` + gas + `}`
	}
	mod, cancel := facLoad(t, "x402.facilitators.evm", cfg(fmt.Sprintf(`,"max_settlement_gas":%d`, evmfacilitator.MinSettlementGas)))
	defer cancel()
	f := mod.(*EVMFacilitator)
	req := facDevnetRequirements(accts[2].Address)
	p, err := x402.SignExactEVM(accts[1].Key(), req, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if v, err := f.Verify(ctx, p, req); err != nil || v.IsValid || v.InvalidReason != x402.ReasonExactEVMSimulationFailed {
		t.Fatalf("verify under a %d gas ceiling = %+v, %v", evmfacilitator.MinSettlementGas, v, err)
	}
	nonce, err := d.Client().PendingNonceAt(ctx, accts[9].Address)
	if err != nil {
		t.Fatal(err)
	}
	if s, err := f.Settle(ctx, p, req); err != nil || s.Success || s.ErrorReason != x402.ReasonExactEVMSimulationFailed || s.Transaction != "" {
		t.Fatalf("settle under a %d gas ceiling = %+v, %v", evmfacilitator.MinSettlementGas, s, err)
	}
	if n, err := d.Client().PendingNonceAt(ctx, accts[9].Address); err != nil || n != nonce {
		t.Fatalf("relayer nonce %d -> %d, %v: a transaction was sent", nonce, n, err)
	}
	def, cancelDef := facLoad(t, "x402.facilitators.evm", cfg(""))
	defer cancelDef()
	if s, err := def.(*EVMFacilitator).Settle(ctx, p, req); err != nil || !s.Success {
		t.Fatalf("settle with the default ceiling = %+v, %v", s, err)
	}

	cctx, cancelCtx := caddy.NewContext(caddy.Context{Context: ctx})
	defer cancelCtx()
	if _, err := cctx.LoadModuleByID("x402.facilitators.evm", json.RawMessage(cfg(`,"max_settlement_gas":0`))); err == nil || !strings.Contains(err.Error(), "max_settlement_gas must be a whole number of at least 1") {
		t.Errorf("a written 0: %v", err)
	}
	if _, err := cctx.LoadModuleByID("x402.facilitators.evm", json.RawMessage(cfg(`,"max_settlement_gas":40000`))); err == nil || !strings.Contains(err.Error(), "max_settlement_gas 40000 is below") {
		t.Errorf("a ceiling below a transfer's need: %v", err)
	}
	if _, err := cctx.LoadModuleByID("x402.facilitators.evm", json.RawMessage(`{"devnet":{},"max_settlement_gas":400000}`)); err == nil || !strings.Contains(err.Error(), "drop max_failed_per_payer, max_in_flight_per_payer, failure_window and max_settlement_gas") {
		t.Errorf("devnet with max_settlement_gas: %v", err)
	}
}

// TestEVMFacilitatorsOfOneRelayerShareItsNonces provisions the devnet
// facilitator and two evm facilitators with its relayer key (development
// account 0) whose rpc_url names the devnet's RPC in two ways: three
// pooled facilitators of one account, as a gate's `facilitator evm` beside
// an x402_facilitator would be. Settlements through all three at once
// must all land, with the relayer's nonces handed out once each.
func TestEVMFacilitatorsOfOneRelayerShareItsNonces(t *testing.T) {
	mod, cancel := facLoad(t, "x402.facilitators.evm", `{"devnet":{"rpc_listen":"127.0.0.1:0"}}`)
	defer cancel()
	var d *evmfacilitator.Devnet
	facilitatorPool.Range(func(k, v any) bool {
		if k == facilitatorDevnetKeyPrefix+"127.0.0.1:0" {
			d = v.(*pooledFacilitator).devnet
		}
		return d == nil
	})
	if d == nil {
		t.Fatal("the devnet is not in the facilitator pool")
	}
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(d.RPCURL(), "http://"))
	accts := evmfacilitator.DevAccounts()
	facs := []*EVMFacilitator{mod.(*EVMFacilitator)}
	for _, host := range []string{"127.0.0.1", "localhost"} {
		m, cancel := facLoad(t, "x402.facilitators.evm", `{"network":"devnet","rpc_url":"http://`+host+`:`+port+`","relayer_key":"`+accts[0].PrivateKeyHex+`"}`)
		defer cancel()
		facs = append(facs, m.(*EVMFacilitator))
	}
	if facs[1].f == facs[2].f || facs[0].f == facs[1].f {
		t.Fatal("the pool shares one facilitator: this test needs three")
	}

	ctx := context.Background()
	first, err := d.Client().NonceAt(ctx, accts[0].Address, nil)
	if err != nil {
		t.Fatal(err)
	}
	req := facDevnetRequirements(accts[2].Address)
	const n = 12
	payments := make([]x402.PaymentPayload, n)
	for i := range payments {
		payer := accts[1+i%8]
		if payer.Index == 2 {
			payer = accts[9] // never the payee
		}
		if payments[i], err = x402.SignExactEVM(payer.Key(), req, nil, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	txs := make([]string, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			s, err := facs[i%3].Settle(ctx, payments[i], req)
			if err == nil && !s.Success {
				err = errors.New("refused: " + s.ErrorReason + " " + s.ErrorMessage)
			}
			txs[i], errs[i] = s.Transaction, err
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("settlement %d through facilitator %d: %v", i, i%3, err)
		}
	}
	if t.Failed() {
		return
	}
	used := map[uint64]bool{}
	for _, h := range txs {
		tx, _, err := d.Client().TransactionByHash(ctx, common.HexToHash(h))
		if err != nil {
			t.Fatalf("transaction %s: %v", h, err)
		}
		used[tx.Nonce()] = true
	}
	for nonce := first; nonce < first+n; nonce++ {
		if !used[nonce] {
			t.Errorf("relayer nonce %d is not one of the settlements': each nonce must be handed out once", nonce)
		}
	}
}

func TestEVMFacilitatorProvisionErrors(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "relayer.key")
	os.WriteFile(keyFile, []byte("not a key\n"), 0o600)
	secret := "0x" + strings.Repeat("ab", 31) + "zz"
	cases := []struct{ desc, cfg, want string }{
		{"rpc mode needs rpc_url", `{"network":"base"}`, "rpc_url is required"},
		{"rpc mode needs a network", `{"rpc_url":"http://127.0.0.1:1"}`, "network is required"},
		{"an unknown network is refused", `{"network":"nowhere","rpc_url":"http://127.0.0.1:1","relayer_key":"` + evmfacilitator.DevAccounts()[0].PrivateKeyHex + `"}`, "network"},
		{"rpc mode needs a relayer key", `{"network":"base","rpc_url":"http://127.0.0.1:1"}`, "relayer_key or relayer_key_file is required"},
		{"a malformed key is refused without being echoed", `{"network":"base","rpc_url":"http://127.0.0.1:1","relayer_key":"` + secret + `"}`, "not a hex secp256k1 private key"},
		{"a key file that is not a key is refused", `{"network":"base","rpc_url":"http://127.0.0.1:1","relayer_key_file":"` + keyFile + `"}`, "not a hex secp256k1 private key"},
		{"a missing key file is refused", `{"network":"base","rpc_url":"http://127.0.0.1:1","relayer_key_file":"` + keyFile + `.missing"}`, "reading relayer_key_file"},
		{"key and key file together are refused", `{"network":"base","rpc_url":"http://127.0.0.1:1","relayer_key":"x","relayer_key_file":"` + keyFile + `"}`, "not both"},
		{"devnet cannot run on another network", `{"network":"base","devnet":{}}`, "devnet runs on eip155:1337"},
		{"devnet brings its own chain", `{"rpc_url":"http://127.0.0.1:1","devnet":{}}`, "drop rpc_url"},
		{"a devnet RPC address that cannot be bound is refused", `{"devnet":{"rpc_listen":"256.0.0.1:1"}}`, "starting devnet"},
		// Written as 0 (or less), a failure budget would read as its
		// default (3 reverted settlements, 16 in flight): refused.
		{"a failure budget of 0 is refused", `{"network":"base","rpc_url":"http://127.0.0.1:1","max_failed_per_payer":0}`, "max_failed_per_payer must be a whole number of at least 1"},
		{"an in-flight cap below 1 is refused", `{"network":"base","rpc_url":"http://127.0.0.1:1","max_in_flight_per_payer":-1}`, "max_in_flight_per_payer must be a whole number of at least 1"},
		{"an unknown field is still refused", `{"network":"base","rpc_url":"http://127.0.0.1:1","max_failed_per_payr":1}`, "unknown field"},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
			defer cancel()
			_, err := ctx.LoadModuleByID("x402.facilitators.evm", json.RawMessage(tc.cfg))
			wantErr(t, err, tc.want)
			if strings.Contains(err.Error(), secret[2:20]) {
				t.Error("the error echoes the key")
			}
		})
	}
}

// secretsSite has every secret option of the gateway's modules, with the
// values given: relayer_key, the http facilitator's Authorization header,
// the Redis store's password, x402_facilitator's token and
// verify_response's verifier_token.
func secretsSite(redis, key, authz, password, token, gatewayToken string) string {
	return fmt.Sprintf(`:{port} {
	route /evm/* {
		x402 {
			accept base $0.01 %[1]s
			facilitator evm {
				network base
				rpc_url http://127.0.0.1:1
				relayer_key %[3]s
			}
			store redis %[2]s {
				password %[5]s
			}
		}
		respond "paid"
	}
	route /http/* {
		x402 {
			accept base $0.01 %[1]s
			facilitator http {
				url http://127.0.0.1:1
				header Authorization "Bearer %[4]s"
			}
			store badger {data}/gate
		}
		respond "paid"
	}
	handle_path /facilitator/* {
		x402_facilitator {
			pay_to %[1]s
			token %[6]s
			evm {
				network base
				rpc_url http://127.0.0.1:1
				relayer_key %[3]s
			}
		}
	}
	route /seller/* {
		verify_response {
			schema `+"`"+`{"type":"object"}`+"`"+`
			verifier_url http://127.0.0.1:1
			verifier_token %[7]s
		}
		respond "{}"
	}
}
`, payTo.Hex(), redis, key, authz, password, token, gatewayToken)
}

// TestSecretOptionsWarnWhenWrittenInline: a secret written in the config
// as it is (relayer_key, an Authorization header, a Redis password, a
// token) is accepted, as Caddy accepts its own modules' secrets, but the
// loaded JSON keeps it, so each is logged as a warning naming the option,
// never the secret. Given as {env.NAME} or {file.PATH}, the secret is
// neither in the adapted JSON nor warned about, and is what the modules
// use (Redis accepts the password, the key and token are valid).
func TestSecretOptionsWarnWhenWrittenInline(t *testing.T) {
	key := evmfacilitator.DevAccounts()[7].PrivateKeyHex[2:]
	const authz, password, token, gatewayToken = "facilitator-auth-0123456789", "redis-password-0123456789", "facilitator-token-0123456789", "gateway-token-0123456789"
	secrets := []string{key, authz, password, token, gatewayToken}
	srv := servers.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	if err := rdb.ConfigSet(context.Background(), "requirepass", password).Err(); err != nil {
		t.Fatal(err)
	}
	options := []string{"relayer_key", "header Authorization", "password", "token", "verifier_token"}

	// warned loads site with its log in a file and returns the options it
	// warned about as secrets written inline.
	warned := func(t *testing.T, site string) map[string]bool {
		t.Helper()
		logFile := filepath.Join(t.TempDir(), "caddy.log")
		startCaddyServers(t, "", logFile, site)
		raw, err := os.ReadFile(logFile)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range secrets {
			if strings.Contains(string(raw), s) {
				t.Errorf("the log repeats a secret (%.8s…)", s)
			}
		}
		return secretWarnings(raw)
	}

	t.Run("literal", func(t *testing.T) {
		got := warned(t, secretsSite(srv.Addr, key, authz, password, token, gatewayToken))
		for _, o := range options {
			if !got[o] {
				t.Errorf("no warning for a literal %s (warned: %v)", o, got)
			}
		}
	})

	t.Run("placeholders", func(t *testing.T) {
		dir := t.TempDir()
		for name, v := range map[string]string{"authz": authz, "gateway": gatewayToken} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(v+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		t.Setenv("AOV_TEST_RELAYER_KEY", key)
		t.Setenv("AOV_TEST_REDIS_PASSWORD", password)
		t.Setenv("AOV_TEST_FACILITATOR_TOKEN", token)
		site := secretsSite(srv.Addr, "{env.AOV_TEST_RELAYER_KEY}", "{file."+filepath.Join(dir, "authz")+"}",
			"{env.AOV_TEST_REDIS_PASSWORD}", "{env.AOV_TEST_FACILITATOR_TOKEN}", "{file."+filepath.Join(dir, "gateway")+"}")
		js := adapt(t, strings.ReplaceAll(strings.ReplaceAll(site, "{port}", "8080"), "{data}", dir))
		for _, s := range secrets {
			if strings.Contains(js, s) {
				t.Errorf("a secret given as a placeholder is in the adapted JSON (%.8s…)", s)
			}
		}
		if got := warned(t, site); len(got) != 0 {
			t.Errorf("warnings for secrets given as placeholders: %v", got)
		}
	})
}

// TestHTTPFacilitatorModule reaches a facilitator API (our own handler on a
// devnet) through the http guest module, with a header placeholder.
func TestHTTPFacilitatorModule(t *testing.T) {
	mod, cancel := facLoad(t, "http.handlers.x402_facilitator", `{"pay_to":["`+facPayTo()+`"],"facilitator":{"type":"evm","devnet":{}}}`)
	defer cancel()
	h := mod.(*FacilitatorHandler)
	var gotAuth string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotAuth = r.Header.Get("Authorization")
		h.ServeHTTP(w, r, nil)
	}))
	defer srv.Close()
	t.Setenv("FAC_TEST_TOKEN", "s3cret")
	hm, cancelHTTP := facLoad(t, "x402.facilitators.http", `{"url":"`+srv.URL+`/","headers":{"Authorization":"Bearer {env.FAC_TEST_TOKEN}"},"timeout":"5s"}`)
	defer cancelHTTP()
	f := hm.(*HTTPFacilitator)
	sup, err := f.Supported(context.Background())
	if err != nil || len(sup.Kinds) != 1 {
		t.Fatalf("supported = %+v, %v", sup, err)
	}
	if gotAuth != "Bearer s3cret" {
		t.Errorf("Authorization = %q, want the placeholder replaced", gotAuth)
	}
	accts := evmfacilitator.DevAccounts()
	req := facDevnetRequirements(accts[2].Address)
	req.Amount = "20000"
	p, _ := x402.SignExactEVM(accts[3].Key(), req, nil, time.Now())
	more := req
	more.Amount = "20001"
	v, err := f.Verify(context.Background(), p, more)
	if err != nil || v.IsValid || v.InvalidReason != x402.ReasonExactEVMValueMismatch {
		t.Fatalf("verify = %+v, %v; want an isValid:false answer", v, err)
	}

	t.Run("a URL that is not http(s) is refused at provision", func(t *testing.T) {
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		defer cancel()
		if _, err := ctx.LoadModuleByID("x402.facilitators.http", json.RawMessage(`{"url":"ftp://x"}`)); err == nil {
			t.Fatal("provisioned an ftp facilitator URL")
		}
	})
}

func TestFacilitatorHandlerNeedsAFacilitator(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	if _, err := ctx.LoadModuleByID("http.handlers.x402_facilitator", json.RawMessage(`{}`)); err == nil || !strings.Contains(err.Error(), "needs a facilitator") {
		t.Fatalf("error %v", err)
	}
}

// TestSecretURLCredentialsWarn: a credential in a URL option's userinfo
// (evm's rpc_url, facilitator http's url and rpc, verify_response's
// verifier_url) is in the loaded JSON as much as a secret option, so each
// is warned about by option name, never with the URL; with the userinfo
// given as a placeholder nothing is warned about.
func TestSecretURLCredentialsWarn(t *testing.T) {
	const key = "rpc-key-0123456789"
	site := func(cred string) string {
		return fmt.Sprintf(`:{port} {
	route /evm/* {
		x402 {
			accept base $0.01 %[1]s
			facilitator evm {
				network base
				rpc_url http://user:%[2]s@127.0.0.1:1
				relayer_key {env.AOV_TEST_RELAYER_KEY}
			}
			store badger {data}/evm
		}
		respond "paid"
	}
	route /http/* {
		x402 {
			accept base $0.01 %[1]s
			facilitator http {
				url http://user:%[2]s@127.0.0.1:1
				rpc base http://%[2]s@127.0.0.1:1
			}
			store badger {data}/http
		}
		respond "paid"
	}
	route /seller/* {
		verify_response {
			schema `+"`"+`{"type":"object"}`+"`"+`
			verifier_url http://gateway:%[2]s@127.0.0.1:1
		}
		respond "{}"
	}
}
`, payTo.Hex(), cred)
	}
	t.Setenv("AOV_TEST_RELAYER_KEY", evmfacilitator.DevAccounts()[7].PrivateKeyHex[2:])
	t.Setenv("AOV_TEST_RPC_KEY", key)
	warned := func(t *testing.T, site string) map[string]bool {
		t.Helper()
		logFile := filepath.Join(t.TempDir(), "caddy.log")
		startCaddyServers(t, "", logFile, site)
		raw, err := os.ReadFile(logFile)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(raw), key) {
			t.Errorf("the log repeats a credential")
		}
		return secretWarnings(raw)
	}
	t.Run("literal", func(t *testing.T) {
		got := warned(t, site(key))
		for _, o := range []string{"rpc_url", "url", "rpc base", "verifier_url"} {
			if !got[o+" (its user:password)"] {
				t.Errorf("no warning for credentials in %s (warned: %v)", o, got)
			}
		}
	})
	t.Run("placeholder", func(t *testing.T) {
		// verifier_url is used as written (no placeholder): left out.
		s := strings.Replace(site("{env.AOV_TEST_RPC_KEY}"), "gateway:{env.AOV_TEST_RPC_KEY}@", "", 1)
		if got := warned(t, s); len(got) != 0 {
			t.Errorf("warnings for credentials given as placeholders: %v", got)
		}
	})
}

// secretWarnings returns the options a Caddy JSON log warns were written
// as literal secrets (secretopt).
func secretWarnings(raw []byte) map[string]bool {
	got := map[string]bool{}
	for _, line := range strings.Split(string(raw), "\n") {
		var e struct{ Level, Msg, Option string }
		if json.Unmarshal([]byte(line), &e) == nil && e.Level == "warn" && strings.Contains(e.Msg, "secret is written in the config") {
			got[e.Option] = true
		}
	}
	return got
}
