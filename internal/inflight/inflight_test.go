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
