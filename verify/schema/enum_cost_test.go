package schema

import (
	"errors"
	"testing"

	"github.com/aovhq/aov/internal/signflip"
)

// The enums of one schema share one budget for their duplicate check,
// charged in pointer order, so the enum named is the one that passes it,
// on every compile.
func TestEnumsShareOneDuplicateCheckBudget(t *testing.T) {
	one := signflip.Square(60) // about 112,000 steps
	schema := `{"$schema":"http://json-schema.org/draft-07/schema#","properties":{"c":{"enum":` + one +
		`},"a":{"enum":` + one + `},"b":{"enum":` + one + `}}}`
	for range 5 {
		_, err := compile(decode(t, schema), compileOptions{})
		var ce *CompileError
		if !errors.As(err, &ce) || len(ce.Fields) != 1 || ce.Fields[0].Field != "expected_schema/properties/c/enum" {
			t.Fatalf("three enums over the budget together: %v; want a CompileError at expected_schema/properties/c/enum", err)
		}
	}
	// Two are within it.
	two := `{"$schema":"http://json-schema.org/draft-07/schema#","properties":{"a":{"enum":` + one + `},"b":{"enum":` + one + `}}}`
	if _, err := compile(decode(t, two), compileOptions{}); err != nil {
		t.Errorf("two enums within the budget: %v", err)
	}
}
