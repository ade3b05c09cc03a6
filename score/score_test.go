package score_test

import (
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/aovhq/aov/score"
)

var now = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

const day = 24 * time.Hour

// same builds n verifications all made at one instant, age ago.
func same(n int, age time.Duration, pass, auth bool) []score.Evidence {
	out := make([]score.Evidence, n)
	for i := range out {
		out[i] = score.Evidence{At: now.Add(-age), Pass: pass, Authenticated: auth}
	}
	return out
}

// history builds n verifications newest first, one per hour starting at
// age, all passing or failing, authenticated or not.
func history(n int, age time.Duration, pass, auth bool) []score.Evidence {
	out := make([]score.Evidence, n)
	for i := range out {
		out[i] = score.Evidence{At: now.Add(-age - time.Duration(i)*time.Hour), Pass: pass, Authenticated: auth}
	}
	return out
}

func concat(parts ...[]score.Evidence) []score.Evidence {
	var out []score.Evidence
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func TestScoreOrdering(t *testing.T) {
	m := score.Default()
	for _, c := range []struct {
		desc          string
		lower, higher []score.Evidence
	}{
		{"more passes score higher: 10 passes above 3", history(3, 0, true, true), history(10, 0, true, true)},
		{"more passes score higher: 100 passes above 10", history(10, 0, true, true), history(100, 0, true, true)},
		{"3 passes out of 3 score below 300 out of 300", history(3, 0, true, true), history(300, 0, true, true)},
		{"a fail lowers the score", concat(history(1, 0, false, true), history(20, time.Hour, true, true)), history(20, time.Hour, true, true)},
		{"more fails lower it further", concat(history(5, 0, false, true), history(20, 5*time.Hour, true, true)), concat(history(1, 0, false, true), history(20, 5*time.Hour, true, true))},
		{"old evidence counts less: 50 passes from 90 days ago score below 50 from today", history(50, 90*day, true, true), history(50, 0, true, true)},
		{"an old fail hurts less than a recent one", concat(history(1, 0, false, true), history(20, time.Hour, true, true)), concat(history(20, 0, true, true), history(1, 60*day, false, true))},
		{"authenticated passes score above the same unauthenticated passes", history(20, 0, true, false), history(20, 0, true, true)},
		{"an unauthenticated fail hurts less than an authenticated one", concat(history(1, 0, false, true), history(20, time.Hour, true, true)), concat(history(1, 0, false, false), history(20, time.Hour, true, true))},
		{"no evidence scores below any pass", nil, history(1, 0, true, false)},
	} {
		t.Run(c.desc, func(t *testing.T) {
			lo, hi := m.Score(now, false, c.lower), m.Score(now, false, c.higher)
			if !(lo.Score < hi.Score) {
				t.Fatalf("score %v is not below %v", lo.Score, hi.Score)
			}
		})
	}
}

func TestScoreValues(t *testing.T) {
	m := score.Default()
	for _, c := range []struct {
		desc     string
		evidence []score.Evidence
		want     float64
	}{
		{"no evidence scores 0", nil, 0},
		{"3 authenticated passes out of 3 score 0.438494", same(3, 0, true, true), 0.438494},
		{"300 authenticated passes out of 300 score 0.987357", same(300, 0, true, true), 0.987357},
		{"only fails score 0", same(50, 0, false, true), 0},
		{"2 passes one half-life old weigh 1 and score like 1 of 1 today", same(2, 30*day, true, true), 0.206543},
		{"3 unauthenticated passes weigh 1.5 and score 0.280815", same(3, 0, true, false), 0.280815},
		// A score's newest_evidence_at is at or before its computed_at, as
		// verifiers require. (Before: it counted as from now, and its date
		// was the newest evidence's.)
		{"a verification stamped after the score's time is not evidence", []score.Evidence{{At: now.Add(time.Microsecond), Pass: true, Authenticated: true}}, 0},
		{"a verification stamped at the score's time is evidence", []score.Evidence{{At: now, Pass: true, Authenticated: true}}, 0.206543},
		{"evidence older than the horizon is not evidence", history(100, 366*day, true, true), 0},
	} {
		t.Run(c.desc, func(t *testing.T) {
			got := m.Score(now, false, c.evidence).Score
			if got != c.want {
				t.Fatalf("score %v, want %v", got, c.want)
			}
		})
	}
}

func TestWilsonLowerBound(t *testing.T) {
	for _, c := range []struct {
		desc       string
		pass, n, z float64
		want       float64
	}{
		{"the textbook case: 1 of 1 at 95% is 0.206543", 1, 1, 1.96, 0.206543},
		{"half of 100 at 95% is 0.40383", 50, 100, 1.96, 0.40383},
		{"no trials bound nothing", 0, 0, 1.96, 0},
		{"a NaN amount of evidence bounds nothing", 1, math.NaN(), 1.96, 0},
	} {
		t.Run(c.desc, func(t *testing.T) {
			if got := math.Round(score.WilsonLowerBound(c.pass, c.n, c.z)*1e6) / 1e6; got != c.want {
				t.Fatalf("%v, want %v", got, c.want)
			}
		})
	}
}

func TestResultInputs(t *testing.T) {
	m := score.Default()
	ev := concat(
		history(2, 0, true, true),       // 2 authenticated passes, ~now
		history(1, 30*day, true, false), // 1 unauthenticated pass, one half-life old
		history(1, 60*day, false, true), // 1 authenticated fail, two half-lives old
		history(1, 400*day, false, false),
	)
	r := m.Score(now, false, ev)
	wantCounts := score.Counts{AuthenticatedPass: 2, UnauthenticatedPass: 1, AuthenticatedFail: 1}
	if r.Counts != wantCounts {
		t.Errorf("counts %+v, want %+v", r.Counts, wantCounts)
	}
	// 1 + 2^(-1/720) ≈ 1.999037; + 0.5·0.5; fail 0.25.
	pass := 1 + math.Exp2(-1.0/720) + 0.25
	if math.Abs(r.Decayed.Pass-pass) > 1e-6 || r.Decayed.Fail != 0.25 || math.Abs(r.Decayed.Evidence-(pass+0.25)) > 1e-6 {
		t.Errorf("decayed %+v, want pass %.6f fail 0.25", r.Decayed, pass)
	}
	if r.Window.Records != 4 || r.Window.Truncated || !r.Window.To.Equal(now) || !r.Window.From.Equal(now.Add(-365*day)) ||
		!r.Window.Newest.Equal(now) || !r.Window.Oldest.Equal(now.Add(-60*day)) {
		t.Errorf("window %+v", r.Window)
	}
	want := score.Params{HalfLifeDays: 30, HorizonDays: 365, MaxRecords: 10000, AuthenticatedWeight: 1, UnauthenticatedWeight: 0.5, Z: 1.96}
	if r.Params != want {
		t.Errorf("params %+v, want %+v", r.Params, want)
	}
}

func TestConfig(t *testing.T) {
	t.Run("a shorter half-life forgets faster", func(t *testing.T) {
		fast, err := score.New(score.Config{HalfLife: day})
		if err != nil {
			t.Fatal(err)
		}
		ev := history(100, 30*day, true, true)
		if f, d := fast.Score(now, false, ev).Score, score.Default().Score(now, false, ev).Score; !(f < d) {
			t.Fatalf("1-day half-life scores %v, not below the default's %v", f, d)
		}
	})
	t.Run("the record cap keeps the newest records and says it truncated", func(t *testing.T) {
		m, err := score.New(score.Config{MaxRecords: 10})
		if err != nil {
			t.Fatal(err)
		}
		ev := concat(history(10, 0, true, true), history(10, 11*time.Hour, false, true))
		r := m.Score(now, false, ev)
		if r.Window.Records != 10 || !r.Window.Truncated || r.Counts.AuthenticatedFail != 0 {
			t.Fatalf("window %+v counts %+v", r.Window, r.Counts)
		}
		exact := m.Score(now, false, ev[:10])
		if exact.Window.Truncated {
			t.Fatal("exactly the cap is reported as truncated")
		}
	})
	t.Run("the largest record cap still has a read limit", func(t *testing.T) {
		m, err := score.New(score.Config{MaxRecords: score.MaxMaxRecords})
		if err != nil {
			t.Fatal(err)
		}
		if m.ReadLimit() != 2*score.MaxMaxRecords {
			t.Fatalf("read limit %d", m.ReadLimit())
		}
	})
	t.Run("a shorter horizon leaves older evidence out", func(t *testing.T) {
		m, err := score.New(score.Config{Horizon: 7 * day})
		if err != nil {
			t.Fatal(err)
		}
		r := m.Score(now, false, concat(history(5, 0, true, true), history(5, 8*day, false, true)))
		if r.Counts.Total() != 5 || r.Counts.AuthenticatedFail != 0 {
			t.Fatalf("counts %+v", r.Counts)
		}
	})
	for _, c := range []struct {
		desc string
		cfg  score.Config
	}{
		{"a negative half-life is refused", score.Config{HalfLife: -day}},
		{"a negative horizon is refused", score.Config{Horizon: -day}},
		{"a negative record cap is refused", score.Config{MaxRecords: -1}},
		{"a record cap above MaxMaxRecords is refused", score.Config{MaxRecords: score.MaxMaxRecords + 1}},
		{"a record cap whose read limit overflows an int is refused", score.Config{MaxRecords: math.MaxInt/2 + 1}},
		{"an unauthenticated weight above 1 is refused", score.Config{UnauthenticatedWeight: 1.5}},
		{"a negative unauthenticated weight is refused", score.Config{UnauthenticatedWeight: -0.5}},
		{"a NaN z is refused", score.Config{Z: math.NaN()}},
		{"an infinite z is refused", score.Config{Z: math.Inf(1)}},
	} {
		t.Run(c.desc, func(t *testing.T) {
			if _, err := score.New(c.cfg); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

func TestDeterministicAndBounded(t *testing.T) {
	m := score.Default()
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 200 {
		n := rng.IntN(500)
		ev := make([]score.Evidence, n)
		at := now.Add(time.Duration(rng.IntN(48)-24) * time.Hour)
		for j := range ev {
			at = at.Add(-time.Duration(rng.Int64N(int64(3 * day))))
			ev[j] = score.Evidence{At: at, Pass: rng.IntN(4) != 0, Authenticated: rng.IntN(2) == 0}
		}
		owned := i%2 == 0
		a, b := m.Score(now, owned, ev), m.Score(now, owned, ev)
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("history %d: two computations differ: %+v / %+v", i, a, b)
		}
		if !(a.Score >= 0 && a.Score <= 1) {
			t.Fatalf("history %d: score %v outside [0, 1]", i, a.Score)
		}
		if owned && (a.Counts.UnauthenticatedPass != 0 || a.Counts.UnauthenticatedFail != 0) {
			t.Fatalf("history %d: an owned agent's labels were counted: %+v", i, a.Counts)
		}
		if a.Counts.Total() != int64(a.Window.Records) {
			t.Fatalf("history %d: counts %+v but %d records", i, a.Counts, a.Window.Records)
		}
		ratio := 0.0
		if a.Decayed.Evidence > 0 {
			ratio = a.Decayed.Pass / a.Decayed.Evidence
		}
		if a.Score > ratio+1e-6 {
			t.Fatalf("history %d: score %v above the decayed pass ratio %v", i, a.Score, ratio)
		}
	}
}

func TestAddStopsReading(t *testing.T) {
	m := score.Default()
	tl := m.Start(now, false)
	if !tl.Add(score.Evidence{At: now, Pass: true}) {
		t.Fatal("a record from now was not counted")
	}
	if tl.Add(score.Evidence{At: now.Add(-400 * day), Pass: true}) {
		t.Fatal("a record beyond the horizon asked for more")
	}
}

// A record the caller skips is not evidence but, like one added, stops the
// read past the horizon; a caller that stops reading inside the horizon
// (its own bound) leaves the window truncated, and past it does not.
func TestSkipAndStop(t *testing.T) {
	m := score.Default()
	tl := m.Start(now, false)
	if !tl.Skip(now) || !tl.Add(score.Evidence{At: now.Add(-day), Pass: true}) {
		t.Fatal("a skipped record inside the horizon ended the read")
	}
	if tl.Skip(now.Add(-400 * day)) {
		t.Fatal("a skipped record beyond the horizon asked for more")
	}
	if r := tl.Result(); r.Window.Records != 1 || r.Window.NotCounted != 1 || r.Window.Truncated || r.Score != m.Score(now, false, same(1, day, true, false)).Score {
		t.Fatalf("window %+v, score %v: want the one added record as the only evidence", r.Window, r.Score)
	}
	for _, c := range []struct {
		desc      string
		at        time.Time
		truncated bool
	}{
		{"stopped at a record inside the horizon", now.Add(-day), true},
		{"stopped at a record beyond the horizon", now.Add(-400 * day), false},
	} {
		t.Run(c.desc, func(t *testing.T) {
			tl := m.Start(now, false)
			tl.Add(score.Evidence{At: now, Pass: true})
			tl.Stop(c.at)
			if r := tl.Result(); r.Window.Truncated != c.truncated || r.Window.Records != 1 {
				t.Fatalf("window %+v, want truncated %v", r.Window, c.truncated)
			}
		})
	}
}

// An owned agent scores only from its owner's evidence: labels, which
// anyone can send under its id, are not evidence, whatever their number.
func TestOwnedAgentScoresOnlyItsOwnersEvidence(t *testing.T) {
	m := score.Default()
	owners := same(3, 0, true, true)
	poisoned := concat(same(4, 0, false, false), owners) // 4 labels, newer
	t.Run("labels under an owned id leave its score unchanged", func(t *testing.T) {
		clean, r := m.Score(now, true, owners), m.Score(now, true, poisoned)
		if r.Score != clean.Score || r.Score != 0.438494 {
			t.Fatalf("score %v with 4 failing labels, %v without; want 0.438494", r.Score, clean.Score)
		}
		if !r.Owned || r.Window.Records != 3 || r.Window.NotCounted != 4 || r.Counts != (score.Counts{AuthenticatedPass: 3}) {
			t.Fatalf("owned %v window %+v counts %+v", r.Owned, r.Window, r.Counts)
		}
	})
	t.Run("the same labels lower an unowned id's score", func(t *testing.T) {
		r := m.Score(now, false, poisoned)
		if !(r.Score < 0.3) || r.Owned || r.Window.NotCounted != 0 || r.Counts.UnauthenticatedFail != 4 {
			t.Fatalf("score %v owned %v window %+v counts %+v", r.Score, r.Owned, r.Window, r.Counts)
		}
	})
	t.Run("an unowned id scores from its labels", func(t *testing.T) {
		if r := m.Score(now, false, same(3, 0, true, false)); r.Score != 0.280815 {
			t.Fatalf("score %v, want 0.280815", r.Score)
		}
	})
	t.Run("the owner's own fails count", func(t *testing.T) {
		r := m.Score(now, true, concat(same(1, 0, false, true), owners))
		if !(r.Score < 0.438494) || r.Counts.AuthenticatedFail != 1 {
			t.Fatalf("score %v counts %+v", r.Score, r.Counts)
		}
	})
	t.Run("labels do not count toward the record cap", func(t *testing.T) {
		small, err := score.New(score.Config{MaxRecords: 10})
		if err != nil {
			t.Fatal(err)
		}
		ev := concat(history(50, 0, false, false), history(10, 2*day, true, true))
		r := small.Score(now, true, ev)
		if r.Window.Records != 10 || r.Window.Truncated || r.Window.NotCounted != 50 || r.Score != small.Score(now, true, ev[50:]).Score {
			t.Fatalf("score %v window %+v", r.Score, r.Window)
		}
	})
}
