package score_test

import (
	"testing"
	"time"

	"github.com/aovhq/aov/score"
)

// BenchmarkScore10k is one score over 10,000 verifications (the default
// record cap), newest first, a third of them unauthenticated, one in ten
// failing: the arithmetic alone, without reading the history.
func BenchmarkScore10k(b *testing.B) {
	ev := make([]score.Evidence, 10000)
	for i := range ev {
		ev[i] = score.Evidence{At: now.Add(-time.Duration(i) * 30 * time.Minute), Pass: i%10 != 0, Authenticated: i%3 != 0}
	}
	m := score.Default()
	b.ReportAllocs()
	for b.Loop() {
		if r := m.Score(now, ev); r.Window.Records != 10000 {
			b.Fatalf("%d records", r.Window.Records)
		}
	}
}
