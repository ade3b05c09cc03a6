package score_test

import (
	"fmt"
	"time"

	"github.com/aovhq/aov/score"
)

// Three passes today, authenticated by the agent's owner, are little
// evidence; three hundred are a lot.
func Example() {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	m := score.Default()
	few := make([]score.Evidence, 3)
	many := make([]score.Evidence, 300)
	for i := range few {
		few[i] = score.Evidence{At: now, Pass: true, Authenticated: true}
	}
	for i := range many {
		many[i] = score.Evidence{At: now, Pass: true, Authenticated: true}
	}
	fmt.Println(m.Score(now, true, few).Score, m.Score(now, true, many).Score)
	// Output: 0.438494 0.987357
}
