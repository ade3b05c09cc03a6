package inflight

import (
	"context"
	"errors"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// TestCleanupWaitsForTheLastRequest: a cleanup of an unloaded config runs
// when its last request leaves, never in Cleanup while one is in flight;
// then the config takes no request in. Modules of one config share one
// count; another config's is its own.
func TestCleanupWaitsForTheLastRequest(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	c := For(ctx)
	if For(ctx) != c {
		t.Fatal("two modules of one config got two counts")
	}
	other, cancelOther := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancelOther()
	if For(other) == c {
		t.Fatal("two configs share one count")
	}

	// Cleanup while the config runs: a module undoing its own failed
	// Provision, which no request used.
	ran := 0
	if err := c.AfterRequests(func() error { ran++; return nil }); err != nil || ran != 1 {
		t.Fatalf("a cleanup of a running config: ran %d times (%v), want at once", ran, err)
	}

	if !c.Enter() || !c.Enter() {
		t.Fatal("a running config refused a request")
	}
	cancel() // Caddy unloads the config, then calls each module's Cleanup
	closed := 0
	for range 2 {
		if err := c.AfterRequests(func() error { closed++; return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if closed != 0 {
		t.Fatal("a cleanup ran with requests in flight")
	}
	if !c.Enter() {
		t.Fatal("a request was refused while others of its config still hold what it uses")
	}
	c.Leave()
	c.Leave()
	if closed != 0 {
		t.Fatal("a cleanup ran with a request in flight")
	}
	c.Leave()
	if closed != 2 {
		t.Fatalf("after the last request %d cleanups ran, want 2", closed)
	}
	if c.Enter() {
		t.Fatal("a request was taken into a config whose resources are closed")
	}
	if err := c.AfterRequests(func() error { closed++; return nil }); err != nil || closed != 3 {
		t.Fatal("a cleanup after the last request did not run at once")
	}
}

// TestCleanupWithNothingInFlightRunsAtOnce: with no request in flight the
// first Cleanup closes at once and returns its error (a clean stop writes
// everything before it returns).
func TestCleanupWithNothingInFlightRunsAtOnce(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	c := For(ctx)
	cancel()
	want := context.Canceled
	if err := c.AfterRequests(func() error { return want }); !errors.Is(err, want) {
		t.Fatalf("error %v, want the cleanup's own", err)
	}
}

// TestAPanickingCleanupDoesNotSkipTheOthers: the cleanups run on the last
// request's goroutine; one that panics is an error, and those after it
// still release what they hold.
func TestAPanickingCleanupDoesNotSkipTheOthers(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	c := For(ctx)
	if !c.Enter() {
		t.Fatal("a running config refused a request")
	}
	cancel()
	ran := false
	c.AfterRequests(func() error { panic("deleted more than stored") })
	c.AfterRequests(func() error { ran = true; return nil })
	if err := c.leave(); err == nil || !ran {
		t.Fatalf("after a panicking cleanup: error %v, the next ran: %v", err, ran)
	}
}

// TestHoldsCloseAfterTheLastRelease: a close with nothing held runs at
// once; one with holds runs at the last release (each release counts
// once) and its error is that release's.
func TestHoldsCloseAfterTheLastRelease(t *testing.T) {
	var h Holds
	ran := 0
	if err := h.Close(func() error { ran++; return nil }); err != nil || ran != 1 {
		t.Fatalf("close with no hold: ran %d times (%v), want at once", ran, err)
	}

	var g Holds
	a, b := g.Hold(), g.Hold()
	closed := 0
	want := errors.New("close failed")
	if err := g.Close(func() error { closed++; return want }); err != nil || closed != 0 {
		t.Fatalf("close while held: ran %d times (%v), want none yet", closed, err)
	}
	if err := a(); err != nil || closed != 0 {
		t.Fatalf("first release: close ran %d times (%v), want none: one hold is left", closed, err)
	}
	if err := a(); err != nil || closed != 0 {
		t.Fatalf("a release given twice counted twice: close ran %d times (%v)", closed, err)
	}
	if err := b(); !errors.Is(err, want) || closed != 1 {
		t.Fatalf("last release: close ran %d times, error %v; want once, %v", closed, err, want)
	}

	var none *Holds
	if err := none.Hold()(); err != nil {
		t.Fatal(err)
	}
	if err := none.Close(func() error { closed++; return nil }); err != nil || closed != 2 {
		t.Fatal("a nil Holds did not close at once")
	}
}
