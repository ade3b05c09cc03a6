package caddymodule

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/internal/solanachain"
	"github.com/aovhq/aov/plugins/svmfacilitator"
	"github.com/aovhq/aov/x402"
)

// newBehindSolanaRPC is a FAKE of a member of a load-balanced RPC pool
// behind the one a transaction landed on, in front of the real chain: it
// has not seen the signature at first (its first getSignatureStatuses
// answers null; later ones are the chain's), simulates on its
// older bank (the simulation passes), and answers sendTransaction with the
// signature without forwarding it, as Agave does with skipPreflight for a
// transaction the leader then drops. Everything else is forwarded.
func newBehindSolanaRPC(t *testing.T, chain string) string {
	var statuses atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req struct {
			ID     json.RawMessage   `json:"id"`
			Method string            `json:"method"`
			Params []json.RawMessage `json:"params"`
		}
		json.Unmarshal(body, &req)
		w.Header().Set("Content-Type", "application/json")
		switch {
		case req.Method == "getSignatureStatuses" && statuses.Add(1) == 1:
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"context":{"slot":1},"value":[null]}}`, req.ID)
			return
		case req.Method == "simulateTransaction":
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"context":{"slot":1},"value":{"err":null,"logs":[]}}}`, req.ID)
			return
		case req.Method == "sendTransaction":
			var s string
			json.Unmarshal(req.Params[0], &s)
			raw, _ := base64.StdEncoding.DecodeString(s)
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":"%s"}`, req.ID, base58.Encode(raw[1:65]))
			return
		}
		resp, err := http.Post(chain, "application/json", bytes.NewReader(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		io.Copy(w, resp.Body)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// provisionSVM provisions an svm facilitator on e's fee payer, with rpc
// and the store module of JSON storeJSON, in a context of its own; stop
// cleans the module up and cancels the context (the config is unloaded).
func provisionSVM(t *testing.T, e *solanaEnv, rpc, storeJSON string) (m *SVMFacilitator, stop func()) {
	t.Helper()
	return provisionSVMWith(t, e, rpc, storeJSON, "")
}

// svmPayment is a payment of 0.02 USDC from e's payer to its payee, with
// the requirements it answers.
func svmPayment(t *testing.T, e *solanaEnv) (x402.PaymentPayload, x402.PaymentRequirements) {
	t.Helper()
	return svmMemoPayment(t, e, "")
}

// svmMemoPayment is svmPayment with memo (none for ""): payments of
// different memos are different messages.
func svmMemoPayment(t *testing.T, e *solanaEnv, memo string) (x402.PaymentPayload, x402.PaymentRequirements) {
	t.Helper()
	authority, err := base58.Decode(e.payer.SecretKey)
	if err != nil {
		t.Fatal(err)
	}
	bh, _ := svmfacilitator.ParsePublicKey(e.chain.LatestBlockhash())
	mint, _ := svmfacilitator.ParsePublicKey(solanachain.USDC)
	payTo, _ := svmfacilitator.ParsePublicKey(e.payee.Address)
	var feePayer svmfacilitator.PublicKey
	copy(feePayer[:], svmFeeKey().Public().(ed25519.PublicKey))
	p := svmfacilitator.Payment{FeePayer: feePayer, Authority: ed25519.PrivateKey(authority), Mint: mint, Program: svmfacilitator.TokenProgram,
		PayTo: payTo, Amount: 20000, Decimals: 6, Blockhash: bh, Memo: memo}
	req := x402.PaymentRequirements{Scheme: x402.SchemeExact, Network: x402.NetworkSolanaDevnet, Amount: "20000", Asset: solanachain.USDC,
		PayTo: e.payee.Address, MaxTimeoutSeconds: 60, Extra: map[string]any{"feePayer": feePayer.String()}}
	return svmfacilitator.Payload(p.Transaction(), req), req
}

// The svm facilitator keeps the transactions it sent in its store (here
// Badger in a folder of its own): after a restart, a replay of a payment
// it answered success is duplicate_settlement naming the transaction even
// on a node that has not seen it, and nothing moves twice. (Before: the
// facilitator kept nothing outside the process, and that node had the
// replay answered success a second time.)
func TestSVMFacilitatorStoreRefusesReplayAfterRestart(t *testing.T) {
	e := newSolanaEnv(t)
	storeJSON := fmt.Sprintf(`{"type":"badger","path":%q}`, t.TempDir())
	m, stop := provisionSVM(t, e, e.chain.URL, storeJSON)
	pp, req := svmPayment(t, e)
	before := e.usdc(t, e.payer.Address)
	first, err := m.Settle(t.Context(), pp, req)
	if err != nil || !first.Success {
		t.Fatalf("first settle: %+v %v", first, err)
	}
	stop()

	m, stop = provisionSVM(t, e, newBehindSolanaRPC(t, e.chain.URL), storeJSON)
	defer stop()
	again, err := m.Settle(t.Context(), pp, req)
	if err != nil || again.Success || again.ErrorReason != svmfacilitator.ReasonDuplicateSettlement || again.Transaction != first.Transaction {
		t.Fatalf("replay after restart: success=%v reason=%q tx=%s err=%v; want duplicate_settlement naming %s",
			again.Success, again.ErrorReason, again.Transaction, err, first.Transaction)
	}
	if got := before - e.usdc(t, e.payer.Address); got != 20000 {
		t.Fatalf("charged %d; want one payment", got)
	}
}

// A reload that changes the store's settings (here the Redis timeout,
// which gives the store another client) gets a facilitator holding the
// new store: the old config's client is closed once it is unloaded, and a
// facilitator kept across the reload with it would fail every settlement.
func TestSVMFacilitatorReloadWithOtherStoreSettings(t *testing.T) {
	e := newSolanaEnv(t)
	srv := servers.StartRedis(t)
	_, stop := provisionSVM(t, e, e.chain.URL, fmt.Sprintf(`{"type":"redis","addresses":[%q],"timeout":"1s"}`, srv.Addr))
	m, stop2 := provisionSVM(t, e, e.chain.URL, fmt.Sprintf(`{"type":"redis","addresses":[%q],"timeout":"2s"}`, srv.Addr))
	defer stop2()
	stop()
	pp, req := svmPayment(t, e)
	if s, err := m.Settle(t.Context(), pp, req); err != nil || !s.Success {
		t.Fatalf("settle after the reload: %+v %v", s, err)
	}
}

// The Caddyfile's store subdirective is the JSON's store: a module in the
// x402.stores namespace, given once.
func TestSVMFacilitatorCaddyfileStore(t *testing.T) {
	var m SVMFacilitator
	if err := m.UnmarshalCaddyfile(caddyfile.NewTestDispenser("svm {\nstore badger /var/lib/aov/svm\n}")); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(m.StoreRaw, &got); err != nil || got["type"] != "badger" || got["path"] != "/var/lib/aov/svm" {
		t.Fatalf("store = %s (%v)", m.StoreRaw, err)
	}
	err := new(SVMFacilitator).UnmarshalCaddyfile(caddyfile.NewTestDispenser("svm {\nstore badger /a\nstore badger /b\n}"))
	if err == nil {
		t.Fatal("store given twice was accepted")
	}
}

// A reload whose store JSON is unchanged but whose placeholders expand to
// other settings (the Redis address or password in {env.*} or {file.*},
// moved or rotated) gets a facilitator holding the new store: the
// facilitator kept across the reload takes the store of the config now
// loading, whatever its JSON. (Before: the pooled facilitator was keyed by
// the store's unexpanded JSON and kept the old config's Redis client,
// closed once that config was unloaded: every settlement failed with
// "redis: client is closed".)
func TestSVMFacilitatorReloadAfterPlaceholderChange(t *testing.T) {
	e := newSolanaEnv(t)
	srv1 := servers.StartRedis(t)
	srv2 := servers.StartRedis(t)
	storeJSON := `{"type":"redis","addresses":["{env.AOV_SVM_STORE_ADDR}"]}`
	t.Setenv("AOV_SVM_STORE_ADDR", srv1.Addr)
	_, stop := provisionSVM(t, e, e.chain.URL, storeJSON)
	t.Setenv("AOV_SVM_STORE_ADDR", srv2.Addr)
	m, stop2 := provisionSVM(t, e, e.chain.URL, storeJSON)
	defer stop2()
	stop()
	pp, req := svmPayment(t, e)
	if s, err := m.Settle(t.Context(), pp, req); err != nil || !s.Success {
		t.Fatalf("settle after a reload with the same store JSON expanding to another Redis: %+v %v; want success", s, err)
	}
}

// A reload that fails after the svm facilitator was provisioned cleans up
// its own modules, and with them its handle of the store: the running
// config's facilitator goes back to the running config's handle, and
// settles. The failed reload names the same Redis store with another
// client (another timeout: a client of its own, as a rotated password
// makes one), so the facilitator is the running config's, and the failed
// config's client is closed. The same JSON expands to another spelling of
// the server's address, which makes another client of the same store, as
// a rotated password in {file.*} does.
func TestSVMFacilitatorFailedReloadKeepsRunningStore(t *testing.T) {
	e := newSolanaEnv(t)
	srv := servers.StartRedis(t)
	_, port, _ := strings.Cut(srv.Addr, ":")
	storeJSON := `{"type":"redis","addresses":["{env.AOV_SVM_STORE_ADDR}"]}`
	t.Setenv("AOV_SVM_STORE_ADDR", srv.Addr)
	m, stop := provisionSVM(t, e, e.chain.URL, storeJSON)
	defer stop()
	t.Setenv("AOV_SVM_STORE_ADDR", "localhost:"+port)
	failed, stopFailed := provisionSVM(t, e, e.chain.URL, storeJSON)
	if failed.f != m.f {
		t.Fatal("a reload naming the same store got another facilitator; want the one kept")
	}
	stopFailed() // the new config failed further on: it is unloaded, the running one stays
	pp, req := svmPayment(t, e)
	if s, err := m.Settle(t.Context(), pp, req); err != nil || !s.Success {
		t.Fatalf("settle on the running config after a failed reload: %+v %v; want success", s, err)
	}
}

// A reload naming the same store through a new client (the same JSON
// expanding to another spelling of its address here, a rotated password
// likewise) keeps the facilitator, and its
// budgets, and hands it the new client: once the old config and its
// client are gone, it settles.
func TestSVMFacilitatorReloadSameStoreNewClient(t *testing.T) {
	e := newSolanaEnv(t)
	srv := servers.StartRedis(t)
	_, port, _ := strings.Cut(srv.Addr, ":")
	storeJSON := `{"type":"redis","addresses":["{env.AOV_SVM_STORE_ADDR}"]}`
	t.Setenv("AOV_SVM_STORE_ADDR", srv.Addr)
	old, stop := provisionSVM(t, e, e.chain.URL, storeJSON)
	t.Setenv("AOV_SVM_STORE_ADDR", "localhost:"+port)
	m, stop2 := provisionSVM(t, e, e.chain.URL, storeJSON)
	defer stop2()
	if m.f != old.f {
		t.Fatal("a reload naming the same store got another facilitator; want the one kept")
	}
	stop()
	pp, req := svmPayment(t, e)
	if s, err := m.Settle(t.Context(), pp, req); err != nil || !s.Success {
		t.Fatalf("settle after a reload naming the same store through a new client: %+v %v; want success", s, err)
	}
}

// An svm facilitator without a store line uses the database in the gate's
// default folder as the gate opened it: beside a gate whose store is
// `store badger { no_sync }`, the config loads, as it did before the
// facilitator kept a store. (Before: the facilitator opened that folder
// first, with no_sync off, and the gate's store was refused for asking
// otherwise.)
func TestSVMFacilitatorDefaultStoreFollowsGateNoSync(t *testing.T) {
	t.Setenv("XDG_DATA_HOME", t.TempDir())
	e := newSolanaEnv(t)
	port := freePort(t)
	err := tryLoadCaddy(t, port, fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept solana-devnet $0.02 %s
			facilitator %s
			store badger {
				no_sync
			}
		}
		reverse_proxy %s
	}
}
`, e.payee.Address, e.svmBlock(), strings.TrimPrefix(newUpstream(t).URL, "http://")))
	if err != nil {
		t.Fatalf("gate with store badger { no_sync } and an svm facilitator without a store: %v; want the config to load", err)
	}
	caddy.Stop()
}

// Likewise beside an x402_facilitator whose discovery list is kept in
// `store badger { no_sync }`: the handler opens its store before its svm
// facilitator joins the default folder, and the config loads. (Before: the
// handler loaded its facilitator first, which opened the folder without
// no_sync, and the handler's store was refused for asking otherwise.)
func TestSVMFacilitatorDefaultStoreFollowsFacilitatorHandlerNoSync(t *testing.T) {
	t.Setenv("XDG_DATA_HOME", t.TempDir())
	e := newSolanaEnv(t)
	port := freePort(t)
	err := tryLoadCaddy(t, port, fmt.Sprintf(`:{port} {
	handle_path /facilitator/* {
		x402_facilitator {
			pay_to %s
			store badger {
				no_sync
			}
			%s
		}
	}
}
`, e.payee.Address, e.svmBlock()))
	if err != nil {
		t.Fatalf("x402_facilitator with store badger { no_sync } and an svm facilitator without a store: %v; want the config to load", err)
	}
	caddy.Stop()
}

// Two svm blocks of one config with the same fee payer and settings but
// different stores (route A's own store, route B's another) each record
// their sends in their own store: after a restart, a replay through route
// A's store on a node a slot behind is duplicate_settlement, and nothing
// moves twice. (Before: the two blocks shared one pooled facilitator,
// which used the store of the block provisioned last, so route A's send
// was recorded in route B's store only and the replay was answered
// success a second time.)
func TestSVMFacilitatorBlocksWithTheirOwnStores(t *testing.T) {
	e := newSolanaEnv(t)
	storeA := fmt.Sprintf(`{"type":"badger","path":%q}`, t.TempDir())
	storeB := fmt.Sprintf(`{"type":"badger","path":%q}`, t.TempDir())
	mA, stopA := provisionSVM(t, e, e.chain.URL, storeA) // route A's block
	_, stopB := provisionSVM(t, e, e.chain.URL, storeB)  // then route B's
	pp, req := svmPayment(t, e)
	before := e.usdc(t, e.payer.Address)
	first, err := mA.Settle(t.Context(), pp, req)
	if err != nil || !first.Success {
		t.Fatalf("first settle: %+v %v", first, err)
	}
	stopB()
	stopA() // restart
	m, stop := provisionSVM(t, e, newBehindSolanaRPC(t, e.chain.URL), storeA)
	defer stop()
	again, err := m.Settle(t.Context(), pp, req)
	if err != nil || again.Success || again.ErrorReason != svmfacilitator.ReasonDuplicateSettlement || again.Transaction != first.Transaction {
		t.Errorf("replay after a restart through route A's store: success=%v reason=%q tx=%s err=%v; want duplicate_settlement naming %s",
			again.Success, again.ErrorReason, again.Transaction, err, first.Transaction)
	}
	if got := before - e.usdc(t, e.payer.Address); got != 20000 {
		t.Fatalf("charged %d; want one payment", got)
	}
}

// A reload that names another store (here another Badger folder) and
// fails after its svm block was provisioned leaves the running config's
// sends recorded in the running config's store: after a restart, a replay
// through it on a node a slot behind is duplicate_settlement. (Before: the
// reload's block handed the shared facilitator its store at once, so the
// running config's settlements in that window were recorded in the
// failed config's store only, closed with it.)
func TestSVMFacilitatorFailedReloadWithAnotherStoreLosesNoRecord(t *testing.T) {
	e := newSolanaEnv(t)
	running := fmt.Sprintf(`{"type":"badger","path":%q}`, t.TempDir())
	failing := fmt.Sprintf(`{"type":"badger","path":%q}`, t.TempDir())
	mR, stopR := provisionSVM(t, e, e.chain.URL, running)
	_, stopN := provisionSVM(t, e, e.chain.URL, failing) // the reload, failing on a later module
	pp, req := svmPayment(t, e)
	before := e.usdc(t, e.payer.Address)
	first, err := mR.Settle(t.Context(), pp, req) // a request of the running config
	if err != nil || !first.Success {
		t.Fatalf("first settle: %+v %v", first, err)
	}
	stopN() // the failed reload's modules are cleaned up
	stopR() // restart
	m, stop := provisionSVM(t, e, newBehindSolanaRPC(t, e.chain.URL), running)
	defer stop()
	again, err := m.Settle(t.Context(), pp, req)
	if err != nil || again.Success || again.ErrorReason != svmfacilitator.ReasonDuplicateSettlement || again.Transaction != first.Transaction {
		t.Errorf("replay after a restart through the running config's store: success=%v reason=%q tx=%s err=%v; want duplicate_settlement naming %s",
			again.Success, again.ErrorReason, again.Transaction, err, first.Transaction)
	}
	if got := before - e.usdc(t, e.payer.Address); got != 20000 {
		t.Fatalf("charged %d; want one payment", got)
	}
}

// Two svm blocks with the same settings naming one Redis store (one
// identity) with other options each write their send records through a
// handle with their own options. Block A's store says wait_replicas 1
// (a record is acknowledged once a replica has it; with no replica here,
// every write of A's store fails), block B's says nothing: A is refused
// beside B as it is alone. (Before: the two shared one facilitator, which
// wrote A's records through B's handle, without waiting for a replica.)
func TestSVMFacilitatorBlocksNamingOneStoreWithOtherOptionsKeepTheirOwn(t *testing.T) {
	e := newSolanaEnv(t)
	srv := servers.StartRedis(t)
	storeA := fmt.Sprintf(`{"type":"redis","addresses":[%q],"wait_replicas":1}`, srv.Addr)
	storeB := fmt.Sprintf(`{"type":"redis","addresses":[%q]}`, srv.Addr)

	alone, stopAlone := provisionSVM(t, e, e.chain.URL, storeA)
	pp, req := svmPayment(t, e)
	s, err := alone.Settle(t.Context(), pp, req)
	stopAlone()
	if err == nil {
		t.Fatalf("block A alone (wait_replicas 1, no replica) settled: %+v", s)
	}

	mA, stopA := provisionSVM(t, e, e.chain.URL, storeA)
	defer stopA()
	mB, stopB := provisionSVM(t, e, e.chain.URL, storeB)
	defer stopB()
	if mA.f == mB.f {
		t.Fatal("blocks naming one store with other options share one facilitator")
	}
	pp, req = svmPayment(t, e)
	if s, err := mA.Settle(t.Context(), pp, req); err == nil {
		t.Fatalf("block A beside block B settled %+v: its send record went through B's handle, without waiting for a replica", s)
	}
}
