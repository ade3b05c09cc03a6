package server

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/receipt"
	"github.com/aovhq/aov/score"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/verify"
)

// scorePrefix is the path prefix of GET /score/{agent_id}.
const scorePrefix = "/score/"

// ScoreDocument is the answer of GET /score/{agent_id} and of the MCP tool
// get_verification_record (SPEC §8): the agent's trust score, the method
// and every input it was computed from, signed under the trust-score
// context. An agent with no history gets a document too: score 0, no
// evidence, signed; that is a true statement about the agent.
type ScoreDocument struct {
	AgentID string `json:"agent_id"`
	// Score is in [0, 1]: the time-decayed Wilson lower bound of the
	// agent's pass rate (package score).
	Score  float64     `json:"score"`
	Method ScoreMethod `json:"method"`
	Inputs ScoreInputs `json:"inputs"`
	// Counts are exact all-time totals, authenticated apart from
	// unauthenticated; the score itself uses only the window's evidence.
	Counts     ScoreCounts         `json:"counts"`
	ComputedAt string              `json:"computed_at"`
	Verify     receipt.VerifyBlock `json:"verify"`
}

// ScoreMethod names the method and the parameters in force, so a reader can
// recompute the score from the inputs.
type ScoreMethod struct {
	Name        string       `json:"name"`
	Version     string       `json:"version"`
	Description string       `json:"description"`
	Params      score.Params `json:"params"`
}

// ScoreInputs are what the score was computed from.
type ScoreInputs struct {
	// Owned is whether the agent id has an owner (see gateway.go), so that
	// only its owner's verifications are evidence.
	Owned   bool          `json:"owned"`
	Window  ScoreWindow   `json:"window"`
	Counts  score.Counts  `json:"counts"`
	Decayed score.Decayed `json:"decayed"`
}

// ScoreWindow is the evidence window: from (computed_at minus the
// horizon) to computed_at, how many verifications were evidence, how many
// of those recorded under the id were not (notCounted), and whether the
// record cap left older ones out.
type ScoreWindow struct {
	From       string  `json:"from"`
	To         string  `json:"to"`
	Records    int     `json:"records"`
	NotCounted int     `json:"not_counted"`
	Truncated  bool    `json:"truncated"`
	Oldest     *string `json:"oldest_evidence_at"`
	Newest     *string `json:"newest_evidence_at"`
}

// ScoreCounts are an agent's all-time totals.
type ScoreCounts struct {
	Authenticated   PassFail `json:"authenticated"`
	Unauthenticated PassFail `json:"unauthenticated"`
	Total           int64    `json:"total"`
}

// PassFail is a pair of counts.
type PassFail struct {
	Pass int64 `json:"pass"`
	Fail int64 `json:"fail"`
}

// methodDescription is published in every score document.
const methodDescription = "Lower bound of the Wilson score interval of the pass rate over the agent's verifications, " +
	"each weighted by 2^(-age/half-life) and by the authenticated or unauthenticated weight; " +
	"of an agent id with an owner only the verifications its owner authenticated count; " +
	"0 without evidence. test- agents are never scored."

// scorePageSize is how many records one read of the history returns while
// a score is computed.
const scorePageSize = store.MaxPageSize

// serveScore is GET /score/{agent_id}. Payment is the gateway's business:
// the route is priced there and never free, so verifierd serves it only to
// the gateway (paidRoute).
func (s *Server) serveScore(w http.ResponseWriter, r *http.Request, _ *requestLog) error {
	gw := s.gatewayInfo(r.Header, r.RemoteAddr)
	if err := s.paidRoute(gw); err != nil {
		return err
	}
	doc, err := s.scoreAgent(r.Context(), gw, strings.TrimPrefix(r.URL.Path, scorePrefix))
	if err != nil {
		return err
	}
	writeDoc(w, r, doc)
	return nil
}

// paidRoute refuses a paid route (the score, REST or MCP) to a caller that
// did not come through the gateway, which is where it is paid for: without
// the gateway token anyone who reaches verifierd's listener would get it
// free. Started with UngatedPaidRoutes (development), it serves everyone.
func (s *Server) paidRoute(gw gatewayInfo) error {
	if gw.trusted || s.ungated {
		return nil
	}
	return apierr.Forbidden("this paid route is served only through the gateway, which takes its payment", "use_gateway",
		apierr.Field{Field: HeaderGatewayToken, Problem: "is missing or wrong",
			Fix: "Call the service's public URL (the gateway); verifierd's own listener serves paid routes only to it."})
}

// scoreAgent computes, signs and returns agent's score document. A test-
// agent is refused (422): such ids are examples and never get a score.
// The store reads are bounded like a record (gw's storeBy): a stalled
// store is a 503, not a request held for as long as the store is stalled.
// Signing keeps ctx: the signer has its own bounds.
func (s *Server) scoreAgent(ctx context.Context, gw gatewayInfo, agent string) ([]byte, error) {
	if err := score.CheckAgent(agent); err != nil {
		return nil, err
	}
	rctx, cancel := context.WithDeadline(ctx, gw.storeBy(time.Now()))
	defer cancel()
	// Only the owner's verifications are authenticated evidence (see
	// gateway.go), whatever a record says, and of an owned agent nothing
	// else is evidence.
	owner, err := s.scoreOwner(rctx, agent)
	if err != nil {
		return nil, err
	}
	at := s.now().UTC().Truncate(time.Microsecond)
	// Of an owned agent only the authenticated records are read (the
	// store's authenticated index): the labels anyone can record under its
	// id are not evidence, and reading them would let a flood of them slow
	// every score of it (BenchmarkScore10k). verifierd marks a record
	// authenticated only for the id's owner, and ownerEvidence still
	// checks each one.
	page := s.history.Verifications
	if owner != "" {
		page = s.history.AuthenticatedVerifications
	}
	tally := s.score.Start(at, owner != "")
	// What one score reads, evidence or not, is bounded by the method's
	// read limit (ReadLimit says why), whatever others left under the id.
	limit := s.score.ReadLimit()
	cursor, read := "", 0
	for more := true; more; {
		// The last page asks for one record past the limit: whether one
		// is there, and how old, says whether the window is truncated.
		vs, next, err := page(rctx, agent, cursor, min(scorePageSize, limit-read+1))
		if err != nil {
			return nil, apierr.Unavailable("verification history store", 5, err)
		}
		for _, v := range vs {
			if read == limit {
				tally.Stop(v.VerifiedAt)
				more = false
				break
			}
			read++
			if countsTowardScore(v, owner) {
				more = tally.Add(score.Evidence{At: v.VerifiedAt, Pass: v.Result == "pass", Authenticated: ownerEvidence(v, owner)})
			} else {
				more = tally.Skip(v.VerifiedAt)
			}
			if !more {
				break
			}
		}
		cursor = next
		more = more && next != ""
	}
	c, err := s.history.AgentCounts(rctx, agent)
	if err != nil {
		return nil, apierr.Unavailable("verification history store", 5, err)
	}
	cancel()
	res := tally.Result()
	doc := ScoreDocument{
		AgentID: agent,
		Score:   res.Score,
		Method: ScoreMethod{
			Name: score.MethodName, Version: score.MethodVersion,
			Description: methodDescription, Params: res.Params,
		},
		Inputs: ScoreInputs{
			Owned: res.Owned,
			Window: ScoreWindow{
				From:       verify.FormatTime(res.Window.From),
				To:         verify.FormatTime(res.Window.To),
				Records:    res.Window.Records,
				NotCounted: notCounted(c, res),
				Truncated:  res.Window.Truncated,
				Oldest:     optTime(res.Window.Oldest),
				Newest:     optTime(res.Window.Newest),
			},
			Counts:  res.Counts,
			Decayed: res.Decayed,
		},
		Counts: ScoreCounts{
			Authenticated:   PassFail{Pass: c.AuthenticatedPass, Fail: c.AuthenticatedFail},
			Unauthenticated: PassFail{Pass: c.Pass - c.AuthenticatedPass, Fail: c.Fail - c.AuthenticatedFail},
			Total:           c.Total(),
		},
		ComputedAt: verify.FormatTime(at),
	}
	signed, _, err := s.sign(ctx, receipt.ContextScore, doc.ComputedAt, func(kv string) ([]byte, error) {
		doc.Verify = s.verify
		doc.Verify.KeyVersion = kv
		return json.Marshal(doc)
	})
	if err != nil {
		return nil, err
	}
	return signed, nil
}

// scoreOwner is the owner whose evidence alone counts in agent's score, ""
// for an agent without one (whose every verification counts as a label).
func (s *Server) scoreOwner(ctx context.Context, agent string) (string, error) {
	owner, err := s.ownerOf(ctx, agent, "")
	if err != nil {
		return "", apierr.Unavailable("agent owner store", 5, err)
	}
	return owner, nil
}

// countsTowardScore reports whether a recorded verification is evidence in
// its agent's score (age and the window's bounds aside): a delivered one
// (store's Counted: not a paid call still pending or reported unpaid),
// under an agent without an owner any, under an owned one only the
// owner's. The score reads with it and /reputation flags each record with
// it, so the two cannot disagree.
func countsTowardScore(v store.Verification, owner string) bool {
	return v.Counted() && (owner == "" || ownerEvidence(v, owner))
}

// notCounted is how many delivered verifications recorded under the id are
// not evidence of res: counts.total minus window.records, so others'
// labels of an owned id, and records older than the horizon or beyond the
// record cap. It comes from the exact counts, not from reading those
// records: a score of an owned id never reads its labels.
func notCounted(c store.Counts, res score.Result) int {
	return max(int(c.Total())-res.Window.Records, 0)
}

func optTime(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	s := verify.FormatTime(t.UTC().Truncate(time.Microsecond))
	return &s
}
