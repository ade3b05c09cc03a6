package verify

import (
	"context"
	"errors"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/apierr"
)

// regexAttack is 1 MB of request whose pattern costs thousands of steps per
// byte of the string it is matched against: before budgets it cost a
// minute of CPU.
func regexAttack(n int) []byte {
	return []byte(`{"task_id":"t","expected_schema":{"type":"object","properties":{"s":{"type":"string",` +
		`"pattern":"(?:a?){1000}a{1000}b"}}},"submitted_output":{"s":"` + strings.Repeat("a", n) + `"}}`)
}

// failureFlood is a request whose every item fails.
func failureFlood(n int) []byte {
	return []byte(`{"task_id":"t","expected_schema":{"type":"array","items":{"type":"string","minLength":2}},` +
		`"submitted_output":[` + strings.TrimSuffix(strings.Repeat("1,", n), ",") + `,"x"]}`)
}

func TestRegexBudgetRefusesBeforeMatching(t *testing.T) {
	v := New(Config{})
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := v.Parse(regexAttack(1<<20 - 200))
	var e *apierr.Error
	if !errors.As(err, &e) || e.Status != http.StatusUnprocessableEntity || e.Charged ||
		len(e.Fields) != 1 || e.Fields[0].Field != "expected_schema" || !strings.Contains(e.Fields[0].Problem, "regular-expression work") {
		t.Fatalf("Parse(regex attack) = %v; want a 422 naming expected_schema's regular-expression work", err)
	}
	if strings.Contains(e.Error(), "aaaa") {
		t.Error("the refusal echoes the output")
	}
	// The same pattern within budget runs: the budget is a product.
	if _, err := v.Parse(regexAttack(1000)); err != nil {
		t.Errorf("the pattern on 1,000 bytes: %v", err)
	}
	// A pattern too large on its own is refused at compile time, under a
	// smaller limit.
	small := New(Config{MaxPatternSize: 100})
	_, err = small.Parse(regexAttack(10))
	if !errors.As(err, &e) || e.Status != 422 || !strings.Contains(e.Fields[0].Problem, "too large to evaluate") ||
		e.Fields[0].Field != "expected_schema/properties/s/pattern" {
		t.Errorf("Parse with MaxPatternSize 100: %v; want a 422 at the pattern", err)
	}
}

// constAttack applies a const of n numbers to the same array through allOf
// uses times: the validator compares them deeply (as big.Rat) and is not
// interrupted, so with 50,000 numbers and 50 uses (580 KB) it took seconds.
func constAttack(n, uses int) []byte {
	var arr strings.Builder
	arr.WriteByte('[')
	for i := range n {
		if i > 0 {
			arr.WriteByte(',')
		}
		arr.WriteString(strconv.Itoa(i))
	}
	arr.WriteByte(']')
	return []byte(`{"task_id":"t","expected_schema":{"$defs":{"c":{"const":` + arr.String() + `}},"allOf":[` +
		strings.TrimSuffix(strings.Repeat(`{"$ref":"#/$defs/c"},`, uses), ",") + `]},"submitted_output":` + arr.String() + `}`)
}

func TestLargeConstRefusedBeforeTheValidator(t *testing.T) {
	v := New(Config{})
	_, err := v.Parse(constAttack(50_000, 50))
	var e *apierr.Error
	if !errors.As(err, &e) || e.Status != http.StatusUnprocessableEntity || e.Code != apierr.CodeInvalidRequest || e.Charged ||
		len(e.Fields) != 1 || e.Fields[0].Field != "expected_schema" || !strings.Contains(e.Fields[0].Problem, "evaluation steps") {
		t.Fatalf("Parse(const attack) = %v; want a 422 naming expected_schema's evaluation steps", err)
	}
	if strings.Contains(e.Error(), "49999") {
		t.Error("the refusal echoes the schema or the output")
	}
	// The same const applied once runs, and passes.
	if _, err := v.Parse(constAttack(50_000, 1)); err != nil {
		t.Errorf("the const applied once: %v", err)
	}
}

func TestVerificationStopsWithItsContext(t *testing.T) {
	v := New(Config{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := v.ParseContext(ctx, failureFlood(10_000))
	var e *apierr.Error
	if !errors.As(err, &e) || e.Code != apierr.CodeVerificationTimeout || e.Status != http.StatusServiceUnavailable ||
		!e.Retryable || e.Charged || !errors.Is(err, context.Canceled) {
		t.Fatalf("ParseContext(cancelled) = %v; want 503 verification_timeout", err)
	}
	// A deadline in the past is the wall-clock limit.
	ctx, cancel = context.WithTimeout(context.Background(), -1)
	defer cancel()
	if _, err := v.ParseContext(ctx, failureFlood(10)); !errors.As(err, &e) || e.Code != apierr.CodeVerificationTimeout ||
		!strings.Contains(e.Message, "time limit of 5 seconds") || !strings.Contains(e.Message, "retry after 1 second,") {
		t.Errorf("ParseContext(past deadline) = %v; want verification_timeout naming the 5 second limit", err)
	}
}

// Only the first ListCap schema failures are kept; the result counts the
// rest, and lists every failing check in blocking_checks.
func TestFailuresCappedInTheResult(t *testing.T) {
	v := New(Config{ListCap: 3})
	req, err := v.Parse(failureFlood(1000))
	if err != nil {
		t.Fatal(err)
	}
	if len(req.report.Failures) != 3 || req.report.FailuresTotal != 1001 {
		t.Fatalf("the report keeps %d of %d failures; want 3 of 1001", len(req.report.Failures), req.report.FailuresTotal)
	}
	r := v.Check(req, "id", verifiedAt)
	if r.ErrorsTotal != 1001 || r.ErrorsDetailTotal != 1001 || r.HintsTotal != 1001 || len(r.Errors) != 3 || len(r.Hints) != 3 {
		t.Errorf("errors %d/%d, details %d, hints %d/%d; want 3 of 1001 each", len(r.Errors), r.ErrorsTotal, r.ErrorsDetailTotal, len(r.Hints), r.HintsTotal)
	}
	// The one minLength failure is the last item: past the cap, but
	// still a blocking check.
	if strings.Join(r.BlockingChecks, ",") != "schema:type,schema:minLength" {
		t.Errorf("blocking_checks = %v; want schema:type then schema:minLength", r.BlockingChecks)
	}
}

// The memory a failing verification holds no longer grows with the
// failures' descriptions: with the cap, the allocations of a flood of
// failures stay a fraction of what describing each one costs.
func TestFailureFloodMemory(t *testing.T) {
	body := failureFlood(50_000)
	alloc := func(listCap int) uint64 {
		v := New(Config{ListCap: listCap})
		if _, err := v.Parse(body); err != nil { // compile once, outside the measure
			t.Fatal(err)
		}
		var a, b runtime.MemStats
		runtime.ReadMemStats(&a)
		req, err := v.Parse(body)
		if err != nil {
			t.Fatal(err)
		}
		v.Check(req, "id", verifiedAt).AppendJSON(nil)
		runtime.ReadMemStats(&b)
		return b.TotalAlloc - a.TotalAlloc
	}
	capped, all := alloc(DefaultListCap), alloc(1<<30)
	if capped*3 > all*2 {
		t.Errorf("a flood of 50,000 failures allocates %d bytes capped and %d uncapped; want the cap to save at least a third", capped, all)
	}
	t.Logf("50,000 failures: %d MB capped, %d MB uncapped", capped>>20, all>>20)
}

// Evaluations beyond MaxConcurrent wait for a slot, within their deadline.
func TestConcurrentEvaluationsBounded(t *testing.T) {
	v := New(Config{MaxConcurrent: 1, Timeout: 50 * time.Millisecond})
	body := []byte(invoiceRequest("129.5"))
	v.slots <- struct{}{} // every slot busy
	_, err := v.Parse(body)
	var e *apierr.Error
	if !errors.As(err, &e) || e.Code != apierr.CodeVerificationTimeout {
		t.Fatalf("Parse with every slot busy past the deadline = %v; want verification_timeout", err)
	}
	<-v.slots
	if _, err := v.Parse(body); err != nil {
		t.Fatalf("Parse with a free slot: %v", err)
	}
	if len(v.slots) != 0 {
		t.Error("a finished evaluation kept its slot")
	}
}

// A schema's compile waits for a slot like its evaluation: a schema within
// every limit can cost a fraction of a second and tens of MiB to compile,
// so requests compiling at once are bounded by MaxConcurrent too. (Before:
// the compile ran before the slot was asked for, so any number of
// requests compiled at once, each then waiting for a slot.)
func TestSchemaCompilesWaitForASlot(t *testing.T) {
	v := New(Config{MaxConcurrent: 1})
	body := []byte(invoiceRequest("129.5"))
	v.slots <- struct{}{} // every slot busy
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := v.ParseContext(ctx, body)
	var e *apierr.Error
	if !errors.As(err, &e) || e.Code != apierr.CodeVerificationTimeout {
		t.Fatalf("Parse with every slot busy past the deadline = %v; want verification_timeout", err)
	}
	if n := v.cache.Len(); n != 0 {
		t.Errorf("with every slot busy, %d schemas were compiled; want none before a slot is free", n)
	}
	<-v.slots
	if _, err := v.Parse(body); err != nil {
		t.Fatalf("Parse with a free slot: %v", err)
	}
	if n := v.cache.Len(); n != 1 {
		t.Errorf("after a verification in a free slot the cache holds %d schemas; want 1", n)
	}
	if len(v.slots) != 0 {
		t.Error("a finished verification kept its slot")
	}
}
