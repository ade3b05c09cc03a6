package server_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/aovhq/aov/store"
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
