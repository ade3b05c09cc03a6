// Package score is the trust score method: it turns an agent's verification
// history (pass or fail, when, and whether the agent's owner authenticated
// it) into one number in [0, 1] that rewards sustained passing and
// discounts old and scarce evidence.
//
// # Method (name "time-decayed-wilson-lower-bound", version "3")
//
//  1. Evidence. An agent id with an owner (its address for an account id,
//     else the first wallet that bound it; the caller decides that) scores
//     only from verifications its owner authenticated: every other record
//     under its id, which anyone can send, is not evidence at all, so
//     nobody but the owner can raise or sink its score. An agent id without
//     an owner scores from every verification under it, each a bare label.
//     Agents whose id starts with "test-" are examples and never get a
//     score (the caller refuses them).
//
//  2. Window. Only the agent's newest MaxRecords pieces of evidence
//     (default 10,000) no older than Horizon (default 365 days) before the
//     moment of computation, and none after it, count (a verification
//     recorded while the score is computed is not evidence of it, so no
//     evidence date a score states is after the score's own time). Records that are not evidence do not
//     count toward the cap, so a flood of labels cannot push an owner's
//     evidence out of the window. A caller reading a history for one score
//     reads at most ReadLimit records (twice the cap), evidence or not, and
//     the window says it is truncated when that may leave evidence out.
//
//  3. Weight. Each piece of evidence weighs w = a · 2^(−age / HalfLife): a
//     is 1 for an authenticated verification (the caller proved with
//     X-Wallet-Auth the wallet that owns the agent id) and
//     UnauthenticatedWeight (default 0.5) for a bare label of an agent
//     without an owner; age is the time since the verification, and
//     HalfLife defaults to 30 days, so a month-old pass counts half as
//     much as one from today.
//
//  4. Decayed counts. P = Σ w over passes, F = Σ w over fails, n = P + F
//     (the effective amount of evidence).
//
//  5. Score. The lower bound of the Wilson score interval for the pass
//     proportion p = P/n at z = Z (default 1.96, the 95% interval):
//
//     score = (p + z²/2n − z·√(p(1−p)/n + z²/4n²)) / (1 + z²/n)
//
//     and 0 when n = 0. The bound is what the pass rate is, with 95%
//     confidence, at least: few data points leave it wide, so 3 passes out
//     of 3 score 0.44 while 300 out of 300 score 0.99; fails pull it down;
//     evidence that ages or is unauthenticated counts as less evidence.
//
// Version 1 counted the labels of an owned agent too, at
// UnauthenticatedWeight, which let anyone lower an owned agent's score.
// Version 2 counted a verification dated after the moment of computation
// as from then (age 0): one recorded while the score was computed made the
// score's newest_evidence_at later than its computed_at. Version 3 leaves
// it out.
//
// Everything is deterministic given the records, their order, whether the
// agent has an owner, and the clock: the score of a history is reproducible
// by anyone holding its records. Results are rounded to 6 decimal places.
//
// The package is not for reading the history (the caller feeds the records,
// newest first) nor for signing or serving the score (verifierd does).
package score

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Method identity, published with every score so a reader knows which
// formula produced it; the version changes whenever the formula or a
// default does.
const (
	MethodName    = "time-decayed-wilson-lower-bound"
	MethodVersion = "3"
)

// Defaults of Config.
const (
	DefaultHalfLife              = 30 * 24 * time.Hour
	DefaultHorizon               = 365 * 24 * time.Hour
	DefaultMaxRecords            = 10000
	DefaultUnauthenticatedWeight = 0.5
	DefaultZ                     = 1.96
)

// MaxMaxRecords is the largest record cap New accepts (1,000,000, a
// hundred times the default): a score reads up to twice the cap from the
// history on every call, and a cap so large that twice it overflows an
// int would leave no read limit at all.
const MaxMaxRecords = 1_000_000

// Config sets the method's parameters; zero fields take the defaults. The
// parameters in force are reported with every Result.
type Config struct {
	// HalfLife is the age at which a verification counts half (30 days).
	HalfLife time.Duration
	// Horizon is the age beyond which a verification is not evidence at all
	// (365 days): at the default half-life its weight would be below 0.03%.
	Horizon time.Duration
	// MaxRecords caps the evidence to the newest verifications (10,000), so
	// the arithmetic of a score is bounded however busy an agent is. At
	// most MaxMaxRecords.
	MaxRecords int
	// UnauthenticatedWeight is the weight of a verification of an agent
	// without an owner (a bare label), relative to 1 for one its owner
	// authenticated (0.5). In (0, 1]. An owned agent's labels weigh nothing.
	UnauthenticatedWeight float64
	// Z is the normal quantile of the Wilson bound (1.96: the lower end of
	// the 95% interval). Larger is more cautious with little evidence.
	Z float64
}

// Params are the parameters a score was computed with, as published.
type Params struct {
	HalfLifeDays          float64 `json:"half_life_days"`
	HorizonDays           float64 `json:"horizon_days"`
	MaxRecords            int     `json:"max_records"`
	AuthenticatedWeight   float64 `json:"authenticated_weight"`
	UnauthenticatedWeight float64 `json:"unauthenticated_weight"`
	Z                     float64 `json:"z"`
}

// Method computes scores with one configuration. It is immutable and safe
// for concurrent use.
type Method struct {
	halfLife   time.Duration
	horizon    time.Duration
	maxRecords int
	unauthW    float64
	z          float64
}

// New checks cfg and fills in the defaults.
func New(cfg Config) (*Method, error) {
	m := &Method{
		halfLife:   cfg.HalfLife,
		horizon:    cfg.Horizon,
		maxRecords: cfg.MaxRecords,
		unauthW:    cfg.UnauthenticatedWeight,
		z:          cfg.Z,
	}
	if m.halfLife == 0 {
		m.halfLife = DefaultHalfLife
	}
	if m.horizon == 0 {
		m.horizon = DefaultHorizon
	}
	if m.maxRecords == 0 {
		m.maxRecords = DefaultMaxRecords
	}
	if m.unauthW == 0 {
		m.unauthW = DefaultUnauthenticatedWeight
	}
	if m.z == 0 {
		m.z = DefaultZ
	}
	switch {
	case m.halfLife < 0:
		return nil, fmt.Errorf("score: half-life %s is negative", m.halfLife)
	case m.horizon < 0:
		return nil, fmt.Errorf("score: horizon %s is negative", m.horizon)
	case m.maxRecords < 0:
		return nil, fmt.Errorf("score: max records %d is negative", m.maxRecords)
	case m.maxRecords > MaxMaxRecords:
		return nil, fmt.Errorf("score: max records %d is above %d", m.maxRecords, MaxMaxRecords)
	case !(m.unauthW > 0 && m.unauthW <= 1):
		return nil, errors.New("score: unauthenticated weight must be in (0, 1]")
	case !(m.z > 0) || math.IsInf(m.z, 0):
		return nil, errors.New("score: z must be a positive finite number")
	}
	return m, nil
}

// Default is the method with every default; the published score uses it
// unless the operator configures otherwise.
func Default() *Method {
	m, _ := New(Config{})
	return m
}

// Params reports the parameters in force.
func (m *Method) Params() Params {
	return Params{
		HalfLifeDays:          round6(m.halfLife.Hours() / 24),
		HorizonDays:           round6(m.horizon.Hours() / 24),
		MaxRecords:            m.maxRecords,
		AuthenticatedWeight:   1,
		UnauthenticatedWeight: m.unauthW,
		Z:                     m.z,
	}
}

// MaxRecords is the cap on evidence records, so a caller paging through a
// history knows when to stop reading.
func (m *Method) MaxRecords() int { return m.maxRecords }

// readFactor is ReadLimit in record caps.
const readFactor = 2

// ReadLimit is how many records, evidence or not, a caller reads at most
// for one score (twice the record cap), stopping with Tally.Stop. Records
// a caller skips as not evidence never fill the window, and anyone may be
// able to write them (verifierd's paid calls that were never delivered),
// so without a limit of their own they would set what every score of an
// agent costs. Twice the cap keeps that cost within twice a full window's,
// and cuts an agent's evidence short only where such records outnumber
// the whole window; the window then says it is truncated. New keeps the
// cap to MaxMaxRecords; were it larger, the limit would stop at the
// largest int rather than wrap to a negative number that bounds nothing.
func (m *Method) ReadLimit() int {
	if m.maxRecords > math.MaxInt/readFactor {
		return math.MaxInt
	}
	return readFactor * m.maxRecords
}

// Evidence is one verification as the score sees it.
type Evidence struct {
	At   time.Time
	Pass bool
	// Authenticated is true when the agent's owner proved its wallet on
	// the verification; the caller must not set it for anyone else.
	Authenticated bool
}

// Counts are the evidence inside the window, exactly, split by
// authentication. An owned agent's unauthenticated counts are always 0:
// its labels are not evidence (Window.NotCounted).
type Counts struct {
	AuthenticatedPass   int64 `json:"authenticated_pass"`
	AuthenticatedFail   int64 `json:"authenticated_fail"`
	UnauthenticatedPass int64 `json:"unauthenticated_pass"`
	UnauthenticatedFail int64 `json:"unauthenticated_fail"`
}

// Total is the amount of evidence inside the window.
func (c Counts) Total() int64 {
	return c.AuthenticatedPass + c.AuthenticatedFail + c.UnauthenticatedPass + c.UnauthenticatedFail
}

// Decayed are the weighted counts the bound is computed from.
type Decayed struct {
	Pass     float64 `json:"pass"`
	Fail     float64 `json:"fail"`
	Evidence float64 `json:"evidence"` // n = pass + fail
}

// Window says which records were evidence.
type Window struct {
	// From and To bound the evidence in time: To is the moment of
	// computation, From is To minus the horizon.
	From, To time.Time
	// Records is how many verifications were evidence.
	Records int
	// NotCounted is how many verifications inside the window were read but
	// are not evidence: under an owned agent id, those its owner did not
	// authenticate, and any the caller skipped (Tally.Skip).
	NotCounted int
	// Truncated is true when the record cap was reached, or the caller
	// stopped reading inside the horizon (Tally.Stop): older
	// verifications inside the horizon were, or may have been, left out.
	Truncated bool
	// Oldest and Newest are the times of the oldest and newest evidence
	// (zero without evidence).
	Oldest, Newest time.Time
}

// Result is a score with everything it was computed from.
type Result struct {
	Score float64
	// Owned is whether the agent had an owner, so that only its owner's
	// evidence counted.
	Owned   bool
	Params  Params
	Window  Window
	Counts  Counts
	Decayed Decayed
}

// Tally accumulates evidence for one score. Feed it newest first (the
// order histories are read in) and stop when Add returns false.
type Tally struct {
	m      *Method
	owned  bool
	now    time.Time
	from   time.Time
	counts Counts
	pass   float64
	fail   float64
	n      int
	skip   int
	full   bool
	oldest time.Time
	newest time.Time
}

// Start begins a score computed at now of an agent that has an owner
// (owned) or not. Of an owned agent only authenticated evidence counts.
func (m *Method) Start(now time.Time, owned bool) *Tally {
	return &Tally{m: m, owned: owned, now: now, from: now.Add(-m.horizon)}
}

// Add counts e if it is evidence inside the window. It returns false once
// e is older than the horizon or the record cap is reached: for a history
// read newest first, nothing after that can count, so the caller can stop
// reading. A record that is not evidence (an owned agent's label) or is
// dated after the window's end (recorded while the score is computed) is
// skipped, and reading goes on.
func (t *Tally) Add(e Evidence) bool {
	if t.owned && !e.Authenticated || e.At.After(t.now) {
		return t.Skip(e.At)
	}
	if t.full || e.At.Before(t.from) {
		return false
	}
	if t.n >= t.m.maxRecords {
		t.full = true
		return false
	}
	w := math.Exp2(-float64(t.now.Sub(e.At)) / float64(t.m.halfLife))
	if !e.Authenticated {
		w *= t.m.unauthW
	}
	switch {
	case e.Pass && e.Authenticated:
		t.counts.AuthenticatedPass++
	case e.Pass:
		t.counts.UnauthenticatedPass++
	case e.Authenticated:
		t.counts.AuthenticatedFail++
	default:
		t.counts.UnauthenticatedFail++
	}
	if e.Pass {
		t.pass += w
	} else {
		t.fail += w
	}
	if t.n == 0 || e.At.Before(t.oldest) {
		t.oldest = e.At
	}
	if t.n == 0 || e.At.After(t.newest) {
		t.newest = e.At
	}
	t.n++
	return true
}

// Skip notes a record read at time at that is not evidence whoever owns
// the agent (the caller's own rule, such as a paid call whose answer was
// not delivered), as Add notes an owned agent's label. Like Add, it
// returns false once at is older than the horizon or the window is full:
// for a history read newest first, nothing after that can count.
func (t *Tally) Skip(at time.Time) bool {
	if t.full || at.Before(t.from) {
		return false
	}
	t.skip++
	return true
}

// Stop ends the window at a record of time at that the caller will not
// read, because it bounds how much one score reads: when at is inside the
// horizon, evidence may be left out, and the window says it is truncated.
func (t *Tally) Stop(at time.Time) {
	if !at.Before(t.from) {
		t.full = true
	}
}

// Result computes the score from what was added.
func (t *Tally) Result() Result {
	n := t.pass + t.fail
	return Result{
		Score:  round6(WilsonLowerBound(t.pass, n, t.m.z)),
		Owned:  t.owned,
		Params: t.m.Params(),
		Window: Window{
			From: t.from, To: t.now, Records: t.n, NotCounted: t.skip, Truncated: t.full,
			Oldest: t.oldest, Newest: t.newest,
		},
		Counts:  t.counts,
		Decayed: Decayed{Pass: round6(t.pass), Fail: round6(t.fail), Evidence: round6(n)},
	}
}

// Score computes at now the score of an agent that has an owner (owned) or
// not from its verifications, newest first.
func (m *Method) Score(now time.Time, owned bool, evidence []Evidence) Result {
	t := m.Start(now, owned)
	for _, e := range evidence {
		if !t.Add(e) {
			break
		}
	}
	return t.Result()
}

// WilsonLowerBound is the lower end of the Wilson score interval for pass
// successes out of n trials at normal quantile z; n may be fractional
// (weighted evidence). It is 0 for n ≤ 0 and always within [0, 1].
func WilsonLowerBound(pass, n, z float64) float64 {
	if !(n > 0) {
		return 0
	}
	p := math.Min(math.Max(pass/n, 0), 1)
	z2 := z * z
	centre := p + z2/(2*n)
	margin := z * math.Sqrt(p*(1-p)/n+z2/(4*n*n))
	lb := (centre - margin) / (1 + z2/n)
	return math.Min(math.Max(lb, 0), 1)
}

func round6(f float64) float64 {
	return math.Round(f*1e6) / 1e6
}
