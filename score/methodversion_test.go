package score_test

import (
	"testing"
	"time"

	"github.com/aovhq/aov/score"
)

// Leaving out a verification dated after the score's time changed which
// records count (version 2 counted it as from now, at full weight), so it
// is a new version of the method: a version-2 score of a history whose one
// verification is an hour after now was 0.206543; the method now scores
// it 0, and one name and version must not stand for both. (Before: still
// version "2" after the change.)
func TestLeavingOutLateEvidenceIsMethodVersion3(t *testing.T) {
	const underVersion2 = 0.206543
	history := []score.Evidence{{At: now.Add(time.Hour), Pass: true, Authenticated: true}}
	got := score.Default().Score(now, false, history).Score
	if got == underVersion2 {
		t.Fatalf("a verification an hour after the score counts (%v), as under version 2", got)
	}
	if score.MethodVersion != "3" {
		t.Fatalf("method %s version %q scores this history %v; version 2 scored it %v, so the version is 3",
			score.MethodName, score.MethodVersion, got, underVersion2)
	}
}
