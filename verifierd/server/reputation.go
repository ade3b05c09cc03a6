package server

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/verify"
)

// reputationPrefix is the path prefix of GET /reputation/{agent_id}.
const reputationPrefix = "/reputation/"

// Reputation is the answer of GET /reputation/{agent_id} (SPEC §8): an
// agent's free pass/fail history, counts and the newest verifications, paged
// with next_cursor. It lists what was checked (hashes) and how it came out,
// never the content, the task id, or who paid.
type Reputation struct {
	AgentID string `json:"agent_id"`
	// TestAgent is true for agent ids starting with "test-": such agents
	// are examples, and never get a trust score.
	TestAgent bool `json:"test_agent"`
	// Owned is true when the agent id has an owner (see gateway.go): then
	// only the verifications its owner authenticated count toward its
	// trust score, and the others stay here as a record.
	Owned  bool             `json:"owned"`
	Counts ReputationCounts `json:"counts"`
	// FirstVerifiedAt and LastVerifiedAt are null for an agent never seen.
	FirstVerifiedAt *string           `json:"first_verified_at"`
	LastVerifiedAt  *string           `json:"last_verified_at"`
	Verifications   []ReputationEntry `json:"verifications"`
	// NextCursor is the cursor of the next (older) page; null on the last.
	NextCursor *string `json:"next_cursor"`
}

// ReputationCounts are exact totals over the agent's whole history.
// Authenticated counts are those of calls whose agent_id was bound to the
// wallet the caller proved (X-Wallet-Auth).
type ReputationCounts struct {
	Pass              int64   `json:"pass"`
	Fail              int64   `json:"fail"`
	Total             int64   `json:"total"`
	PassRatio         float64 `json:"pass_ratio"`
	AuthenticatedPass int64   `json:"authenticated_pass"`
	AuthenticatedFail int64   `json:"authenticated_fail"`
}

// ReputationEntry is one verification of the history.
type ReputationEntry struct {
	VerificationID string `json:"verification_id"`
	VerifiedAt     string `json:"verified_at"`
	Result         string `json:"result"`
	OutputHash     string `json:"output_hash"`
	SchemaHash     string `json:"schema_hash"`
	RulesHash      string `json:"rules_hash"`
	RequestHash    string `json:"request_hash"`
	// Authenticated is the record's flag: a wallet proof bound the agent
	// id when it was made.
	Authenticated bool `json:"authenticated"`
	// CountsTowardScore is whether the record is evidence by the score's
	// rules (countsTowardScore): a delivered call (not a paid one still
	// pending or reported unpaid), any for an agent without an owner, for
	// an owned one only its owner's authenticated ones; never of a test-
	// agent. It does not say the current score counted it: that also
	// depends on the score's window, which leaves out a record past the
	// horizon, one behind max_records newer pieces of evidence, and one
	// behind the read limit of newer records, evidence or not (score's
	// ReadLimit). Working that out per record would mean reading, for each,
	// every newer record up to the limit.
	CountsTowardScore bool `json:"counts_toward_score"`
}

// serveReputation is GET /reputation/{agent_id}?limit=&cursor=.
func (s *Server) serveReputation(w http.ResponseWriter, r *http.Request, _ *requestLog) error {
	agent := strings.TrimPrefix(r.URL.Path, reputationPrefix)
	var fields []apierr.Field
	if agent == "" || utf8.RuneCountInString(agent) > 200 || !utf8.ValidString(agent) {
		fields = append(fields, apierr.Field{Field: "agent_id", Problem: "must be 1 to 200 characters",
			Fix: "Put the agent_id used in verification requests in the path, URL-encoded: /reputation/seller-7."})
	}
	q := r.URL.Query()
	limit := store.DefaultPageSize
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > store.MaxPageSize {
			fields = append(fields, apierr.Field{Field: "limit", Problem: "is not a whole number from 1 to " + strconv.Itoa(store.MaxPageSize),
				Fix: "Send limit between 1 and " + strconv.Itoa(store.MaxPageSize) + ", or leave it out for " + strconv.Itoa(store.DefaultPageSize) + "."})
		} else {
			limit = n
		}
	}
	if len(fields) > 0 {
		return apierr.Invalid(fields...)
	}
	cursor := q.Get("cursor")
	// The reads are bounded like the record (storeBy): a stalled store is
	// a 503, not a request held for as long as the store is stalled.
	ctx, cancel := context.WithDeadline(r.Context(), s.gatewayInfo(r.Header, r.RemoteAddr).storeBy(time.Now()))
	defer cancel()
	vs, next, err := s.history.Verifications(ctx, agent, cursor, limit)
	if errors.Is(err, store.ErrBadCursor) {
		return apierr.Invalid(apierr.Field{Field: "cursor", Problem: "is not a cursor this service handed out",
			Fix: "Send the next_cursor of the previous page unchanged, or leave cursor out for the newest page."})
	}
	if err != nil {
		return apierr.Unavailable("verification history store", 5, err)
	}
	c, err := s.history.AgentCounts(ctx, agent)
	if err != nil {
		return apierr.Unavailable("verification history store", 5, err)
	}
	owner, err := s.scoreOwner(ctx, agent)
	if err != nil {
		return err
	}
	testAgent := strings.HasPrefix(agent, store.TestAgentPrefix)
	rep := Reputation{
		AgentID:   agent,
		TestAgent: testAgent,
		Owned:     owner != "",
		Counts: ReputationCounts{
			Pass: c.Pass, Fail: c.Fail, Total: c.Total(),
			AuthenticatedPass: c.AuthenticatedPass, AuthenticatedFail: c.AuthenticatedFail,
		},
		Verifications: make([]ReputationEntry, 0, len(vs)),
	}
	if c.Total() > 0 {
		rep.Counts.PassRatio = float64(int64(float64(c.Pass)/float64(c.Total())*1e6+0.5)) / 1e6
		first, last := verify.FormatTime(c.First), verify.FormatTime(c.Last)
		rep.FirstVerifiedAt, rep.LastVerifiedAt = &first, &last
	}
	for _, v := range vs {
		rep.Verifications = append(rep.Verifications, ReputationEntry{
			VerificationID:    v.ID,
			VerifiedAt:        verify.FormatTime(v.VerifiedAt.Truncate(time.Microsecond)),
			Result:            v.Result,
			OutputHash:        v.OutputHash,
			SchemaHash:        v.SchemaHash,
			RulesHash:         v.RulesHash,
			RequestHash:       v.RequestHash,
			Authenticated:     v.Authenticated,
			CountsTowardScore: !testAgent && countsTowardScore(v, owner),
		})
	}
	if next != "" {
		rep.NextCursor = &next
	}
	body, err := json.Marshal(rep)
	if err != nil {
		return apierr.Internal(err)
	}
	writeDoc(w, r, append(body, '\n'))
	return nil
}
