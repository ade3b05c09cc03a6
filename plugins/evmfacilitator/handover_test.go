package evmfacilitator

import (
	"context"
	"errors"
	"math/big"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/core/types"

	"github.com/aovhq/aov/x402"
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
	d := startDevnet(t, DevnetConfig{gasLimit: spikeGasLimit, MaxClockLead: 20 * time.Second})
	e := &testEnv{d: d}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	g := &congestion{t: t, d: d}
	sctx, scancel := context.WithCancel(context.Background())
	defer scancel()
	sc := &gateDeadline{spikeBeforeSend: &spikeBeforeSend{Chain: d.Client(), g: g, ctx: ctx}, cancel: scancel}
	old, err := New(Config{Chain: sc, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	req := e.requirements(payee, amount)
	req.MaxTimeoutSeconds = 12
	p := mustSignExact(t, payer, req)
	validBefore := old.checkOwn(ctx, p, req).auth.ValidBefore.Uint64()
	_, err = old.Settle(sctx, p, req)
	var ue *x402.UnknownOutcomeError
	if !errors.As(err, &ue) {
		t.Fatalf("settle sent before the spike: %v; want an unknown outcome", err)
	}
	first := sc.all()[0]

	// The reload.
	reloaded, err := New(Config{Chain: d.Client(), Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer reloaded.Close()
	old.Close()

	for {
		h, err := d.Client().HeaderByNumber(ctx, nil)
		if err == nil && h.Time > validBefore+1 && uint64(time.Now().Unix()) > validBefore+1 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		n, nerr := d.Client().NonceAt(ctx, reloaded.relayer, nil)
		if nerr == nil && n > first.Nonce() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("20 s after validBefore the relayer's nonce %d is still taken by the stuck settlement %s of the facilitator the reload closed; want it cancelled by the new one", first.Nonce(), first.Hash().Hex())
		}
	}
	for deadline := time.Now().Add(15 * time.Second); watching(reloaded.nonces); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the relayer's look-after still runs with no outcome left to learn")
		}
	}
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
	req := e.requirements(payee, amount)
	c := f.checkOwn(context.Background(), mustSignExact(t, payer, req), req)
	tx, err := types.SignNewTx(f.key, f.signer, &types.DynamicFeeTx{ChainID: f.chainID, Gas: 300_000, GasFeeCap: big.NewInt(1e9), To: &c.token, Data: c.txData})
	if err != nil {
		t.Fatal(err)
	}
	s := newSentSettlement(tx, time.Now(), c.auth.ValidBefore)
	s.owner.Store(f)
	s.c = *c
	f.nonces.keep(usedKey{token: c.token, from: c.auth.From, nonce: c.auth.Nonce}, s, time.Now())
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
