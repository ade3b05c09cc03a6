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

const refusedMsg = "signing request refused: missing or wrong bearer secret"

// refusingServer serves a signing handler with a secret on loopback TCP,
// with clock as its clock and its log to h, and reports its address.
func refusingServer(t *testing.T, clock func() time.Time, h *recordingHandler) string {
	t.Helper()
	dir := filepath.Join(shortDir(t), "keys")
	op, err := keystore.Open(dir, keystore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := op.Generate(); err != nil {
		t.Fatal(err)
	}
	keys, err := keystore.OpenSigner(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { keys.Close() })
	srv, err := NewServer(ServerConfig{Keys: keys, Secret: "s3cret-s3cret-s3cret", Logger: slog.New(h), Now: clock})
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
	return ln.Addr().String()
}

// refuseOne sends a signing request without the secret and reports the
// status it got (0 when it got none).
func refuseOne(addr string) int {
	resp, err := http.Post("http://"+addr+PathSign, "application/json", strings.NewReader("{}"))
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// On the loopback TCP listener any local process can send requests
// without the secret; each is refused, but the log gets the first and
// then at most one line per refusalLogEvery, counting the refusals it
// stands for, so nobody without the secret can fill certd's log.
func TestRequestsWithoutTheSecretAreLoggedAtMostOncePerInterval(t *testing.T) {
	var (
		clockMu sync.Mutex
		now     = time.Now()
	)
	clock := func() time.Time { clockMu.Lock(); defer clockMu.Unlock(); return now }
	h := &recordingHandler{}
	addr := refusingServer(t, clock, h)
	refuse := func(n int) {
		for range n {
			if code := refuseOne(addr); code != http.StatusUnauthorized {
				t.Fatalf("status %d", code)
			}
		}
	}
	refuse(200)
	if got := h.lines(); len(got) != 1 || got[0] != refusedMsg+" refused=1" {
		t.Fatalf("200 requests without the secret logged %d lines %q; want the first alone", len(got), got)
	}
	clockMu.Lock()
	now = now.Add(refusalLogEvery)
	clockMu.Unlock()
	refuse(1)
	if got := h.lines(); len(got) != 2 || got[1] != refusedMsg+" refused=200" {
		t.Fatalf("a refusal %s later logged %q; want one more line counting the 199 refused since and this one", refusalLogEvery, got)
	}
}

// A refusal that read the clock just before another, and reaches the
// limiter after it (preempted in between), is not "the clock went back":
// two refusals a millisecond apart make one line. The clock below is
// scripted: the first reading (A) is held until a line is logged, or half
// a second if none can be while A reads, and then answers t0; B, sent
// while A is held, reads t0+1ms.
func TestARefusalPreemptedBeforeTheLimiterIsNotLoggedAgain(t *testing.T) {
	t0 := time.Now()
	h := &recordingHandler{}
	var mu sync.Mutex
	readings := 0
	held := make(chan struct{})
	clock := func() time.Time {
		mu.Lock()
		readings++
		first := readings == 1
		mu.Unlock()
		if !first {
			return t0.Add(time.Millisecond)
		}
		close(held)
		for deadline := time.Now().Add(500 * time.Millisecond); len(h.lines()) == 0 && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		return t0
	}
	addr := refusingServer(t, clock, h)
	a := make(chan int)
	go func() { a <- refuseOne(addr) }()
	<-held
	if code := refuseOne(addr); code != http.StatusUnauthorized {
		t.Fatalf("B: status %d", code)
	}
	if code := <-a; code != http.StatusUnauthorized {
		t.Fatalf("A: status %d", code)
	}
	if got := h.lines(); len(got) != 1 || got[0] != refusedMsg+" refused=1" {
		t.Errorf("two refusals 1 ms apart logged %q; want one line, the first", got)
	}
}
