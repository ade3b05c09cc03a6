package evmfacilitator

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/ethclient"

	"github.com/aovhq/aov/x402"
)

// restartableEndpoint is a devnet serving JSON-RPC on a local port and an
// ethclient dialled to it, as a gateway's rpc_url facilitator reaches a
// devnet's rpc_listen; restart stops that devnet and starts another on the
// same address: the node behind the endpoint is now another chain of chain
// ID 1337 (README: "a devnet started again is another chain").
type restartableEndpoint struct {
	d      *Devnet
	client *ethclient.Client
	listen string
}

func newRestartableEndpoint(t *testing.T) *restartableEndpoint {
	t.Helper()
	d, err := StartDevnet(DevnetConfig{RPCListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	client, err := ethclient.Dial(d.RPCURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	return &restartableEndpoint{d: d, client: client, listen: strings.TrimPrefix(d.RPCURL(), "http://")}
}

func (r *restartableEndpoint) restart(t *testing.T) {
	t.Helper()
	r.d.Close()
	r.d = startDevnet(t, DevnetConfig{RPCListen: r.listen})
}

// A facilitator whose endpoint's node restarts as another chain of its
// chain ID (a devnet stopped and started again on the same rpc_listen,
// which a reload that drops and re-adds the devnet does while the rpc_url
// facilitator stays loaded) settles on the new chain with the relayer's
// nonce of that chain. (Before: it kept the identity read when it was made
// and the nonce cached from the chain before, ahead of the relayer's on the
// new one: the settlement was queued, never mined, its outcome unknown.)
func TestAnEndpointRestartedAsAnotherChainSettlesWithThatChainsNonces(t *testing.T) {
	ep := newRestartableEndpoint(t)
	f, err := New(Config{Chain: ep.client, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for i := 0; i < 2; i++ {
		req := (&testEnv{d: ep.d}).requirements(payee, amount)
		if r, err := f.Settle(context.Background(), mustSignExact(t, payer, req), req); err != nil || !r.Success {
			t.Fatalf("settle %d = %+v, %v", i, r, err)
		}
	}
	ep.restart(t)
	req := (&testEnv{d: ep.d}).requirements(payee, amount)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if r, err := f.Settle(ctx, mustSignExact(t, payer, req), req); err != nil || !r.Success {
		t.Errorf("settle on the chain started again at %s = %+v, %v; want success", ep.listen, r, err)
	}
	if f.knownNonces() != ep.d.nonces.of(f.relayer) {
		t.Errorf("the facilitator still holds the nonce manager of the chain before")
	}
}

// A settlement kept on one chain (its transaction lost by the node, its
// outcome unknown) is never resolved or sent again on the chain that
// replaced it behind the endpoint: the client's retry through the same
// facilitator is answered unknown, nothing sent, and the relayer's
// look-after leaves it alone, so the payer's authorization, signed
// transaction and all, never executes on the new chain. (Before: the retry
// and the look-after sent the old chain's transaction to the new one,
// where it was mined and moved the payer's tokens.)
func TestASettlementKeptOnOneChainIsNeverSentOnTheChainThatReplacedIt(t *testing.T) {
	ep := newRestartableEndpoint(t)
	vc := &fakeLosingSends{Chain: ep.client, drop: 2}
	f, err := New(Config{Chain: vc, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	req := (&testEnv{d: ep.d}).requirements(payee, amount)
	pay := mustSignExact(t, payer, req)
	_, err = f.Settle(context.Background(), pay, req)
	var ue *x402.UnknownOutcomeError
	if !errors.As(err, &ue) {
		t.Fatalf("settle with its transaction lost = %v; want an unknown outcome", err)
	}
	vc.mu.Lock()
	lost := vc.lost[0]
	vc.mu.Unlock()

	ep.restart(t)
	before := usdcBalance(t, ep.d, crypto.PubkeyToAddress(payer.PublicKey))
	r, err := f.Settle(context.Background(), pay, req) // the client's retry
	if !errors.As(err, &ue) || r.Success {
		t.Errorf("retry after the chain behind the endpoint changed = %+v, %v; want an unknown outcome", r, err)
	}
	for deadline := time.Now().Add(6 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if rc, err := ep.d.Client().TransactionReceipt(context.Background(), lost.Hash()); err == nil {
			t.Fatalf("the transaction %s kept of the chain before was sent on the new chain and mined there (status %d); the payer's balance on it went %s -> %s", lost.Hash().Hex(), rc.Status, before, usdcBalance(t, ep.d, crypto.PubkeyToAddress(payer.PublicKey)))
		}
	}
	if after := usdcBalance(t, ep.d, crypto.PubkeyToAddress(payer.PublicKey)); after.Cmp(before) != 0 {
		t.Errorf("the payer's balance on the new chain went %s -> %s", before, after)
	}
}
