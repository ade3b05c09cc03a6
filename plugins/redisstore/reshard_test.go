package redisstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/store"
)

// clusterNodes is one plain client per node of cl (closed with the test),
// and of them the masters.
func clusterNodes(t *testing.T, ctx context.Context, cl *servers.Cluster) (masters []*redis.Client) {
	for _, addr := range cl.Addrs {
		n := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { n.Close() })
		role, err := n.Do(ctx, "role").Slice()
		if err != nil {
			t.Fatal(err)
		}
		if role[0] == "master" {
			masters = append(masters, n)
		}
	}
	return masters
}

// slotOwner is the master of masters serving key's slot, another master,
// and the slot.
func slotOwner(t *testing.T, ctx context.Context, masters []*redis.Client, key string) (owner, other *redis.Client, slot int) {
	slot = int(masters[0].ClusterKeySlot(ctx, key).Val())
	for _, m := range masters {
		// A master answers MOVED for a key of a slot it does not serve.
		if err := m.Exists(ctx, key).Err(); err == nil {
			owner = m
		} else if other == nil {
			other = m
		}
	}
	if owner == nil || other == nil {
		t.Fatalf("slot %d: owner %v, other %v", slot, owner, other)
	}
	return owner, other, slot
}

func nodeID(t *testing.T, ctx context.Context, c *redis.Client) string {
	id, err := c.Do(ctx, "cluster", "myid").Text()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// migrateSlot marks slot as moving from from to to and moves its keys,
// as redis-cli --cluster reshard does, leaving from its owner: from
// answers ASK for a key it no longer holds.
func migrateSlot(t *testing.T, ctx context.Context, from, to *redis.Client, slot int) {
	if err := to.Do(ctx, "cluster", "setslot", slot, "importing", nodeID(t, ctx, from)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := from.Do(ctx, "cluster", "setslot", slot, "migrating", nodeID(t, ctx, to)).Err(); err != nil {
		t.Fatal(err)
	}
	host, port, _ := strings.Cut(to.Options().Addr, ":")
	for {
		keys, err := from.ClusterGetKeysInSlot(ctx, slot, 100).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) == 0 {
			return
		}
		args := []any{"migrate", host, port, "", 0, 5000, "keys"}
		for _, k := range keys {
			args = append(args, k)
		}
		if err := from.Do(ctx, args...).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// assignSlot ends a migration: every master learns that to serves slot,
// after which from answers MOVED.
func assignSlot(t *testing.T, ctx context.Context, masters []*redis.Client, to *redis.Client, slot int) {
	id := nodeID(t, ctx, to)
	for _, m := range append([]*redis.Client{to}, masters...) {
		if err := m.Do(ctx, "cluster", "setslot", slot, "node", id).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestWaitedWritesFollowAMovedSlot: with wait_replicas on a Cluster, a
// write goes to the primary of its keys' slot by the client's slot map
// (its WAIT must run on the write's own connection). A slot that moved
// to another primary (resharding) since the map was read is answered
// MOVED by the old one, or ASK while its keys are moving: the write is
// sent again, once, to the primary named, and answered as it would have
// been before the move. The old primary ran nothing (it holds no key of
// the slot after the calls). (Before: each such write was a 503 until the
// client reread the slot map on its own, up to a minute later.)
func TestWaitedWritesFollowAMovedSlot(t *testing.T) {
	ctx := context.Background()
	cl := servers.StartRedisClusterReplicated(t)
	masters := clusterNodes(t, ctx, cl)
	// The slot map is read once, at New, and not again for the test's
	// length: only a redirection would make it be read again.
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs, ClusterStateReloadInterval: time.Hour})
	t.Cleanup(func() { rdb.Close() })
	s, err := New(ctx, rdb, Options{Prefix: "mv", WaitReplicas: 1, WaitTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	until := time.Now().Add(time.Minute)
	first, err := s.Claims().Claim(ctx, []string{"k1"}, until)
	if err != nil {
		t.Fatalf("a claim before the move: %v", err)
	}
	label, _, _ := dayOf(time.Now())
	akey := s.Allowance().(allowance).key("p", "c", label)
	if _, err := s.Allowance().Reserve(ctx, "p", "c", time.Now(), 5); err != nil {
		t.Fatalf("a reservation before the move: %v", err)
	}

	// The claims' slot, mid-migration: its keys are on the new primary,
	// the old one still serves the slot and answers ASK.
	from, to, slot := slotOwner(t, ctx, masters, "mv:{c}:k1")
	migrateSlot(t, ctx, from, to, slot)
	if _, err := s.Claims().Claim(ctx, []string{"k2"}, until); err != nil {
		t.Fatalf("a claim of a new key while its slot migrates = %v, want claimed", err)
	}
	var held *store.ClaimedError
	if _, err := s.Claims().Claim(ctx, []string{"k1"}, until); !errors.As(err, &held) {
		t.Fatalf("a claim of a migrated claimed key = %v, want ClaimedError", err)
	}

	// Its move done, and the allowance's slot moved at once: the old
	// primaries answer MOVED.
	assignSlot(t, ctx, masters, to, slot)
	afrom, ato, aslot := slotOwner(t, ctx, masters, akey)
	migrateSlot(t, ctx, afrom, ato, aslot)
	assignSlot(t, ctx, masters, ato, aslot)

	if _, err := s.Claims().Claim(ctx, []string{"k1"}, until); !errors.As(err, &held) {
		t.Fatalf("a claim of a moved claimed key = %v, want ClaimedError", err)
	}
	if err := s.Claims().Settle(ctx, first, "tx", time.Time{}); err != nil {
		t.Fatalf("settling a claim whose slot moved = %v, want settled", err)
	}
	r, err := s.Allowance().Reserve(ctx, "p", "c", time.Now(), 5)
	if err != nil {
		t.Fatalf("a reservation whose slot moved = %v, want reserved", err)
	}
	if r.Remaining != 3 {
		t.Fatalf("remaining after the second reservation = %d, want 3 (the first moved with its slot)", r.Remaining)
	}
	if err := s.Allowance().Commit(ctx, r); err != nil {
		t.Fatalf("committing a reservation whose slot moved = %v", err)
	}
	// A paid call's record: written with its claim, and listed among the
	// held ones (both writes on the moved slot, the listing on its index).
	hc := s.Claims().(store.HeldClaims)
	if _, err := hc.ClaimHeld(ctx, []string{"h1"}, until, time.Minute, func(store.Claim) (string, error) { return "record", nil }); err != nil {
		t.Fatalf("a held claim whose slot moved = %v, want claimed", err)
	}
	var listed []string
	if err := hc.Held(ctx, func(key string, st store.ClaimState) bool {
		listed = append(listed, key+"="+st.Note)
		return true
	}); err != nil || len(listed) != 1 || listed[0] != "h1=record" {
		t.Fatalf("held claims after the move = %v, %v, want h1 with its record", listed, err)
	}
	st, err := s.Claims().Lookup(ctx, "k1")
	if err != nil || !st.Settled || st.Note != "tx" {
		t.Fatalf("k1 after the move = %+v, %v, want settled with its note", st, err)
	}
	for _, c := range []struct {
		m    *redis.Client
		slot int
	}{{from, slot}, {afrom, aslot}} {
		if n := c.m.ClusterCountKeysInSlot(ctx, c.slot).Val(); n != 0 {
			t.Errorf("the old primary %s holds %d keys of slot %d, want 0 (a redirected script does not run)", c.m.Options().Addr, n, c.slot)
		}
	}
}

// failOver kills the primary serving key's slot and has its replica take
// over (CLUSTER FAILOVER TAKEOVER), then moves a replica of another
// primary under the new one (as replica migration does), so that it has
// a replica of its own for wait_replicas. It returns once that replica
// acknowledges a write of key's slot on the new primary (a WAIT after it,
// as a store's write does), the Cluster recovered; and the dead primary's
// address. (Before: it returned once the new primary listed its replica
// online, and for up to a second more under load WAIT found none that
// acknowledged: the store's next write was refused as not replicated.)
func failOver(t *testing.T, ctx context.Context, cl *servers.Cluster, key string) (dead string) {
	t.Helper()
	a, _, _ := slotOwner(t, ctx, clusterNodes(t, ctx, cl), key)
	dead = a.Options().Addr
	var rep, spare *redis.Client
	for _, addr := range cl.Addrs {
		n := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { n.Close() })
		role, err := n.Do(ctx, "role").Slice()
		if err != nil {
			t.Fatal(err)
		}
		if role[0] != "slave" {
			continue
		}
		if net.JoinHostPort(role[1].(string), strconv.FormatInt(role[2].(int64), 10)) == dead {
			rep = n
		} else if spare == nil {
			spare = n
		}
	}
	if rep == nil || spare == nil {
		t.Fatalf("the primary %s's replica %v, another replica %v", dead, rep, spare)
	}
	for _, n := range cl.Nodes {
		if n.Addr == dead {
			n.Stop()
		}
	}
	if err := rep.Do(ctx, "cluster", "failover", "takeover").Err(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if role, _ := rep.Do(ctx, "role").Slice(); len(role) > 0 && role[0] == "master" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the replica was not promoted")
		}
	}
	if err := spare.Do(ctx, "cluster", "replicate", nodeID(t, ctx, rep)).Err(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var acked *redis.Cmd
		rep.Pipelined(ctx, func(p redis.Pipeliner) error { // one connection: WAIT counts its writes
			p.Set(ctx, key+":replicated", 1, 0)
			acked = p.Do(ctx, "wait", 1, 1000)
			return nil
		})
		if n, err := acked.Int64(); err == nil && n >= 1 {
			return dead
		}
		if time.Now().After(deadline) {
			t.Fatalf("the new primary's replica never acknowledged a write: %v, %q", acked, rep.Info(ctx, "replication").Val())
		}
	}
}

// TestWritesFollowAFailoverFromADeadPrimary: the claims' primary dies and
// the Cluster promotes its replica, every live node's slot map naming the
// new primary. The first write after the failover, sent to the dead one,
// fails to reach it (a dial error), within its deadline, and is not sent
// again (it may have run before go-redis's try that could not connect);
// the store reads the slot map again, so the next claim is served, with
// and without wait_replicas, on stores made by the Caddy module (its
// client's own map reload comes a minute after its last). (Before: every
// write went on to the dead address, connection refused, until that
// reload: 55 s of 503s measured.)
func TestWritesFollowAFailoverFromADeadPrimary(t *testing.T) {
	ctx := context.Background()
	cl := servers.StartRedisClusterReplicated(t)
	cctx, cancel := caddy.NewContext(caddy.Context{Context: ctx})
	defer cancel()
	stores := map[string]*Store{}
	for name, wait := range map[string]int{"with wait_replicas 1": 1, "without wait_replicas": 0} {
		// A WAIT of two seconds, not the default 100 ms: a replica starved of
		// the CPU on a loaded machine is no failover's doing.
		m := &RedisStore{Addresses: cl.Addrs, Cluster: true, Prefix: "fo", WaitReplicas: wait, WaitTimeout: caddy.Duration(2 * time.Second)}
		if err := m.Provision(cctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Cleanup() })
		stores[name] = m.store
	}
	until := time.Now().Add(time.Hour)
	for name, s := range stores {
		if _, err := s.Claims().Claim(ctx, []string{"before " + name}, until); err != nil {
			t.Fatal(err)
		}
	}
	dead := failOver(t, ctx, cl, "fo:{c}:x")
	var wg sync.WaitGroup
	for name, s := range stores {
		wg.Go(func() {
			start := time.Now()
			_, err := s.Claims().Claim(ctx, []string{"first after " + name}, until)
			t.Logf("%s: the first claim after the failover: %v in %v", name, err, time.Since(start))
			if err != nil && (!unreachedNode(err) || time.Since(start) > s.opTimeout) {
				t.Errorf("%s: the first claim after the Cluster promoted the replica of the dead %s = %v after %v; want claimed, or the dead node unreached within %v", name, dead, err, time.Since(start), s.opTimeout)
			}
			start = time.Now()
			_, err = s.Claims().Claim(ctx, []string{"next after " + name}, until)
			t.Logf("%s: the next claim: %v in %v", name, err, time.Since(start))
			if err != nil {
				t.Errorf("%s: the claim after the slot map was read again = %v, want claimed", name, err)
			}
		})
	}
	wg.Wait()
}

// TestAnUnreachableNodeRereadsTheSlotMapAtMostEveryInterval: while the
// claims' primary is down and not yet replaced, every write of its slot
// fails to reach it and rereads the slot map, but the rereads of all of a
// Store's callers are at most one per rereadEvery: an outage is no
// storm of CLUSTER SLOTS on the nodes still up. Each write fails within
// its deadline, nothing served.
func TestAnUnreachableNodeRereadsTheSlotMapAtMostEveryInterval(t *testing.T) {
	ctx := context.Background()
	cl := servers.StartRedisCluster(t)
	s := moduleStore(t, ctx, cl, Options{Prefix: "un"})
	dead, _, _ := slotOwner(t, ctx, clusterNodes(t, ctx, cl), "un:{c}:x")
	slotsReads := func() (n int64) {
		for _, addr := range cl.Addrs {
			if addr == dead.Options().Addr {
				continue
			}
			c := redis.NewClient(&redis.Options{Addr: addr})
			info := c.Info(ctx, "commandstats").Val()
			c.Close()
			for l := range strings.SplitSeq(info, "\n") {
				if stat, ok := strings.CutPrefix(strings.TrimSpace(l), "cmdstat_cluster|slots:calls="); ok {
					calls, _, _ := strings.Cut(stat, ",")
					v, _ := strconv.ParseInt(calls, 10, 64)
					n += v
				}
			}
		}
		return n
	}
	for _, n := range cl.Nodes {
		if n.Addr == dead.Options().Addr {
			n.Stop()
		}
	}
	before := slotsReads()
	start := time.Now()
	var wg sync.WaitGroup
	var served atomic.Int64
	for w := range 16 {
		wg.Go(func() {
			for i := 0; time.Since(start) < 2*time.Second; i++ {
				if _, err := s.Claims().Claim(ctx, []string{fmt.Sprintf("w%d-%d", w, i)}, time.Now().Add(time.Minute)); err == nil {
					served.Add(1)
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	reads := slotsReads() - before
	if served.Load() != 0 {
		t.Errorf("%d claims served with their primary down", served.Load())
	}
	if most := int64(took/rereadEvery) + 2; reads < 1 || reads > most {
		t.Errorf("%d slot map reads in %v of writes to a dead primary, want 1 to %d (one per %v at most)", reads, took, most, rereadEvery)
	}
}

// TestOnlyAFailedDialIsAnUnreachedNode: the store reads the slot map
// again only when go-redis could not reach the node at all (a dial
// error), not for a connection cut after the write was sent nor any
// answer of the server.
func TestOnlyAFailedDialIsAnUnreachedNode(t *testing.T) {
	ctx := context.Background()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	cut, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer cut.Close()
	go func() { // reads a command, then closes the connection
		for {
			c, err := cut.Accept()
			if err != nil {
				return
			}
			c.Read(make([]byte, 512))
			c.Close()
		}
	}()
	_, up := standalone(t)
	for _, c := range []struct {
		name string
		addr string
		want bool
	}{{"nothing listening", closed, true}, {"cut after the command was sent", cut.Addr().String(), false}} {
		rdb := redis.NewClient(&redis.Options{Addr: c.addr, MaxRetries: -1, Protocol: 2, DisableIdentity: true})
		err := rdb.Eval(ctx, "return 1", []string{"k"}).Err()
		rdb.Close()
		if got := unreachedNode(err); got != c.want || err == nil {
			t.Errorf("%s: %v: unreached %v, want %v", c.name, err, got, c.want)
		}
	}
	if err := up.Eval(ctx, "return redis.error_reply('ERR refused')", nil).Err(); err == nil || unreachedNode(err) {
		t.Errorf("a server's error answer %v counted as unreached", err)
	}
}

// dyingProxy forwards to a Redis server. Once armed, the first client
// chunk carrying "evalsha" is forwarded (the server runs the script), its
// answer is withheld, and the proxy then dies: the connection is cut and
// the listener closed, so every later dial is refused -- a primary killed
// right after it ran a write.
type dyingProxy struct {
	*servers.FaultProxy
	armed atomic.Bool
	cut   atomic.Bool
	evals atomic.Int32
}

func newDyingProxy(t *testing.T, target string) *dyingProxy {
	p := &dyingProxy{}
	p.FaultProxy = servers.StartFaultProxy(t, target, p.relay)
	return p
}

func (p *dyingProxy) relay(c, s net.Conn) {
	var hold atomic.Bool
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := s.Read(buf)
			if n > 0 && !hold.Load() {
				c.Write(buf[:n])
			}
			if err != nil {
				c.Close()
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			chunk := bytes.ToLower(buf[:n])
			isEval := bytes.Contains(chunk, []byte("evalsha"))
			if isEval {
				p.evals.Add(1)
			}
			if isEval && p.armed.Load() && !p.cut.Load() {
				hold.Store(true)
				s.Write(buf[:n])
				time.Sleep(100 * time.Millisecond) // the server runs it
				p.cut.Store(true)
				p.Kill()
				return
			}
			s.Write(buf[:n])
		}
		if err != nil {
			s.Close()
			return
		}
	}
}

// TestACutWriteIsNotRunAgainOnTheNewPrimary: a primary runs an allowance
// Commit and dies before it answers; go-redis sends the write again on a
// new connection, which cannot be made (a dial error). The store reads the
// slot map again, which now names the promoted replica, but does not send
// the write there: it may have run (it did), and the caller gets the
// error, a 503. The script ran once. (Before: the store took the dial
// error for a write that never reached a node and ran the script again on
// the new primary, so a Commit that had landed answered
// store.ErrNotReserved, a claim Release store.ErrClaimLost.)
func TestACutWriteIsNotRunAgainOnTheNewPrimary(t *testing.T) {
	ctx := context.Background()
	srv := servers.StartRedis(t)
	p1, p2 := newDyingProxy(t, srv.Addr), newDyingProxy(t, srv.Addr)
	o := moduleClusterOptions(&servers.Cluster{})
	o.ClusterSlots = func(context.Context) ([]redis.ClusterSlot, error) {
		addr := p1.Addr
		if p1.cut.Load() {
			addr = p2.Addr // the replica promoted
		}
		return []redis.ClusterSlot{{Start: 0, End: 16383, Nodes: []redis.ClusterNode{{Addr: addr}}}}, nil
	}
	rdb := redis.NewClusterClient(o)
	t.Cleanup(func() { rdb.Close() })
	s, err := New(ctx, rdb, Options{Prefix: "cut"})
	if err != nil {
		t.Fatal(err)
	}
	direct := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer direct.Close()
	if err := finishScript.Load(ctx, direct).Err(); err != nil {
		t.Fatal(err)
	}
	res, err := s.Allowance().Reserve(ctx, "pool", "client", time.Now(), 5)
	if err != nil {
		t.Fatal(err)
	}
	p1.armed.Store(true)
	start := time.Now()
	err = s.Allowance().Commit(ctx, res)
	took := time.Since(start)
	runs := int(1 + p2.evals.Load())
	if !p1.cut.Load() {
		t.Fatal("precondition: the proxy never cut the commit")
	}
	rem, _ := s.Allowance().Remaining(ctx, "pool", "client", time.Now(), 5)
	if runs > 1 || err == nil || !unreachedNode(err) {
		t.Errorf("commit cut after it ran on the dead node: the script ran %d times (second on the new node), Commit returned %v after %v, remaining %d of 5; "+
			"want it never sent again and the dial error, not a wrong answer about a unit it committed", runs, err, took, rem)
	}
	// The map was read again: the next write goes to the new primary.
	if _, err := s.Allowance().Reserve(ctx, "pool", "client", time.Now(), 5); err != nil || p2.evals.Load() == 0 {
		t.Errorf("the write after the failed commit = %v, %d scripts on the new primary; want served there", err, p2.evals.Load())
	}
}

// blackholeAddr is a listening address that never accepts and whose accept
// queue is full: the kernel drops further SYNs, so a dial to it hangs until
// its timeout, as a dial to a host that died (power loss, instance gone,
// partition) does, rather than being refused.
func blackholeAddr(t *testing.T) string {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, _ := syscall.Getsockname(fd)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
	for i := 0; i < 4; i++ { // fill the accept queue
		if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
			t.Cleanup(func() { c.Close() })
		}
	}
	start := time.Now()
	if c, err := net.DialTimeout("tcp", addr, 300*time.Millisecond); err == nil || time.Since(start) < 250*time.Millisecond {
		if c != nil {
			c.Close()
		}
		t.Skipf("precondition: %s does not drop SYNs (err %v)", addr, err)
	}
	return addr
}

// TestAFailoverFromAVanishedHostIsFollowed: a Cluster primary whose host
// is gone (its SYNs unanswered, so a dial hangs rather than being
// refused) is replaced by its promoted replica. The first write sent to
// it fails within the store's timeout (a 503), as go-redis dials it again
// until the deadline; the store then reads the slot map again, by itself
// and within a bounded time of its own, and the next write goes to the
// new primary and is served. (Before: the write's failure was the
// deadline, not an unreached node, and the map was not read again:
// every write was a 503 for 11 s, until go-redis stopped dialing the
// dead host after a pool's worth of failed dials.)
func TestAFailoverFromAVanishedHostIsFollowed(t *testing.T) {
	ctx := context.Background()
	srv := servers.StartRedis(t)
	dead := blackholeAddr(t)
	var phase atomic.Int32 // 0 the primary serves, 1 it vanished (map still names it), 2 replica promoted
	o := moduleClusterOptions(&servers.Cluster{})
	o.ClusterSlots = func(context.Context) ([]redis.ClusterSlot, error) {
		addr := srv.Addr
		if phase.Load() == 1 {
			addr = dead
		}
		return []redis.ClusterSlot{{Start: 0, End: 16383, Nodes: []redis.ClusterNode{{Addr: addr}}}}, nil
	}
	rdb := redis.NewClusterClient(o)
	t.Cleanup(func() { rdb.Close() })
	s, err := New(ctx, rdb, Options{Prefix: "gone"})
	if err != nil {
		t.Fatal(err)
	}
	// A write served first, as the module's provision does (keyspaceMarker):
	// the client's command info is cached, its pool warm.
	if err := s.Claims().Record(ctx, "warm", "n", time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	phase.Store(1)
	rdb.ForEachMaster(ctx, func(context.Context, *redis.Client) error { return nil }) // the client's map names the dead host
	phase.Store(2)                                                                    // the Cluster promoted the replica
	start := time.Now()
	err = s.Claims().Record(ctx, "first", "n", time.Now().Add(time.Minute))
	took := time.Since(start)
	t.Logf("the first write after the promotion: %v in %v", err, took)
	if took > s.opTimeout+200*time.Millisecond {
		t.Errorf("the first write after the promotion took %v, want at most the store's timeout %v", took, s.opTimeout)
	}
	_, srvPort, _ := net.SplitHostPort(srv.Addr)
	for {
		// The client names a node of a loopback address by its port.
		addr := ""
		if node, err := rdb.MasterForKey(ctx, "gone:{c}:x"); err == nil {
			addr = node.Options().Addr
		}
		if _, port, _ := net.SplitHostPort(addr); port == srvPort {
			break
		}
		if time.Since(start) > 3*s.opTimeout {
			t.Fatalf("the slot map was not read again %v after the primary's host went: the client names %q for the slot", time.Since(start), addr)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("the map was read again %v after the first write began", time.Since(start))
	if err := s.Claims().Record(ctx, "next", "n", time.Now().Add(time.Minute)); err != nil {
		t.Errorf("the write after the slot map was read again = %v, want served on the new primary", err)
	}
}
