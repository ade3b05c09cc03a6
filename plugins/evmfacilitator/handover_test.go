package evmfacilitator

import (
	"testing"
	"time"
)

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
	s := keepUnknownSettlement(t, e, f)
	f.Close()
	for deadline := time.Now().Add(time.Second); watching(f.nonces); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the look-after still runs a second after the only facilitator closed")
		}
	}

	elsewhere, err := New(Config{Chain: startDevnet(t, DevnetConfig{}).Client(), Network: DevnetNetwork, RelayerKey: DevKey(0)})
	if err != nil {
		t.Fatal(err)
	}
	defer elsewhere.Close()
	if s.owner.Load() != f || watching(f.nonces) {
		t.Fatal("a facilitator on another chain of chain ID 1337 took over the settlement")
	}

	next, err := New(Config{Chain: d.Client(), Network: DevnetNetwork, RelayerKey: DevKey(0), ReceiptTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	if s.owner.Load() != next {
		t.Fatal("the next facilitator of the key on the chain did not take the settlement over")
	}
	if !watching(next.nonces) {
		t.Error("no look-after runs for the settlement taken over")
	}
}
