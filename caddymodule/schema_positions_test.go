package caddymodule

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// The gate compiles a request's schema before it answers 402, unpaid, and
// the metaschema check of that compile writes the location of every value
// where a subschema belongs. Values there that were not charged (numbers,
// true), or locations whose cost grows with depth times length, cost the
// gate hundreds of MiB for requests of tens of KB: 500 numbers under one
// 50 KB name (51 KB) allocated 165 MiB. Each is now refused with a small
// 422 for a few MiB, and verifierd never sees it.
func TestUnpaidValuesWhereSchemasBelongAreRefusedCheaply(t *testing.T) {
	_, fac := sharedDevnet(t)
	vf := startVerifier(t)
	base := startCaddy(t, realSite(vf, fac, 0, ""))
	leaves := make([]string, 500)
	for i := range leaves {
		leaves[i] = `"` + strings.Repeat("n", 50) + strconv.Itoa(i) + `":{}`
	}
	deep := `{"properties":{` + strings.Join(leaves, ",") + `}}`
	for i := 0; i < 28; i++ {
		deep = `{"properties":{"` + strings.Repeat("n", 60) + `":` + deep + `}}`
	}
	for _, c := range []struct{ name, schema string }{
		{"numbers under a long name", `{"properties":{"` + strings.Repeat("k", 50_000) + `":{"prefixItems":[` +
			strings.TrimSuffix(strings.Repeat("1,", 500), ",") + `]}}}`},
		{"20,000 true subschemas", `{"prefixItems":[` + strings.TrimSuffix(strings.Repeat("true,", 20_000), ",") + `]}`},
		{"deep medium names", deep},
	} {
		body := `{"task_id":"t","expected_schema":` + c.schema + `,"submitted_output":{}}`
		var status int
		var answer []byte
		cost := measure(t, func() {
			resp := post(t, base+"/verify/schema", body, nil)
			status = resp.StatusCode
			answer, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
		})
		t.Logf("%s: %d bytes, status %d, answer %d bytes, allocated %d MiB", c.name, len(body), status, len(answer), cost.allocated>>20)
		var e struct {
			Code   string `json:"code"`
			Fields []struct {
				Field string `json:"field"`
			} `json:"fields"`
		}
		if err := json.Unmarshal(answer, &e); status != http.StatusUnprocessableEntity || err != nil || e.Code != "invalid_request" ||
			len(e.Fields) != 1 || e.Fields[0].Field != "expected_schema" {
			t.Errorf("%s: status %d, %.300s; want 422 invalid_request refusing the schema", c.name, status, answer[max(0, len(answer)-400):])
		}
		if len(answer) > 4<<10 {
			t.Errorf("%s: a refusal of %d bytes", c.name, len(answer))
		}
		if cost.allocated > 16<<20 {
			t.Errorf("%s: the gate allocated %d MiB for one unpaid %d-byte request", c.name, cost.allocated>>20, len(body))
		}
	}
	if n := vf.calls.Load(); n != 0 {
		t.Errorf("verifierd ran %d times", n)
	}
}
