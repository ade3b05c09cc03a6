package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/store"
)

// moduleClusterOptions are the options of a client on cl as the Caddy
// module makes it, with its default timeouts (module.go), whose slot map
// is read once and not again for the test's length: only the store (or a
// redirection) makes it be read again.
func moduleClusterOptions(cl *servers.Cluster) *redis.ClusterOptions {
	return &redis.ClusterOptions{Addrs: cl.Addrs, ClusterStateReloadInterval: time.Hour,
		DialTimeout: stallTimeout, ReadTimeout: stallTimeout, WriteTimeout: stallTimeout, MaxRetries: 2, DialerRetries: 1, ContextTimeoutEnabled: true}
}

// moduleClusterClient is a client on cl made with moduleClusterOptions.
func moduleClusterClient(t *testing.T, cl *servers.Cluster) *redis.ClusterClient {
	rdb := redis.NewClusterClient(moduleClusterOptions(cl))
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// moduleStore is a Store on cl with opts, through a client made as the
// Caddy module makes it (moduleClusterClient).
func moduleStore(t *testing.T, ctx context.Context, cl *servers.Cluster, opts Options) *Store {
	t.Helper()
	s, err := New(ctx, moduleClusterClient(t, cl), opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A write MOVED to another primary is sent there in what is left of the
// store operation's one deadline (`timeout`, 3 s here): an old primary
// slow to answer MOVED and a new one that stalls fail the claim as soon as
// the same claim sent to the stalled primary directly, within timeout +
// the undo's 0.5 s (README). (Before: the slot map's read and the
// redirected write each got a full timeout of their own, 2.4 s in all
// with the module's 1 s, 0.65 s past the bound; 6.2 s here, 1.7 s past a
// bound with a second of slack for a loaded machine.)
func TestARedirectedWriteKeepsTheOperationsDeadline(t *testing.T) {
	ctx := context.Background()
	cl := servers.StartRedisClusterReplicated(t)
	masters := clusterNodes(t, ctx, cl)
	const timeout = 3 * time.Second
	o := moduleClusterOptions(cl)
	o.DialTimeout, o.ReadTimeout, o.WriteTimeout = timeout, timeout, timeout
	rdb := redis.NewClusterClient(o)
	t.Cleanup(func() { rdb.Close() })
	s, err := New(ctx, rdb, Options{Prefix: "mv", WaitReplicas: 1, WaitTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	until := time.Now().Add(time.Minute)
	if _, err := s.Claims().Claim(ctx, []string{"a1"}, until); err != nil {
		t.Fatal(err)
	}
	from, to, slot := slotOwner(t, ctx, masters, "mv:{c}:a1")
	migrateSlot(t, ctx, from, to, slot)
	assignSlot(t, ctx, masters, to, slot)
	stalled := func(key string) time.Duration {
		t.Helper()
		start := time.Now()
		_, err := s.Claims().Claim(ctx, []string{key}, until)
		took := time.Since(start)
		to.Do(ctx, "client", "unpause")
		if err == nil {
			t.Fatalf("claim %s succeeded on a stalled primary", key)
		}
		t.Logf("claim %s: %v after %v", key, err, took)
		return took
	}
	// The old primary answers MOVED after 2.7 s; the new one stalls writes.
	if err := to.Do(ctx, "client", "pause", 10000, "write").Err(); err != nil {
		t.Fatal(err)
	}
	if err := from.Do(ctx, "client", "pause", 2700, "all").Err(); err != nil {
		t.Fatal(err)
	}
	took := stalled("k1")
	// The same stall of the primary the map already names.
	if _, err := s.Claims().Claim(ctx, []string{"k0"}, until); err != nil {
		t.Fatal(err)
	}
	if err := to.Do(ctx, "client", "pause", 10000, "write").Err(); err != nil {
		t.Fatal(err)
	}
	base := stalled("k2")
	const bound = timeout + undoTimeout + time.Second
	if base > bound {
		t.Errorf("a claim on a stalled primary took %v, want at most timeout + 0.5 s (%v, with slack)", base, bound)
	}
	if took > bound || took-base > time.Second {
		t.Errorf("a claim MOVED to a stalled primary took %v, the same claim sent there directly %v: want one deadline (timeout 3 s) for the whole operation", took, base)
	}
}

// While the claims' slot migrates, a write of several keys of which the
// new primary lacks some (every claim of a paid call, with the held
// index; an EVM payment's two keys) is answered TRYAGAIN there, even
// after ASKING, until the move ends. The script did not run: the store
// tries it again, in what is left of the operation's deadline. A move
// that outlasts it refuses the write as before (the gateway's 503),
// having claimed nothing; a settlement's write is refused too and lands
// once the move is over. A move that ends meanwhile, with or without
// wait_replicas, serves it. (Before: every such write was refused at once,
// so every paid call was a 503 for the whole move.)
func TestWritesWaitOutTheirSlotsMigration(t *testing.T) {
	ctx := context.Background()
	cl := servers.StartRedisClusterReplicated(t)
	masters := clusterNodes(t, ctx, cl)
	rdb := moduleClusterClient(t, cl)
	s, err := New(ctx, rdb, Options{Prefix: "mv", WaitReplicas: 1, WaitTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	s0, err := New(ctx, rdb, Options{Prefix: "mv"})
	if err != nil {
		t.Fatal(err)
	}
	until := time.Now().Add(time.Minute)
	toSettle, err := s.Claims().Claim(ctx, []string{"s1"}, until)
	if err != nil {
		t.Fatal(err)
	}
	from, to, slot := slotOwner(t, ctx, masters, "mv:{c}:s1")
	migrateSlot(t, ctx, from, to, slot)

	// A move that outlasts the deadline.
	for _, st := range []*Store{s, s0} {
		start := time.Now()
		_, err := st.Claims().Claim(ctx, []string{"p1", "n1"}, until)
		took := time.Since(start)
		if !redis.HasErrorPrefix(err, "TRYAGAIN") {
			t.Fatalf("a two-key claim during a long move (wait_replicas %d) = %v, want TRYAGAIN", st.opts.WaitReplicas, err)
		}
		if took < stallTimeout/2 || took > stallTimeout+undoTimeout+250*time.Millisecond {
			t.Errorf("a two-key claim during a long move failed after %v, want tried again until the deadline (timeout 1 s, then the undo's 0.5 s)", took)
		}
	}
	for _, k := range []string{"p1", "n1"} {
		if _, err := s.Claims().Lookup(ctx, k); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s after a refused claim = %v, want not found (nothing claimed)", k, err)
		}
	}
	if err := s.Claims().Settle(ctx, toSettle, "tx", time.Time{}); !redis.HasErrorPrefix(err, "TRYAGAIN") {
		t.Fatalf("a settlement's write during a long move = %v, want TRYAGAIN", err)
	}
	if st, err := s.Claims().Lookup(ctx, "s1"); err != nil || st.Settled {
		t.Fatalf("the claim after its settlement was refused = %+v, %v, want held unsettled", st, err)
	}

	// A move that ends within the deadline.
	type result struct {
		what string
		err  error
	}
	results := make(chan result)
	hold := func(store.Claim) (string, error) { return "record", nil }
	for what, write := range map[string]func() error{
		"a two-key claim": func() error { _, err := s.Claims().Claim(ctx, []string{"p2", "n2"}, until); return err },
		"a paid call's held claim": func() error {
			_, err := s.Claims().(store.HeldClaims).ClaimHeld(ctx, []string{"h1"}, until, time.Minute, hold)
			return err
		},
		"a two-key claim without wait_replicas": func() error { _, err := s0.Claims().Claim(ctx, []string{"p3", "n3"}, until); return err },
	} {
		go func() { results <- result{what, write()} }()
	}
	time.Sleep(300 * time.Millisecond)
	assignSlot(t, ctx, masters, to, slot)
	for range 3 {
		if r := <-results; r.err != nil {
			t.Errorf("%s during a move that ended within the deadline = %v, want claimed", r.what, r.err)
		}
	}
	if err := s.Claims().Settle(ctx, toSettle, "tx", time.Time{}); err != nil {
		t.Errorf("a settlement's write once the move ended = %v, want settled", err)
	}
}

// clusterSlotsReads is how many slot map reads (CLUSTER SLOTS or SHARDS)
// the nodes of cl have answered.
func clusterSlotsReads(t *testing.T, ctx context.Context, cl *servers.Cluster) (n int64) {
	for _, addr := range cl.Addrs {
		c := redis.NewClient(&redis.Options{Addr: addr})
		info, err := c.Info(ctx, "commandstats").Result()
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\n") {
			stat, ok := strings.CutPrefix(line, "cmdstat_cluster|slots:")
			if !ok {
				stat, ok = strings.CutPrefix(line, "cmdstat_cluster|shards:")
			}
			var calls int64
			if _, err := fmt.Sscanf(stat, "calls=%d,", &calls); ok && err == nil {
				n += calls
			}
		}
	}
	return n
}

// An ASK names the node a slot's keys are moving to, and the slot map,
// which names the old one, stays right: the write goes to the node named
// without a read of the map. (Before: every write the old primary
// answered ASK reread the whole map first, a CLUSTER SLOTS per write for
// as long as the move lasted.) A node that lacks the script (restarted,
// SCRIPT FLUSH) loads it, and the rerun is sent after ASKING again;
// likewise the write MOVED once the move ends. Closing the Store closes
// the client it kept for the node ASK named.
func TestAnAskReadsNoSlotMap(t *testing.T) {
	ctx := context.Background()
	cl := servers.StartRedisClusterReplicated(t)
	masters := clusterNodes(t, ctx, cl)
	s := moduleStore(t, ctx, cl, Options{Prefix: "mv", WaitReplicas: 1, WaitTimeout: stallTimeout / 2})
	until := time.Now().Add(time.Minute)
	if _, err := s.Claims().Claim(ctx, []string{"a1"}, until); err != nil {
		t.Fatal(err)
	}
	from, to, slot := slotOwner(t, ctx, masters, "mv:{c}:a1")
	migrateSlot(t, ctx, from, to, slot)
	before := clusterSlotsReads(t, ctx, cl)
	const n = 20
	for i := range n {
		if _, err := s.Claims().Claim(ctx, []string{fmt.Sprint("k", i)}, until); err != nil {
			t.Fatal(err)
		}
	}
	if d := clusterSlotsReads(t, ctx, cl) - before; d != 0 {
		t.Errorf("%d writes answered ASK read the slot map %d times, want none", n, d)
	}
	if got := to.ClusterCountKeysInSlot(ctx, slot).Val(); got != n+1 {
		t.Errorf("the node the slot moves to holds %d keys of it, want %d", got, n+1)
	}
	for _, m := range masters {
		m.ScriptFlush(ctx)
	}
	first, err := s.Claims().Claim(ctx, []string{"k-noscript"}, until)
	if err != nil {
		t.Errorf("a claim answered ASK by a node without the script: %v", err)
	}
	assignSlot(t, ctx, masters, to, slot)
	for _, m := range masters {
		m.ScriptFlush(ctx)
	}
	if err := s.Claims().Settle(ctx, first, "tx", time.Time{}); err != nil {
		t.Errorf("a settlement MOVED to a node without the script: %v", err)
	}
	if got := from.ClusterCountKeysInSlot(ctx, slot).Val(); got != 0 {
		t.Errorf("the old primary holds %d keys of the slot, want 0", got)
	}
	ask := s.asks.clients[to.Options().Addr]
	if ask == nil {
		t.Fatalf("no client kept for %s", to.Options().Addr)
	}
	s.Close()
	if err := ask.c.Ping(ctx).Err(); !errors.Is(err, redis.ErrClosed) {
		t.Errorf("the client of the node ASK named, after Close: %v, want closed", err)
	}
}

// askNodes keeps at most maxAskNodes clients: the least recently used one
// goes, closed once the write using it is done, and close closes them all.
func TestAskNodesAreBounded(t *testing.T) {
	ctx := context.Background()
	like := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer like.Close()
	var a askNodes
	addr := func(i int) string { return fmt.Sprint("127.0.0.1:", 10+i) }
	first, doneFirst, err := a.get(like, addr(0))
	if err != nil {
		t.Fatal(err)
	}
	got := []*redis.Client{first}
	for i := 1; i <= maxAskNodes; i++ {
		c, done, err := a.get(like, addr(i))
		if err != nil {
			t.Fatal(err)
		}
		if c.Options().Addr != addr(i) {
			t.Fatalf("client for %s has address %s", addr(i), c.Options().Addr)
		}
		done()
		got = append(got, c)
	}
	if len(a.clients) != maxAskNodes {
		t.Fatalf("%d clients kept, want %d", len(a.clients), maxAskNodes)
	}
	if _, ok := a.clients[addr(0)]; ok {
		t.Fatal("the least recently used client was kept")
	}
	// Nothing listens there: an open client fails on its dial.
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := first.Ping(short).Err(); errors.Is(err, redis.ErrClosed) {
		t.Fatal("the evicted client was closed while a write used it")
	}
	doneFirst()
	if err := first.Ping(ctx).Err(); !errors.Is(err, redis.ErrClosed) {
		t.Errorf("the evicted client once its write was done: %v, want closed", err)
	}
	again, done, _ := a.get(like, addr(1))
	done()
	if again != got[1] {
		t.Error("a kept client was made again")
	}
	a.close()
	for _, c := range got[1:] {
		if err := c.Ping(ctx).Err(); !errors.Is(err, redis.ErrClosed) {
			t.Errorf("%s after close: %v, want closed", c.Options().Addr, err)
		}
	}
	if _, _, err := a.get(like, addr(1)); !errors.Is(err, redis.ErrClosed) {
		t.Errorf("get after close = %v, want redis.ErrClosed", err)
	}
}

// A write rerun because the server lacked its script (restarted,
// promoted, SCRIPT FLUSH) waits for its replicas in what is left of the
// operation's deadline: its WAIT is shortened to fit, so a write no
// replica acknowledges is answered ErrNotReplicated within `timeout`, as
// a first run is, though the first run's WAIT used up most of it.
// (Before: the shortened WAIT ended 0.1 s before the deadline, and Redis,
// which ends a blocked WAIT on its 10-a-second timer, answered it up to
// 0.1 s late: now and then the rerun failed on its deadline instead.) The
// client's timeout is 3 s here, with a second of slack for a loaded
// machine.
func TestARerunsWaitFitsTheDeadline(t *testing.T) {
	ctx := context.Background()
	srv := servers.StartRedis(t)
	const timeout = 3 * time.Second
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, DialTimeout: timeout, ReadTimeout: timeout,
		WriteTimeout: timeout, MaxRetries: 2, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	// The first run's WAIT takes 2 s of the 3; the rerun's must fit in
	// the rest.
	const wait = 2 * time.Second
	s, err := New(ctx, rdb, Options{Prefix: "rerun", WaitReplicas: 1, WaitTimeout: wait})
	if err != nil {
		t.Fatal(err)
	}
	s.rdb.ScriptFlush(ctx)
	start := time.Now()
	_, err = s.Claims().Claim(ctx, []string{"k1"}, time.Now().Add(time.Minute))
	took := time.Since(start)
	if !errors.Is(err, ErrNotReplicated) {
		t.Errorf("a rerun claim with no replica = %v, want ErrNotReplicated", err)
	}
	if took > timeout+undoTimeout+time.Second {
		t.Errorf("a rerun claim with no replica took %v, want within timeout (3 s) and the undo's 0.5 s, with slack", took)
	}
}
