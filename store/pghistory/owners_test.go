package pghistory

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/store/storetest"
)

// TestOwners: of concurrent first binders of one agent id on two instances
// exactly one wins and every binder learns the winner; an owner never
// changes; bad input is refused.
func TestOwners(t *testing.T) {
	srv := servers.StartPostgres(t)
	dsn := freshDB(t, srv)
	a, b := open(t, dsn), open(t, dsn)
	ctx := context.Background()
	if o, err := a.AgentOwner(ctx, "seller"); err != nil || o != "" {
		t.Fatalf("an unbound agent: %q, %v", o, err)
	}
	owners := make([]string, 20)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range owners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			h := a
			if i%2 == 1 {
				h = b
			}
			o, err := h.BindAgent(ctx, "seller", fmt.Sprintf("0xwallet%02d", i))
			if err != nil {
				t.Error(err)
			}
			owners[i] = o
		}()
	}
	close(start)
	wg.Wait()
	winner, _ := b.AgentOwner(ctx, "seller")
	if !strings.HasPrefix(winner, "0xwallet") {
		t.Fatalf("owner %q", winner)
	}
	for i, o := range owners {
		if o != winner {
			t.Errorf("binder %d was told %q, the owner is %q", i, o, winner)
		}
	}
	if o, _ := a.BindAgent(ctx, "seller", "0xlate"); o != winner {
		t.Fatalf("a later binder changed the owner to %q", o)
	}
	for _, c := range []struct{ agent, wallet string }{{"", "0x1"}, {"x", ""}, {"x", strings.Repeat("w", 129)}, {strings.Repeat("a", 70000), "0x1"}} {
		if _, err := a.BindAgent(ctx, c.agent, c.wallet); err == nil {
			t.Errorf("BindAgent(%.10q, %.10q) accepted", c.agent, c.wallet)
		}
	}
	if o, err := a.BindAgent(ctx, "nul\x00agent", "0xn"); err != nil || o != "0xn" {
		t.Fatalf("an agent id with NUL: %q, %v", o, err)
	}
}

// TestSchema1Migrates: a version 1 database (no authenticated column) gets
// the column set from its records when an instance opens it, and is
// version 2 afterwards.
func TestSchema1Migrates(t *testing.T) {
	srv := servers.StartPostgres(t)
	dsn := freshDB(t, srv)
	ctx := context.Background()
	h := open(t, dsn)
	at := time.Date(2026, 11, 29, 21, 0, 0, 0, time.UTC)
	for i, auth := range []bool{true, false, true} {
		v := storetest.Sample(fmt.Sprint("v", i), "seller-7", at.Add(time.Duration(i)*time.Second), "pass")
		v.Authenticated, v.Wallet = auth, "0xowner"
		if err := h.RecordVerification(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	// What version 1 wrote: no flag, version 1.
	if _, err := h.pool.Exec(ctx, `UPDATE aov_verifications SET authenticated = false`); err != nil {
		t.Fatal(err)
	}
	if _, err := h.pool.Exec(ctx, `UPDATE aov_schema_version SET version = 1`); err != nil {
		t.Fatal(err)
	}
	if got, _, err := h.AuthenticatedVerifications(ctx, "seller-7", "", 10); err != nil || len(got) != 0 {
		t.Fatalf("the downgraded index still lists %v (%v)", got, err)
	}
	h2 := open(t, dsn)
	got, _, err := h2.AuthenticatedVerifications(ctx, "seller-7", "", 10)
	if err != nil || len(got) != 2 || got[0].ID != "v2" || got[1].ID != "v0" {
		t.Fatalf("after the migration: %+v, %v; want v2 and v0", got, err)
	}
	var v int
	if err := h2.pool.QueryRow(ctx, `SELECT version FROM aov_schema_version`).Scan(&v); err != nil || v != schemaVersion {
		t.Fatalf("schema version %d (%v) after the migration, want %d", v, err, schemaVersion)
	}
}
