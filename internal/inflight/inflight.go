// Package inflight keeps what a Caddy config's modules hold (a store
// handle, a pooled client, a chain connection) usable until the last
// request that config's handlers took in has finished.
//
// Caddy cleans up a config's modules as soon as a reload has started the
// new config and told the old servers to shut down; it does not wait for
// the old servers' requests to drain, and it calls Cleanup synchronously
// during the reload, so a Cleanup must not wait for them either. A module
// whose Cleanup would close something a request may still use hands the
// close to AfterRequests instead: it runs at once when nothing of the
// config is in flight, else when the last request Leaves. A request Enters
// before it touches anything the config holds.
//
// One counter per config, not per resource: a request of a gate uses its
// store, its facilitator and whatever wallet_auth in front of it holds, and
// one Enter covers them all.
package inflight

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
)

// Config counts the requests in flight in one loaded Caddy config and
// holds the cleanups waiting for them.
type Config struct {
	// n is one for the config itself until it is unloaded (the first
	// AfterRequests after its context ends), plus one per request in
	// flight. Once it reaches zero it stays there: Enter refuses.
	n atomic.Int64
	// done is the config's context's Done (nil for a context that never
	// ends, as in some tests): a Cleanup while it is open is a module
	// undoing its own failed Provision, not an unload.
	done <-chan struct{}

	mu       sync.Mutex
	unloaded bool           // the config's own count was given back
	drained  bool           // n reached zero: cleanups run at once
	waiting  []func() error // cleanups to run when n reaches zero
}

// configs holds the Config of each config being loaded or running, keyed
// by its context's Done channel: every module of one config load shares it
// (Caddy derives per-server contexts from it with values only) and each
// load has its own. The entry goes when the config is unloaded; modules
// keep their pointer.
var configs = struct {
	sync.Mutex
	m map[<-chan struct{}]*Config
}{m: map[<-chan struct{}]*Config{}}

// For returns the Config of the config ctx belongs to, for a module to
// keep from its Provision.
func For(ctx caddy.Context) *Config {
	var done <-chan struct{}
	if ctx.Context != nil { // a zero Context (a test's) has none
		done = ctx.Done()
	}
	if done == nil {
		c := &Config{}
		c.n.Store(1)
		return c
	}
	configs.Lock()
	defer configs.Unlock()
	if c := configs.m[done]; c != nil {
		return c
	}
	c := &Config{done: done}
	c.n.Store(1)
	configs.m[done] = c
	context.AfterFunc(ctx, func() {
		configs.Lock()
		delete(configs.m, done)
		configs.Unlock()
	})
	return c
}

// Enter counts a request in; it must Leave. It reports false when the
// config was unloaded and nothing of it is in flight any more: what its
// modules held may be closed, and the request must not use it (it is
// answered as if the store were down, which it is for this config). A nil
// Config (a handler built without Provision, as in tests) belongs to no
// config: it always enters.
func (c *Config) Enter() bool {
	if c == nil {
		return true
	}
	for {
		n := c.n.Load()
		if n == 0 {
			return false
		}
		if c.n.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// Leave counts a request out. The last one out of an unloaded config runs
// the cleanups that waited for it (their errors are logged: nobody else is
// left to tell).
func (c *Config) Leave() {
	if err := c.leave(); err != nil {
		caddy.Log().Error("cleaning up after the last request of an unloaded config", zap.Error(err))
	}
}

func (c *Config) leave() error {
	if c == nil || c.n.Add(-1) != 0 {
		return nil
	}
	c.mu.Lock()
	c.drained = true
	fns := c.waiting
	c.waiting = nil
	c.mu.Unlock()
	var errs []error
	for _, fn := range fns {
		errs = append(errs, runCleanup(fn))
	}
	return errors.Join(errs...)
}

// runCleanup runs fn, a panic in it made an error: the cleanups after it
// must still run (each releases something of its own), and it runs on a
// request's goroutine, which a panic there would take down.
func runCleanup(fn func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("cleanup panicked: %v", p)
		}
	}()
	return fn()
}

// AfterRequests runs fn, a module's Cleanup, once no request of the config
// is in flight: at once (returning fn's error) if none is, else when the
// last one Leaves. It never waits. Called while the config's context is
// still open it is a module undoing its own failed Provision, which no
// request can have used: fn runs at once, as it does on a nil Config (a
// module never provisioned).
func (c *Config) AfterRequests(fn func() error) error {
	if c == nil {
		return fn()
	}
	c.mu.Lock()
	if c.drained || (c.done != nil && !closed(c.done)) {
		c.mu.Unlock()
		return fn()
	}
	c.waiting = append(c.waiting, fn)
	first := !c.unloaded
	c.unloaded = true
	c.mu.Unlock()
	if first {
		// The config's own count: with nothing in flight this runs fn
		// (the only one waiting) now, and returns its error.
		return c.leave()
	}
	return nil
}

func closed(done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// Holds keeps what a module holds (a store's handle) open past the
// config's requests for users that outlive them: a facilitator's sends
// and the drops of their records run until the facilitator's Close, which
// the config's requests do not count. Caddy cleans up a config's modules
// in no set order, so the store module's Cleanup may come before the
// facilitator's; with a hold, its close waits for the holder's release.
// A nil Holds holds nothing.
type Holds struct {
	mu      sync.Mutex
	n       int          // holds not released
	closing func() error // the close that waits for them, set by Close
}

// Hold counts a user in until it calls release, once (later calls do
// nothing). The last release after Close runs the close that waited and
// returns its error.
func (h *Holds) Hold() (release func() error) {
	if h == nil {
		return func() error { return nil }
	}
	h.mu.Lock()
	h.n++
	h.mu.Unlock()
	var once sync.Once
	return func() (err error) {
		once.Do(func() {
			h.mu.Lock()
			h.n--
			var fn func() error
			if h.n == 0 {
				fn, h.closing = h.closing, nil
			}
			h.mu.Unlock()
			if fn != nil {
				err = runCleanup(fn)
			}
		})
		return err
	}
}

// Close runs fn, the module's close, at once (returning its error) when
// nothing holds it, else when the last hold is released.
func (h *Holds) Close(fn func() error) error {
	if h == nil {
		return fn()
	}
	h.mu.Lock()
	if h.n > 0 {
		h.closing = fn
		h.mu.Unlock()
		return nil
	}
	h.mu.Unlock()
	return fn()
}
