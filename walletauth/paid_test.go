package walletauth

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/plugins/redisstore"
	"github.com/aovhq/aov/store"
)

const (
	paidPayer    = "0xAbC0000000000000000000000000000000000001"
	paidResource = "api.example.com/verify/schema"
)

// flakySettle is a fake store whose first Settle fails (a Redis timeout, a
// dropped connection): the fault of the two-write record this file's
// tests were written against, which a real Badger cannot be made to show.
type flakySettle struct {
	store.Claims
	failed bool
}

func (f *flakySettle) Settle(ctx context.Context, c store.Claim, note string, keep time.Time) error {
	if !f.failed {
		f.failed = true
		return errors.New("i/o timeout")
	}
	return f.Claims.Settle(ctx, c, note, keep)
}

// hasAccess fails t unless addr has paid access to paidResource.
func hasAccess(t *testing.T, p PaidAccess, addr string) {
	t.Helper()
	ok, err := p.Has(context.Background(), addr, paidResource)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Fatal("Has = false after a recorded payment: the wallet does not get the access it paid for")
	}
}

// A second write that fails must not leave the record pending: the wallet
// paid and gets its access.
func TestPaidAccessSurvivesAFailedSecondWrite(t *testing.T) {
	ctx := context.Background()
	pa := PaidAccess{Claims: &flakySettle{Claims: newDB(t).Claims()}}
	if err := pa.Record(ctx, paidPayer, paidResource); err != nil {
		t.Fatal(err)
	}
	hasAccess(t, pa, paidPayer)
}

// A record left pending (by an earlier build killed between its claim and
// its settle, on a real Badger) is made settled by the next payment's
// record, not taken for "already recorded" for its 30 days.
func TestPaidAccessSettlesARecordLeftPending(t *testing.T) {
	ctx := context.Background()
	db := newDB(t)
	if _, err := db.Claims().Claim(ctx, []string{paidKey(paidPayer, paidResource)}, time.Now().Add(DefaultPaidAccessTTL)); err != nil {
		t.Fatal(err)
	}
	pa := PaidAccess{Claims: db.Claims()}
	if err := pa.Record(ctx, paidPayer, paidResource); err != nil {
		t.Fatal(err)
	}
	hasAccess(t, pa, paidPayer)
}

// A payment while the record lasts renews it to TTL from that payment, and
// one under a TTL lowered since never shortens it.
func TestPaidAccessRenewsWithEachPayment(t *testing.T) {
	ctx := context.Background()
	db := newDB(t)
	until := func() time.Time {
		t.Helper()
		st, err := db.Claims().Lookup(ctx, paidKey(paidPayer, paidResource))
		if err != nil || !st.Settled {
			t.Fatalf("record %+v, %v", st, err)
		}
		return st.Until
	}
	if err := (PaidAccess{Claims: db.Claims(), TTL: time.Hour}).Record(ctx, paidPayer, paidResource); err != nil {
		t.Fatal(err)
	}
	first := until()
	if err := (PaidAccess{Claims: db.Claims(), TTL: 2 * time.Hour}).Record(ctx, paidPayer, paidResource); err != nil {
		t.Fatal(err)
	}
	renewed := until()
	if renewed.Sub(first) < 59*time.Minute {
		t.Fatalf("a second payment (TTL 2h) moved the record's end from %v to %v, want about an hour later", first, renewed)
	}
	if err := (PaidAccess{Claims: db.Claims(), TTL: time.Minute}).Record(ctx, paidPayer, paidResource); err != nil {
		t.Fatal(err)
	}
	if got := until(); !got.Equal(renewed) {
		t.Fatalf("a payment under a shorter TTL moved the record's end from %v to %v", renewed, got)
	}
}

// With Redis and wait_replicas 1 but no replica, the record's write is on
// the primary and reported as not replicated: it is there, settled, and
// the wallet has its access once it reads from the primary.
func TestPaidAccessNotReplicated(t *testing.T) {
	ctx := context.Background()
	srv := servers.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	waiting, err := redisstore.New(ctx, rdb, redisstore.Options{Prefix: "pa", WaitReplicas: 1, WaitTimeout: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	err = PaidAccess{Claims: waiting.Claims()}.Record(ctx, paidPayer, paidResource)
	if !errors.Is(err, redisstore.ErrNotReplicated) {
		t.Fatalf("Record with no replica = %v, want ErrNotReplicated", err)
	}
	hasAccess(t, PaidAccess{Claims: waiting.Claims()}, paidPayer)
	// A record left pending by an earlier build (its settle not
	// acknowledged) is settled by the next payment's record.
	const other = "0xAbC0000000000000000000000000000000000002"
	if _, err := waiting.Claims().Claim(ctx, []string{paidKey(other, paidResource)}, time.Now().Add(time.Hour)); !errors.Is(err, redisstore.ErrNotReplicated) {
		t.Fatalf("claim with no replica = %v, want ErrNotReplicated", err)
	}
	plain, err := redisstore.New(ctx, rdb, redisstore.Options{Prefix: "pa"})
	if err != nil {
		t.Fatal(err)
	}
	pa := PaidAccess{Claims: plain.Claims()}
	if err := pa.Record(ctx, other, paidResource); err != nil {
		t.Fatal(err)
	}
	hasAccess(t, pa, other)
}

// TestPaidAccessTTLIsBounded: a year (366 days) of access records; a TTL
// past MaxPaidAccessTTL (one reaching past what the store keeps, 2262 for
// Badger's Unix nanoseconds, among them) is refused by name, never left to
// fail in the store.
func TestPaidAccessTTLIsBounded(t *testing.T) {
	ctx := context.Background()
	pa := PaidAccess{Claims: newDB(t).Claims(), TTL: MaxPaidAccessTTL}
	if err := pa.Record(ctx, paidPayer, paidResource); err != nil {
		t.Fatalf("Record with TTL %s: %v", pa.TTL, err)
	}
	hasAccess(t, pa, paidPayer)
	for _, ttl := range []time.Duration{MaxPaidAccessTTL + time.Second, 2_400_000 * time.Hour} {
		pa.TTL = ttl
		if err := pa.Record(ctx, paidPayer, paidResource); err == nil || !strings.Contains(err.Error(), "is over") {
			t.Errorf("Record with TTL %s: %v, want refused as over %s", ttl, err, MaxPaidAccessTTL)
		}
	}
}
