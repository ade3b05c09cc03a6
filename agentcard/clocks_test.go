package agentcard

import (
	"bytes"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/keystore"
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

// While certd signs nothing because its key directory does not load (here
// a key file newer than the index at start), anonymous card requests do
// not each reload it and log an error: the cause is logged once, the
// reload retried at most once per RetryEvery, and the recovery logged once.
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
	servedKeys(t, card) // within RetryEvery of the last retry: not retried
	if strings.Contains(log.String(), "signing again") {
		t.Fatal("the card retried the reload within RetryEvery")
	}
	time.Sleep(RetryEvery)
	for range 3 {
		servedKeys(t, card)
	}
	if n := strings.Count(log.String(), "signing again"); n != 1 {
		t.Fatalf("recovery logged %d times, want once:\n%s", n, log)
	}
}
