package e2e

import (
	"math/big"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aovhq/aov/plugins/evmfacilitator"
)

// AOV_FACILITATOR=remote make run: the facilitator (with the devnet) runs
// as its own supervised process, the gateway pays through it, and when it
// dies it is restarted with its chain intact while the gateway keeps
// serving; Ctrl-C stops it too.
func TestRunScriptRemoteFacilitator(t *testing.T) {
	env, base, rpcURL := runEnv(t, filepath.Join(t.TempDir(), "data"))
	env = append(env, "AOV_FACILITATOR=remote", "AOV_FACILITATOR_ADDR="+freeAddr(t))
	rs := startRunScript(t, env)
	body := example(t, "invoice-fixed.json")
	payer := evmfacilitator.DevAccounts()[4]
	req, resource := offerAt(t, base)
	before := usdcAt(t, rpcURL, req.Asset, payer.Address)
	pay := func(t *testing.T) { payVerify(t, base, body, payer, req, resource) }
	pay(t)
	mustStatus(t, get(t, base+"/facilitator/supported"), http.StatusOK)

	pid := rs.pidOf(t, "facilitator")
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	rs.waitOutput(t, "restarting facilitator", 1, 10*time.Second)
	// Until it is back, free calls are served and the service answers.
	mustStatus(t, post(t, base+"/verify/schema", body), http.StatusOK)
	waitFor(t, "the restarted facilitator", func() error {
		if rs.pidOf(t, "facilitator") == pid {
			return errNotYet
		}
		return httpOK(base + "/facilitator/supported")
	})
	pay(t)
	paid := new(big.Int).Sub(before, usdcAt(t, rpcURL, req.Asset, payer.Address))
	if want := new(big.Int).Mul(big.NewInt(2), mustBig(t, req.Amount)); paid.Cmp(want) != 0 {
		t.Fatalf("the payer has paid %v, want %v (the chain must survive the facilitator's death)", paid, want)
	}
	rs.interrupt(t)
	for _, name := range []string{"caddy stopped", "facilitator stopped", "verifierd stopped", "certd stopped"} {
		if !strings.Contains(rs.out.String(), name) {
			t.Errorf("output lacks %q", name)
		}
	}
}
