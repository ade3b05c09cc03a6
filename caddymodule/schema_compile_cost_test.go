package caddymodule

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/aovhq/aov/internal/signflip"
)

// The gate compiles a request's schema to tell 422 from 402, unpaid, so
// everything the compiler does before it answers is work anyone can ask
// for. Each of these schemas made it do far more than its size; each is
// now refused before the compiler sees it, for a bounded allocation.
func TestUnpaidSchemasCostlyToCompileAreRefusedCheaply(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 5, ""))

	// The compiler deduplicates required before it checks that it holds
	// strings: 200 sign-flipped arrays of 200 numbers (80 KB) cost it 1 s
	// of CPU and 314 MiB.
	required := strings.Replace(signFlipEnumRequest(200), `{"$schema":"http://json-schema.org/draft-04/schema#","enum":`, `{"required":`, 1)

	// 25,000 subschemas under const, which is data, reached by a $ref
	// (664 KB): the compiler compiled them all, 4.3 s of CPU and 202 MiB,
	// and the gate answered 402.
	var hidden strings.Builder
	hidden.WriteString(`{"task_id":"t","expected_schema":{"$ref":"#/const/a","const":{"a":{"properties":{`)
	for i := range 25_000 {
		if i > 0 {
			hidden.WriteByte(',')
		}
		hidden.WriteString(`"p` + strconv.Itoa(i) + `":{"type":"string"}`)
	}
	hidden.WriteString(`}}}},"submitted_output":{}}`)

	// An enum of 110 arrays of 40 long numbers differing only in signs
	// (102 KB): each comparison parses both sides into big.Rat, and at one
	// step a number it cost 0.8 s of CPU and 446 MiB within the budget.
	num := "1.234567890123456e-300"
	longNumbers := `{"task_id":"t","expected_schema":{"$schema":"http://json-schema.org/draft-07/schema#","enum":` + signflip.Rows(num, 110, 40) + `},"submitted_output":1}`

	for _, tc := range []struct {
		name, body, field, problem string
	}{
		{"required of sign flips", required, "expected_schema/required", "checking the schema's required values for duplicates"},
		{"subschemas under const", hidden.String(), "expected_schema", "more than 5000 objects"},
		{"enum of long numbers", longNumbers, "expected_schema/enum", "checking the schema's enum values for duplicates"},
	} {
		var status int
		var answer []byte
		c := measure(t, func() {
			resp := post(t, base+"/verify/schema", tc.body, nil)
			status = resp.StatusCode
			answer, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
		})
		t.Logf("%s: %d bytes, status %d, CPU %v, allocated %d MiB, peak heap +%d MiB", tc.name, len(tc.body), status, c.cpu, c.allocated>>20, c.peakHeap>>20)
		if c.allocated > 64<<20 {
			t.Errorf("%s: the gate allocated %d MiB for one unpaid %d-byte request", tc.name, c.allocated>>20, len(tc.body))
		}
		var e struct {
			Code   string `json:"code"`
			Fields []struct {
				Field   string `json:"field"`
				Problem string `json:"problem"`
			} `json:"fields"`
		}
		if err := json.Unmarshal(answer, &e); status != http.StatusUnprocessableEntity || err != nil || e.Code != "invalid_request" ||
			len(e.Fields) != 1 || e.Fields[0].Field != tc.field || !strings.Contains(e.Fields[0].Problem, tc.problem) {
			t.Errorf("%s: status %d, %.300s; want 422 invalid_request naming %s", tc.name, status, answer, tc.field)
		}
	}
	if up.calls.Load() != 0 {
		t.Errorf("the upstream ran %d times", up.calls.Load())
	}
}
