package verify

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/aovhq/aov/apierr"
)

// formatAllOf is a request whose output is one string, pre followed by rep
// up to about strLen bytes, under an allOf of n schemas each asserting
// format f.
func formatAllOf(f, pre, rep string, strLen, n int) []byte {
	var b strings.Builder
	b.WriteString(`{"task_id":"t","expected_schema":{"allOf":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"format":"` + f + `"}`)
	}
	b.WriteString(`]},"submitted_output":"` + pre + strings.Repeat(rep, strLen/len(rep)) + `"}`)
	return []byte(b.String())
}

// formatFanOut is a request whose output is one string of rep up to about
// strLen bytes, under a $ref tree that applies one "format": f schema
// 4^levels times.
func formatFanOut(f, rep string, strLen, levels int) []byte {
	var b strings.Builder
	b.WriteString(`{"task_id":"t","expected_schema":{"$ref":"#/$defs/a` + strconv.Itoa(levels) + `","$defs":{"a0":{"format":"` + f + `"}`)
	for i := 1; i <= levels; i++ {
		r := `{"$ref":"#/$defs/a` + strconv.Itoa(i-1) + `"}`
		b.WriteString(`,"a` + strconv.Itoa(i) + `":{"allOf":[` + r + `,` + r + `,` + r + `,` + r + `]}`)
	}
	b.WriteString(`}},"submitted_output":"` + strings.Repeat(rep, strLen/len(rep)) + `"}`)
	return []byte(b.String())
}

// parseAllocs parses body and reports what that allocated.
func parseAllocs(v *Verifier, body []byte) (uint64, error) {
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	_, err := v.ParseContext(context.Background(), body)
	runtime.ReadMemStats(&m1)
	return m1.TotalAlloc - m0.TotalAlloc, err
}

// refusedBySteps fails t unless err is the 422 of the schema step budget.
func refusedBySteps(t *testing.T, name string, err error) {
	t.Helper()
	var e *apierr.Error
	if !errors.As(err, &e) || e.Status != 422 || e.Code != apierr.CodeInvalidRequest || len(e.Fields) == 0 ||
		e.Fields[0].Field != "expected_schema" || !strings.Contains(e.Fields[0].Problem, "evaluation steps") {
		t.Errorf("%s: %.200v; want 422 invalid_request from the step budget", name, err)
	}
}

// A format check reads the whole string, and several split it or parse it
// whole (json-pointer allocates 16 bytes per "/"), in the walk and again
// in the validator, at every application. It is charged by the string's
// length, so a long string under many format schemas is refused by the
// step budget while the same schemas over short strings pass. (Before:
// 1,000 json-pointer or uri-template checks of a 900 KB string passed the
// budget, ran for the whole Timeout and ended 503, retryable.)
func TestFormatChecksAreChargedByLength(t *testing.T) {
	v := New(Config{MaxSchemaSteps: 1 << 16})
	for _, f := range []struct{ name, pre, rep string }{
		{"json-pointer", "", "/"},
		{"relative-json-pointer", "1", "/"},
		{"uri-template", "", "/{}"},
		{"uri", "a:", "/"},
		{"uri-reference", "", "é"},
		{"iri-reference", "", "é"},
		{"uuid", "", "-"},
		{"ipv4", "", "."},
		{"semver", "", "."},
		{"duration", "P", "T"},
	} {
		long := formatAllOf(f.name, f.pre, f.rep, 16_000, 100)
		a, err := parseAllocs(v, long)
		refusedBySteps(t, f.name+" over 16 KB", err)
		if a > 64<<20 {
			t.Errorf("%s: refusing it allocated %d MB", f.name, a>>20)
		}
		if _, err := v.Parse(formatAllOf(f.name, f.pre, f.rep, 100, 100)); err != nil {
			t.Errorf("%s over 100 bytes: %v; want it evaluated", f.name, err)
		}
	}
}

// Within the free tier's 64 KiB and passing the gateway's pre-check, a
// $ref tree applying "format":"json-pointer" 16,384 times to a 60 KB
// string is refused by the step budget, within bounded memory. (Before: it
// passed the budget, ran into the 5 s Timeout with 5.5 GB allocated and
// ended 503 verification_timeout: retryable, no free call spent.)
func TestFreeTierFormatFanOutIsRefused(t *testing.T) {
	v := New(Config{})
	body := formatFanOut("json-pointer", "/", 60_000, 7)
	if len(body) > 64<<10 {
		t.Fatalf("body %d bytes, past the free tier's 64 KiB", len(body))
	}
	if err := v.Precheck(body); err != nil {
		t.Fatalf("Precheck: %v", err)
	}
	a, err := parseAllocs(v, body)
	refusedBySteps(t, "fan-out", err)
	if a > 512<<20 {
		t.Errorf("refusing it allocated %d MB", a>>20)
	}
}
