package verify

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/aovhq/aov/apierr"
)

// numbersOutput is an output {"a": [...], "total": n} of about size bytes
// of numbers ("0.5", "1.5", ...), and their sum.
func numbersOutput(size int) (string, float64) {
	var b strings.Builder
	b.WriteString(`{"a":[`)
	sum := 0.0
	for i := 0; b.Len() < size; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(i))
		b.WriteString(".5")
		sum += float64(i) + 0.5
	}
	b.WriteString(`],"total":`)
	b.WriteString(strconv.FormatFloat(sum, 'f', 1, 64))
	b.WriteString(`}`)
	return b.String(), sum
}

func rulesRequest(rules []string, bounds, output string) []byte {
	return []byte(`{"task_id":"t","expected_schema":{"type":"object"},"bounds":` + bounds +
		`,"rules":[` + strings.Join(rules, ",") + `],"submitted_output":` + output + `}`)
}

// Hostile requests: a hundred cheap rules over one 1 MiB array cost
// seconds of CPU in Check, after Parse, outside the time limit and the
// slots. Their work is now counted before anything runs, and refused.
func TestIntegrityWorkOverBudgetIsRefused(t *testing.T) {
	output, _ := numbersOutput(1<<20 - 8000)
	for _, rule := range []string{`{"type":"unique","field":"a[]"}`, `{"type":"exists_in","field":"a[]","in_field":"a[]"}`} {
		body := rulesRequest(slicesRepeat(rule, DefaultMaxRules), "null", output)
		v := New(Config{})
		for name, err := range map[string]error{"Parse": parseErr(v, body), "Precheck": v.Precheck(body)} {
			var e *apierr.Error
			if !errors.As(err, &e) || e.Status != http.StatusUnprocessableEntity || e.Code != apierr.CodeInvalidRequest || e.Charged ||
				len(e.Fields) != 1 || e.Fields[0].Field != "rules" ||
				!strings.Contains(e.Fields[0].Problem, "need more than 16777216 units of integrity-check work") {
				t.Errorf("%s of 100 × %s over 1 MiB: %v; want a 422 naming rules and the integrity budget", name, rule, err)
			} else if strings.Contains(e.Error(), "0.5,") {
				t.Errorf("%s: the refusal echoes the output", name)
			}
		}
	}

	// Bounds count too, each limit one walk.
	v := New(Config{MaxIntegrityWork: 1000})
	small, _ := numbersOutput(10_000)
	_, err := v.Parse(rulesRequest(nil, `{"a[]":{"min":0,"max":1e9}}`, small))
	var e *apierr.Error
	if !errors.As(err, &e) || e.Status != 422 || e.Fields[0].Field != "bounds" {
		t.Errorf("a bound over 2,000 values with a budget of 1,000: %v; want a 422 naming bounds", err)
	}
}

func parseErr(v *Verifier, body []byte) error {
	_, err := v.Parse(body)
	return err
}

func slicesRepeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// An honest large request, a 1 MiB output under a handful of rules and a
// bound, fits the default budget and is checked.
func TestIntegrityWorkHonestLargeRequest(t *testing.T) {
	output, _ := numbersOutput(1<<20 - 2000)
	rules := []string{
		`{"type":"sum_equals","field":"a[]","equals_field":"total","tolerance":1}`,
		`{"type":"gte","field":"a[]","value":0}`,
		`{"type":"lte","field":"a[]","other_field":"total"}`,
		`{"type":"unique","field":"a[]"}`,
		`{"type":"exists_in","field":"a[]","in_field":"a[]"}`,
	}
	body := rulesRequest(rules, `{"a[]":{"min":0,"max":1e9}}`, output)
	if len(body) > DefaultMaxBodyBytes {
		t.Fatalf("the request is %d bytes, over the body limit", len(body))
	}
	v := New(Config{})
	req, err := v.Parse(body)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	work, over := integrityWork(req.output, req.bounds, req.rules, 1<<62)
	if over != "" || work > DefaultMaxIntegrityWork*3/4 {
		t.Errorf("the handful of rules over 1 MiB needs %d units; want well within %d", work, DefaultMaxIntegrityWork)
	}
	t.Logf("integrity work of 5 rules and a bound over 1 MiB: %d units", work)
	r := v.Check(req, "id", verifiedAt)
	if r.Result != ResultPass || r.Integrity != (Tally{Passed: 7, Total: 7}) {
		t.Errorf("result %s, integrity %+v, errors %v; want a pass of 7 checks", r.Result, r.Integrity, r.Errors)
	}
	// The SPEC §10 invoice needs a few dozen units.
	inv, err := v.Parse([]byte(invoiceRequest("135.0")))
	if err != nil {
		t.Fatal(err)
	}
	if work, _ := integrityWork(inv.output, inv.bounds, inv.rules, 1<<62); work == 0 || work > 100 {
		t.Errorf("the invoice's integrity work is %d units", work)
	}
}

// The units are what work.go says: one per value a path enters; for each
// value unique or exists_in compares, 16 per value inside it and one per
// 16 bytes of its text.
func TestIntegrityWorkUnits(t *testing.T) {
	v := New(Config{})
	req, err := v.Parse(rulesRequest([]string{
		`{"type":"unique","field":"a[].id"}`,
		`{"type":"exists_in","field":"c","values":["xxxxxxxxxxxxxxxx", 1]}`,
		`{"type":"gte","field":"a[].n","other_field":"c"}`,
	}, `{"$.a[].n":{"min":0,"max":5}}`, `{"a":[{"id":"0123456789abcdef","n":1},{"id":[1,2],"n":2}],"c":"xxxxxxxxxxxxxxxx"}`))
	if err != nil {
		t.Fatal(err)
	}
	const (
		bounds = 2 * (1 + 2 + 2)               // a, its 2 items, their n; twice (min and max)
		unique = (1 + 2 + 2) + (16 + 1) + 3*16 // the walk; "0123456789abcdef"; [1,2]
		exists = (16 + 1) + 16 + 1 + (16 + 1)  // the two allowed values; the walk to c and c
		gte    = 1 + (1 + 2 + 2)               // c; the walk
		want   = bounds + unique + exists + gte
	)
	if work, over := integrityWork(req.output, req.bounds, req.rules, 1<<62); work != want || over != "" {
		t.Errorf("integrity work = %d (over %q); want %d", work, over, want)
	}
	if _, over := integrityWork(req.output, req.bounds, req.rules, want-1); over != "rules" {
		t.Errorf("with a budget one short, over = %q; want rules", over)
	}
	if _, over := integrityWork(req.output, req.bounds, req.rules, want); over != "" {
		t.Errorf("with a budget of exactly the work, over = %q; want none", over)
	}
}

// The integrity checks run under the verification's context: past its
// deadline, or once the caller has gone, they stop, and Parse answers 503
// verification_timeout.
func TestIntegrityChecksStopWithTheContext(t *testing.T) {
	v := New(Config{})
	output, _ := numbersOutput(100_000)
	req, err := v.Parse(rulesRequest([]string{`{"type":"unique","field":"a[]"}`}, "null", output))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := v.integrity(ctx, req); !errors.Is(err, context.Canceled) {
		t.Errorf("integrity checks with a cancelled context: %v; want context.Canceled", err)
	}
	if err := v.integrity(context.Background(), req); err != nil || req.result.Result != ResultPass {
		t.Errorf("integrity checks: %v, result %q", err, req.result.Result)
	}
}
