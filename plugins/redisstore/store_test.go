package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/store/storetest"
)

var prefixes atomic.Int64

// backend returns a contract-suite backend on rdb: a Store with a prefix of
// its own per subtest, so subtests sharing one server never see each
// other's keys.
func backend(rdb redis.UniversalClient) storetest.NewGateway {
	return func(t *testing.T, ttl time.Duration) storetest.Gateway {
		s, err := New(context.Background(), rdb, Options{Prefix: fmt.Sprintf("t%d", prefixes.Add(1)), ReservationTTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		return storetest.Gateway{Allowance: s.Allowance(), Claims: s.Claims(), ServerDay: true}
	}
}

// quiet drops go-redis's connection-pool log lines (a stopped server
// makes it log every failed dial).
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	redis.SetLogger(quiet{})
	os.Exit(m.Run())
}

func standalone(t *testing.T, extra ...string) (*servers.Redis, *redis.Client) {
	srv := servers.StartRedis(t, extra...)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 128})
	t.Cleanup(func() { rdb.Close() })
	return srv, rdb
}

func cluster(t *testing.T) *redis.ClusterClient {
	cl := servers.StartRedisCluster(t)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs, PoolSize: 128})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

func TestContractStandalone(t *testing.T) {
	_, rdb := standalone(t)
	t.Run("allowance", func(t *testing.T) { storetest.TestAllowance(t, backend(rdb)) })
	t.Run("claims", func(t *testing.T) { storetest.TestClaims(t, backend(rdb)) })
}

func TestContractCluster(t *testing.T) {
	rdb := cluster(t)
	t.Run("allowance", func(t *testing.T) { storetest.TestAllowance(t, backend(rdb)) })
	t.Run("claims", func(t *testing.T) { storetest.TestClaims(t, backend(rdb)) })
	t.Run("WAIT goes to the primary of the keys' slot", func(t *testing.T) {
		ctx := context.Background()
		s, err := New(ctx, rdb, Options{Prefix: "cw", WaitReplicas: 1, WaitTimeout: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		// No node has a replica: the script runs on the right primary
		// (no MOVED), the unacknowledged write is an error, and it is
		// undone there (the caller answers 503: retry).
		if _, err := s.Allowance().Reserve(ctx, "p", "c", time.Now(), 3); !errors.Is(err, ErrNotReplicated) {
			t.Fatalf("Reserve = %v, want ErrNotReplicated", err)
		}
		if _, err := s.Claims().Claim(ctx, []string{"k1", "k2"}, time.Now().Add(time.Minute)); !errors.Is(err, ErrNotReplicated) {
			t.Fatalf("Claim = %v, want ErrNotReplicated", err)
		}
		if n := rdb.Exists(ctx, "cw:{c}:k1", "cw:{c}:k2").Val(); n != 0 {
			t.Fatalf("%d claim keys on the cluster, want 0 (the write ran, unacknowledged, and was undone)", n)
		}
	})
}

func TestNewRefusesAnEvictingServer(t *testing.T) {
	ctx := context.Background()
	for _, policy := range []string{"volatile-lru", "allkeys-lru", "volatile-ttl", "allkeys-random"} {
		t.Run(policy, func(t *testing.T) {
			_, rdb := standalone(t, "--maxmemory-policy", policy)
			_, err := New(ctx, rdb, Options{})
			if err == nil || !strings.Contains(err.Error(), policy) || !strings.Contains(err.Error(), "noeviction") {
				t.Fatalf("New against %s = %v, want a refusal naming the policy", policy, err)
			}
		})
	}
	t.Run("a prefix with a hash tag brace is refused", func(t *testing.T) {
		_, rdb := standalone(t)
		if _, err := New(ctx, rdb, Options{Prefix: "a{b}"}); err == nil {
			t.Fatal("accepted a prefix with braces")
		}
	})
}

// TestScriptsAreSafeToRunTwice runs each write script a second time with
// the same arguments, as go-redis does when a connection drops after the
// server ran a command: nothing is counted or claimed twice.
func TestScriptsAreSafeToRunTwice(t *testing.T) {
	ctx := context.Background()
	_, rdb := standalone(t)
	s, err := New(ctx, rdb, Options{Prefix: "twice"})
	if err != nil {
		t.Fatal(err)
	}
	// The server's day (the test runs on the server's machine).
	label, start, end := dayOf(time.Now())
	key := s.Allowance().(allowance).key("p", "c", label)
	for range 2 {
		if _, err := s.write(ctx, reserveScript, []string{key}, start, end, 2, 60000, "id-1"); err != nil {
			t.Fatal(err)
		}
	}
	if n := rdb.ZCard(ctx, key).Val(); n != 1 {
		t.Fatalf("a reserve run twice holds %d units, want 1", n)
	}
	for range 2 {
		s.write(ctx, finishScript, []string{key}, "id-1", "1")
	}
	if used := rdb.ZCount(ctx, key, "(0", "+inf").Val(); used != 1 {
		t.Fatalf("a commit run twice counts %d units, want 1", used)
	}
	if _, err := s.write(ctx, reserveScript, []string{key}, start, end, 2, 60000, "id-1"); err != nil {
		t.Fatal(err)
	}
	if used := rdb.ZCard(ctx, key).Val(); used != 1 {
		t.Fatalf("a reserve resent after its commit holds %d units, want 1", used)
	}

	cl := s.Claims().(claims)
	keys := cl.keys([]string{"a", "b"})
	until := time.Now().Add(time.Minute).UnixMilli()
	for i := range 2 {
		v, err := s.write(ctx, claimScript, keys, strings.Repeat("ab", 16), until)
		if err != nil || v.([]any)[0] != int64(1) {
			t.Fatalf("claim run %d: %v, %v; want success (the holder's own token)", i+1, v, err)
		}
	}
	c := store.Claim{Keys: []string{"a", "b"}, Token: strings.Repeat("ab", 16)}
	for i := range 2 {
		if err := cl.Settle(ctx, c, "0xtx", time.Time{}); err != nil {
			t.Fatalf("settle run %d: %v", i+1, err)
		}
	}
	if v, err := s.write(ctx, claimScript, keys, strings.Repeat("ab", 16), until); err != nil || v.([]any)[0] != int64(1) {
		t.Fatalf("a claim resent after its settle: %v, %v", v, err)
	}
	if st, err := cl.Lookup(ctx, "a"); err != nil || !st.Settled {
		t.Fatalf("a claim resent after its settle unsettled it: %+v, %v", st, err)
	}

	// A record renewed by a later one (a second payment) is not cut back
	// by the first one's resend.
	rk := cl.keys([]string{"paid"})
	for i, u := range []int64{until, until + 1000, until} {
		if _, err := s.write(ctx, recordScript, rk, strings.Repeat("cd", 16), u, "paid"); err != nil {
			t.Fatalf("record run %d: %v", i+1, err)
		}
	}
	if st, err := cl.Lookup(ctx, "paid"); err != nil || !st.Settled || st.Until.UnixMilli() != until+1000 {
		t.Fatalf("a record renewed, then the first resent: %+v, %v; want settled until the renewal's %d", st, err, until+1000)
	}
}

// TestFailsClosed: with the server gone every operation is an error (the
// gateway answers 503), never a grant, a claim or a "not found".
func TestFailsClosed(t *testing.T) {
	ctx := context.Background()
	srv, rdb := standalone(t)
	s, err := New(ctx, rdb, Options{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.Allowance().Reserve(ctx, "p", "c", time.Now(), 5)
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.Claims().Claim(ctx, []string{"k"}, time.Now().Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	sentinels := []error{store.ErrExhausted, store.ErrNotReserved, store.ErrClaimed, store.ErrClaimLost, store.ErrNotFound, store.ErrClaimSettled}
	check := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Errorf("%s with the server down succeeded", what)
		}
		for _, s := range sentinels {
			if errors.Is(err, s) {
				t.Errorf("%s with the server down = %v, a store answer instead of an outage", what, err)
			}
		}
	}
	_, err = s.Allowance().Reserve(ctx, "p", "c", time.Now(), 5)
	check("Reserve", err)
	check("Commit", s.Allowance().Commit(ctx, r))
	_, err = s.Allowance().Remaining(ctx, "p", "c", time.Now(), 5)
	check("Remaining", err)
	_, err = s.Claims().Claim(ctx, []string{"k2"}, time.Now().Add(time.Minute))
	check("Claim", err)
	check("Settle", s.Claims().Settle(ctx, c, "tx", time.Time{}))
	_, err = s.Claims().Lookup(ctx, "k")
	check("Lookup", err)

	srv.Start()
	if err := s.Allowance().Commit(ctx, r); !errors.Is(err, store.ErrNotReserved) {
		t.Fatalf("after the server came back (memory only, so empty): commit = %v; want ErrNotReserved", err)
	}
}

// TestWaitForReplicas: with wait_replicas a write returns only once a
// replica has it, and a write no replica acknowledges in time is an error.
func TestWaitForReplicas(t *testing.T) {
	ctx := context.Background()
	primary, rdb := standalone(t)
	s, err := New(ctx, rdb, Options{Prefix: "w", WaitReplicas: 1, WaitTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claims().Claim(ctx, []string{"k"}, time.Now().Add(time.Minute)); !errors.Is(err, ErrNotReplicated) {
		t.Fatalf("claim with no replica = %v, want ErrNotReplicated", err)
	}
	host, port, _ := strings.Cut(primary.Addr, ":")
	replica, rrdb := standalone(t, "--replicaof", host, port)
	_ = replica
	deadline := time.Now().Add(10 * time.Second)
	// Linked on the replica's side, and online on the primary's (only an
	// online replica acknowledges a WAIT).
	for !strings.Contains(rrdb.Info(ctx, "replication").Val(), "master_link_status:up") ||
		!strings.Contains(rdb.Info(ctx, "replication").Val(), "state=online") {
		if time.Now().After(deadline) {
			t.Fatal("replica never linked")
		}
		time.Sleep(20 * time.Millisecond)
	}
	c, err := s.Claims().Claim(ctx, []string{"k2"}, time.Now().Add(time.Minute))
	if err != nil {
		t.Fatalf("claim with a replica: %v", err)
	}
	if err := s.Claims().Settle(ctx, c, "tx", time.Time{}); err != nil {
		t.Fatal(err)
	}
	if got := rrdb.HGet(ctx, "w:{c}:k2", "s").Val(); got != "1" {
		t.Fatalf("the replica has s=%q right after the settle returned, want 1", got)
	}
}

// TestCommitRetriedAfterAnOutage: a commit that fails because Redis is
// away (after the call was served) is retried until it lands, so the unit
// counts once Redis is back instead of coming back when it lapses. The
// client is given back (AfterRetries, as the module's Cleanup does once no
// request uses the store) only after that: closed under the retry, the
// unit would be granted a second time.
func TestCommitRetriedAfterAnOutage(t *testing.T) {
	ctx := context.Background()
	srv, rdb, s, r := reservedWhenRedisStops(t, "retry", 2)
	if err := s.Allowance().Commit(ctx, r); err == nil || errors.Is(err, store.ErrNotReserved) {
		t.Fatalf("commit with Redis down = %v, want a transport error", err)
	}
	given := make(chan struct{})
	s.AfterRetries(func() { close(given) })
	select {
	case <-given:
		t.Fatal("the client was given back while a commit was being retried")
	case <-time.After(300 * time.Millisecond):
	}
	srv.Start()
	key := s.Allowance().(allowance).key("p", "c", r.Day)
	deadline := time.Now().Add(10 * time.Second)
	for rdb.ZScore(ctx, key, r.ID).Val() != math.Inf(1) {
		if time.Now().After(deadline) {
			t.Fatal("the commit never landed after Redis came back")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := s.Allowance().Commit(ctx, r); !errors.Is(err, store.ErrNotReserved) {
		t.Fatalf("the retried commit counted the unit; a further commit = %v, want ErrNotReserved", err)
	}
	select {
	case <-given:
	case <-time.After(10 * time.Second):
		t.Fatal("the client was never given back after the retried commit landed")
	}
}

// TestReleaseRetriedAfterAnOutage: a release that fails because Redis is
// away (the call was refused, a 422: nothing may be taken) is retried as
// a commit is, so once Redis is back the unit is free again. Before, it
// was given up at once, and the client's free call stayed held until the
// reservation lapsed (5 minutes): with a limit of 1, no free call at all.
func TestReleaseRetriedAfterAnOutage(t *testing.T) {
	ctx := context.Background()
	srv, rdb, s, r := reservedWhenRedisStops(t, "retryrel", 1)
	if err := s.Allowance().Release(ctx, r); err == nil || errors.Is(err, store.ErrNotReserved) {
		t.Fatalf("release with Redis down = %v, want a transport error", err)
	}
	srv.Start()
	key := s.Allowance().(allowance).key("p", "c", r.Day)
	deadline := time.Now().Add(10 * time.Second)
	for rdb.Exists(ctx, key).Val() != 0 && rdb.ZScore(ctx, key, r.ID).Err() == nil {
		if time.Now().After(deadline) {
			t.Fatal("the release never landed after Redis came back: the client's free call stays held until the reservation lapses")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := s.Allowance().Reserve(ctx, "p", "c", time.Now(), 1); err != nil {
		t.Fatalf("the one free call of the day after the retried release: %v", err)
	}
	given := make(chan struct{})
	s.AfterRetries(func() { close(given) })
	select {
	case <-given:
	case <-time.After(10 * time.Second):
		t.Fatal("the client was never given back after the retried release landed")
	}
}

// gatewayClock is a FAKE: the gateway's clock set off from the Redis
// server's by skew (nothing else can put two clocks apart in a test on one
// machine). It keeps the monotonic reading, as a real clock's time does.
func gatewayClock(t *testing.T, skew time.Duration) {
	now = func() time.Time { return time.Now().Add(skew) }
	t.Cleanup(func() { now = time.Now })
}

// A commit retried after an outage is judged by the time elapsed on the
// gateway since the reservation, never by comparing the gateway's clock
// with the server's. Ahead of the server by more than the reservation's
// lifetime, the gateway used to give up at once, and the served call's
// unit came back when it lapsed, to be granted a second time; behind it,
// it went on retrying (and holding the client, AfterRetries) for as long
// as the clocks were apart, long after the unit had lapsed.
func TestCommitRetryIgnoresTheGatewayClock(t *testing.T) {
	ctx := context.Background()
	t.Run("ahead", func(t *testing.T) {
		gatewayClock(t, store.DefaultReservationTTL+time.Minute)
		srv, rdb, s, r := reservedWhenRedisStops(t, "skew", 1)
		if err := s.Allowance().Commit(ctx, r); err == nil || errors.Is(err, store.ErrNotReserved) {
			t.Fatalf("commit with Redis down = %v, want a transport error", err)
		}
		srv.Start()
		key := s.Allowance().(allowance).key("p", "c", r.Day)
		deadline := time.Now().Add(10 * time.Second)
		for rdb.ZScore(ctx, key, r.ID).Val() != math.Inf(1) {
			if time.Now().After(deadline) {
				t.Fatal("the commit was never retried: the served call's unit would be granted again once it lapses")
			}
			time.Sleep(20 * time.Millisecond)
		}
		if _, err := s.Allowance().Reserve(ctx, "p", "c", time.Now(), 1); !errors.Is(err, store.ErrExhausted) {
			t.Fatalf("a second free call after the first was served and counted: %v, want ErrExhausted", err)
		}
	})
	t.Run("behind", func(t *testing.T) {
		gatewayClock(t, -time.Hour)
		srv, rdb := standalone(t)
		s, err := New(ctx, rdb, Options{Prefix: "skew", ReservationTTL: 300 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		r, err := s.Allowance().Reserve(ctx, "p", "c", time.Now(), 1)
		if err != nil {
			t.Fatal(err)
		}
		srv.Stop() // for good: the unit lapses unanswered
		if err := s.Allowance().Commit(ctx, r); err == nil {
			t.Fatal("commit with Redis down succeeded")
		}
		given := make(chan struct{})
		s.AfterRetries(func() { close(given) })
		select {
		case <-given:
		case <-time.After(30 * time.Second):
			t.Fatal("the commit was still retried long after its reservation lapsed (300 ms)")
		}
	})
}

// reservedWhenRedisStops reserves a unit of client c in pool p, of limit
// a day, on a Redis that puts every write on disk (it comes back with the
// reservation), then stops that Redis: what a commit or a release made
// during the outage leaves is the test's.
func reservedWhenRedisStops(t *testing.T, prefix string, limit int) (*servers.Redis, *redis.Client, *Store, store.Reservation) {
	t.Helper()
	ctx := context.Background()
	srv, rdb := standalone(t, "--appendonly", "yes", "--appendfsync", "always")
	s, err := New(ctx, rdb, Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.Allowance().Reserve(ctx, "p", "c", time.Now(), limit)
	if err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	return srv, rdb, s, r
}
