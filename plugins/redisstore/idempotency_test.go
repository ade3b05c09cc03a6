package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/store/storetest"
)

// paymentIDBackend is the contract suite's backend of payment identifiers
// on rdb, with a prefix of its own per subtest.
func paymentIDBackend(rdb redis.UniversalClient) storetest.NewPaymentIDs {
	return func(t *testing.T) store.PaymentIDs {
		s, err := New(context.Background(), rdb, Options{Prefix: fmt.Sprintf("t%d", prefixes.Add(1))})
		if err != nil {
			t.Fatal(err)
		}
		return s.PaymentIDs()
	}
}

func TestPaymentIDsContract(t *testing.T) {
	t.Run("standalone", func(t *testing.T) {
		_, rdb := standalone(t)
		storetest.TestPaymentIDs(t, paymentIDBackend(rdb))
	})
	t.Run("cluster", func(t *testing.T) {
		storetest.TestPaymentIDs(t, paymentIDBackend(cluster(t)))
	})
}

// TestPaymentIDScriptsAreSafeToRunTwice runs each write a second time, as
// go-redis does when a connection drops after the server ran it.
func TestPaymentIDScriptsAreSafeToRunTwice(t *testing.T) {
	ctx := context.Background()
	_, rdb := standalone(t)
	s, err := New(ctx, rdb, Options{Prefix: "pidtwice"})
	if err != nil {
		t.Fatal(err)
	}
	p := s.PaymentIDs()
	const id = "pay_run_twice_000000000001"
	until := time.Now().Add(time.Hour)
	for i := range 2 {
		st, _, err := p.Bind(ctx, id, "fp1", until)
		if err != nil || st.Fingerprint != "fp1" || st.Done {
			t.Fatalf("Bind run %d = %+v, %v; want fp1's own binding", i+1, st, err)
		}
	}
	for i := range 2 {
		if err := p.Save(ctx, id, "fp1", []byte("answer"), until); err != nil {
			t.Fatalf("Save run %d = %v", i+1, err)
		}
	}
	if st, err := p.Lookup(ctx, id); err != nil || string(st.Answer) != "answer" || !st.Done {
		t.Fatalf("Lookup = %+v, %v", st, err)
	}
	if _, _, err := p.Bind(ctx, "pay_run_twice_000000000002", "fp1", until); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := p.Unbind(ctx, "pay_run_twice_000000000002", "fp1"); err != nil {
			t.Fatalf("Unbind run %d = %v", i+1, err)
		}
	}
	if _, err := p.Lookup(ctx, "pay_run_twice_000000000002"); err != store.ErrNotFound {
		t.Fatalf("after Unbind: %v", err)
	}
	if n := rdb.Exists(ctx, "pidtwice:p:"+fmt.Sprintf("%x", id)).Val(); n != 1 {
		t.Fatalf("the binding is not under its documented key (%d)", n)
	}
}

// BenchmarkRedisPaymentIDs: a local Redis with AOF fsync every second,
// against its own claim in the same run.
func BenchmarkRedisPaymentIDs(b *testing.B) {
	srv := servers.StartRedis(b, "--appendonly", "yes", "--appendfsync", "everysec")
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 128})
	defer rdb.Close()
	s, err := New(context.Background(), rdb, Options{Prefix: "pidbench"})
	if err != nil {
		b.Fatal(err)
	}
	storetest.BenchmarkPaymentIDs(b, s.PaymentIDs(), s.Claims())
}
