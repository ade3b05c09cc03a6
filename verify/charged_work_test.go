package verify

import (
	"strings"
	"testing"

	"github.com/aovhq/aov/apierr"

	"github.com/aovhq/aov/internal/signflip"
)

// refusedForSteps fails the test unless err is the 422 naming
// expected_schema's evaluation steps.
func refusedForSteps(t *testing.T, err error) {
	t.Helper()
	if e := apierr.From(err); e.Status != 422 || len(e.Fields) != 1 || e.Fields[0].Field != "expected_schema" || !strings.Contains(e.Fields[0].Problem, "evaluation steps") {
		t.Errorf("%.300v; want 422 naming expected_schema's evaluation steps", e)
	}
}

// The unpaid precheck compiles the schema, and the compiler deduplicates
// required before it checks that it holds strings: 300 sign-flipped
// arrays of 300 numbers under required cost it 5.7 s. 150 (45 KB)
// allocated 130 MB; now the array is refused for the work of its
// duplicate check, as an enum is.
func TestPrecheckRefusesRequiredCostlyToDeduplicate(t *testing.T) {
	v := New(Config{})
	body := []byte(strings.Replace(string(signFlipEnum(150)), `{"$schema":"http://json-schema.org/draft-04/schema#","enum":`, `{"required":`, 1))
	var err error
	n := allocatedBy(func() { err = v.Precheck(body) })
	if n > 32<<20 {
		t.Errorf("an unpaid precheck of a %d KB schema allocated %d MB", len(body)>>10, n>>20)
	}
	e := apierr.From(err)
	if e.Status != 422 || len(e.Fields) != 1 || e.Fields[0].Field != "expected_schema/required" ||
		!strings.Contains(e.Fields[0].Problem, "checking the schema's required values for duplicates") {
		t.Fatalf("%.300v; want 422 naming expected_schema/required", e)
	}
}

// The validator makes an error for every failure inside not (and if) too,
// and keeps them all until not returns: 500,000 items failing under not
// (976 KB) allocated 408 MB and held 150 MB, charged nothing. They are
// now charged as failures anywhere else, and refused before it runs.
func TestFailuresInsideNotAreCharged(t *testing.T) {
	v := New(Config{})
	out := "[" + strings.TrimSuffix(strings.Repeat("1,", 500_000), ",") + "]"
	body := []byte(`{"task_id":"t","expected_schema":{"$defs":{"a":{"type":"array","items":{"$ref":"#/$defs/a"}}},"not":{"$ref":"#/$defs/a"}},"submitted_output":` + out + `}`)
	var err error
	n := allocatedBy(func() { _, err = v.Parse(body) })
	if n > 128<<20 {
		t.Errorf("a %d KB request allocated %d MB", len(body)>>10, n>>20)
	}
	refusedForSteps(t, err)
}

// uniqueItems over 170 arrays of 64 long numbers that differ only in the
// signs of their last ones (251 KB): the validator parses both sides of
// each comparison into big.Rat, 6 steps' work a number, and ran 8 s after
// a walk that charged one step a number. Charged by their digits, the
// output is refused before it runs.
func TestUniqueItemsOfLongNumbersIsCharged(t *testing.T) {
	v := New(Config{})
	num := "1.234567890123456e-300"
	body := []byte(`{"task_id":"t","expected_schema":{"uniqueItems":true},"submitted_output":` + signflip.Rows(num, 170, 64) + `}`)
	var err error
	n := allocatedBy(func() { _, err = v.Parse(body) })
	if n > 64<<20 {
		t.Errorf("a %d KB request allocated %d MB", len(body)>>10, n>>20)
	}
	refusedForSteps(t, err)
}
