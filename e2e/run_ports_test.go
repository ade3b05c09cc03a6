package e2e

import (
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// runScriptToEnd runs scripts/run.sh with env until it exits, and returns
// its output and exit code. A script still running after within (one that
// started a stack instead of refusing) is stopped as Ctrl-C stops it, and
// the test fails.
func runScriptToEnd(t *testing.T, env []string, within time.Duration) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(repoRoot, "scripts", "run.sh"))
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGINT) }
	cmd.WaitDelay = time.Minute
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("run.sh still running after %v instead of refusing:\n%s", within, out)
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), code
}

// withEnv returns env with name set to value (replacing it if present).
func withEnv(env []string, name, value string) []string {
	out := make([]string, 0, len(env)+1)
	for _, e := range env {
		if !strings.HasPrefix(e, name+"=") {
			out = append(out, e)
		}
	}
	return append(out, name+"="+value)
}

func envOf(env []string, name string) string {
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, name+"="); ok {
			return v
		}
	}
	return ""
}

// A second make run whose HTTP port a running stack already serves stops
// before building or starting anything, naming the variable and the
// address. Before, the running stack answered its start-up checks, it said
// "aov is running", and its Caddy joined the port (SO_REUSEPORT): the
// kernel split buyers between two stacks with different keys, gateway
// tokens, allowances and chains. Every other address it listens on is
// checked the same way (here against a plain listener).
func TestRunScriptRefusesAnAddressInUse(t *testing.T) {
	env1, _, _ := runEnv(t, filepath.Join(t.TempDir(), "data"))
	startRunScript(t, env1)

	env2, _, _ := runEnv(t, filepath.Join(t.TempDir(), "data2"))
	port := envOf(env1, "AOV_HTTP_PORT")
	out, code := runScriptToEnd(t, withEnv(env2, "AOV_HTTP_PORT", port), 4*time.Minute)
	if code != 1 || !strings.Contains(out, "AOV_HTTP_PORT: 127.0.0.1:"+port+" is already in use") || strings.Contains(out, "started") || strings.Contains(out, "aov is running") {
		t.Fatalf("second run.sh on the running stack's port %s: exit %d\n%s\nwant exit 1 naming AOV_HTTP_PORT, nothing started", port, code, out)
	}

	for _, v := range []string{"AOV_VERIFIERD_ADDR", "AOV_CERTD_PUBLIC_ADDR", "AOV_ADMIN_ADDR", "AOV_VERIFIERD_METRICS_ADDR", "AOV_DEVNET_RPC_ADDR"} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		env, _, _ := runEnv(t, filepath.Join(t.TempDir(), "data"))
		out, code := runScriptToEnd(t, withEnv(env, v, ln.Addr().String()), 4*time.Minute)
		ln.Close()
		if code != 1 || !strings.Contains(out, v+": "+ln.Addr().String()+" is already in use") || strings.Contains(out, "started") {
			t.Fatalf("%s taken: exit %d\n%s\nwant exit 1 naming %s, nothing started", v, code, out, v)
		}
	}
}

// A second make run on the data folder of a running one (its own ports) is
// refused, certd seeing the live socket, and leaves the running stack's
// data/solana-chain.json (the local chain's URL and test wallets, which
// make load reads) as it was. Before, it emptied that file before being
// refused.
func TestRunScriptRefusedOnALiveDataFolderKeepsItsSolanaWallets(t *testing.T) {
	if _, err := os.Stat(filepath.Join(repoRoot, "interop", "node_modules", "litesvm")); err != nil {
		t.Skip("no interop/node_modules: make interop-deps")
	}
	data := filepath.Join(t.TempDir(), "data")
	env1, _, _ := runEnv(t, data)
	startRunScript(t, env1)
	file := filepath.Join(data, "solana-chain.json")
	before, err := os.ReadFile(file)
	if err != nil || len(before) == 0 {
		t.Fatalf("the running stack's %s: %q, %v", file, before, err)
	}

	env2, _, _ := runEnv(t, data)
	out, code := runScriptToEnd(t, env2, 4*time.Minute)
	if code != 1 || !strings.Contains(out, "exited during start-up") {
		t.Fatalf("second run.sh on a live data folder: exit %d\n%s\nwant it refused", code, out)
	}
	after, _ := os.ReadFile(file)
	if string(after) != string(before) {
		t.Errorf("the refused run changed %s: %d bytes before, %d after", file, len(before), len(after))
	}
	if left, _ := filepath.Glob(file + ".*"); len(left) > 0 {
		t.Errorf("the refused run left %v", left)
	}
}

// Every TCP port a make run listens on is checked before it starts: the
// stack of a run (with AOV_FACILITATOR=remote, which starts the most
// listeners) listens only on addresses its settings name, and a second run
// given any one of them stops, naming that setting, before starting
// anything. Before, AOV_FACILITATOR_ADMIN_ADDR (the facilitator's Caddy
// admin API, localhost:2020 by default, as is a seller's Caddy's in README)
// went unchecked, and a second facilitator's admin API joined the first's
// port (SO_REUSEPORT): the kernel split `caddy reload` and `GET /config/`
// between the two.
func TestRunScriptChecksEveryAddressItListensOn(t *testing.T) {
	remoteEnv := func() []string {
		env, _, _ := runEnv(t, filepath.Join(t.TempDir(), "data"))
		return append(env, "AOV_FACILITATOR=remote", "AOV_FACILITATOR_ADDR="+freeAddr(t), "AOV_FACILITATOR_ADMIN_ADDR="+freeAddr(t))
	}
	env := remoteEnv()
	rs := startRunScript(t, env)
	setting := map[string]string{} // port → the setting naming it
	for _, e := range env {
		name, value, _ := strings.Cut(e, "=")
		if name == "AOV_HTTP_PORT" {
			setting[value] = name
		} else if strings.HasSuffix(name, "_ADDR") {
			_, port, _ := net.SplitHostPort(value)
			setting[port] = name
		}
	}
	ports := listeningPorts(t, rs.cmd.Process.Pid)
	if len(ports) < 8 {
		t.Fatalf("the stack listens on %v: fewer ports than its settings name", ports)
	}
	t.Logf("the stack listens on %v", ports)
	for _, port := range ports {
		v := setting[port]
		if v == "" {
			t.Errorf("the stack listens on port %s, which no setting names", port)
			continue
		}
		out, code := runScriptToEnd(t, withEnv(remoteEnv(), v, envOf(env, v)), 2*time.Minute)
		if code != 1 || !strings.Contains(out, v+": ") || !strings.Contains(out, " is already in use") || strings.Contains(out, "started") {
			t.Errorf("%s taken by a running stack: exit %d\n%s\nwant exit 1 naming %s, nothing started", v, code, out, v)
		}
	}
}

// listeningPorts is the TCP ports on which pid or a process descending from
// it listens, read from /proc.
func listeningPorts(t *testing.T, pid int) []string {
	t.Helper()
	procs, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	parent := map[int]int{}
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid …; comm may hold spaces and parentheses.
		fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		var self, ppid int
		fmt.Sscan(filepath.Base(filepath.Dir(p)), &self)
		fmt.Sscan(fields[1], &ppid)
		parent[self] = ppid
	}
	inodes := map[string]bool{}
	for p := range parent {
		q := p
		for q != 0 && q != pid {
			q = parent[q]
		}
		if q != pid {
			continue
		}
		fds, _ := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", p))
		for _, fd := range fds {
			if l, err := os.Readlink(fd); err == nil && strings.HasPrefix(l, "socket:[") {
				inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
			}
		}
	}
	seen := map[string]bool{}
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			// sl local_address rem_address st … inode (the tenth field)
			if len(f) < 10 || f[3] != "0A" || !inodes[f[9]] {
				continue
			}
			port, err := strconv.ParseUint(f[1][strings.LastIndexByte(f[1], ':')+1:], 16, 16)
			if err != nil {
				t.Fatalf("%s: %q", table, line)
			}
			seen[strconv.FormatUint(port, 10)] = true
		}
	}
	return slices.Sorted(maps.Keys(seen))
}

// Two make runs started together on the same addresses (each with its own
// data folder) start one stack: the other waits (saying so) while the
// first checks, builds and starts, then finds the addresses in use and
// stops, having started nothing. Before, both passed the check (nothing listens until
// the daemons start) and both stacks died, "… exited during start-up".
func TestTwoRunsAtOnceStartOneStack(t *testing.T) {
	env1, base, _ := runEnv(t, filepath.Join(t.TempDir(), "data"))
	env2 := withEnv(env1, "AOV_DATA", filepath.Join(t.TempDir(), "data2"))
	runs := []*runScript{launchRunScript(t, env1), launchRunScript(t, env2)}
	exited := func(rs *runScript) bool {
		select {
		case <-rs.done:
			return true
		default:
			return false
		}
	}
	settled := func() bool {
		for _, rs := range runs {
			if !exited(rs) && !rs.running() {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(4 * time.Minute)
	for !settled() && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	var up, refused int
	for _, rs := range runs {
		out := rs.out.String()
		switch {
		case rs.running() && !exited(rs):
			up++
		case exited(rs) && strings.Contains(out, "waiting for it") && strings.Contains(out, " is already in use") && !strings.Contains(out, " started (pid"):
			refused++
		}
	}
	if up != 1 || refused != 1 {
		t.Fatalf("two run.sh at once: %d running, %d refused before starting anything; want 1 and 1\n--- first ---\n%s\n--- second ---\n%s", up, refused, runs[0].out.String(), runs[1].out.String())
	}
	if err := httpOK(base + "/health"); err != nil {
		t.Errorf("the stack that started does not serve: %v", err)
	}
}
