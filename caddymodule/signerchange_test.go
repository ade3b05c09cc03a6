package caddymodule

import (
	"fmt"
	"io"
	"math/big"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/ethereum/go-ethereum/common"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// The gate's embedded evm facilitator sent a held payment's transfer, its
// reply lost (the record names no transaction: the embedded facilitator's
// unknown outcome carries none). The operator then changes relayer_key (a
// restart, or a reload, on the same store), and the charged buyer
// retries: the transfer is the gate's own, sent from the relayer its
// facilitator had when the attempt was made (heldRecord.Signers), and
// the held payment is served. (Before: only the relayer of now counted,
// the transfer was "settled by another settlement", the claim released
// and the charged buyer refused 402.)
func TestHeldEVMPaymentServedAfterRelayerKeyChange(t *testing.T) {
	for _, c := range []struct {
		name string
		key  int
	}{{"same key (control)", faultyRelayer}, {"rotated key", 9}} {
		t.Run(c.name, func(t *testing.T) { testHeldAfterRotation(t, c.key) })
	}
}

func testHeldAfterRotation(t *testing.T, key int) {
	d, _ := sharedDevnet(t)
	up := newUpstream(t)
	storeDir := gateDir(t)
	first := pendingSite(up.URL, "lose_reply", storeDir, "")
	p := payThenRestart(t, d, first, 2+key%2, replyLost, func() string { return startCaddy(t, relayerSite(up.URL, d, storeDir, key)) })
	servedAfterRotation(t, d, up, p)
}

// A gateway killed mid-settlement (its embedded evm facilitator's relayer
// sent the transfer, no reply came back) leaves only the record written
// with the claim. The operator restarts it with another relayer_key on
// the same store, and the charged buyer retries: the claim's record kept
// the relayer the facilitator had when the attempt was made, the transfer
// is the gate's own, and the upstream runs for the buyer. (Before: only a
// record of an attempt that ended unknown kept the signers; the killed
// attempt's record had none, the transfer was "settled by another
// settlement", and the charged buyer was refused 402.)
func TestHeldPaymentKilledMidSettlementServedAfterRelayerKeyChange(t *testing.T) {
	for _, c := range []struct {
		name string
		key  int
	}{{"same key (control)", faultyRelayer}, {"rotated key", 9}} {
		t.Run(c.name, func(t *testing.T) {
			d, _ := sharedDevnet(t)
			up := newUpstream(t)
			storeDir := gateDir(t)
			payer := 4 + c.key%2
			p := payThenRestart(t, d, killSite(up.URL, "killed_devnet", storeDir), payer, killedMidSettlement,
				func() string { return startCaddy(t, relayerSite(up.URL, d, storeDir, c.key)) })
			servedAfterRotation(t, d, up, p)
		})
	}
}

// relayerSite is a paid route whose store is in storeDir, settled by an
// embedded evm facilitator on d whose relayer is dev account key.
func relayerSite(up string, d *evmfacilitator.Devnet, storeDir string, key int) string {
	return fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept devnet $0.02 %[3]s
			facilitator evm {
				network devnet
				rpc_url %[2]s
				relayer_key %[5]s
			}
			store badger %[4]s
			public_base_url https://gateway.test
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up, "http://"), d.RPCURL(), payTo.Hex(), storeDir, evmfacilitator.DevAccounts()[key].PrivateKeyHex)
}

// servedAfterRotation retries p, a payment the gate's own facilitator
// settled before a restart with maybe another relayer_key, and wants the
// paid answer (retryServed).
func servedAfterRotation(t *testing.T, d *evmfacilitator.Devnet, up *upstream, p restartedPayment) {
	t.Helper()
	retryServed(t, d, up, p.url, p.sig, p.payer, p.before, "after the restart (the gate's own facilitator sent the transfer)")
}

// retryServed retries the charged buyer payer's payment sig at url and
// wants the paid answer, the upstream run at most once more; after says
// what came between the payment and the retry.
func retryServed(t *testing.T, d *evmfacilitator.Devnet, up *upstream, url, sig string, payer common.Address, before *big.Int, after string) {
	t.Helper()
	calls := up.calls.Load()
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	b, _ := io.ReadAll(resp.Body)
	t.Logf("charged %v; retry %s: %d %.400s", charged(t, d, payer, before), after, resp.StatusCode, b)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"payment":"paid"`) || up.calls.Load() > calls+1 {
		t.Fatalf("the charged buyer's retry %s: %d %.300s; want the paid answer", after, resp.StatusCode, b)
	}
}

// A remote facilitator changes its relayer (its GET /supported now lists
// the new address) less than 5 minutes after the gate read its signers
// for another held payment. A payment it then settles from the new
// relayer, its reply lost, is read with the remembered list, which lacks
// the sender: the gate asks /supported again before ruling the transfer
// another settlement's, finds it listed, and serves the charged buyer.
// (Before: the remembered list was final, the remote's own transfer was
// "settled by another settlement" and the charged buyer refused 402.)
func TestHeldRemotePaymentServedAfterRemoteSignerChange(t *testing.T) {
	t.Run("no earlier read of /supported (control)", func(t *testing.T) { testStaleSigners(t, false) })
	t.Run("signers read before the rotation", func(t *testing.T) { testStaleSigners(t, true) })
}

func testStaleSigners(t *testing.T, warm bool) {
	d, fac := sharedDevnet(t)
	oldSigner := evmfacilitator.DevAccounts()[8].Address.Hex()
	var rotated atomic.Bool
	// P1 is refused before anything is sent (held); P2 is sent, its reply
	// lost.
	remote := newLossyProxy(t, fac, "refuse", func(s map[string]any) {
		if !rotated.Load() {
			s["signers"] = map[string][]string{"eip155:*": {oldSigner}} // before the rotation
		}
	})
	up := newUpstream(t)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept devnet $0.01 %[3]s
			facilitator http {
				url %[2]s
				rpc devnet %[4]s
			}
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), remote.URL, payTo.Hex(), d.RPCURL()))
	url := base + "/verify/schema"

	// P1: held, its retry reads the chain and the remote's signers (old).
	sig1 := signFor(t, paymentRequired(t, post(t, url, "", nil)), 1)
	for i := 0; i < 2 && warm; i++ {
		resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig1})
		if e := readJSON(t, resp); resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("P1 try %d: %d %v", i, resp.StatusCode, e)
		}
	}
	// The remote rotates its relayer to the one it now sends from.
	rotated.Store(true)
	remote.mode.Store("lose_reply")
	buyer := 2
	if warm {
		buyer = 4
	}
	payer := evmfacilitator.DevAccounts()[buyer].Address
	before := balance(t, d, payer)
	sig2 := signFor(t, paymentRequired(t, post(t, url, "", nil)), buyer)
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig2})
	if e := readJSON(t, resp); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("P2 first try: %d %v", resp.StatusCode, e)
	}
	retryServed(t, d, up, url, sig2, payer, before, "of P2 (the remote's own transfer, from the signer its /supported lists now)")
}

// A multi of two embedded evm members on one network (two relayer keys,
// no remote): the first member sent a held payment's transfer, its reply
// lost. A reload or restart puts the other member first, so pick now
// chooses it and it reads the payment: every member's relayer counts, and
// the charged buyer is served. (Before: without a remote member the
// member picked counted its own relayer alone, the multi's own transfer
// was another settlement's, and the charged buyer was refused 402.)
func TestHeldMultiEVMPaymentServedAfterMembersReordered(t *testing.T) {
	t.Run("same order (control)", func(t *testing.T) { testMultiReorder(t, false) })
	t.Run("reordered", func(t *testing.T) { testMultiReorder(t, true) })
}

func testMultiReorder(t *testing.T, reorder bool) {
	d, _ := sharedDevnet(t)
	up := newUpstream(t)
	storeDir := gateDir(t)
	evm9 := fmt.Sprintf("evm {\n\t\t\t\t\tnetwork devnet\n\t\t\t\t\trpc_url %s\n\t\t\t\t\trelayer_key %s\n\t\t\t\t}", d.RPCURL(), evmfacilitator.DevAccounts()[9].PrivateKeyHex)
	site := func(members string) string {
		return fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept devnet $0.02 %[3]s
			facilitator multi {
				%[5]s
			}
			store badger %[4]s
			public_base_url https://gateway.test
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), "", payTo.Hex(), storeDir, members)
	}
	first := site("faulty_devnet lose_reply\n\t\t\t\t" + evm9)
	reordered := site(evm9 + "\n\t\t\t\tfaulty_devnet none")
	if !reorder {
		reordered = site("faulty_devnet none\n\t\t\t\t" + evm9)
	}
	key := 5
	if reorder {
		key = 8
	}
	p := payThenRestart(t, d, first, key, replyLost, func() string { return startCaddy(t, reordered) })
	retryServed(t, d, up, p.url, p.sig, p.payer, p.before, "after the multi's members were reordered (a member of the gate's multi sent the transfer)")
}

// A remote facilitator's signers are asked in the background the first
// time a claim wants them unread, so the claims after it keep them
// without waiting on the remote. A gateway on a remote (fakeKilledHTTP)
// is killed mid-settlement twice: the first payment's claim comes before
// any read of the remote's /supported; the second's after it. The remote
// then changes the relayer its /supported lists, and the gateway
// restarts: the second payment's record kept the relayer that sent its
// transfer, and its charged buyer is served. (Before: the remote's
// signers were read only once an attempt ended unknown; a killed
// attempt's record kept none, and its transfer, sent from a relayer the
// remote no longer lists, was "settled by another settlement".)
func TestHeldRemotePaymentKilledMidSettlementServedAfterRemoteSignerChange(t *testing.T) {
	d, fac := sharedDevnet(t)
	var rotated atomic.Bool
	var asked atomic.Int64
	remote := newLossyProxy(t, fac, "lose_reply", func(s map[string]any) {
		asked.Add(1)
		if rotated.Load() {
			s["signers"] = map[string][]string{"eip155:*": {evmfacilitator.DevAccounts()[8].Address.Hex()}}
		}
	})
	remote.pass.Store(true) // /settle forwarded: the gateway is killed mid-settlement
	up := newUpstream(t)
	storeDir := gateDir(t)
	url := startCaddy(t, killSite(up.URL, "killed_http "+remote.URL, storeDir)) + "/verify/schema"
	pay := func(key int) string {
		sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), key)
		killedMidSettlement(t, url, sig)
		return sig
	}
	pay(2)
	for i := 0; asked.Load() == 0 && i < 200; i++ {
		time.Sleep(50 * time.Millisecond) // the background ask, bounded
	}
	t.Logf("the remote's /supported asked %d time(s) after the first claim", asked.Load())
	payer := evmfacilitator.DevAccounts()[3].Address
	before := balance(t, d, payer)
	sig := pay(3)
	if err := caddy.Stop(); err != nil {
		t.Fatal(err)
	}
	rotated.Store(true)
	p := restartedPayment{payer: payer, before: before, sig: sig,
		url: startCaddy(t, killSite(up.URL, "http {\n\t\t\t\turl "+remote.URL+"\n\t\t\t\trpc devnet "+d.RPCURL()+"\n\t\t\t}", storeDir)) + "/verify/schema"}
	servedAfterRotation(t, d, up, p)
}
