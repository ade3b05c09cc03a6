package evmfacilitator

import (
	"context"
	"errors"
	"math/big"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/core/types"
)

// Two chains with one chain ID, each with the relayer key, running at
// once (two devnets: both are chain 1337), and facilitators of the key
// made on each while both run, as a gateway holding two configurations
// of one key on two such chains (or a test rig) does: each settles on its
// own chain, with the relayer's nonce of that chain. (Before: both took
// the nonce manager of chain ID 1337, the nonce cached from one chain was
// used on the other, where it was ahead of the relayer's and left the
// settlement queued, never mined, its outcome unknown after
// receipt_timeout.)
func TestChainsOfOneChainIDDoNotShareTheRelayerNonces(t *testing.T) {
	a := startDevnet(t, DevnetConfig{})
	b := startDevnet(t, DevnetConfig{})
	newFac := func(d *Devnet) *Facilitator {
		t.Helper()
		f, err := New(Config{Chain: d.Client(), Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 3 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	fa, fb := newFac(a), newFac(b)
	settle := func(d *Devnet, f *Facilitator, which string) {
		t.Helper()
		req := (&testEnv{d: d}).requirements(payee, amount)
		if r, err := f.Settle(context.Background(), mustSignExact(t, payer, req), req); err != nil || !r.Success {
			t.Fatalf("settle on %s = %+v, %v", which, r, err)
		}
	}
	// The relayer's nonce on a runs two ahead of its nonce on b.
	settle(a, fa, "a")
	settle(a, fa, "a")
	settle(b, fb, "b")
	settle(a, fa, "a")
	if fa.nonces == fb.nonces {
		t.Error("the relayer's facilitators on two chains of one chain ID share one nonce manager")
	}
}

// genesisOutage is the devnet's client whose reads of the genesis block
// fail while down is set, as an RPC endpoint that is down when the
// gateway's configuration loads.
type genesisOutage struct {
	Chain
	down atomic.Bool
}

func (c *genesisOutage) HeaderByNumber(ctx context.Context, n *big.Int) (*types.Header, error) {
	if c.down.Load() && n != nil && n.Sign() == 0 {
		return nil, errors.New("connection refused")
	}
	return c.Chain.HeaderByNumber(ctx, n)
}

// A facilitator made while its chain cannot be identified (New reads the
// genesis block, and the endpoint is down) sends nothing until it can: its
// settle is an error, retryable, and the relayer's nonce is untouched; once
// the endpoint answers, its next settle identifies the chain and settles
// with the nonces the chain's other facilitators of the key use.
func TestAChainIdentifiedLaterSettlesWithItsOwnNonces(t *testing.T) {
	e := newEnv(t)
	oc := &genesisOutage{Chain: e.d.Client()}
	oc.down.Store(true)
	f, err := New(Config{Chain: oc, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	before, err := e.d.Client().PendingNonceAt(context.Background(), f.relayer)
	if err != nil {
		t.Fatal(err)
	}
	req := e.requirements(payee, amount)
	pay := mustSignExact(t, payer, req)
	if r, err := f.Settle(context.Background(), pay, req); err == nil || r.Success || r.ErrorReason != "" {
		t.Fatalf("settle on a chain not identified = %+v, %v; want an error and no refusal", r, err)
	}
	if after, err := e.d.Client().PendingNonceAt(context.Background(), f.relayer); err != nil || after != before {
		t.Fatalf("the relayer's nonce went from %d to %d (%v): something was sent", before, after, err)
	}
	oc.down.Store(false)
	if r, err := f.Settle(context.Background(), pay, req); err != nil || !r.Success {
		t.Fatalf("settle once the chain answers = %+v, %v", r, err)
	}
	if f.nonces != e.f.nonces {
		t.Error("the facilitator identified late does not share the chain's nonce manager")
	}
}
