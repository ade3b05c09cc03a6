package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/verifierd/server"
)

// A paid call the gateway marks pending is recorded pending, uncounted, and
// asks for a report; the gateway's report (with its token) records the
// outcome once; anyone without the token is 404 and changes nothing.
func TestSettlementReports(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	pending := map[string]string{"X-Aov-Gateway-Token": gatewayToken, "X-Aov-Payment": "paid", "X-Aov-Settlement": "pending"}
	verifyPending := func() string {
		t.Helper()
		w := f.do(http.MethodPost, "/verify/schema", invoice("129.5", ""), pending)
		if w.Code != http.StatusOK || w.Header().Get("X-Aov-Settlement-Report") != "/v1/gateway/settlement" {
			t.Fatalf("status %d, report header %q", w.Code, w.Header().Get("X-Aov-Settlement-Report"))
		}
		return decode(t, w)["verification_id"].(string)
	}
	payment := func(id string) string {
		t.Helper()
		rec, err := f.db.Verification(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		return rec.Payment
	}
	report := func(hdr map[string]string, id, outcome string) int {
		t.Helper()
		h := map[string]string{"Content-Type": "application/json"}
		for k, v := range hdr {
			h[k] = v
		}
		return f.do(http.MethodPost, "/v1/gateway/settlement", []byte(`{"verification_id":"`+id+`","payment":"`+outcome+`"}`), h).Code
	}
	gw := map[string]string{"X-Aov-Gateway-Token": gatewayToken}

	paid, unpaid := verifyPending(), verifyPending()
	if payment(paid) != store.PaymentPending {
		t.Fatalf("recorded %q, want pending", payment(paid))
	}
	if code := report(nil, paid, "paid"); code != http.StatusNotFound || payment(paid) != store.PaymentPending {
		t.Fatalf("a report without the gateway token: %d, record %q", code, payment(paid))
	}
	if code := report(gw, paid, "paid"); code != http.StatusNoContent || payment(paid) != store.PaymentPaid {
		t.Fatalf("paid report: %d, record %q", code, payment(paid))
	}
	if code := report(gw, unpaid, "unpaid"); code != http.StatusNoContent || payment(unpaid) != store.PaymentUnpaid {
		t.Fatalf("unpaid report: %d, record %q", code, payment(unpaid))
	}
	if code := report(gw, paid, "unpaid"); code != http.StatusNoContent || payment(paid) != store.PaymentPaid {
		t.Fatalf("a second report changed the record: %d, %q", code, payment(paid))
	}
	if code := report(gw, paid, "free"); code != http.StatusUnprocessableEntity {
		t.Fatalf("a report of %q: %d", "free", code)
	}
	if code := report(gw, "no-such-id", "paid"); code != http.StatusNotFound {
		t.Fatalf("a report of an unknown id: %d", code)
	}
	c, err := f.db.AgentCounts(context.Background(), "seller-7")
	if err != nil {
		t.Fatal(err)
	}
	if c.Paid != 1 || c.Total() != 1 {
		t.Fatalf("counts %+v: only the paid call counts", c)
	}
}

// The MCP tool verify_schema follows the same mechanism: marked pending by
// the gateway, it is recorded pending and its HTTP answer asks for the
// report; the score tool records nothing and asks for none; a call the
// gateway did not mark (free, or an unknown caller) asks for none.
func TestSettlementReportsOverMCP(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	pending := map[string]string{"X-Aov-Gateway-Token": gatewayToken, "X-Aov-Payment": "paid", "X-Aov-Settlement": "pending",
		"Accept": "application/json, text/event-stream"}
	free := map[string]string{"X-Aov-Gateway-Token": gatewayToken, "X-Aov-Payment": "free", "X-Aov-Settlement": "pending",
		"Accept": "application/json, text/event-stream"}
	toolResult := func(hdr map[string]string, tool string, args []byte) (report string, doc map[string]any) {
		t.Helper()
		w := f.do(http.MethodPost, "/mcp", mcpCall(tool, args), hdr)
		var resp struct {
			Result struct {
				IsError           bool           `json:"isError"`
				StructuredContent map[string]any `json:"structuredContent"`
			} `json:"result"`
		}
		if w.Code != http.StatusOK || json.Unmarshal(w.Body.Bytes(), &resp) != nil || resp.Result.IsError {
			t.Fatalf("%s: status %d: %s", tool, w.Code, w.Body.Bytes())
		}
		return w.Header().Get("X-Aov-Settlement-Report"), resp.Result.StructuredContent
	}
	ctx := context.Background()

	report, doc := toolResult(pending, "verify_schema", invoice("129.5", ""))
	if report != "/v1/gateway/settlement" {
		t.Fatalf("a pending tool call asked for report %q", report)
	}
	rec, err := f.db.Verification(ctx, doc["verification_id"].(string))
	if err != nil || rec.Payment != store.PaymentPending || rec.Counted() {
		t.Fatalf("recorded %+v, %v; want pending, uncounted", rec, err)
	}
	report, doc = toolResult(free, "verify_schema", invoice("129.5", ""))
	if rec, err := f.db.Verification(ctx, doc["verification_id"].(string)); report != "" || err != nil || rec.Payment != store.PaymentFree {
		t.Fatalf("a free tool call: report %q, recorded %+v, %v", report, rec, err)
	}
	before, _, _ := f.db.Verifications(ctx, "", "", 10)
	if report, _ := toolResult(pending, "get_verification_record", []byte(`{"agent_id":"seller-7"}`)); report != "" {
		t.Fatalf("the score tool asked for report %q", report)
	}
	if after, _, _ := f.db.Verifications(ctx, "", "", 10); len(after) != len(before) {
		t.Fatalf("the score tool recorded something: %d records, then %d", len(before), len(after))
	}
}

// A verification the gateway has stopped waiting for (its X-Aov-Answer-By
// has passed, or will have by the time the answer reaches it) is neither
// signed nor recorded: it would count for an agent although no buyer saw
// it. The header is believed only with the gateway token.
func TestNoRecordAfterTheGatewayGaveUp(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	by := func(d time.Duration) string { return strconv.FormatInt(time.Now().Add(d).UnixMilli(), 10) }
	for _, tc := range []struct {
		name   string
		hdr    map[string]string
		status int
	}{
		{"passed", map[string]string{"X-Aov-Gateway-Token": gatewayToken, "X-Aov-Payment": "free", "X-Aov-Answer-By": by(-time.Second)}, http.StatusServiceUnavailable},
		{"within the margin", map[string]string{"X-Aov-Gateway-Token": gatewayToken, "X-Aov-Payment": "free", "X-Aov-Answer-By": by(20 * time.Millisecond)}, http.StatusServiceUnavailable},
		{"in time", map[string]string{"X-Aov-Gateway-Token": gatewayToken, "X-Aov-Payment": "free", "X-Aov-Answer-By": by(10 * time.Second)}, http.StatusOK},
		{"not from the gateway", map[string]string{"X-Aov-Answer-By": by(-time.Second)}, http.StatusOK},
		{"unreadable", map[string]string{"X-Aov-Gateway-Token": gatewayToken, "X-Aov-Payment": "free", "X-Aov-Answer-By": "soon"}, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, err := f.db.AgentCounts(context.Background(), "seller-7")
			if err != nil {
				t.Fatal(err)
			}
			w := f.do(http.MethodPost, "/verify/schema", invoice("129.5", ""), tc.hdr)
			if w.Code != tc.status {
				t.Fatalf("status %d, want %d: %s", w.Code, tc.status, w.Body)
			}
			after, err := f.db.AgentCounts(context.Background(), "seller-7")
			if err != nil {
				t.Fatal(err)
			}
			recorded := after.Total() - before.Total()
			if want := map[bool]int64{true: 1, false: 0}[tc.status == http.StatusOK]; recorded != want {
				t.Fatalf("recorded %d verifications, want %d", recorded, want)
			}
			if tc.status != http.StatusOK {
				var e map[string]any
				if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e["code"] != "upstream_unavailable" || e["charged"] != false {
					t.Fatalf("refusal %s", w.Body)
				}
			}
		})
	}
}

// slowDisk is a fake: the real store behind a history write that takes
// delay before it reaches the store's group commit (a slow disk, or a
// commit queue the process was stalled in).
type slowDisk struct {
	*store.DB
	delay time.Duration
}

func (d slowDisk) RecordVerification(ctx context.Context, v store.Verification) error {
	time.Sleep(d.delay)
	return d.DB.RecordVerification(ctx, v)
}

// A verification whose history write is still waiting when the gateway's
// answer-by time (less the margin) passes is not recorded: the store gets
// the gateway's deadline and checks it at the last instant before the
// write, and the answer is the same refusal as for one signed too late.
func TestNoRecordWhenTheWriteOutlastsTheGateway(t *testing.T) {
	f := newFixture(t, fixtureOpts{history: func(db *store.DB) server.History {
		return slowDisk{db, 300 * time.Millisecond}
	}})
	hdr := map[string]string{"X-Aov-Gateway-Token": gatewayToken, "X-Aov-Payment": "free",
		"X-Aov-Answer-By": strconv.FormatInt(time.Now().Add(350*time.Millisecond).UnixMilli(), 10)}
	w := f.do(http.MethodPost, "/verify/schema", invoice("129.5", ""), hdr)
	var e map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &e); w.Code != http.StatusServiceUnavailable || err != nil || e["code"] != "upstream_unavailable" || e["charged"] != false {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	if c, err := f.db.AgentCounts(context.Background(), "seller-7"); err != nil || c.Total() != 0 {
		t.Fatalf("recorded %+v, %v", c, err)
	}
	// Without an answer-by time the same slow write is recorded.
	delete(hdr, "X-Aov-Answer-By")
	if w := f.do(http.MethodPost, "/verify/schema", invoice("129.5", ""), hdr); w.Code != http.StatusOK {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	if c, err := f.db.AgentCounts(context.Background(), "seller-7"); err != nil || c.Total() != 1 {
		t.Fatalf("recorded %+v, %v", c, err)
	}
}

// A gateway reporting several outcomes at once sends them in one batch:
// each is recorded as a single report would be, the answer is 204 only
// when all are, and a malformed batch records nothing.
func TestSettlementReportBatches(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	pending := map[string]string{"X-Aov-Gateway-Token": gatewayToken, "X-Aov-Payment": "paid", "X-Aov-Settlement": "pending"}
	gw := map[string]string{"X-Aov-Gateway-Token": gatewayToken, "Content-Type": "application/json"}
	ctx := context.Background()
	verifyPending := func() string {
		t.Helper()
		w := f.do(http.MethodPost, "/verify/schema", invoice("129.5", ""), pending)
		if w.Code != http.StatusOK {
			t.Fatalf("status %d", w.Code)
		}
		return decode(t, w)["verification_id"].(string)
	}
	payment := func(id string) string {
		t.Helper()
		rec, err := f.db.Verification(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return rec.Payment
	}
	type rep struct {
		ID      string `json:"verification_id"`
		Payment string `json:"payment"`
	}
	batch := func(hdr map[string]string, reps ...rep) int {
		t.Helper()
		b, _ := json.Marshal(map[string][]rep{"reports": reps})
		return f.do(http.MethodPost, "/v1/gateway/settlement", b, hdr).Code
	}

	ids := make([]string, 6)
	for i := range ids {
		ids[i] = verifyPending()
	}
	if code := batch(map[string]string{"Content-Type": "application/json"}, rep{ids[0], "paid"}); code != http.StatusNotFound || payment(ids[0]) != store.PaymentPending {
		t.Fatalf("a batch without the gateway token: %d, record %q", code, payment(ids[0]))
	}
	if code := batch(gw, rep{ids[0], "paid"}, rep{ids[1], "unpaid"}, rep{ids[2], "paid"}); code != http.StatusNoContent {
		t.Fatalf("batch: %d", code)
	}
	for i, want := range []string{store.PaymentPaid, store.PaymentUnpaid, store.PaymentPaid, store.PaymentPending} {
		if got := payment(ids[i]); got != want {
			t.Fatalf("record %d: %q, want %q", i, got, want)
		}
	}
	// An unknown id does not fail the batch (TestSettlementBatchWithAnUnknownID);
	// recorded ones repeated change nothing.
	if code := batch(gw, rep{ids[0], "unpaid"}, rep{"no-such-id", "paid"}, rep{ids[3], "paid"}); code != http.StatusOK {
		t.Fatalf("a batch with an unknown id: %d", code)
	}
	if payment(ids[0]) != store.PaymentPaid || payment(ids[3]) != store.PaymentPaid {
		t.Fatalf("records %q %q after a batch with an unknown id", payment(ids[0]), payment(ids[3]))
	}
	many := make([]rep, server.MaxSettlementBatch+1)
	for i := range many {
		many[i] = rep{ids[4], "paid"}
	}
	for name, body := range map[string]string{
		"empty":            `{"reports":[]}`,
		"a free outcome":   `{"reports":[{"verification_id":"` + ids[4] + `","payment":"paid"},{"verification_id":"` + ids[5] + `","payment":"free"}]}`,
		"no id":            `{"reports":[{"verification_id":"` + ids[4] + `","payment":"paid"},{"payment":"paid"}]}`,
		"both forms":       `{"verification_id":"` + ids[4] + `","payment":"paid","reports":[{"verification_id":"` + ids[5] + `","payment":"paid"}]}`,
		"an unknown field": `{"reports":[{"verification_id":"` + ids[4] + `","payment":"paid","note":1}]}`,
		"not a list":       `{"reports":{"verification_id":"` + ids[4] + `","payment":"paid"}}`,
		"nothing":          `{}`,
		"too many":         func() string { b, _ := json.Marshal(map[string][]rep{"reports": many}); return string(b) }(),
	} {
		if code := f.do(http.MethodPost, "/v1/gateway/settlement", []byte(body), gw).Code; code != http.StatusUnprocessableEntity {
			t.Fatalf("%s: %d, want 422", name, code)
		}
	}
	if payment(ids[4]) != store.PaymentPending || payment(ids[5]) != store.PaymentPending {
		t.Fatalf("a refused batch recorded %q %q", payment(ids[4]), payment(ids[5]))
	}
	c, err := f.db.AgentCounts(ctx, "seller-7")
	if err != nil {
		t.Fatal(err)
	}
	if c.Paid != 3 || c.Total() != 3 {
		t.Fatalf("counts %+v: the three paid calls count", c)
	}
	// The store failing the batch's transaction is the store's outage (the
	// gateway retries), not any outcome's refusal.
	f.db.Close()
	w := f.do(http.MethodPost, "/v1/gateway/settlement", []byte(`{"reports":[{"verification_id":"`+ids[4]+`","payment":"paid"},{"verification_id":"`+ids[5]+`","payment":"paid"}]}`), gw)
	var e map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &e); w.Code != http.StatusServiceUnavailable || err != nil || e["code"] != "upstream_unavailable" {
		t.Fatalf("a batch the store cannot take: %d %s, want 503 upstream_unavailable", w.Code, w.Body)
	}
}

// A batch holding an id the history does not know (a row lost in a
// PostgreSQL failover, a report sent to the wrong instance) records every
// other outcome and says per report what happened, in the batch's order:
// 200 {"results": ["recorded" | "final" | "not_found", ...]}. Before, the
// whole batch was answered 404, and the gateway took every outcome in it
// for unreported and sent each again. A single report of an unknown id is
// still 404. Run on both histories.
func TestSettlementBatchWithAnUnknownID(t *testing.T) {
	type history interface {
		Verification(ctx context.Context, id string) (store.Verification, error)
		AgentCounts(ctx context.Context, agentID string) (store.Counts, error)
	}
	for name, newF := range map[string]func(t *testing.T) (*fixture, history){
		"badger": func(t *testing.T) (*fixture, history) {
			f := newFixture(t, fixtureOpts{})
			return f, f.db
		},
		"postgres": func(t *testing.T) (*fixture, history) {
			f, _, direct := pgFixture(t)
			return f, direct
		},
	} {
		t.Run(name, func(t *testing.T) {
			f, h := newF(t)
			ctx := context.Background()
			pending := map[string]string{"X-Aov-Gateway-Token": gatewayToken, "X-Aov-Payment": "paid", "X-Aov-Settlement": "pending"}
			gw := map[string]string{"X-Aov-Gateway-Token": gatewayToken, "Content-Type": "application/json"}
			ids := make([]string, 2)
			for i := range ids {
				w := f.do(http.MethodPost, "/verify/schema", invoice("129.5", ""), pending)
				if w.Code != http.StatusOK {
					t.Fatalf("status %d: %s", w.Code, w.Body)
				}
				ids[i] = decode(t, w)["verification_id"].(string)
			}
			body := `{"reports":[{"verification_id":"` + ids[0] + `","payment":"paid"},{"verification_id":"no-such-id","payment":"paid"},` +
				`{"verification_id":"` + ids[1] + `","payment":"unpaid"},{"verification_id":"` + ids[0] + `","payment":"unpaid"}]}`
			w := f.do(http.MethodPost, "/v1/gateway/settlement", []byte(body), gw)
			if w.Code != http.StatusOK {
				t.Fatalf("status %d: %s", w.Code, w.Body)
			}
			if got, want := w.Body.String(), `{"results":["recorded","not_found","recorded","final"]}`; got != want {
				t.Fatalf("answer %s, want %s", got, want)
			}
			for i, want := range []string{store.PaymentPaid, store.PaymentUnpaid} {
				if rec, err := h.Verification(ctx, ids[i]); err != nil || rec.Payment != want {
					t.Fatalf("record %d: %+v, %v; want %s", i, rec, err, want)
				}
			}
			if c, err := h.AgentCounts(ctx, "seller-7"); err != nil || c.Paid != 1 || c.Total() != 1 {
				t.Fatalf("counts %+v, %v: the paid call counts once", c, err)
			}
			// All known: 204 as before, no body.
			w = f.do(http.MethodPost, "/v1/gateway/settlement", []byte(`{"reports":[{"verification_id":"`+ids[0]+`","payment":"paid"},{"verification_id":"`+ids[1]+`","payment":"paid"}]}`), gw)
			if w.Code != http.StatusNoContent || w.Body.Len() != 0 {
				t.Fatalf("a batch of known ids: %d %s", w.Code, w.Body)
			}
			w = f.do(http.MethodPost, "/v1/gateway/settlement", []byte(`{"verification_id":"no-such-id","payment":"paid"}`), gw)
			if w.Code != http.StatusNotFound {
				t.Fatalf("a single report of an unknown id: %d %s", w.Code, w.Body)
			}
		})
	}
}

// FuzzSettlementReport: whatever the gateway's channel carries, a report
// is recorded only as paid or unpaid, and nothing panics.
func FuzzSettlementReport(f *testing.F) {
	fx := newFixture(f, fixtureOpts{})
	pending := map[string]string{"X-Aov-Gateway-Token": gatewayToken, "X-Aov-Payment": "paid", "X-Aov-Settlement": "pending"}
	w := fx.do(http.MethodPost, "/verify/schema", invoice("129.5", ""), pending)
	var doc map[string]any
	if json.Unmarshal(w.Body.Bytes(), &doc) != nil {
		f.Fatalf("verify: %d", w.Code)
	}
	id, _ := doc["verification_id"].(string)
	for _, s := range []string{`{"verification_id":"` + id + `","payment":"paid"}`, `{"reports":[{"verification_id":"` + id + `","payment":"unpaid"}]}`,
		`{"reports":[]}`, `{"reports":null}`, `{"verification_id":"` + id + `"}`, `[]`, `{"reports":[{}],"payment":"paid"}`,
		`{"reports":[{"verification_id":"` + id + `","payment":"paid"},{"verification_id":"nope","payment":"paid"}]}`} {
		f.Add([]byte(s))
	}
	gw := map[string]string{"X-Aov-Gateway-Token": gatewayToken, "Content-Type": "application/json"}
	f.Fuzz(func(t *testing.T, body []byte) {
		w := fx.do(http.MethodPost, "/v1/gateway/settlement", body, gw)
		switch code := w.Code; code {
		case http.StatusOK:
			// Per report of a batch with an unknown id: one result each,
			// at least one not_found, and no input echoed.
			var in struct {
				Reports []json.RawMessage `json:"reports"`
			}
			var out struct {
				Results []string `json:"results"`
			}
			if json.Unmarshal(body, &in) != nil || json.Unmarshal(w.Body.Bytes(), &out) != nil || len(out.Results) != len(in.Reports) {
				t.Fatalf("200 %s for %q", w.Body, body)
			}
			notFound := false
			for _, r := range out.Results {
				switch r {
				case server.SettlementNotFound:
					notFound = true
				case server.SettlementRecorded, server.SettlementFinal:
				default:
					t.Fatalf("result %q for %q", r, body)
				}
			}
			if !notFound {
				t.Fatalf("200 without an unknown id for %q: %s", body, w.Body)
			}
		case http.StatusNoContent, http.StatusNotFound, http.StatusUnprocessableEntity, http.StatusBadRequest, http.StatusUnsupportedMediaType, http.StatusRequestEntityTooLarge:
		default:
			t.Fatalf("status %d for %q", code, body)
		}
		rec, err := fx.db.Verification(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if p := rec.Payment; p != store.PaymentPending && p != store.PaymentPaid && p != store.PaymentUnpaid {
			t.Fatalf("recorded %q", p)
		}
	})
}
