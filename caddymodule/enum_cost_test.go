package caddymodule

import (
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/aovhq/aov/internal/signflip"
)

// signFlipEnumRequest is a verification whose draft-04 schema enumerates
// signflip.Square(n). The draft-04 metaschema says "enum": {"uniqueItems":
// true}, and the schema compiler's hash ignores the sign of numbers, so it
// compares every pair of members deeply.
func signFlipEnumRequest(n int) string {
	return `{"task_id":"t","expected_schema":{"$schema":"http://json-schema.org/draft-04/schema#","enum":` + signflip.Square(n) + `},"submitted_output":1}`
}

// The gate compiles a request's schema to tell 422 from 402, unpaid: 300
// such members (181 KB) cost it 3 s of CPU and 1 GB of allocation, 200 (80
// KB) about 300 MB. The enum is now refused for the work of its duplicate
// check before the compiler makes it.
func TestUnpaidEnumCostlyToDeduplicateIsRefusedCheaply(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 5, ""))
	body := signFlipEnumRequest(200)
	var status int
	var answer []byte
	c := measure(t, func() {
		resp := post(t, base+"/verify/schema", body, nil)
		status = resp.StatusCode
		answer, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
	})
	t.Logf("%d bytes, status %d, CPU %v, allocated %d MiB, peak heap +%d MiB", len(body), status, c.cpu, c.allocated>>20, c.peakHeap>>20)
	if c.allocated > 64<<20 {
		t.Errorf("the gate allocated %d MiB for one unpaid %d-byte request", c.allocated>>20, len(body))
	}
	var e struct {
		Code   string `json:"code"`
		Fields []struct {
			Field string `json:"field"`
		} `json:"fields"`
	}
	if err := json.Unmarshal(answer, &e); status != http.StatusUnprocessableEntity || err != nil ||
		e.Code != "invalid_request" || len(e.Fields) != 1 || e.Fields[0].Field != "expected_schema/enum" {
		t.Errorf("status %d, %.300s; want 422 invalid_request naming expected_schema/enum", status, answer)
	}
	if up.calls.Load() != 0 {
		t.Errorf("the upstream ran %d times", up.calls.Load())
	}
}
