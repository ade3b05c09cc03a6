package caddymodule

import (
	"context"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// stalledUpstream is an upstream whose calls, while stall is set, wait
// until the test lets them go: entered says one has arrived.
type stalledUpstream struct {
	*upstream
	stall   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func newStalledUpstream(t *testing.T) *stalledUpstream {
	s := &stalledUpstream{upstream: newUpstream(t), entered: make(chan struct{}, 1), release: make(chan struct{})}
	s.during = func() {
		if s.stall.Load() {
			s.entered <- struct{}{}
			<-s.release
		}
	}
	return s
}

// inFlight sends a call whose upstream stalls and returns once the
// upstream holds it: the gate has reserved its free unit (or verified its
// payment) and waits for the answer. The answer comes on the channel after
// the test closes release.
func (s *stalledUpstream) inFlight(t *testing.T, url string, hdr map[string]string) <-chan *http.Response {
	t.Helper()
	s.stall.Store(true)
	done := make(chan *http.Response, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(validRequest))
		req.Header.Set("Content-Type", "application/json")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := testClient.Do(req)
		if err != nil {
			t.Errorf("call in flight: %v", err)
			done <- nil
			return
		}
		done <- resp
	}()
	select {
	case <-s.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the call never reached the upstream")
	}
	s.stall.Store(false)
	return done
}

// answer waits for a call's answer; the client's own timeout bounds it.
func answer(t *testing.T, done <-chan *http.Response) *http.Response {
	t.Helper()
	resp := <-done
	if resp == nil {
		t.FailNow()
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// withStore is gateSite on the store in dir with the badger options opts
// (a Caddyfile block, or "").
func withStore(site, dir, opts string) string {
	return strings.ReplaceAll(site, "store badger {data}/gate", "store badger "+filepath.Join(dir, "gate")+" "+opts)
}

// TestReloadKeepsTheStoreOfCallsInFlight: a reload that changes the
// store's settings cleans up the old config while its calls still run
// (Caddy stops the old servers without waiting for them). Those calls keep
// the old config's store until they finish: a free call in flight is
// counted, a paid call in flight settles and delivers. The old store is
// closed once the last of them is done, and the new config's calls use
// the new store.
func TestReloadKeepsTheStoreOfCallsInFlight(t *testing.T) {
	_, fac := sharedDevnet(t)
	flush := "{\n\t\t\t\tallowance_flush 1h\n\t\t\t}"

	t.Run("allowance_flush", func(t *testing.T) {
		up := newStalledUpstream(t)
		dir := t.TempDir()
		site := gateSite(up.URL, fac, 1, "")
		base := startCaddy(t, withStore(site, dir, flush))
		url := base + "/verify/schema"
		port, _ := strconv.Atoi(base[strings.LastIndex(base, ":")+1:])

		done := up.inFlight(t, url, nil)
		loadCaddy(t, port, withStore(site, dir, ""))
		close(up.release)
		if resp := answer(t, done); resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderFreeRemaining) != "0" {
			t.Fatalf("free call in flight across the reload: %d, remaining %q", resp.StatusCode, resp.Header.Get(HeaderFreeRemaining))
		}
		// The unit stays reserved in memory for a while whether or not
		// the commit took: only the folder, reopened after a clean stop,
		// tells whether the call was counted.
		if err := caddy.Stop(); err != nil {
			t.Fatal(err)
		}
		db := openClosed(t, filepath.Join(dir, "gate"))
		rem, err := db.Allowance().Remaining(context.Background(), "verify", "ip:127.0.0.1", time.Now(), 1)
		if err != nil || rem != 0 {
			t.Fatalf("after the reload: %d remaining (%v), want 0: the free call in flight was not counted", rem, err)
		}
	})

	t.Run("path", func(t *testing.T) {
		up := newStalledUpstream(t)
		oldDir, newDir := t.TempDir(), t.TempDir()
		site := gateSite(up.URL, fac, 1, "")
		base := startCaddy(t, withStore(site, oldDir, ""))
		url := base + "/verify/schema"
		port, _ := strconv.Atoi(base[strings.LastIndex(base, ":")+1:])

		free := up.inFlight(t, url, nil)
		pr := paymentRequired(t, post(t, url, "", nil))
		paid := up.inFlight(t, url, map[string]string{x402.HeaderPaymentSignature: signFor(t, pr, 2)})
		loadCaddy(t, port, withStore(site, newDir, ""))
		// The new config's calls use the new store: its allowance is
		// fresh while the old config's calls are still running.
		if resp := post(t, url, validRequest, nil); resp.StatusCode != http.StatusOK {
			t.Fatalf("free call on the new store: %d", resp.StatusCode)
		}
		close(up.release)

		if resp := answer(t, free); resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderFreeRemaining) != "0" {
			t.Fatalf("free call in flight across the reload: %d, remaining %q", resp.StatusCode, resp.Header.Get(HeaderFreeRemaining))
		}
		resp := answer(t, paid)
		var sr x402.SettleResponse
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("paid call in flight across the reload: %d: %v", resp.StatusCode, readJSON(t, resp))
		}
		if err := x402.DecodeHeader(resp.Header.Get(x402.HeaderPaymentResponse), &sr); err != nil || !sr.Success || sr.Transaction == "" {
			t.Fatalf("paid call in flight across the reload: PAYMENT-RESPONSE %+v (%v)", sr, err)
		}
		if body := readJSON(t, resp); body["payment"] != "paid" || !strings.EqualFold(body["payer"].(string), evmfacilitator.DevAccounts()[2].Address.Hex()) {
			t.Fatalf("paid call in flight across the reload: upstream saw %v", body)
		}

		// The old store is closed after its last call: the folder opens
		// (Badger locks it while open), and holds the free call's count.
		db := openClosed(t, filepath.Join(oldDir, "gate"))
		rem, err := db.Allowance().Remaining(context.Background(), "verify", "ip:127.0.0.1", time.Now(), 1)
		if err != nil || rem != 0 {
			t.Fatalf("the old store: %d remaining (%v), want 0: the free call in flight was not counted", rem, err)
		}
	})
}

// openClosed opens the store in dir once whoever had it open has closed
// it; it fails t if that does not happen within a generous bound (the
// close runs as the last call of the old config finishes, which may be
// just after its answer reached the client).
func openClosed(t *testing.T, dir string) *store.DB {
	t.Helper()
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var db *store.DB
		if db, err = store.Open(dir, store.Options{}); err == nil {
			t.Cleanup(func() { db.Close() })
			return db
		}
	}
	t.Fatalf("the old store in %s was never closed: %v", dir, err)
	return nil
}

// Caddy's exit stops the servers, runs every Cleanup and exits the process.
// A call still in flight then (past the grace period, or on a connection
// Shutdown does not track) holds the Badger handle's close until it ends,
// which an exiting process never sees; the counts of the free calls
// completed before it (allowance_flush) are written in Cleanup all the
// same, so they are on disk when Stop returns.
func TestStopWithACallInFlightWritesTheCountsBeforeIt(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newStalledUpstream(t)
	dir := t.TempDir()
	base := startCaddy(t, withStore(gateSite(up.URL, fac, 5, ""), dir, "{\n\t\t\t\tallowance_flush 1h\n\t\t\t}"))
	url := base + "/verify/schema"
	if resp := post(t, url, validRequest, nil); resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderFreeRemaining) != "4" {
		t.Fatalf("a free call: %d, remaining %q", resp.StatusCode, resp.Header.Get(HeaderFreeRemaining))
	}
	done := up.inFlight(t, url, nil)
	if err := caddy.Stop(); err != nil {
		t.Fatal(err)
	}
	onDisk := copyStoreDir(t, filepath.Join(dir, "gate")) // what an exit now leaves
	close(up.release)
	answer(t, done)
	db, err := store.Open(onDisk, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if rem, err := db.Allowance().Remaining(context.Background(), "verify", "ip:127.0.0.1", time.Now(), 5); err != nil || rem != 4 {
		t.Fatalf("on disk when Stop returned: %d of 5 remaining (%v), want 4: the completed free call's count was not written", rem, err)
	}
}

// copyStoreDir copies a Badger folder as it is on disk now, without its
// LOCK file: what a process that exits at this instant leaves behind.
func copyStoreDir(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	err := filepath.WalkDir(src, func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() || e.Name() == "LOCK" {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Join(dst, filepath.Dir(rel)), 0o700); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}
