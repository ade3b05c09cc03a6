// Package servers starts real Redis and PostgreSQL servers for tests: each
// on loopback ports of its own, under a temporary folder, stopped when the
// test ends. It runs the installed binaries (Debian's redis-server, and
// PostgreSQL's initdb and postgres); without them a test is skipped, except
// under CI (CI set in the environment), where that is a failure. Every wait
// is bounded.
package servers

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/interop"
	"github.com/aovhq/aov/internal/syncbuf"
)

// startTimeout bounds every wait for a server to come up.
const startTimeout = 20 * time.Second

// Redis is one running redis-server.
type Redis struct {
	Addr string
	dir  string
	args []string
	t    testing.TB

	mu  sync.Mutex
	cmd *exec.Cmd
	out *syncbuf.Buffer
}

// redisBinary returns the redis-server path, skipping (or failing) t.
func redisBinary(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("redis-server")
	if err != nil {
		interop.Missing(t, "redis-server is not installed (apt-get install redis-server); the Redis tests need it")
	}
	return p
}

// StartRedis starts a standalone Redis with AOF off and maxmemory-policy
// noeviction, plus extra arguments ("--maxmemory-policy", "allkeys-lru").
func StartRedis(t testing.TB, extra ...string) *Redis {
	t.Helper()
	bin := redisBinary(t)
	port := FreePort(t, false)
	r := &Redis{Addr: "127.0.0.1:" + strconv.Itoa(port), dir: t.TempDir(), t: t}
	r.args = append([]string{bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--dir", r.dir, "--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction",
		"--repl-diskless-sync-delay", "0", "--logfile", ""}, extra...)
	r.Start()
	t.Cleanup(r.Stop)
	return r
}

// Start (re)starts the server on its address and waits until it answers.
func (r *Redis) Start() {
	r.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil {
		return
	}
	r.out = new(syncbuf.Buffer)
	cmd := exec.Command(r.args[0], r.args[1:]...)
	cmd.Stdout, cmd.Stderr = r.out, r.out
	// The server dies with the test binary, even one killed by a timeout.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		r.t.Fatalf("starting redis-server: %v", err)
	}
	r.cmd = cmd
	if err := waitRedis(r.Addr, "PING", "+PONG"); err != nil {
		r.t.Fatalf("redis-server on %s did not come up: %v\n%s", r.Addr, err, r.out.String())
	}
}

// Stop kills the server (SIGKILL: what a crash looks like) and waits for
// it to exit. Calling it on a stopped server is harmless.
func (r *Redis) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return
	}
	r.cmd.Process.Kill()
	r.cmd.Wait()
	r.cmd = nil
}

// Pause stops the server with SIGSTOP: the kernel still accepts its
// connections and buffers what clients send, and nothing is answered,
// which is how a stalled server looks from outside. Resume (or the test's
// end) lets it run on what was buffered.
func (r *Redis) Pause() {
	r.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		r.t.Fatal("pausing a stopped redis-server")
	}
	if err := r.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		r.t.Fatalf("SIGSTOP redis-server: %v", err)
	}
	pid := r.cmd.Process.Pid
	r.t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) })
	// The signal is queued, not yet taken: a thread on another processor
	// may still answer for a moment. Wait until every thread has stopped.
	dir := fmt.Sprintf("/proc/%d/task", pid)
	for deadline := time.Now().Add(startTimeout); ; time.Sleep(time.Millisecond) {
		if allStopped(dir) {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatal("redis-server did not stop after SIGSTOP")
		}
	}
}

// allStopped reports whether every thread listed in dir (/proc/<pid>/task)
// is stopped.
func allStopped(dir string) bool {
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, task := range tasks {
		stat, err := os.ReadFile(filepath.Join(dir, task.Name(), "stat"))
		// The state follows the command name's closing parenthesis.
		i := strings.LastIndexByte(string(stat), ')')
		if err != nil || i < 0 || i+2 >= len(stat) || (stat[i+2] != 'T' && stat[i+2] != 't') {
			return false
		}
	}
	return true
}

// Resume lets a paused server run again (SIGCONT).
func (r *Redis) Resume() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil {
		r.cmd.Process.Signal(syscall.SIGCONT)
	}
}

// waitRedis sends cmd (inline protocol) until the answer starts with want.
func waitRedis(addr, cmd, want string) error {
	deadline := time.Now().Add(startTimeout)
	var last error
	for time.Now().Before(deadline) {
		ans, err := redisInline(addr, cmd)
		if err == nil && strings.HasPrefix(ans, want) {
			return nil
		}
		last = err
		if err == nil {
			last = fmt.Errorf("answered %q", ans)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return last
}

func redisInline(addr, cmd string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte(cmd + "\r\n")); err != nil {
		return "", err
	}
	buf := make([]byte, 4096)
	n, err := c.Read(buf)
	return string(buf[:n]), err
}

// Cluster is a running Redis Cluster of three masters, with or without a
// replica each.
type Cluster struct {
	Addrs []string
	Nodes []*Redis
}

// StartRedisCluster starts a three-master Redis Cluster on loopback. Each
// node also binds its port + 10000 (the cluster bus), so both are chosen
// free.
func StartRedisCluster(t testing.TB) *Cluster {
	t.Helper()
	return startRedisCluster(t, 0)
}

// StartRedisClusterReplicated starts a three-master Redis Cluster with one
// replica per master, and returns once every master has its replica
// connected: a store with wait_replicas 1 then has its writes acknowledged
// on every slot.
func StartRedisClusterReplicated(t testing.TB) *Cluster {
	t.Helper()
	cl := startRedisCluster(t, 1)
	for _, n := range cl.Nodes {
		deadline := time.Now().Add(startTimeout)
		for {
			// Online on the primary's side (only an online replica
			// acknowledges a WAIT), linked on the replica's.
			info, _ := redisInline(n.Addr, "INFO replication")
			if strings.Contains(info, "state=online") || strings.Contains(info, "master_link_status:up") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster node %s never had its replication up: %q", n.Addr, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return cl
}

func startRedisCluster(t testing.TB, replicas int) *Cluster {
	t.Helper()
	bin := redisBinary(t)
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		interop.Missing(t, "redis-cli is not installed (apt-get install redis-tools); the Redis Cluster tests need it")
	}
	cl := &Cluster{}
	for range 3 * (1 + replicas) {
		port := FreePort(t, true)
		r := &Redis{Addr: "127.0.0.1:" + strconv.Itoa(port), dir: t.TempDir(), t: t}
		r.args = []string{bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--dir", r.dir, "--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction",
			"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(r.dir, "nodes.conf"),
			"--cluster-node-timeout", "5000", "--logfile", ""}
		r.Start()
		t.Cleanup(r.Stop)
		cl.Nodes = append(cl.Nodes, r)
		cl.Addrs = append(cl.Addrs, r.Addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	args := append([]string{"--cluster", "create"}, cl.Addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	for _, n := range cl.Nodes {
		if err := waitRedis(n.Addr, "CLUSTER INFO", "$"); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(startTimeout)
		for {
			ans, _ := redisInline(n.Addr, "CLUSTER INFO")
			if strings.Contains(ans, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster node %s never reported cluster_state:ok: %q", n.Addr, ans)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return cl
}

// Postgres is one running PostgreSQL server with trust authentication on
// loopback; DSN connects to its "postgres" database as user "postgres".
type Postgres struct {
	DSN string

	t   testing.TB
	pid int // the postmaster's
}

// postgresBin finds the folder of initdb and postgres: on PATH, or
// Debian's /usr/lib/postgresql/<version>/bin (newest first).
func postgresBin(t testing.TB) string {
	t.Helper()
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p)
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi > vj
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d
		}
	}
	interop.Missing(t, "PostgreSQL is not installed (apt-get install postgresql); the PostgreSQL tests need initdb and postgres")
	return ""
}

// StartPostgres initialises a cluster in a temporary folder and starts
// postgres on a free loopback port (fsync off: a test server). PostgreSQL
// refuses to run as root, so as root it runs as the "postgres" user that
// Debian's package creates. extra are more server arguments ("-c",
// "fsync=on"); later settings win.
func StartPostgres(t testing.TB, extra ...string) *Postgres {
	t.Helper()
	bin := postgresBin(t)
	dir, err := os.MkdirTemp("", "aov-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			interop.Missing(t, "running as root and there is no postgres user to run PostgreSQL as")
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	data := filepath.Join(dir, "data")
	run := func(ctx context.Context, name string, args ...string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, filepath.Join(bin, name), args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
		cmd.WaitDelay = 5 * time.Second
		return cmd
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if out, err := run(ctx, "initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync").CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	port := FreePort(t, false)
	out := new(syncbuf.Buffer)
	args := append([]string{"-D", data, "-p", strconv.Itoa(port), "-k", dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "synchronous_commit=off",
		"-c", "full_page_writes=off", "-c", "max_connections=200"}, extra...)
	cmd := run(context.Background(), "postgres", args...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting postgres: %v", err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt) // fast shutdown
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	addr := "127.0.0.1:" + strconv.Itoa(port)
	deadline := time.Now().Add(startTimeout)
	for {
		if strings.Contains(out.String(), "ready to accept connections") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("postgres on %s did not come up:\n%s", addr, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return &Postgres{DSN: "postgres://postgres@" + addr + "/postgres?sslmode=disable", t: t, pid: cmd.Process.Pid}
}

// Pause stops the server with SIGSTOP, the postmaster and every process it
// started (the backends of open connections included): connections are
// still accepted by the kernel and nothing is answered, which is how a
// stalled server looks from outside. Resume (or the test's end) lets it
// run again.
func (p *Postgres) Pause() {
	p.t.Helper()
	// The postmaster first: once it has stopped it forks no backend, so
	// the children listed then are all there are.
	p.stop(p.pid)
	for _, pid := range childrenOf(p.pid) {
		p.stop(pid)
	}
}

// stop sends pid SIGSTOP, to be undone when the test ends, and waits until
// it has taken it (or exited: a backend whose client went away). As with
// Redis, a signal is queued, not yet taken.
func (p *Postgres) stop(pid int) {
	p.t.Helper()
	syscall.Kill(pid, syscall.SIGSTOP)
	p.t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) })
	for deadline := time.Now().Add(startTimeout); ; time.Sleep(time.Millisecond) {
		if state := procState(pid); state == 0 || strings.IndexByte("TtZX", state) >= 0 {
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("postgres process %d did not stop after SIGSTOP", pid)
		}
	}
}

// Resume lets a paused server run again (SIGCONT), every process Pause
// stopped and any started since.
func (p *Postgres) Resume() {
	for _, pid := range append([]int{p.pid}, childrenOf(p.pid)...) {
		syscall.Kill(pid, syscall.SIGCONT)
	}
}

// procState is the state letter of process pid (/proc/<pid>/stat), 0 when
// there is no such process.
func procState(pid int) byte {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	// The state follows the command name's closing parenthesis.
	i := strings.LastIndexByte(string(stat), ')')
	if err != nil || i < 0 || i+2 >= len(stat) {
		return 0
	}
	return stat[i+2]
}

// childrenOf lists the processes whose parent is pid (from /proc).
func childrenOf(pid int) []int {
	var kids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", child))
		// The parent's pid is the second field after the command name's
		// closing parenthesis (the state is the first).
		i := strings.LastIndexByte(string(stat), ')')
		if err != nil || i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			kids = append(kids, child)
		}
	}
	return kids
}

var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// FreePort returns a loopback port no other caller in this process got;
// with bus set, port+10000 is free too (a Redis Cluster node binds both).
func FreePort(t testing.TB, bus bool) int {
	t.Helper()
	for range 1000 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if bus {
			if port+10000 > 65535 {
				continue
			}
			bl, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000))
			if err != nil {
				continue
			}
			bl.Close()
		}
		handedOut.Lock()
		seen := handedOut.ports[port] || (bus && handedOut.ports[port+10000])
		handedOut.ports[port] = true
		if bus {
			handedOut.ports[port+10000] = true
		}
		handedOut.Unlock()
		if !seen {
			return port
		}
	}
	t.Fatal("no free port")
	return 0
}

// StartSentinel starts one Redis Sentinel (quorum 1) watching primary under
// the name master, deciding a primary is down after downAfter. It runs
// redis-server in sentinel mode (Debian's redis-sentinel is the same
// binary), with a config file of its own it may rewrite.
func StartSentinel(t testing.TB, primary *Redis, master string, downAfter time.Duration) *Redis {
	t.Helper()
	bin := redisBinary(t)
	port := FreePort(t, false)
	dir := t.TempDir()
	host, pport, _ := net.SplitHostPort(primary.Addr)
	conf := filepath.Join(dir, "sentinel.conf")
	body := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor %s %s %s 1\n"+
		"sentinel down-after-milliseconds %s %d\nsentinel failover-timeout %s 2000\n",
		port, dir, master, host, pport, master, downAfter.Milliseconds(), master)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	r := &Redis{Addr: "127.0.0.1:" + strconv.Itoa(port), dir: dir, t: t, args: []string{bin, conf, "--sentinel"}}
	r.Start()
	t.Cleanup(r.Stop)
	return r
}
