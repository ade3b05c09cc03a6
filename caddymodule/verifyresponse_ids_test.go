package caddymodule

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/aovhq/aov/apierr"
)

// The task_id and agent_id verify_response sends come from templates a
// client fills (a query parameter, a header). One verifierd refuses (over
// 200 characters) or that cannot be sent as it is (not UTF-8: JSON would
// carry U+FFFD, and the receipt would name another id than the one it is
// checked against) is refused with 400 before the upstream runs, naming the
// field and not the value, and the free unit is given back. An id of any
// UTF-8 text within the limit is sent, and its receipt is attached.
func TestVerifyResponseRefusesAnIDVerifierdWouldNotRecord(t *testing.T) {
	buildBinaries(t)
	vf := startVerifier(t)
	up := newUpstream(t)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /q/* {
		x402 {
			accept base $0.02 0x1111111111111111111111111111111111111111
			facilitator http {
				url http://127.0.0.1:1
			}
			store badger %s
			free_allowance {
				per_day 3
			}
		}
		verify_response {
			schema `+"`"+`{"type":"object"}`+"`"+`
			task_id "t-{http.request.uri.query.t}"
			agent_id "{http.request.header.X-Agent}"
			verifier_url %s
			verifier_token %s
		}
		reverse_proxy %s
	}
}`, t.TempDir(), vf.srv.URL, verifierToken, strings.TrimPrefix(up.URL, "http://")))

	long := strings.Repeat("x", 199) // "t-" + 199: 201 characters
	for _, c := range []struct {
		desc, query, agent, field, value string
	}{
		{"a task_id that is not UTF-8", "?t=%ff%fe", "seller-7", "task_id", "\xff\xfe"},
		{"a task_id over 200 characters", "?t=" + long, "seller-7", "task_id", long},
		{"an agent_id over 200 characters", "?t=abc", long + "yy", "agent_id", long},
	} {
		t.Run(c.desc, func(t *testing.T) {
			calls := up.calls.Load()
			resp, body := getBody(t, base+"/q/x"+c.query, map[string]string{"X-Agent": c.agent})
			if resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("status %d, want 400: %.300s", resp.StatusCode, body)
			}
			var e apierr.Error
			if err := json.Unmarshal(body, &e); err != nil {
				t.Fatalf("not the error shape: %v: %.300s", err, body)
			}
			if e.Code != apierr.CodeInvalidRequest || e.Charged || e.Retryable || len(e.Fields) != 1 || e.Fields[0].Field != c.field {
				t.Fatalf("refusal %+v, want invalid_request naming %s, uncharged, not retryable", e, c.field)
			}
			if strings.Contains(string(body), c.value) {
				t.Fatalf("the refusal echoes the value: %.300s", body)
			}
			if n := up.calls.Load() - calls; n != 0 {
				t.Fatalf("the upstream ran %d times for a call that can never be verified", n)
			}
		})
	}

	// Non-ASCII text and characters JSON escapes are ids like any other:
	// the receipt is about exactly the id sent. The refused calls took no
	// free unit: this is the first of three.
	resp, body := getBody(t, base+"/q/x?t=%C3%A9%3C%26", map[string]string{"X-Agent": "agent-é"})
	if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderVerificationStatus) != "pass" {
		t.Fatalf("a valid id: status %d, verification %q: %.300s", resp.StatusCode, resp.Header.Get(HeaderVerificationStatus), body)
	}
	var rc struct {
		TaskID  string `json:"task_id"`
		AgentID string `json:"agent_id"`
	}
	if err := json.Unmarshal(headerReceipt(t, resp, HeaderVerificationReceipt), &rc); err != nil || rc.TaskID != "t-é<&" || rc.AgentID != "agent-é" {
		t.Fatalf("receipt ids %q %q (%v)", rc.TaskID, rc.AgentID, err)
	}
	if got := resp.Header.Get(HeaderFreeRemaining); got != "2" {
		t.Fatalf("free calls remaining %q, want 2: a refused call kept its unit", got)
	}
}
