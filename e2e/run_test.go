package e2e

import (
	"errors"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/syncbuf"
	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// runScript starts scripts/run.sh (what `make run` runs) in its own process
// group, as a shell in a terminal would, and waits until it says the
// service is up.
type runScript struct {
	cmd  *exec.Cmd
	out  *syncbuf.Buffer
	done chan struct{} // closed when the script has exited; err is then set
	err  error
}

func startRunScript(t *testing.T, env []string) *runScript {
	t.Helper()
	rs := launchRunScript(t, env)
	deadline := time.Now().Add(3 * time.Minute)
	for !rs.running() {
		select {
		case <-rs.done:
			t.Fatalf("run.sh exited before the service was up: %v\n%s", rs.err, rs.out.String())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("run.sh did not bring the service up within 3 minutes:\n%s", rs.out.String())
		}
	}
	return rs
}

// running reports whether the script has said the service is up.
func (rs *runScript) running() bool {
	return strings.Contains(rs.out.String(), "aov is running")
}

// launchRunScript starts scripts/run.sh like startRunScript, without
// waiting; the test's cleanup stops it as Ctrl-C would if it still runs.
func launchRunScript(t *testing.T, env []string) *runScript {
	t.Helper()
	cmd := exec.Command("bash", filepath.Join(repoRoot, "scripts", "run.sh"))
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), env...)
	out := &syncbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	rs := &runScript{cmd: cmd, out: out, done: make(chan struct{})}
	go func() {
		rs.err = cmd.Wait()
		close(rs.done)
	}()
	t.Cleanup(func() {
		select {
		case <-rs.done:
		default:
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
			<-rs.done
		}
		if t.Failed() {
			t.Logf("---- run.sh output ----\n%s", out.String())
		}
	})
	return rs
}

// interrupt sends SIGINT to the script's process group, as Ctrl-C in a
// terminal does, and waits for the script to end.
func (rs *runScript) interrupt(t *testing.T) {
	t.Helper()
	if err := syscall.Kill(-rs.cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-rs.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("run.sh did not stop within 60 s of Ctrl-C:\n%s", rs.out.String())
	}
}

// `make run` builds, creates its data folder, starts certd, verifierd and
// Caddy, serves through Caddy, and stops all three on Ctrl-C; a second run
// keeps the key and history of the first.
func TestRunScript(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	http1, verifierd, certd, admin, metrics, rpc := freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t)
	_, port, _ := net.SplitHostPort(http1)
	env := []string{
		"AOV_DATA=" + data,
		"AOV_BIN=" + bin.dir,
		"AOV_HTTP_PORT=" + port,
		"AOV_VERIFIERD_ADDR=" + verifierd,
		"AOV_CERTD_PUBLIC_ADDR=" + certd,
		"AOV_ADMIN_ADDR=" + admin,
		"AOV_VERIFIERD_METRICS_ADDR=" + metrics,
		"AOV_DEVNET_RPC_ADDR=" + rpc,
		"AOV_SOLANA_RPC_ADDR=" + freeAddr(t),
	}
	base := "http://127.0.0.1:" + port
	card := base + "/.well-known/agent-card.json"

	first := startRunScript(t, env)
	t.Run("the first start generates a development key and a gateway token", func(t *testing.T) {
		out := first.out.String()
		if !strings.Contains(out, "certd -dev will generate one") || !strings.Contains(out, "generating "+data+"/gateway-token") {
			t.Fatalf("output:\n%s", out)
		}
	})
	t.Run("it prints where the service, the agent card and the facilitator are", func(t *testing.T) {
		out := first.out.String()
		for _, want := range []string{"http://localhost:" + port + "/health", "http://localhost:" + port + "/.well-known/agent-card.json", "http://localhost:" + port + "/facilitator/supported", "http://" + rpc, "curl -s http://localhost:" + port + "/verify/schema"} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q", want)
			}
		}
	})
	t.Run("the 402 offers Solana payments only when the local Solana chain runs", func(t *testing.T) {
		// The chain needs interop's npm peers: this checkout has them or
		// not, and the run must say which and offer accordingly. (Before:
		// without them every 402 still offered solana-devnet, which
		// nothing could settle.)
		_, err := os.Stat(filepath.Join(repoRoot, "interop", "node_modules", "litesvm"))
		chain := err == nil
		r := post(t, base+"/verify/schema", nil)
		mustStatus(t, r, http.StatusPaymentRequired)
		var pr x402.PaymentRequired
		if err := x402.DecodeHeader(r.header.Get(x402.HeaderPaymentRequired), &pr); err != nil {
			t.Fatal(err)
		}
		var networks []string
		for _, a := range pr.Accepts {
			networks = append(networks, a.Network)
		}
		solana := slices.Contains(networks, x402.NetworkSolanaDevnet)
		if solana != chain || !slices.Contains(networks, "eip155:1337") {
			t.Fatalf("the local Solana chain runs: %v; the 402 offers %v", chain, networks)
		}
		out := first.out.String()
		if strings.Contains(out, "Solana RPC    http://") != chain || strings.Contains(out, "offer devnet payments only") == chain {
			t.Fatalf("the output does not say whether the Solana chain runs (%v):\n%s", chain, out)
		}
	})
	receipt := post(t, base+"/verify/schema", example(t, "invoice-draft.json"))
	mustStatus(t, receipt, http.StatusOK)
	if r := decode[result](t, receipt); r.Result != "fail" {
		t.Fatalf("the worked example gave %q, want fail", r.Result)
	}
	t.Run("everything lives under the data folder, secrets readable by the owner only", func(t *testing.T) {
		for _, tc := range []struct {
			path string
			mode os.FileMode // 0: any
		}{
			{".", 0o700},
			{"gateway-token", 0o600},
			{"keys", 0o700},
			{"keys/index.json", 0},
			{"certd", 0o700},
			{"verifierd/MANIFEST", 0},
			{"caddy/config/caddy/autosave.json", 0},
			{"caddy/data/caddy/x402/MANIFEST", 0}, // the gateway's Badger store
			{"logs/access.log", 0},
		} {
			fi, err := os.Stat(filepath.Join(data, tc.path))
			if err != nil {
				t.Errorf("%s: %v", tc.path, err)
				continue
			}
			if tc.mode != 0 && fi.Mode().Perm() != tc.mode {
				t.Errorf("%s has mode %v, want %v", tc.path, fi.Mode().Perm(), tc.mode)
			}
		}
	})

	t.Run("make load measures a running stack and leaves it running", func(t *testing.T) {
		// make run's default runs the facilitator inside Caddy: nothing
		// listens on the facilitator's port, which load.sh must take in
		// its stride. Only scenarios that do not draw on the 100 free
		// calls a day of this stack. The durability pair it starts
		// beside the baseline signs with the running stack's keys.
		_, baselinePort, _ := net.SplitHostPort(freeAddr(t))
		durable, nosync := freeAddr(t), freeAddr(t)
		cmd := exec.Command("bash", filepath.Join(repoRoot, "scripts", "load.sh"), "-scenarios", "baseline,direct,durable,nosync", "-c", "1", "-d", "200ms", "-warmup", "0", "-idle", "0")
		cmd.Dir = repoRoot
		cmd.Env = append(os.Environ(), append(env, "AOV_BASELINE_PORT="+baselinePort, "AOV_FACILITATOR_ADDR="+freeAddr(t),
			"AOV_DURABLE_VERIFIERD_ADDR="+durable, "AOV_NOSYNC_VERIFIERD_ADDR="+nosync)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("load.sh: %v\n%s", err, out)
		}
		for _, want := range []string{"facilitator: inside the gateway's Caddy", "baseline at 1: ", "verifierd-durable CPU/req", "verifierd-nosync CPU/req", "durable at 1: ", " req/s of the same verifierd with -no-sync"} {
			if !strings.Contains(string(out), want) {
				t.Errorf("output lacks %q:\n%s", want, out)
			}
		}
		if strings.Contains(string(out), "starting a stack of its own") || strings.Contains(string(out), "requests failed") {
			t.Errorf("load.sh did not measure the running stack cleanly:\n%s", out)
		}
		mustStatus(t, get(t, base+"/health"), http.StatusOK)
		for _, addr := range []string{durable, nosync} {
			if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
				c.Close()
				t.Errorf("the durability pair's verifierd on %s still accepts connections after load.sh ended", addr)
			}
		}
	})

	first.interrupt(t)
	t.Run("Ctrl-C stops Caddy, verifierd and certd", func(t *testing.T) {
		out := first.out.String()
		for _, name := range []string{"caddy stopped", "verifierd stopped", "certd stopped"} {
			if !strings.Contains(out, name) {
				t.Errorf("output lacks %q", name)
			}
		}
		for _, addr := range []string{http1, verifierd, certd, admin, metrics, rpc} {
			if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
				c.Close()
				t.Errorf("%s still accepts connections after Ctrl-C", addr)
			}
		}
	})

	second := startRunScript(t, env)
	t.Run("a second start keeps the key: the first run's receipt verifies against its card", func(t *testing.T) {
		if strings.Contains(second.out.String(), "will generate one") {
			t.Fatal("the second start generated a new key")
		}
		if out, code := aov(t, "receipt", "verify", "--card", card, writeFile(t, "first.json", receipt.body)); code != 0 {
			t.Fatalf("exit %d\n%s", code, out)
		}
	})
	second.interrupt(t)
}

// `make load` with nothing running: scripts/load.sh starts a stack of its
// own and a plain Caddy reverse_proxy beside it, measures every scenario,
// prints the ratios and the CPU per request of each process, and stops
// everything it started.
func TestLoadScript(t *testing.T) {
	http1, verifierd, certd, admin, metrics, rpc := freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t)
	baseline, facilitator, durable, nosync := freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t)
	_, port, _ := net.SplitHostPort(http1)
	_, baselinePort, _ := net.SplitHostPort(baseline)
	cmd := exec.Command("bash", filepath.Join(repoRoot, "scripts", "load.sh"), "-c", "2", "-d", "500ms", "-warmup", "0")
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(),
		"AOV_BIN="+bin.dir,
		"AOV_HTTP_PORT="+port,
		"AOV_VERIFIERD_ADDR="+verifierd,
		"AOV_CERTD_PUBLIC_ADDR="+certd,
		"AOV_ADMIN_ADDR="+admin,
		"AOV_VERIFIERD_METRICS_ADDR="+metrics,
		"AOV_DEVNET_RPC_ADDR="+rpc,
		"AOV_SOLANA_RPC_ADDR="+freeAddr(t),
		"AOV_BASELINE_PORT="+baselinePort,
		"AOV_FACILITATOR_ADDR="+facilitator,
		"AOV_FACILITATOR_ADMIN_ADDR="+freeAddr(t),
		"AOV_DURABLE_VERIFIERD_ADDR="+durable,
		"AOV_NOSYNC_VERIFIERD_ADDR="+nosync,
	)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("load.sh: %v\n%s", err, out)
	}
	for _, want := range []string{"starting a stack of its own", "caddy CPU/req", "verifierd CPU/req", "certd CPU/req",
		"free", "baseline", "direct", "mcp", "paid", "facilitator", "the plain reverse_proxy", "stopping the stack it started",
		"facilitator: its own process", "facilitator CPU/req", "gateway caddy CPU/req",
		"mcp-baseline", "the plain reverse_proxy carrying the same MCP call", "the MCP transport's own cost",
		"verifierd-durable CPU/req", "verifierd-nosync CPU/req", "durable at 2: ", " req/s of the same verifierd with -no-sync"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// paid-solana runs on the local Solana chain when the stack has one
	// (the npm peers of interop/ installed), and says why not otherwise.
	solana := "paid-solana: skipped: no Solana chain"
	if _, err := os.Stat(filepath.Join(repoRoot, "interop", "node_modules", "litesvm")); err == nil {
		solana = "paid-solana at 2: "
	}
	if !strings.Contains(string(out), solana) {
		t.Errorf("output lacks %q:\n%s", solana, out)
	}
	if strings.Contains(string(out), "requests failed") {
		t.Errorf("some load requests failed:\n%s", out)
	}
	for _, addr := range []string{http1, verifierd, certd, baseline, facilitator, durable, nosync} {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			t.Errorf("%s still accepts connections after load.sh ended", addr)
		}
	}
}

// pidOf returns the pid the script last reported for name ("NAME started
// (pid N)").
func (rs *runScript) pidOf(t *testing.T, name string) int {
	t.Helper()
	out := rs.out.String()
	marker := name + " started (pid "
	i := strings.LastIndex(out, marker)
	if i < 0 {
		t.Fatalf("run.sh did not report %s's pid:\n%s", name, out)
	}
	rest := out[i+len(marker):]
	pid, err := strconv.Atoi(rest[:strings.IndexByte(rest, ')')])
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// waitOutput waits until the script's output contains want n times.
func (rs *runScript) waitOutput(t *testing.T, want string, n int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for strings.Count(rs.out.String(), want) < n {
		if time.Now().After(deadline) {
			t.Fatalf("run.sh did not print %q (%d times) within %v:\n%s", want, n, within, rs.out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// runEnv is the environment of a run.sh on free ports with its data in data.
func runEnv(t *testing.T, data string) (env []string, base, rpcURL string) {
	t.Helper()
	http1, verifierd, certd, admin, metrics, rpc := freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t)
	_, port, _ := net.SplitHostPort(http1)
	return []string{
		"AOV_DATA=" + data,
		"AOV_BIN=" + bin.dir,
		"AOV_HTTP_PORT=" + port,
		"AOV_VERIFIERD_ADDR=" + verifierd,
		"AOV_CERTD_PUBLIC_ADDR=" + certd,
		"AOV_ADMIN_ADDR=" + admin,
		"AOV_VERIFIERD_METRICS_ADDR=" + metrics,
		"AOV_DEVNET_RPC_ADDR=" + rpc,
		"AOV_SOLANA_RPC_ADDR=" + freeAddr(t),
	}, "http://127.0.0.1:" + port, "http://" + rpc
}

// Under make run, a daemon that dies is restarted with a backoff and a line
// in the log while the others keep running; a request meanwhile is a prompt
// 503 or a 200, never a hang; Ctrl-C still stops everything.
func TestRunScriptRestartsADeadDaemon(t *testing.T) {
	env, base, rpcURL := runEnv(t, filepath.Join(t.TempDir(), "data"))
	rs := startRunScript(t, env)
	certd := rs.pidOf(t, "certd")
	body := example(t, "invoice-fixed.json")
	payer := evmfacilitator.DevAccounts()[3]
	req, resource := offerAt(t, base)
	before := usdcAt(t, rpcURL, req.Asset, payer.Address)
	pay := func(t *testing.T) { payVerify(t, base, body, payer, req, resource) }
	pay(t)

	for round, name := range []string{"verifierd", "verifierd", "certd", "caddy"} {
		pid := rs.pidOf(t, name)
		if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		// Until it is back, every request is answered promptly.
		deadline := time.Now().Add(60 * time.Second)
		for {
			start := time.Now()
			resp, err := client.Get(base + "/health")
			if took := time.Since(start); took > testUpstreamTimeout+deadlineMargin {
				t.Fatalf("/health took %v while %s was down", took, name)
			}
			status := 0
			if err == nil {
				status = resp.StatusCode
				resp.Body.Close()
			} else if name != "caddy" {
				// Only the front door's own death refuses connections.
				t.Fatalf("/health while %s was down: %v", name, err)
			}
			if status != http.StatusOK && status != http.StatusServiceUnavailable && err == nil {
				t.Fatalf("/health answered %d while %s was down", status, name)
			}
			if status == http.StatusOK && rs.pidOf(t, name) != pid {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s was not back within 60 s:\n%s", name, rs.out.String())
			}
			time.Sleep(100 * time.Millisecond)
		}
		n := 1
		if round == 1 {
			n = 2
		}
		rs.waitOutput(t, name+" exited (status", n, time.Second)
		rs.waitOutput(t, "restarting "+name, n, time.Second)
	}
	t.Run("the second restart of one daemon waits longer (backoff)", func(t *testing.T) {
		out := rs.out.String()
		if !strings.Contains(out, "verifierd exited (status 137) after") || !strings.Contains(out, "restarting it in 2 s") {
			t.Fatalf("output:\n%s", out)
		}
	})
	t.Run("a restart is of the dead process only", func(t *testing.T) {
		if rs.pidOf(t, "certd") == certd {
			t.Error("certd was not restarted")
		}
		if n := strings.Count(rs.out.String(), " (restart "); n != 4 {
			t.Errorf("%d restarts, want 4 (verifierd twice, certd, caddy)", n)
		}
	})
	t.Run("the devnet chain survived Caddy's death: the paid call is still on chain", func(t *testing.T) {
		paid := new(big.Int).Sub(before, usdcAt(t, rpcURL, req.Asset, payer.Address))
		if paid.String() != req.Amount {
			t.Fatalf("after the restart the payer has paid %v, want %s", paid, req.Amount)
		}
	})
	t.Run("after the restarts a verification is served, and paid on the same chain", func(t *testing.T) {
		mustStatus(t, post(t, base+"/verify/schema", body), http.StatusOK)
		pay(t)
		paid := new(big.Int).Sub(before, usdcAt(t, rpcURL, req.Asset, payer.Address))
		if want := new(big.Int).Mul(big.NewInt(2), mustBig(t, req.Amount)); paid.Cmp(want) != 0 {
			t.Fatalf("the payer has paid %v, want %v", paid, want)
		}
	})
	rs.interrupt(t)
	for _, name := range []string{"caddy stopped", "verifierd stopped", "certd stopped"} {
		if !strings.Contains(rs.out.String(), name) {
			t.Errorf("output lacks %q", name)
		}
	}
}

func mustBig(t *testing.T, s string) *big.Int {
	t.Helper()
	n, ok := new(big.Int).SetString(s, 10)
	if !ok {
		t.Fatalf("not a number: %q", s)
	}
	return n
}

// payVerify pays one POST /verify/schema of body at base with payer's
// fresh authorization for req, and wants the paid answer.
func payVerify(t *testing.T, base string, body []byte, payer evmfacilitator.DevAccount, req x402.PaymentRequirements, resource x402.Resource) {
	t.Helper()
	p, err := x402.SignExactEVM(payer.Key(), req, &resource, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	sig, err := x402.EncodeHeader(p)
	if err != nil {
		t.Fatal(err)
	}
	r := do(t, http.MethodPost, base+"/verify/schema", body, map[string]string{x402.HeaderPaymentSignature: sig})
	mustStatus(t, r, http.StatusOK)
	if r.header.Get(x402.HeaderPaymentResponse) == "" {
		t.Fatal("a paid answer without PAYMENT-RESPONSE")
	}
}

// `make run` with a number of seconds given with a unit (AOV_STOP_GRACE=2m,
// AOV_RESTART_MAX_BACKOFF=30s, the way README writes the default) is
// refused at once, with a message naming the variable, and starts nothing.
// Before, it started, and the value broke the script's arithmetic only
// when it was used: on Ctrl-C stop_all killed Caddy without its grace,
// mid-way through the paid calls it was finishing; the first time a daemon
// died the supervision loop ended and took the whole service down with it
// instead of restarting the daemon.
func TestRunScriptRefusesSecondsWithAUnit(t *testing.T) {
	for _, tc := range []struct{ name, value string }{
		{"AOV_STOP_GRACE", "2m"}, {"AOV_STOP_GRACE", "1.5"}, {"AOV_STOP_GRACE", "-3"}, {"AOV_STOP_GRACE", "86401"},
		{"AOV_RESTART_MAX_BACKOFF", "30s"}, {"AOV_RESTART_MAX_BACKOFF", "0"}, {"AOV_RESTART_MAX_BACKOFF", "1e3"},
		{"AOV_RESTART_RESET", "1m"}, {"AOV_RESTART_RESET", " 30"},
	} {
		data := filepath.Join(t.TempDir(), "data")
		cmd := exec.Command("bash", filepath.Join(repoRoot, "scripts", "run.sh"))
		cmd.Dir = repoRoot
		cmd.Env = append(os.Environ(), tc.name+"="+tc.value, "AOV_DATA="+data, "AOV_BIN="+filepath.Join(data, "bin"))
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), tc.name+"=") || !strings.Contains(string(out), ": must be a whole number of seconds") {
			t.Fatalf("%s=%q: %v\n%s\nwant exit status 2 and the reason", tc.name, tc.value, err, out)
		}
		if strings.Contains(string(out), "started") {
			t.Fatalf("%s=%q started something:\n%s", tc.name, tc.value, out)
		}
	}
}

// AOV_SOLANA is on or off: any other value ("false", "0", which an on/off
// switch invites) is refused at once, naming the variable, and starts
// nothing. (Before: it was pasted into a snippet name, and Caddy's load
// failed with "File to import not found: solana_offer_false".)
func TestRunScriptRefusesAnAOVSolanaButOnOrOff(t *testing.T) {
	for _, v := range []string{"false", "0", "yes", "ON"} {
		data := filepath.Join(t.TempDir(), "data")
		cmd := exec.Command("bash", filepath.Join(repoRoot, "scripts", "run.sh"))
		cmd.Dir = repoRoot
		cmd.Env = append(os.Environ(), "AOV_SOLANA="+v, "AOV_DATA="+data, "AOV_BIN="+filepath.Join(data, "bin"))
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "AOV_SOLANA="+v+": must be on or off") {
			t.Fatalf("AOV_SOLANA=%q: %v\n%s\nwant exit status 2 and the reason", v, err, out)
		}
		if strings.Contains(string(out), "started") || strings.Contains(string(out), "building") {
			t.Fatalf("AOV_SOLANA=%q started something:\n%s", v, out)
		}
	}
}
