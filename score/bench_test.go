package score_test

import (
	"testing"
	"time"

	"github.com/aovhq/aov/score"
)

// BenchmarkScore10k is one score over 10,000 verifications (the default
// record cap), newest first, a third of them unauthenticated, one in ten
// failing: the arithmetic alone, without reading the history. "unowned"
// counts every record; "owned" skips the third that are labels, against
// the same records in the same run.
func BenchmarkScore10k(b *testing.B) {
	ev := make([]score.Evidence, 10000)
	for i := range ev {
		ev[i] = score.Evidence{At: now.Add(-time.Duration(i) * 30 * time.Minute), Pass: i%10 != 0, Authenticated: i%3 != 0}
	}
	m := score.Default()
	for _, c := range []struct {
		name    string
		owned   bool
		records int
	}{{"unowned", false, 10000}, {"owned", true, 6666}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if r := m.Score(now, c.owned, ev); r.Window.Records != c.records {
					b.Fatalf("%d records", r.Window.Records)
				}
			}
		})
	}
}
