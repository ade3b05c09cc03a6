package pghistory

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/store/storetest"
)

// blackHole is a FAKE: a TCP proxy in front of the real PostgreSQL that,
// once armed, lets the first connection to send a COMMIT go dark: from
// that COMMIT on it forwards nothing either way and closes nothing on the
// server's side. That is what a verifierd whose host died (power loss,
// kernel panic) or was cut off by a partition looks like to the server,
// which keeps the session until TCP keepalive notices (over two hours by
// default). Nothing else causes it on cue.
type blackHole struct {
	DSN   string
	armed atomic.Bool
	ln    net.Listener
	mu    sync.Mutex
	held  []net.Conn
}

// cut closes the proxy and every connection through it.
func (b *blackHole) cut() {
	b.ln.Close()
	b.mu.Lock()
	for _, c := range b.held {
		c.Close()
	}
	b.mu.Unlock()
}

func startBlackHole(t *testing.T, dsn string) *blackHole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	start := strings.Index(dsn, "@") + 1
	end := start + strings.Index(dsn[start:], "/")
	target := dsn[start:end]
	b := &blackHole{DSN: dsn[:start] + ln.Addr().String() + dsn[end:]}
	b.ln = ln
	t.Cleanup(b.cut)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			b.mu.Lock()
			b.held = append(b.held, c, s)
			b.mu.Unlock()
			dark := new(atomic.Bool)
			go b.pipe(c, s, dark, true)
			go b.pipe(s, c, dark, false)
		}
	}()
	return b
}

// pipe forwards from one side to the other until its connection goes
// dark, then drops everything and never closes the other side (a dead
// host sends no FIN). A connection that is not dark is a healthy link:
// a side's close is passed on.
func (b *blackHole) pipe(from, to net.Conn, dark *atomic.Bool, client bool) {
	buf := make([]byte, 64<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 && client && strings.Contains(string(buf[:n]), "COMMIT\x00") && b.armed.CompareAndSwap(true, false) {
			dark.Store(true)
		}
		if n > 0 && !dark.Load() {
			to.Write(buf[:n])
		}
		if err != nil {
			if !dark.Load() {
				to.Close()
			}
			return
		}
	}
}

// A verifierd that vanishes between its record's INSERT and its COMMIT
// (the record is an explicit transaction: see RecordVerification) leaves the
// server a session idle in transaction that holds the agent's counts row.
// The server ends that session after idleInTransactionTimeout, so another
// instance's record of the same agent waits at most that long (and no
// longer than its own deadline while it waits), and the vanished record is
// rolled back, which the lookup of its lost COMMIT then reports.
func TestVanishedRecorderReleasesTheAgentsCounts(t *testing.T) {
	srv := servers.StartPostgres(t)
	dsn := freshDB(t, srv)
	direct := open(t, dsn) // another verifierd instance, healthy
	bh := startBlackHole(t, dsn)
	h := open(t, bh.DSN) // the instance whose host is about to vanish
	// Before h's pool closes: pgx waits up to 15 s for the server to close
	// a connection it gave up on, and the dark one's never does.
	defer bh.cut()
	ctx := context.Background()
	if err := h.RecordVerification(ctx, storetest.Sample("warm", "shared-agent", timeBase, "pass")); err != nil {
		t.Fatal(err)
	}

	// The doomed instance's BEGIN+INSERT reaches the server; its COMMIT,
	// and everything after it on that connection, never does.
	bh.armed.Store(true)
	doomed := make(chan error, 1)
	go func() {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		doomed <- h.RecordVerification(rctx, storetest.Sample("doomed", "shared-agent", timeBase, "pass"))
	}()
	for i := 0; ; i++ {
		var n int
		if err := direct.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND state = 'idle in transaction'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if i == 500 {
			t.Fatal("the doomed record's transaction never went idle on the server")
		}
		time.Sleep(10 * time.Millisecond)
	}

	// A record that waits on the lock ends at its own deadline, having
	// recorded nothing: the wait is under the caller's context.
	sctx, scancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err := direct.RecordVerification(sctx, storetest.Sample("short", "shared-agent", timeBase.Add(time.Second), "pass"))
	scancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a record waiting on the vanished session's lock past its deadline: %v, want the deadline", err)
	}

	// One with the answer deadline of Caddyfile.example's gateway (15 s)
	// is recorded once the server has ended the vanished session.
	hctx, hcancel := context.WithTimeout(ctx, 15*time.Second)
	err = direct.RecordVerification(hctx, storetest.Sample("healthy", "shared-agent", timeBase.Add(2*time.Second), "pass"))
	hcancel()
	if err != nil {
		t.Fatalf("a healthy instance's record of the same agent, after a peer vanished mid-transaction: %v", err)
	}

	// The doomed record's COMMIT went unanswered; the lookup finds its
	// transaction rolled back, not still in progress.
	if err := <-doomed; err == nil || errors.Is(err, errCommitUnknown) {
		t.Fatalf("the vanished record: %v, want rolled back", err)
	}
	for id, want := range map[string]bool{"warm": true, "doomed": false, "short": false, "healthy": true} {
		_, err := direct.Verification(ctx, id)
		if got := err == nil; got != want || err != nil && !errors.Is(err, store.ErrNotFound) {
			t.Errorf("record %s stored %v (%v), want %v", id, got, err, want)
		}
	}
	if c, err := direct.AgentCounts(ctx, "shared-agent"); err != nil || c.Pass != 2 {
		t.Errorf("counts %+v, %v; want the two records made", c, err)
	}
}

// The pool's sessions end a transaction left idle after
// idleInTransactionTimeout unless the operator's address sets the
// setting, as a parameter or in options; and a record whose session the
// server ended that way between its INSERT and its COMMIT is answered as
// not recorded, and is not. The pause is a fake (servers.PGFault holding
// the INSERT's answer): our own gap there is a clock read.
func TestIdleInTransactionTimeout(t *testing.T) {
	srv := servers.StartPostgres(t)
	dsn := freshDB(t, srv)
	ctx := context.Background()
	for _, tc := range []struct{ name, dsn, want string }{
		{"the default", dsn, idleInTransactionTimeout},
		{"a parameter of the address", dsn + "&idle_in_transaction_session_timeout=300ms", "300ms"},
		{"options", dsn + "&options=-c%20idle_in_transaction_session_timeout%3D2min", "2min"},
		{"off", dsn + "&idle_in_transaction_session_timeout=0", "0"},
	} {
		var got string
		if err := open(t, tc.dsn).pool.QueryRow(ctx, `SHOW idle_in_transaction_session_timeout`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != tc.want {
			t.Errorf("%s: idle_in_transaction_session_timeout %s, want %s", tc.name, got, tc.want)
		}
	}

	direct := open(t, dsn)
	proxy := servers.StartPGFault(t, &servers.Postgres{DSN: dsn + "&idle_in_transaction_session_timeout=300ms"})
	h := open(t, proxy.DSN)
	if err := h.RecordVerification(ctx, storetest.Sample("warm", "agent", timeBase, "pass")); err != nil {
		t.Fatal(err)
	}
	proxy.Arm("", servers.DelayAnswer, 1500*time.Millisecond) // the INSERT's answer
	err := h.RecordVerification(ctx, storetest.Sample("ended", "agent", timeBase, "pass"))
	if proxy.Hits.Load() != 1 {
		t.Fatalf("the fault never happened: %v", err)
	}
	if err == nil || errors.Is(err, errCommitUnknown) {
		t.Fatalf("a record whose session the server ended: %v, want not recorded", err)
	}
	if _, err := direct.Verification(ctx, "ended"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the record whose session was ended: %v, want not found", err)
	}
	if c, err := direct.AgentCounts(ctx, "agent"); err != nil || c.Pass != 1 {
		t.Fatalf("counts %+v, %v; want the warm record alone", c, err)
	}
	t.Logf("answered: %v", err)
}
