package score

import (
	"math"
	"testing"
)

// A read limit that would overflow an int is the largest int, never a
// negative number that would turn the bound off. New refuses such a cap;
// this holds for a Method however it came to have one.
func TestReadLimitSaturates(t *testing.T) {
	for _, n := range []int{math.MaxInt/readFactor + 1, math.MaxInt} {
		if got := (&Method{maxRecords: n}).ReadLimit(); got != math.MaxInt {
			t.Errorf("max records %d: read limit %d, want %d", n, got, math.MaxInt)
		}
	}
}
