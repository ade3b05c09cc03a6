package verify

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// constFanOut is a request whose schema applies a const (or an enum
// holding it) of n zeros 4^levels times at the root, through $refs to an
// allOf of four $refs nested levels deep, to the output "x": every
// application fails at "$" with the same keyword and the same text.
func constFanOut(kw string, n, levels int) []byte {
	var b strings.Builder
	val := "[" + strings.TrimSuffix(strings.Repeat("0,", n), ",") + "]"
	if kw == "enum" {
		val = "[" + val + "]"
	}
	b.WriteString(`{"task_id":"t","expected_schema":{"$ref":"#/$defs/a` + strconv.Itoa(levels) + `","$defs":{"a0":{"` + kw + `":` + val + `}`)
	for i := 1; i <= levels; i++ {
		r := `{"$ref":"#/$defs/a` + strconv.Itoa(i-1) + `"}`
		b.WriteString(`,"a` + strconv.Itoa(i) + `":{"allOf":[` + r + `,` + r + `,` + r + `,` + r + `]}`)
	}
	b.WriteString(`}},"submitted_output":"x"}`)
	return []byte(b.String())
}

// A failed const or enum is described by the first 60 bytes of the
// schema's value, and that is all describing it costs, however large the
// value and however often it fails: the text is written once, when the
// schema compiles. (Before: every failure the kept list could take,
// including every one at the same path with the same keyword, serialised
// the whole value and then clipped it, after the step budget and the
// Timeout had stopped counting; a 50 KB free-tier request of 4,096
// failures of a 25,000-item const took 7 s and allocated 455 MB.)
func TestConstAndEnumFailuresAreDescribedOnceByTheirClippedValue(t *testing.T) {
	v := New(Config{})
	for _, tc := range []struct{ kw, expected string }{
		{"const", "the value [" + strings.Repeat("0,", 30)[:59] + "…"},
		{"enum", "one of [" + strings.Repeat("0,", 30)[:59] + "…"},
	} {
		body := constFanOut(tc.kw, 25000, 6)
		freeTier(t, v, body)
		err, alloc := parseBounded(t, v, body)
		if err != nil {
			refusedBySteps(t, tc.kw, err)
			continue
		}
		t.Logf("%s: %d-byte request, %d KB allocated", tc.kw, len(body), alloc>>10)
		if alloc > 32<<20 {
			t.Errorf("%s: a %d-byte request of 4,096 equal failures allocated %d MB; want its failures described within 32 MB", tc.kw, len(body), alloc>>20)
			continue
		}
		req, err := v.Parse(body)
		if err != nil {
			t.Fatalf("%s: %v", tc.kw, err)
		}
		r := v.Check(req, "id", time.Now())
		if r.Result == ResultPass || len(r.ErrorsDetail) == 0 {
			t.Fatalf("%s: result %s with %d errors_detail; want a failure", tc.kw, r.Result, len(r.ErrorsDetail))
		}
		if got := r.ErrorsDetail[0].Expected; got != tc.expected {
			t.Errorf("%s: expected %q; want %q", tc.kw, got, tc.expected)
		}
	}
}
