package signer

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aovhq/aov/keystore"
)

// recordingHandler keeps every log record.
type recordingHandler struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *recordingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.records = append(h.records, r.Clone())
	h.mu.Unlock()
	return nil
}
func (h *recordingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordingHandler) WithGroup(string) slog.Handler      { return h }

// lines reports the messages logged, each with its "refused" count.
func (h *recordingHandler) lines() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, r := range h.records {
		line := r.Message
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "refused" {
				line += " refused=" + a.Value.String()
			}
			return true
		})
		out = append(out, line)
	}
	return out
}

// On the loopback TCP listener any local process can send requests
// without the secret; each is refused, but the log gets the first and
// then at most one line per refusalLogEvery, counting the refusals it
// stands for, so nobody without the secret can fill certd's log.
func TestRequestsWithoutTheSecretAreLoggedAtMostOncePerInterval(t *testing.T) {
	const secret = "s3cret-s3cret-s3cret"
	dir := filepath.Join(shortDir(t), "keys")
	op, err := keystore.Open(dir, keystore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := op.Generate(); err != nil {
		t.Fatal(err)
	}
	keys, err := keystore.Open(dir, keystore.Options{Watch: true, CurrentOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { keys.Close() })
	var (
		clockMu sync.Mutex
		now     = time.Now()
	)
	clock := func() time.Time { clockMu.Lock(); defer clockMu.Unlock(); return now }
	h := &recordingHandler{}
	srv, err := NewServer(ServerConfig{Keys: keys, Secret: secret, Logger: slog.New(h), Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := ListenTCP("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 5 * time.Second}
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })
	refuse := func(n int) {
		for range n {
			resp, err := http.Post("http://"+ln.Addr().String()+PathSign, "application/json", strings.NewReader("{}"))
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Fatalf("status %d", resp.StatusCode)
			}
		}
	}
	const msg = "signing request refused: missing or wrong bearer secret"
	refuse(200)
	if got := h.lines(); len(got) != 1 || got[0] != msg+" refused=1" {
		t.Fatalf("200 requests without the secret logged %d lines %q; want the first alone", len(got), got)
	}
	clockMu.Lock()
	now = now.Add(refusalLogEvery)
	clockMu.Unlock()
	refuse(1)
	if got := h.lines(); len(got) != 2 || got[1] != msg+" refused=200" {
		t.Fatalf("a refusal %s later logged %q; want one more line counting the 199 refused since and this one", refusalLogEvery, got)
	}
}
