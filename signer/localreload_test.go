package signer

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/keystore"
	"github.com/aovhq/aov/receipt"
)

// steppedClock is a wall clock the test steps, forward or back (an NTP
// step), shared by certd's key store and the in-process signer.
type steppedClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *steppedClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

func (c *steppedClock) Step(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// After this host's clock is stepped back behind a retirement, the retired
// key is in service again by it, but the in-process signer forgot its
// private key when it retired, and the index, unchanged, gives a signature
// no reason to read it again: signing stops with the advice that a SIGHUP
// loads it. Reload (what verifierd's SIGHUP calls) loads it, and the key
// signs again. (Before: verifierd had no way to reload, and SIGHUP killed it.)
func TestLocalReloadLoadsTheKeyTheClockWentBackTo(t *testing.T) {
	keysDir := filepath.Join(shortDir(t), "keys")
	c := &steppedClock{t: time.Now().UTC()}
	certd, err := keystore.Open(keysDir, keystore.Options{Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := certd.Generate(); err != nil {
		t.Fatal(err)
	}
	l, err := newLocal(keysDir, c.Now, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	c.Step(time.Minute)
	if _, err := certd.Rotate(); err != nil {
		t.Fatal(err)
	}
	c.Step(time.Second)
	if kv, err := l.CurrentKey(ctx); err != nil || kv != "k1" {
		t.Fatalf("CurrentKey = %q, %v; want k1 (as of the last signature)", kv, err)
	}
	if err := l.Ping(ctx); err != nil {
		t.Fatalf("Ping after the rotation: %v", err)
	}
	if kv, err := l.CurrentKey(ctx); err != nil || kv != "k2" {
		t.Fatalf("CurrentKey after the rotation = %q, %v; want k2", kv, err)
	}

	c.Step(-30 * time.Second) // behind k1's retirement
	err = l.Ping(ctx)
	if apierr.From(err).Status != http.StatusServiceUnavailable || !strings.Contains(err.Error(), "SIGHUP") {
		t.Fatalf("Ping after the clock went back = %v; want a 503 advising a SIGHUP", err)
	}

	kv, versions, err := l.Reload()
	if err != nil || kv != "k1" || versions != 2 {
		t.Fatalf("Reload = %q, %d, %v; want k1 of 2 versions", kv, versions, err)
	}
	at := nowString()
	resp := sampleResponse("k1", at, 256)
	att, err := l.Sign(ctx, receipt.ContextVerify, "k1", at, resp)
	if err != nil {
		t.Fatalf("Sign after Reload: %v", err)
	}
	checkSignature(t, certd, receipt.ContextVerify, resp, att)
}
