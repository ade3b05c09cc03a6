package caddymodule

import (
	"fmt"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/aovhq/aov/plugins/evmfacilitator"
)

// A config naming evm facilitators whose rpc_url accepts connections and
// never answers loads at once: each facilitator reads its chain's genesis
// block in the background, and sends nothing until it has. (Before: New
// read it within 10 s, one facilitator after another, so two such
// facilitators held the config load, caddy reload and the admin API, 20 s,
// and n of them n×10 s.)
func TestAConfigLoadDoesNotWaitForTheChainsGenesisRead(t *testing.T) {
	addr := stalledListener(t)
	endpoint := "http://" + addr
	site := ""
	for i, rt := range []string{"30s", "45s"} { // two facilitators: their settings differ
		site += fmt.Sprintf(`
	route /verify/r%d {
		x402 {
			accept base $0.02 %s
			facilitator evm {
				network base
				rpc_url %s
				relayer_key %s
				receipt_timeout %s
			}
			store badger {data}/gate%d
		}
		respond "ok"
	}`, i, payTo.Hex(), endpoint, evmfacilitator.DevAccounts()[9].PrivateKeyHex, rt, i)
	}
	start := time.Now()
	err := tryLoadCaddy(t, freePort(t), ":{port} {"+site+"\n}\n")
	took := time.Since(start)
	if err != nil {
		t.Fatalf("load = %v", err)
	}
	defer caddy.Stop()
	if took > 5*time.Second {
		t.Errorf("the config load took %s with the chain's node not answering; want it not to wait for the genesis reads", took.Round(time.Millisecond))
	}
}
