package evmfacilitator

import (
	"context"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/core/types"
)

// identified waits for f to identify its chain, and returns the relayer's
// nonce manager on it.
func identified(t testing.TB, f *Facilitator) *nonceManager {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := f.relayerNonces(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n.unhold()
	return n
}

// A settlement stuck by a fee spike, answered unknown, whose facilitator is
// then replaced by a reload that changes its settings (Caddy provisions
// the new configuration's facilitator, here with another receipt_timeout
// and chain client, and only then closes the old one: New, then Close), is
// cancelled past its validBefore by the new facilitator's look-after,
// with no retry. (Before: the closed facilitator's settlements were looked
// after by no one, the stuck one kept the relayer's nonce and every later
// settlement of the relayer queued behind it.)
func TestAReloadHandsTheStuckSettlementsOver(t *testing.T) {
	st := settleIntoSpike(t, 3*time.Second)

	// The reload.
	reloaded, err := New(Config{Chain: st.d.Client(), Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer reloaded.Close()
	st.f.Close()

	st.waitNonceFreed(t, reloaded)
}

// The settlements of a facilitator closed while no other of the key on its
// chain is open wait for the next one made on that chain, which takes them
// over and looks after them; one made on another chain of the chain ID
// does not. (Before: they were looked after by no one.)
func TestTheNextFacilitatorTakesOverWhatAClosedOneLeft(t *testing.T) {
	d := startDevnet(t, DevnetConfig{})
	e := &testEnv{d: d}
	f, err := New(Config{Chain: d.Client(), Network: DevnetNetwork, RelayerKey: DevKey(0), ReceiptTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	identified(t, f)
	s := keepUnknownSettlement(t, e, f)
	f.Close()
	for deadline := time.Now().Add(5 * time.Second); watching(f.nonces); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the look-after still runs 5 s after the only facilitator closed; its next round was 15 s away")
		}
	}

	elsewhere, err := New(Config{Chain: startDevnet(t, DevnetConfig{}).Client(), Network: DevnetNetwork, RelayerKey: DevKey(0)})
	if err != nil {
		t.Fatal(err)
	}
	defer elsewhere.Close()
	identified(t, elsewhere)
	if s.owner.Load() != f || watching(f.nonces) {
		t.Fatal("a facilitator on another chain of chain ID 1337 took over the settlement")
	}

	next, err := New(Config{Chain: d.Client(), Network: DevnetNetwork, RelayerKey: DevKey(0), ReceiptTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	identified(t, next)
	if s.owner.Load() != next {
		t.Fatal("the next facilitator of the key on the chain did not take the settlement over")
	}
	if !watching(next.nonces) {
		t.Error("no look-after runs for the settlement taken over")
	}
}

// fillsTheGap waits up to 8 s for the relayer's nonce on d to pass lost's,
// the transaction of a settlement that the node lost: the look-after of
// whoever holds the settlement sends it again.
func fillsTheGap(t *testing.T, d *Devnet, f *Facilitator, lost *types.Transaction) bool {
	t.Helper()
	for deadline := time.Now().Add(8 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		n, err := d.Client().NonceAt(context.Background(), f.relayer, nil)
		if err == nil && n > lost.Nonce() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// A reload whose new facilitator is loaded while its node does not answer
// the genesis read (a blip) still hands it the old one's settlements once
// the node answers: it identifies the chain in the background and takes
// over what the old one left. (Before: New read the genesis block once,
// and the facilitator opened only at its first settle or status read, so
// the old one's lost settlement was looked after by no one until a payment
// came.)
func TestAFacilitatorIdentifiedAfterAReloadTakesTheClosedOnesSettlementsOver(t *testing.T) {
	d := startDevnet(t, DevnetConfig{})
	vc := &fakeLosingSends{Chain: d.Client(), drop: 2}
	f1, err := New(Config{Chain: vc, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	req := (&testEnv{d: d}).requirements(payee, amount)
	if _, err = f1.Settle(context.Background(), mustSignExact(t, payer, req), req); err == nil {
		t.Fatal("want an unknown outcome")
	}
	vc.mu.Lock()
	lost := vc.lost[0]
	vc.mu.Unlock()
	oc := &genesisOutage{Chain: d.Client()}
	oc.down.Store(true)
	f2, err := New(Config{Chain: oc, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer f2.Close()
	f1.Close()
	time.Sleep(300 * time.Millisecond)
	oc.down.Store(false) // the node answers again
	if !fillsTheGap(t, d, f1, lost) {
		t.Fatalf("8 s after the reload (node answering again) the relayer's nonce %d (lost %s) is still a gap: the loaded facilitator took nothing over", lost.Nonce(), lost.Hash().Hex())
	}
}
