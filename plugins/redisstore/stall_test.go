package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/aovhq/aov/internal/servers"
)

// A free call's Reserve while Redis stalls (accepts, never answers) fails
// within a bounded wait (the gateway answers 503). The script was sent and
// runs late when Redis resumes, and the undo cannot follow it (its
// connection's handshake stalls too): the client has one unit fewer, for
// one reservation lifetime after Redis answers again, and never more.
func TestAStalledReserveCostsOneUnitForOneLifetime(t *testing.T) {
	srv := servers.StartRedis(t)
	// The client as the Caddy module makes it (module.go).
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, DialTimeout: time.Second, ReadTimeout: time.Second,
		WriteTimeout: time.Second, MaxRetries: 2, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	const ttl, limit = 2 * time.Second, 3
	s, err := New(ctx, rdb, Options{Prefix: "stall", ReservationTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	al := s.Allowance()
	// Loads the script: a late EVALSHA of a script the server lacks
	// would do nothing.
	r, err := al.Reserve(ctx, "verify", "c", time.Now(), limit)
	if err != nil {
		t.Fatal(err)
	}
	if err := al.Release(ctx, r); err != nil {
		t.Fatal(err)
	}
	srv.Pause()
	start := time.Now()
	_, err = al.Reserve(ctx, "verify", "c", time.Now(), limit)
	took := time.Since(start)
	if err == nil {
		t.Fatal("Reserve succeeded with Redis stalled")
	}
	if took > 5*time.Second {
		t.Errorf("Reserve with Redis stalled took %v", took)
	}
	srv.Resume()
	resumed := time.Now()
	time.Sleep(100 * time.Millisecond)
	n, rerr := al.Remaining(ctx, "verify", "c", time.Now(), limit)
	if rerr != nil || n < limit-1 {
		t.Fatalf("after Redis resumed: %d remaining, %v; at most one unit may be held", n, rerr)
	}
	t.Logf("Reserve failed after %v (%v); %d of %d remaining once Redis resumed", took, err, n, limit)
	time.Sleep(time.Until(resumed.Add(ttl + 200*time.Millisecond)))
	if n, err := al.Remaining(ctx, "verify", "c", time.Now(), limit); err != nil || n != limit {
		t.Errorf("a reservation lifetime after Redis resumed: %d remaining, %v; want %d", n, err, limit)
	}
}
