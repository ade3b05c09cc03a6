package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aovhq/aov/store"
)

// bin holds the paths of the binaries TestMain built.
var bin struct {
	dir                          string
	caddy, certd, verifierd, aov string
}

// repoRoot is the repository's top folder (Caddyfile.example lives there).
var repoRoot string

// TestMain builds every binary the stack runs, once, the way `make run`
// builds them: cmd/caddy is the Caddy that make run starts, so this is also
// the test that it builds.
func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Println("e2e: skipped in -short mode (builds and starts the whole stack)")
		os.Exit(0)
	}
	os.Exit(buildAndRun(m))
}

func buildAndRun(m *testing.M) int {
	root, err := filepath.Abs("..")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	repoRoot = root
	dir, err := os.MkdirTemp("", "aov-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	cmd := exec.Command("go", "build", "-o", dir+string(filepath.Separator),
		"./cmd/caddy", "./certd", "./verifierd", "./cmd/aov")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: building the binaries: %v\n%s", err, out)
		return 1
	}
	bin.dir = dir
	bin.caddy = filepath.Join(dir, "caddy")
	bin.certd = filepath.Join(dir, "certd")
	bin.verifierd = filepath.Join(dir, "verifierd")
	bin.aov = filepath.Join(dir, "aov")
	return m.Run()
}

// proc is one running process of the stack, with its output in a file that
// is printed when the test fails.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	err     error
}

func startProc(t testing.TB, name, logDir string, env []string, path string, args ...string) *proc {
	t.Helper()
	logPath := filepath.Join(logDir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout = f
	cmd.Stderr = f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("starting %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p
}

func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// stop asks the process to end (SIGTERM), as an operator or make run does,
// and kills it if it has not ended after a grace period.
func (p *proc) stop(t testing.TB) {
	t.Helper()
	if !p.running() {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
		t.Errorf("%s did not stop within 15 s of SIGTERM", p.name)
	}
}

func (p *proc) tail(n int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return err.Error()
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// stack is certd, verifierd and Caddy running together on free ports with
// their own data folder.
type stack struct {
	dir   string
	keys  string // certd's key directory
	sock  string // certd's signing socket
	token string // the gateway token Caddy and verifierd share

	certdPublic   string // host:port of certd's agent-card listener
	verifierdAddr string
	caddyAddr     string
	adminAddr     string
	devnetRPC     string // the devnet chain's JSON-RPC, served by Caddy's facilitator

	caddyEnv []string // extra environment for Caddy (Caddyfile.example's {$...} settings)

	certd, verifierd, caddy *proc
	procs                   []*proc
}

// newStack starts a whole stack and stops it when the test ends. caddyEnv
// adds NAME=value settings for Caddyfile.example (AOV_FREE_PER_DAY=1, ...).
func newStack(t testing.TB, caddyEnv ...string) *stack {
	t.Helper()
	dir := t.TempDir()
	s := &stack{
		dir:           dir,
		keys:          filepath.Join(dir, "keys"),
		sock:          filepath.Join(dir, "certd", "sign.sock"),
		certdPublic:   freeAddr(t),
		verifierdAddr: freeAddr(t),
		caddyAddr:     freeAddr(t),
		adminAddr:     freeAddr(t),
		devnetRPC:     freeAddr(t),
		caddyEnv:      caddyEnv,
	}
	for _, d := range []string{"keys", "certd", "verifierd", "caddy/data", "caddy/config", "logs"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	tok := make([]byte, 32)
	if _, err := rand.Read(tok); err != nil {
		t.Fatal(err)
	}
	s.token = hex.EncodeToString(tok)
	if err := os.WriteFile(s.tokenFile(), []byte(s.token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for i := len(s.procs) - 1; i >= 0; i-- {
			s.procs[i].stop(t)
		}
		if t.Failed() {
			for _, p := range s.procs {
				t.Logf("---- %s output (tail) ----\n%s", p.name, p.tail(6000))
			}
		}
	})
	s.startCertd(t, true)
	s.startVerifierd(t)
	s.startCaddy(t)
	s.waitReady(t)
	return s
}

func (s *stack) tokenFile() string { return filepath.Join(s.dir, "gateway-token") }
func (s *stack) base() string      { return "http://" + s.caddyAddr }
func (s *stack) url(path string) string {
	return s.base() + path
}
func (s *stack) cardURL() string { return s.url("/.well-known/agent-card.json") }

func (s *stack) track(p *proc) *proc {
	s.procs = append(s.procs, p)
	return p
}

// startCertd starts certd; dev lets it generate the first key when the key
// directory is empty (what make run does on first start).
func (s *stack) startCertd(t testing.TB, dev bool) {
	t.Helper()
	args := []string{"serve",
		"-keys", s.keys,
		"-sign-socket", s.sock,
		"-public-listen", s.certdPublic,
		"-public-base-url", s.base(),
	}
	if dev {
		args = append(args, "-dev")
	}
	s.certd = s.track(startProc(t, "certd", s.dir, nil, bin.certd, args...))
	waitFor(t, "certd's agent card", func() error {
		if !s.certd.running() {
			return errStopped
		}
		return httpOK("http://" + s.certdPublic + "/.well-known/agent-card.json")
	})
}

func (s *stack) startVerifierd(t testing.TB) {
	t.Helper()
	s.verifierd = s.track(startProc(t, "verifierd", s.dir, nil, bin.verifierd,
		"-listen", s.verifierdAddr,
		"-admin-listen", "",
		"-data", s.historyDir(),
		"-signer-socket", s.sock,
		"-gateway-token-file", s.tokenFile(),
		"-public-base-url", s.base(),
	))
}

func (s *stack) historyDir() string { return filepath.Join(s.dir, "verifierd") }

// history stops verifierd (Badger allows one process per database) and
// reads what it recorded for agent, straight from the database.
func (s *stack) history(t testing.TB, agent string) []store.Verification {
	t.Helper()
	s.verifierd.stop(t)
	db, err := store.Open(s.historyDir(), store.Options{})
	if err != nil {
		t.Fatalf("opening verifierd's history: %v", err)
	}
	defer db.Close()
	recs, _, err := db.Verifications(context.Background(), agent, "", store.MaxPageSize)
	if err != nil {
		t.Fatalf("reading verifierd's history: %v", err)
	}
	return recs
}

func (s *stack) startCaddy(t testing.TB) {
	t.Helper()
	s.startCaddyWith(t, filepath.Join(repoRoot, "Caddyfile.example"))
}

// startCaddyWith starts the stack's Caddy with another Caddyfile (a variant
// of Caddyfile.example) and the same environment.
func (s *stack) startCaddyWith(t testing.TB, config string) {
	t.Helper()
	_, port, _ := net.SplitHostPort(s.caddyAddr)
	env := []string{
		"AOV_HTTP_PORT=" + port,
		"AOV_BIND=127.0.0.1",
		"AOV_ADMIN_ADDR=" + s.adminAddr,
		"AOV_VERIFIERD_ADDR=" + s.verifierdAddr,
		"AOV_CERTD_PUBLIC_ADDR=" + s.certdPublic,
		"AOV_DEVNET_RPC_ADDR=" + s.devnetRPC,
		"AOV_LOG_DIR=" + filepath.Join(s.dir, "logs"),
		"AOV_GATEWAY_TOKEN=" + s.token,
		"AOV_PUBLIC_BASE_URL=" + s.base(),
		"XDG_DATA_HOME=" + filepath.Join(s.dir, "caddy", "data"),
		"XDG_CONFIG_HOME=" + filepath.Join(s.dir, "caddy", "config"),
	}
	env = append(env, s.caddyEnv...)
	s.caddy = s.track(startProc(t, "caddy", s.dir, env, bin.caddy,
		"run", "--config", config, "--adapter", "caddyfile"))
}

// waitReady waits until the chain answers through Caddy.
func (s *stack) waitReady(t testing.TB) {
	t.Helper()
	waitFor(t, "the stack's /health through Caddy", func() error {
		for _, p := range s.procs {
			if !p.running() {
				return fmt.Errorf("%s exited: %v", p.name, p.err)
			}
		}
		return httpOK(s.url("/health"))
	})
}

var errStopped = errors.New("process exited")

func waitFor(t testing.TB, what string, ready func() error) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var err error
	for time.Now().Before(deadline) {
		if err = ready(); err == nil {
			return
		}
		if errors.Is(err, errStopped) || strings.Contains(err.Error(), "exited") {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("waiting for %s: %v", what, err)
}

func httpOK(url string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s answered %d", url, resp.StatusCode)
	}
	return nil
}

// freeAddr returns a loopback address with a port nothing listens on now,
// for a service a test starts later (make run builds first). The port is
// below the kernel's ephemeral range: a port from that range, free when
// picked, may become the source port of any outgoing connection on the
// machine before the service binds it, and the service then fails with
// "address already in use". Below it, only an explicit bind takes a port.
func freeAddr(t testing.TB) string {
	t.Helper()
	for tries := 0; ; tries++ {
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", pickablePorts.lo+mrand.IntN(pickablePorts.n)))
		if err != nil {
			if tries > 1000 {
				t.Fatalf("no free port below the ephemeral range: %v", err)
			}
			continue // taken: try another
		}
		addr := ln.Addr().String()
		ln.Close()
		// Never give one address to two services of this test binary.
		handedOut.Lock()
		seen := handedOut.addrs[addr]
		handedOut.addrs[addr] = true
		handedOut.Unlock()
		if !seen {
			return addr
		}
	}
}

// pickablePorts is the range freeAddr picks from: the ports just below
// the ephemeral range (ip_local_port_range, 32768 when unreadable), down to
// 10000.
var pickablePorts = func() (r struct{ lo, n int }) {
	first := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil && v > 11000 {
				first = v
			}
		}
	}
	r.lo, r.n = 10000, first-10000
	return r
}()

// handedOut is every address freeAddr returned in this test binary.
var handedOut = struct {
	sync.Mutex
	addrs map[string]bool
}{addrs: map[string]bool{}}

// response is one HTTP answer, read whole.
type response struct {
	status int
	header http.Header
	body   []byte
}

var client = &http.Client{Timeout: 30 * time.Second}

func do(t testing.TB, method, url string, body []byte, header map[string]string) response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the answer: %v", method, url, err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

func post(t testing.TB, url string, body []byte) response {
	t.Helper()
	return do(t, http.MethodPost, url, body, nil)
}

func get(t testing.TB, url string) response {
	t.Helper()
	return do(t, http.MethodGet, url, nil, nil)
}

// aov runs the aov command and returns its combined output and exit code.
func aov(t testing.TB, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(bin.aov, args...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	default:
		t.Fatalf("running aov: %v", err)
		return "", -1
	}
}

// example reads one of the request bodies the run script's instructions
// use, so the examples operators are shown are the ones tested here.
func example(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "scripts", "examples", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// writeFile saves b under the test's temp dir and returns the path.
func writeFile(t testing.TB, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
