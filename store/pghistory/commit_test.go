package pghistory

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/store/storetest"
)

// A record whose caller's deadline passes while PostgreSQL works on it is
// either not recorded (the caller's error) or recorded (nil), never
// recorded behind an error: verifierd answers an error as "not recorded",
// and a record it denied must not count for an agent. The faults are a
// fake (servers.PGFault) in front of the real server; what was recorded is
// read back directly.
func TestRecordUnderADeadlineIsAnsweredAsItEnded(t *testing.T) {
	srv := servers.StartPostgres(t)
	dsn := freshDB(t, srv)
	direct := open(t, dsn)
	proxy := servers.StartPGFault(t, &servers.Postgres{DSN: dsn})
	h := open(t, proxy.DSN)
	ctx := context.Background()
	// Warms the pool: the fault is the record's own traffic.
	if err := h.RecordVerification(ctx, storetest.Sample("warm", "other", timeBase, "pass")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		query  string
		action servers.PGFaultAction
		// recorded: the answer must say recorded (nil); otherwise it must
		// be an error and nothing recorded.
		recorded bool
		deadline bool // the error is the caller's deadline
	}{
		// The write's answer comes after the caller's deadline: with the
		// record in a statement of its own (autocommit) it was committed
		// while the caller heard "deadline exceeded".
		{name: "the write's answer is late", action: servers.DelayAnswer, deadline: true},
		// The COMMIT is sent: it is awaited past the caller's deadline,
		// within its own bound, and the record is answered as recorded.
		{name: "the commit's answer is late", query: "COMMIT", action: servers.DelayAnswer, recorded: true},
		// The COMMIT ran but its answer was lost: the outcome is looked
		// up, and it committed.
		{name: "the commit's answer is lost", query: "COMMIT", action: servers.LoseAnswer, recorded: true},
		// The COMMIT never reached the server: the lookup finds the
		// transaction rolled back.
		{name: "the commit is lost", query: "COMMIT", action: servers.LoseRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, agent := "v-"+tc.name, "agent-"+tc.name
			hits := proxy.Hits.Load()
			proxy.Arm(tc.query, tc.action, 1500*time.Millisecond)
			rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			err := h.RecordVerification(rctx, storetest.Sample(id, agent, timeBase, "pass"))
			if proxy.Hits.Load() != hits+1 {
				proxy.Arm("", servers.DelayAnswer, 0) // disarm for the next case
				t.Fatalf("the fault never happened (err %v): the record sent no %q", err, tc.query)
			}
			_, verr := direct.Verification(ctx, id)
			c, cerr := direct.AgentCounts(ctx, agent)
			if verr != nil && !errors.Is(verr, store.ErrNotFound) || cerr != nil {
				t.Fatal(verr, cerr)
			}
			stored := verr == nil
			if stored != (c.Pass == 1) {
				t.Fatalf("record stored %v, counts %+v", stored, c)
			}
			switch {
			case err != nil && stored:
				t.Fatalf("answered %v, yet the record is stored and counted: %+v", err, c)
			case err == nil && !stored:
				t.Fatal("answered recorded, yet nothing is stored")
			case tc.recorded && err != nil:
				t.Fatalf("answered %v; the commit happened and is known", err)
			case !tc.recorded && err == nil:
				t.Fatal("answered recorded")
			case tc.deadline && !errors.Is(err, context.DeadlineExceeded):
				t.Fatalf("answered %v, want the caller's deadline", err)
			case !tc.recorded && !tc.deadline && errors.Is(err, context.DeadlineExceeded):
				t.Fatalf("answered %v: a lost commit is not the caller's deadline", err)
			}
		})
	}
}
