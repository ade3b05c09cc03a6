package server_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/aovhq/aov/receipt"
	"github.com/aovhq/aov/verify"
)

// Bodies and responses live in reused buffers. Concurrent verifications of
// different requests, with refusals in between (whose buffers go back to
// the pool early), must each answer about their own request: the receipt
// verifies, its hashes are those of the body sent, and its result is that
// body's.
func TestReusedBuffersKeepRequestsApart(t *testing.T) {
	for _, local := range []bool{false, true} {
		t.Run(fmt.Sprintf("inprocess=%v", local), func(t *testing.T) {
			f := newFixture(t, fixtureOpts{noSync: true, localSigner: local})
			keys := f.keySet(t)
			var wg sync.WaitGroup
			for g := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range 6 {
						total, want := "135.0", "fail"
						if (g+i)%2 == 0 {
							total, want = "129.5", "pass"
						}
						agent := fmt.Sprintf(`"seller-%d-%d"`, g, i)
						body := bytes.Replace(invoice(total, ""), []byte(`"seller-7"`), []byte(agent), 1)
						if i%3 == 0 { // a refusal first, on the same goroutine
							if w := f.do(http.MethodPost, "/verify/schema", body[:len(body)/2], nil); w.Code != http.StatusUnprocessableEntity {
								t.Errorf("truncated body: status %d", w.Code)
							}
						}
						w := f.do(http.MethodPost, "/verify/schema", body, nil)
						if w.Code != http.StatusOK {
							t.Errorf("status %d: %s", w.Code, w.Body)
							return
						}
						if err := receipt.VerifyReceipt(w.Body.Bytes(), keys, receipt.ContextVerify); err != nil {
							t.Errorf("receipt does not verify: %v", err)
						}
						hashes, err := verify.ComputeHashes(body)
						if err != nil {
							t.Error(err)
							return
						}
						if err := receipt.CheckHashes(w.Body.Bytes(), hashes); err != nil {
							t.Errorf("hashes: %v", err)
						}
						var doc struct {
							Result  string `json:"result"`
							AgentID string `json:"agent_id"`
						}
						if err := json.Unmarshal(w.Body.Bytes(), &doc); err != nil || doc.Result != want || `"`+doc.AgentID+`"` != agent {
							t.Errorf("answer is about %q/%q, want %s/%s (%v)", doc.AgentID, doc.Result, agent, want, err)
						}
					}
				}()
			}
			wg.Wait()
		})
	}
}

// The access log has one line per request with the same fields as before
// it was written without Logger.LogAttrs: the handler's time, level and
// message, then method, route, status, duration_ms and remote, and for a
// verification its id, result and payment.
func TestAccessLogLine(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	f.do(http.MethodPost, "/verify/schema", invoice("135.0", ""), nil)
	f.do(http.MethodGet, "/nope", nil, nil)
	var lines []map[string]any
	for _, l := range bytes.Split(bytes.TrimSpace([]byte(f.logs.String())), []byte("\n")) {
		var m map[string]any
		if err := json.Unmarshal(l, &m); err != nil {
			t.Fatalf("log line is not JSON: %v: %s", err, l)
		}
		if m["msg"] == "request" {
			lines = append(lines, m)
		}
	}
	if len(lines) != 2 {
		t.Fatalf("%d access log lines, want 2: %v", len(lines), lines)
	}
	want := [][]string{
		{"time", "level", "msg", "method", "route", "status", "duration_ms", "remote", "verification_id", "result", "payment"},
		{"time", "level", "msg", "method", "route", "status", "duration_ms", "remote"},
	}
	for i, l := range lines {
		if len(l) != len(want[i]) {
			t.Errorf("line %d has fields %v, want %v", i, l, want[i])
		}
		for _, k := range want[i] {
			if _, ok := l[k]; !ok {
				t.Errorf("line %d lacks %s: %v", i, k, l)
			}
		}
	}
	if l := lines[0]; l["level"] != "INFO" || l["method"] != "POST" || l["route"] != "verify_schema" || l["status"] != 200.0 || l["result"] != "fail" {
		t.Errorf("verification line %v", l)
	}
	if l := lines[1]; l["route"] != "unknown" || l["status"] != 404.0 {
		t.Errorf("404 line %v", l)
	}
}
