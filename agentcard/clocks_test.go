package agentcard

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/keystore"
	"github.com/aovhq/aov/receipt"
	"github.com/aovhq/aov/signer"
)

// certdOnClock is certd's two endpoints on dir, as certdEndpoints, with
// certd's clock c (the key store's and the signing handler's) and a log.
func certdOnClock(t *testing.T, dir string, c *clock) (sign http.Handler, card *Handler, log *bytes.Buffer) {
	t.Helper()
	keys, err := keystore.Open(dir, keystore.Options{Watch: true, CurrentOnly: true, Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { keys.Close() })
	log = new(bytes.Buffer)
	logger := slog.New(slog.NewJSONHandler(log, nil))
	srv, err := signer.NewServer(signer.ServerConfig{Keys: keys, Now: c.Now, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	h, err := NewHandler(cfg, keys, 0, logger)
	if err != nil {
		t.Fatal(err)
	}
	return srv, h, log
}

// wantSigned has certd sign with kv at attestedAt and checks the receipt
// verifies against certd's own card, as `aov receipt verify` does.
func wantSigned(t *testing.T, srv http.Handler, card http.Handler, kv string, attestedAt time.Time) {
	t.Helper()
	code, body, full := signAt(t, srv, kv, attestedAt)
	if code != http.StatusOK {
		t.Fatalf("signing with %s dated %s: %d %s", kv, attestedAt.Format(time.RFC3339Nano), code, body)
	}
	if err := receipt.VerifyReceipt(full, servedKeys(t, card), receipt.ContextVerify); err != nil {
		t.Fatalf("certd signed with %s a receipt dated %s that its own card refuses: %v", kv, attestedAt.Format(time.RFC3339Nano), err)
	}
}

// wantStale checks certd answers 409 naming current to a request for kv.
func wantStale(t *testing.T, srv http.Handler, kv, current string, at time.Time) {
	t.Helper()
	code, body, _ := signAt(t, srv, kv, at)
	if code != http.StatusConflict || !bytes.Contains(body, []byte(`"current_key_version":"`+current+`"`)) {
		t.Fatalf("signing with %s: %d %s; want 409 naming %s", kv, code, body, current)
	}
}

// A rotation run on a clock 10 min ahead of certd's (another host on a
// shared key directory) publishes k2 created in certd's future. certd goes
// on signing with k1 until k1's retired_at arrives by its clock (a request
// for k2 gets 409 naming k1), then with k2. Every receipt, dated anywhere
// within certd's skew of its clock, verifies against certd's card.
func TestARotationOnAClockAheadSignsOnlyReceiptsTheCardAccepts(t *testing.T) {
	dir := t.TempDir()
	certdClock := &clock{t: time.Now().UTC()}
	operator := &clock{t: certdClock.t.Add(-time.Hour)}
	ks, err := keystore.Open(dir, keystore.Options{Now: operator.Now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ks.Generate(); err != nil {
		t.Fatal(err)
	}
	srv, card, _ := certdOnClock(t, dir, certdClock)
	operator.t = certdClock.t.Add(10 * time.Minute)
	if _, err := ks.Rotate(); err != nil {
		t.Fatal(err)
	}
	skew := signer.DefaultMaxSkew - time.Millisecond // as far as a receipt's microseconds allow
	wantStale(t, srv, "k2", "k1", certdClock.t)
	wantSigned(t, srv, card, "k1", certdClock.t)
	// Just before k1's retirement by certd's clock, dated as late as
	// certd allows.
	certdClock.t = operator.t.Add(-time.Microsecond)
	wantSigned(t, srv, card, "k1", certdClock.t.Add(skew))
	// From k2's created_at by certd's clock, dated as early as it allows.
	certdClock.t = operator.t
	wantStale(t, srv, "k1", "k2", certdClock.t)
	wantSigned(t, srv, card, "k2", certdClock.t.Add(-skew))
}

// A rotation run on a clock 10 min behind certd's retires k1 10 min in
// certd's past, before receipts it already delivered. certd refuses that
// index: it signs nothing, the card keeps the history that verifies them,
// and the log names the clock difference once.
func TestARotationOnAClockBehindKeepsDeliveredReceiptsVerifying(t *testing.T) {
	dir := t.TempDir()
	certdClock := &clock{t: time.Now().UTC()}
	operator := &clock{t: certdClock.t.Add(-time.Hour)}
	ks, err := keystore.Open(dir, keystore.Options{Now: operator.Now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ks.Generate(); err != nil {
		t.Fatal(err)
	}
	srv, card, log := certdOnClock(t, dir, certdClock)
	code, _, delivered := signAt(t, srv, "k1", certdClock.t)
	if code != http.StatusOK {
		t.Fatalf("sign k1: %d", code)
	}
	operator.t = certdClock.t.Add(-10 * time.Minute)
	if _, err := ks.Rotate(); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := receipt.VerifyReceipt(delivered, servedKeys(t, card), receipt.ContextVerify); err != nil {
			t.Fatalf("a k1 receipt delivered before the rotation no longer verifies against the card: %v", err)
		}
	}
	for _, kv := range []string{"k1", "k2"} {
		if code, body, _ := signAt(t, srv, kv, certdClock.t); code != http.StatusServiceUnavailable {
			t.Fatalf("signing with %s after a retirement before a delivered receipt: %d %s; want 503", kv, code, body)
		}
	}
	if n := strings.Count(log.String(), "10m0s before the newest receipt"); n != 1 {
		t.Fatalf("the log names the refused retirement %d times, want once:\n%s", n, log)
	}
}

// A compromise of k1 marked on a clock 10 min ahead retires k1 and creates
// k2 in certd's future: no key is in service by certd's clock. certd
// signs nothing (503) but serves the card with the mark, and signs with k2
// from its created_at on.
func TestNoKeyInServiceByCertdsClockSignsNothingUntilOneIs(t *testing.T) {
	dir := t.TempDir()
	certdClock := &clock{t: time.Now().UTC()}
	operator := &clock{t: certdClock.t.Add(-time.Hour)}
	ks, err := keystore.Open(dir, keystore.Options{Now: operator.Now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ks.Generate(); err != nil {
		t.Fatal(err)
	}
	srv, card, log := certdOnClock(t, dir, certdClock)
	operator.t = certdClock.t.Add(10 * time.Minute)
	if _, err := ks.MarkCompromised("k1", certdClock.t.Add(-time.Minute)); err != nil {
		t.Fatal(err)
	}
	for _, kv := range []string{"k1", "k2"} {
		if code, body, _ := signAt(t, srv, kv, certdClock.t); code != http.StatusServiceUnavailable {
			t.Fatalf("signing with %s while no key is in service: %d %s; want 503", kv, code, body)
		}
	}
	if keys := servedKeys(t, card); !strings.Contains(log.String(), "10m0s ahead of this clock") {
		t.Fatalf("the log does not name the clock difference (card keys %v):\n%s", keys, log)
	}
	certdClock.t = operator.t
	wantSigned(t, srv, card, "k2", certdClock.t)
}

// While certd signs nothing because its key directory does not load (here
// a key file newer than the index at start), anonymous card requests do
// not each reload it and log an error: the cause is logged once, the
// reload retried at most once per keystore.RetryEvery, and the recovery logged once.
func TestCardRequestsWhileNotSigningLogOnce(t *testing.T) {
	dir := t.TempDir()
	operator := &clock{t: time.Now().UTC().Add(-time.Hour)}
	ks, err := keystore.Open(dir, keystore.Options{Now: operator.Now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ks.Generate(); err != nil {
		t.Fatal(err)
	}
	stray := filepath.Join(dir, "k2.key")
	if err := os.WriteFile(stray, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, card, log := certdOnClock(t, dir, &clock{t: time.Now().UTC()})
	for range 1000 {
		servedKeys(t, card)
	}
	if n := strings.Count(log.String(), `"level":"ERROR"`); n != 1 {
		t.Fatalf("1000 card requests while not signing wrote %d ERROR lines (%d bytes of log), want 1", n, log.Len())
	}
	if err := os.Rename(stray, filepath.Join(t.TempDir(), "k2.key")); err != nil {
		t.Fatal(err)
	}
	servedKeys(t, card) // within keystore.RetryEvery of the last retry: not retried
	if strings.Contains(log.String(), "signing again") {
		t.Fatal("the card retried the reload within keystore.RetryEvery")
	}
	time.Sleep(keystore.RetryEvery)
	for range 3 {
		servedKeys(t, card)
	}
	if n := strings.Count(log.String(), "signing again"); n != 1 {
		t.Fatalf("recovery logged %d times, want once:\n%s", n, log)
	}
}

// After a rotation on a clock 10 min ahead of certd's, certd signs with k1
// until k1's retired_at by its clock: the card says so (k1 current, k2
// pending, currentKeyVersion k1), and is rebuilt, with a new ETag, at the
// instant the switch comes (k1 retired, k2 current).
func TestCardNamesAsCurrentTheKeyCertdSignsWith(t *testing.T) {
	dir := t.TempDir()
	certdClock := &clock{t: time.Now().UTC().Truncate(time.Microsecond)}
	operator := &clock{t: certdClock.t.Add(-time.Hour)}
	ks, err := keystore.Open(dir, keystore.Options{Now: operator.Now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ks.Generate(); err != nil {
		t.Fatal(err)
	}
	srv, card, _ := certdOnClock(t, dir, certdClock)
	operator.t = certdClock.t.Add(10 * time.Minute)
	if _, err := ks.Rotate(); err != nil {
		t.Fatal(err)
	}
	statuses := func() (string, string) {
		rec := httptest.NewRecorder()
		card.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/.well-known/agent-card.json", nil))
		var c Card
		if err := json.Unmarshal(rec.Body.Bytes(), &c); err != nil {
			t.Fatal(err)
		}
		p := c.Capabilities.Extensions[0].Params
		var s []string
		for _, k := range p.PublicKeys {
			s = append(s, k.KeyVersion+":"+k.Status)
		}
		return p.CurrentKeyVersion + " " + strings.Join(s, ","), rec.Header().Get("ETag")
	}

	wantSigned(t, srv, card, "k1", certdClock.t)
	before, etag := statuses()
	if before != "k1 k1:current,k2:pending" {
		t.Fatalf("certd signs with k1; its card says %q, want %q", before, "k1 k1:current,k2:pending")
	}
	certdClock.t = operator.t.Add(-time.Microsecond) // the last instant of k1's window
	if got, _ := statuses(); got != before {
		t.Fatalf("before the switch the card says %q", got)
	}
	certdClock.t = operator.t
	wantSigned(t, srv, card, "k2", certdClock.t)
	after, etag2 := statuses()
	if after != "k2 k1:retired,k2:current" || etag2 == etag {
		t.Fatalf("at the switch the card says %q (ETag %s, before %s), want %q with a new ETag", after, etag2, etag, "k2 k1:retired,k2:current")
	}
}

// certd's wall clock stepped back behind a retirement (an NTP step): k1's
// window holds the clock again, but certd forgot k1's private key when k1
// retired, so it signs nothing (503, never k2 dated before k2 existed),
// and its card names no current key, until a reload loads k1 again, or
// its clock passes k1's retired_at.
func TestAClockSteppedBackBehindARetirementSignsNothingUntilReloadOrItsTime(t *testing.T) {
	dir := t.TempDir()
	c := &clock{t: time.Now().UTC().Truncate(time.Microsecond).Add(-time.Hour)}
	ks, err := keystore.Open(dir, keystore.Options{Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ks.Generate(); err != nil {
		t.Fatal(err)
	}
	keys, err := keystore.Open(dir, keystore.Options{Watch: true, CurrentOnly: true, Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { keys.Close() })
	log := new(bytes.Buffer)
	srv, err := signer.NewServer(signer.ServerConfig{Keys: keys, Now: c.Now, Logger: slog.New(slog.NewJSONHandler(log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	card, err := NewHandler(cfg, keys, 0, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	c.t = c.t.Add(time.Minute)
	k2, err := ks.Rotate()
	if err != nil {
		t.Fatal(err)
	}
	c.t = c.t.Add(time.Second)
	wantSigned(t, srv, card, "k2", c.t)

	c.t = k2.CreatedAt.Add(-30 * time.Second) // the step back
	for _, kv := range []string{"k1", "k2"} {
		if code, body, _ := signAt(t, srv, kv, c.t); code != http.StatusServiceUnavailable {
			t.Fatalf("signing %s after the step back: %d %s; want 503", kv, code, body)
		}
	}
	if !strings.Contains(log.String(), "private key was not loaded (the clock went back)") {
		t.Errorf("the log does not say why nothing is signed: %s", log)
	}
	if cur := servedKeys(t, card).Current(); cur != "" {
		t.Errorf("the card names %s as currentKeyVersion while certd signs nothing", cur)
	}
	if err := keys.Reload(); err != nil { // SIGHUP
		t.Fatal(err)
	}
	wantSigned(t, srv, card, "k1", c.t)
	c.t = k2.CreatedAt
	wantSigned(t, srv, card, "k2", c.t)
}
