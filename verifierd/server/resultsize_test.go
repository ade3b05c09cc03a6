package server_test

import (
	"net/http"
	"runtime"
	"strings"
	"testing"

	"github.com/aovhq/aov/signer"
	"github.com/aovhq/aov/verify"
)

// longNameBody is a request whose output has one member with a
// nameLen-byte name holding 60 strings that fail the schema's "type".
func longNameBody(nameLen int) []byte {
	items := strings.TrimSuffix(strings.Repeat(`"x",`, 60), ",")
	return []byte(`{"task_id":"t","agent_id":"a1","expected_schema":{"additionalProperties":{"items":{"type":"number"}}},` +
		`"submitted_output":{"` + strings.Repeat("k", nameLen) + `":[` + items + `]}}`)
}

// escapedFindingsBody is a 13 KB request with 3,000 failing values, each
// at a location of about 1 KB under names JSON escapes twice over (in the
// location, then in the result).
func escapedFindingsBody() []byte {
	name := strings.Repeat(`\"`, 64)
	output := strings.Repeat(`{"`+name+`":`, 7) + `[` + strings.TrimSuffix(strings.Repeat(`"x",`, 3000), ",") + `]` + strings.Repeat("}", 7)
	schema := strings.Repeat(`{"additionalProperties":`, 7) + `{"items":{"type":"number"}}` + strings.Repeat("}", 7)
	return []byte(`{"task_id":"t","agent_id":"a1","expected_schema":` + schema + `,"submitted_output":` + output + `}`)
}

// A failing verification's answer is a signed fail receipt, whatever the
// names in the output: the result repeated a member name in every
// location it listed (errors, errors_detail path and message, hints), so a
// 30 KB request made a signing input past the 4 MiB certd accepts and got
// a 500 internal_error, uncharged and repeatable, and a 900 KB one cost
// verifierd about 2 GB of allocation first. At the bound, with -list-cap
// raised so the lists reach MaxListBytes, the signed answer still fits.
func TestLongNamesStillGetASignedFailReceipt(t *testing.T) {
	for _, c := range []struct {
		name    string
		listCap int
		body    []byte
	}{
		{"30 KB name", 0, longNameBody(30_000)},
		{"900 KB name", 0, longNameBody(900_000)},
		{"escaped names", 0, escapedFindingsBody()},
		{"escaped names, lists at their byte bound", 100_000, escapedFindingsBody()},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{ungated: true, listCap: c.listCap})
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			w := f.do("POST", "/verify/schema", c.body, nil)
			runtime.ReadMemStats(&after)
			alloc := after.TotalAlloc - before.TotalAlloc
			t.Logf("request %d bytes: %d, answer %d bytes, %d MB allocated", len(c.body), w.Code, w.Body.Len(), alloc>>20)
			m := decode(t, w)
			if w.Code != http.StatusOK || m["result"] != "fail" || m["attestation"] == nil {
				t.Fatalf("%d %.300s; want a signed fail receipt", w.Code, w.Body.String())
			}
			if w.Body.Len() > verify.MaxListBytes+16<<10 || w.Body.Len() > signer.DefaultMaxBodyBytes/2 {
				t.Errorf("an answer of %d bytes", w.Body.Len())
			}
			if alloc > 64<<20+40*uint64(len(c.body)) {
				t.Errorf("a %d-byte request allocated %d MB", len(c.body), alloc>>20)
			}
		})
	}
}
