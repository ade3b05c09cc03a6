package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/store"
)

// Settlement outcomes, reported by the gateway.
//
// A paid verification (REST, or the MCP tool verify_schema) is recorded
// before it is paid for: the gateway settles only once the answer exists.
// The gateway forwards such a call with X-Aov-Settlement: pending;
// verifierd records it as payment "pending" (kept, not counted toward
// counts, reputation or score) and asks for the outcome with
// X-Aov-Settlement-Report on its HTTP answer (for MCP, the one carrying the
// tool result). After settling, the
// gateway POSTs {"verification_id", "payment": "paid"|"unpaid"} to that
// path over the same authenticated channel (the gateway token); verifierd
// then counts a paid one and leaves an unpaid one (its answer was never
// delivered) out. An outcome is recorded once: a later report changes
// nothing.
//
// A gateway that has several outcomes to report at once sends them in one
// request, {"reports": [{"verification_id", "payment"}, ...]} (at most
// MaxSettlementBatch), recorded in one transaction of the history store
// (one commit for the batch). It is answered 204 when every outcome in it
// is recorded (or was final already). When some name a verification the
// history does not have (a row lost in a database failover, a report sent
// to an instance with another history), the others are recorded all the
// same, and the answer is 200 {"results": [...]}, one per report in the
// batch's order (SettlementRecorded, SettlementFinal, SettlementNotFound):
// a 404 for the whole batch would have the gateway take the recorded ones
// for unreported and send them again, and send again an outcome that no
// retry can record. A failure of the store records none of them: 503, and
// the gateway retries them all.
const (
	// PathSettlement is where the gateway reports outcomes.
	PathSettlement = "/v1/gateway/settlement"
	// HeaderSettlementReport on an answer asks the gateway to report its
	// settlement's outcome to the path it names.
	HeaderSettlementReport = "X-Aov-Settlement-Report"
	// MaxSettlementBatch bounds the outcomes of one batched report.
	MaxSettlementBatch = 256
)

// The result of each report of a batch, when the batch is answered 200.
const (
	// SettlementRecorded: the outcome is recorded now.
	SettlementRecorded = "recorded"
	// SettlementFinal: an outcome was recorded before; this one changed
	// nothing.
	SettlementFinal = "final"
	// SettlementNotFound: the history has no such verification; resending
	// the report cannot record it.
	SettlementNotFound = "not_found"
)

// maxSettlementBody bounds a report's body: a batch of MaxSettlementBatch
// outcomes with ids of up to 128 bytes.
const maxSettlementBody = MaxSettlementBatch * 192

// askSettlementReport asks the gateway for the outcome of a call recorded
// as pending (payment is what was recorded, "" if nothing was). An MCP
// tool call asks on the HTTP answer that carries its result, as REST does.
func askSettlementReport(w http.ResponseWriter, payment string) {
	if payment == store.PaymentPending {
		w.Header().Set(HeaderSettlementReport, PathSettlement)
	}
}

// settlementSetter is the part of a history store that records outcomes.
type settlementSetter interface {
	SetPayments(ctx context.Context, outs []store.PaymentOutcome) ([]error, error)
}

// serveSettlement records a settlement outcome the gateway reports. Only
// the gateway (its token) may report; anyone else is 404, as if the path
// did not exist.
func (s *Server) serveSettlement(w http.ResponseWriter, r *http.Request, _ *requestLog) error {
	if !s.gatewayInfo(r.Header, r.RemoteAddr).trusted {
		return apierr.NotFound("endpoint")
	}
	set, ok := s.history.(settlementSetter)
	if !ok {
		return apierr.NotFound("endpoint")
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, maxSettlementBody+1))
	if err != nil {
		return apierr.Unavailable("gateway", 1, err)
	}
	reps, batch, ok := decodeSettlementReports(b)
	if !ok {
		return &apierr.Error{Code: "invalid_request", Status: http.StatusUnprocessableEntity,
			Message: fmt.Sprintf("A settlement report is {\"verification_id\": <id>, \"payment\": \"paid\"|\"unpaid\"}, or {\"reports\": [...]} of 1 to %d of them.", MaxSettlementBatch)}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 10*time.Second)
	defer cancel()
	errs, err := set.SetPayments(ctx, reps)
	if err != nil {
		return apierr.Unavailable("verification history store", 5, fmt.Errorf("recording settlement outcomes: %w", err))
	}
	notFound := false
	for _, err := range errs {
		switch {
		case err == nil, errors.Is(err, store.ErrPaymentFinal):
		case errors.Is(err, store.ErrNotFound) && batch:
			notFound = true
		case errors.Is(err, store.ErrNotFound):
			return apierr.NotFound("verification")
		default:
			return apierr.Unavailable("verification history store", 5, fmt.Errorf("recording a settlement outcome: %w", err))
		}
	}
	if !notFound {
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	writeDoc(w, r, settlementResults(errs))
	return nil
}

// settlementResults is the 200 answer to a batch: {"results": [...]}, the
// result of each report in order. It names no id (the gateway knows its
// batch's order), so it echoes nothing the request carried.
func settlementResults(errs []error) []byte {
	doc := []byte(`{"results":[`)
	for i, err := range errs {
		if i > 0 {
			doc = append(doc, ',')
		}
		res := SettlementRecorded
		switch {
		case errors.Is(err, store.ErrPaymentFinal):
			res = SettlementFinal
		case errors.Is(err, store.ErrNotFound):
			res = SettlementNotFound
		}
		doc = append(append(append(doc, '"'), res...), '"')
	}
	return append(doc, "]}"...)
}

// settlementReport is one reported outcome.
type settlementReport struct {
	VerificationID string `json:"verification_id"`
	Payment        string `json:"payment"`
}

// decodeSettlementReports reads a report body: one outcome, or a batch of
// 1 to MaxSettlementBatch (batch set). Unknown members, an empty id and any
// payment but paid or unpaid are refused.
func decodeSettlementReports(b []byte) (outs []store.PaymentOutcome, batch, ok bool) {
	if len(b) > maxSettlementBody {
		return nil, false, false
	}
	var body struct {
		settlementReport
		Reports []settlementReport `json:"reports"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil || dec.More() {
		return nil, false, false
	}
	reps := body.Reports
	switch {
	case reps == nil && body.VerificationID == "" && body.Payment == "":
		return nil, false, false
	case reps == nil:
		reps = []settlementReport{body.settlementReport}
	case body.VerificationID != "" || body.Payment != "" || len(reps) == 0 || len(reps) > MaxSettlementBatch:
		return nil, false, false
	}
	outs = make([]store.PaymentOutcome, len(reps))
	for i, rep := range reps {
		outs[i] = store.PaymentOutcome{ID: rep.VerificationID, Payment: rep.Payment}
		if rep.VerificationID == "" || outs[i].Check() != nil {
			return nil, false, false
		}
	}
	return outs, body.Reports != nil, true
}
