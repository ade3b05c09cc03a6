package caddymodule

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// slowCard serves vf's agent card after a delay, as certd over a slow
// link.
func slowCard(t *testing.T, vf *verifierFixture, delay time.Duration) *httptest.Server {
	t.Helper()
	card := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(delay)
		resp, err := testClient.Get(vf.cardURL)
		if err != nil {
			http.Error(w, "unreachable", http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.Header().Set("Content-Type", "application/json")
		io.Copy(w, resp.Body)
	}))
	t.Cleanup(card.Close)
	return card
}

// The card is read within a deadline of its own (verifier_timeout), not
// that of the call that found the keys missing: a call that gives up
// waiting (its own deadline, or its client gone) does not make the card's
// read fail, and the next call, within the second reads are spaced by, is
// given the keys, not the first call's deadline error.
func TestCardReadOutlivesTheCallThatStartedIt(t *testing.T) {
	buildBinaries(t)
	vf := startVerifier(t)
	// The card takes 3s, far past the call's 50ms and the 1s it is allowed
	// on a loaded machine, well within the read's own 10s.
	card := slowCard(t, vf, 3*time.Second)
	k := newReceiptKeys(card.URL+"/.well-known/agent-card.json", testClient, 10*time.Second, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := k.refresh(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a call with 50ms left, card taking 3s: %v", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("the call waited %v, past its own deadline", took)
	}
	ks, err := k.refresh(context.Background())
	if err != nil || ks.Len() == 0 {
		t.Fatalf("the next call, at once: %v (%d keys); want the card's keys, not the first call's deadline", err, ks.Len())
	}
}

// Through Caddy: a call whose verification took most of verifier_timeout
// finds the keys missing and gives up at its own deadline while the card
// (300ms away) is read; a call a moment later, with its own deadline
// ahead, is verified with the keys that read brought.
func TestSlowCallDoesNotFailTheCardForOthers(t *testing.T) {
	buildBinaries(t)
	vf := startVerifier(t)
	agent := startAgent(t)
	card := slowCard(t, vf, 300*time.Millisecond)
	// verifierd taking 1.8s on the answers of task "slow-…", fast on the rest.
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if bytes.Contains(b, []byte(`"task_id":"slow-`)) {
			time.Sleep(1800 * time.Millisecond)
		}
		req, _ := http.NewRequest(r.Method, vf.srv.URL+r.URL.Path, bytes.NewReader(b))
		req.Header = r.Header.Clone()
		resp, err := testClient.Do(req)
		if err != nil {
			http.Error(w, "unreachable", http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, resp.Body)
	}))
	t.Cleanup(slow.Close)
	opts := "verifier_timeout 2s\n\t\t\tcard_url " + card.URL + "/.well-known/agent-card.json"
	base := startCaddy(t, ":{port} {"+strings.Replace(sellerRoute("/s", agent, &verifierFixture{srv: slow}, opts),
		`task_id "invoice-{http.request.uuid}"`, `task_id "{http.request.header.X-Kind}-{http.request.uuid}"`, 1)+"}")
	type result struct {
		status int
		took   time.Duration
	}
	done := make(chan result, 1)
	go func() {
		start := time.Now()
		resp, _ := getBody(t, base+"/s/invoices/INV-7731", map[string]string{"X-Kind": "slow"})
		done <- result{resp.StatusCode, time.Since(start)}
	}()
	time.Sleep(2100 * time.Millisecond)
	resp, body := getBody(t, base+"/s/invoices/INV-7731", map[string]string{"X-Kind": "fast"})
	a := <-done
	// A 503 is the call giving up at its deadline: had it waited for the
	// card, it would have been verified (200). The bound only tells a
	// wait on some longer timeout, far past any slowness of a loaded machine.
	if a.status != http.StatusServiceUnavailable || a.took > 10*time.Second {
		t.Errorf("the slow call: status %d after %v; want 503 at its 2s deadline", a.status, a.took)
	}
	if resp.StatusCode != 200 || resp.Header.Get(HeaderVerificationStatus) != "pass" {
		t.Errorf("the next call (fast verification, healthy card, its own 2s): status %d: %.200s", resp.StatusCode, body)
	}
}
