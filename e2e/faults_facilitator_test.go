package e2e

import (
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// testFacilitatorTimeout is the gate's deadline for one call to the remote
// facilitator in the fault tests (Caddyfile.example's
// AOV_FACILITATOR_TIMEOUT, 30 s by default).
const testFacilitatorTimeout = 4 * time.Second

// facilitatorProc is the x402 facilitator running as its own process
// (a second Caddy from examples/facilitator/Caddyfile) with the devnet
// inside it, its chain kept in a data folder so a restart keeps every
// balance and nonce.
type facilitatorProc struct {
	addr string // its facilitator API
	rpc  string // the devnet's JSON-RPC
	dir  string
	env  []string
	p    *proc
}

// startFacilitator starts the facilitator process and stops it when the
// test ends (after the stack that uses it, which is started later).
func startFacilitator(t *testing.T) *facilitatorProc {
	t.Helper()
	f := &facilitatorProc{addr: freeAddr(t), rpc: freeAddr(t), dir: t.TempDir()}
	for _, d := range []string{"devnet", "caddy/data", "caddy/config"} {
		if err := os.MkdirAll(filepath.Join(f.dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	_, port, _ := net.SplitHostPort(f.addr)
	f.env = []string{
		"AOV_FACILITATOR_PORT=" + port,
		"AOV_BIND=127.0.0.1",
		"AOV_FACILITATOR_ADMIN_ADDR=" + freeAddr(t),
		"AOV_DEVNET_RPC_ADDR=" + f.rpc,
		"AOV_DEVNET_DIR=" + filepath.Join(f.dir, "devnet"),
		"XDG_DATA_HOME=" + filepath.Join(f.dir, "caddy", "data"),
		"XDG_CONFIG_HOME=" + filepath.Join(f.dir, "caddy", "config"),
	}
	t.Cleanup(func() {
		f.p.stop(t)
		if t.Failed() {
			t.Logf("---- facilitator output (tail) ----\n%s", f.p.tail(6000))
		}
	})
	f.start(t)
	return f
}

// start runs the facilitator and waits until it answers /supported.
func (f *facilitatorProc) start(t *testing.T) {
	t.Helper()
	f.p = startProc(t, "facilitator", f.dir, f.env, bin.caddy,
		"run", "--config", filepath.Join(repoRoot, "examples", "facilitator", "Caddyfile"), "--adapter", "caddyfile")
	waitFor(t, "the facilitator's /supported", func() error {
		if !f.p.running() {
			return errStopped
		}
		return httpOK("http://" + f.addr + "/supported")
	})
}

// remoteFacilitatorEnv points Caddyfile.example's gate at f
// (AOV_FACILITATOR=remote) with the fault tests' deadline.
func (f *facilitatorProc) remoteFacilitatorEnv() []string {
	return []string{
		"AOV_FACILITATOR=remote",
		"AOV_FACILITATOR_ADDR=" + f.addr,
		"AOV_DEVNET_RPC_ADDR=" + f.rpc,
		"AOV_FACILITATOR_TIMEOUT=" + testFacilitatorTimeout.String(),
	}
}
