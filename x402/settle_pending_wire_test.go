package x402

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestFacilitatorHandlerPendingSettlementNamesItsTransaction: a
// facilitator whose Settle reports an unknown outcome naming the
// transaction it sent (the svm facilitator's settlement_pending,
// UnknownOutcomeError.Reply) is served by NewFacilitatorHandler in the x402
// settle shape, {success:false, errorReason:"settlement_pending",
// transaction, network, payer}: the only answer the official @x402/core
// resource server's settleWithPendingRetry retries /settle for, and what
// our own HTTPFacilitator hands the gate as UnknownOutcomeError.Reply, so
// the gate polls the named transaction. (Before: a bare 503 in the
// service's error shape, with neither the reason nor the transaction.)
func TestFacilitatorHandlerPendingSettlementNamesItsTransaction(t *testing.T) {
	key := testKey(t)
	now := time.Unix(1_800_000_000, 0)
	const tx = "0x1111111111111111111111111111111111111111111111111111111111111111"
	req := devnetRequirements()
	fake := &fakeFacilitator{now: now, settleErr: &UnknownOutcomeError{Op: "settle",
		Reply: &SettleResponse{Success: false, ErrorReason: ReasonSettlementPending, Transaction: tx, Network: req.Network},
		Err:   errors.New("confirm timeout")}}
	var raw string
	h := NewFacilitatorHandler(fake)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		b, _ := io.ReadAll(rec.Result().Body)
		raw = string(b)
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		w.Write(b)
	}))
	defer srv.Close()
	p, err := SignExactEVM(key, req, &Resource{URL: "https://a.example/r"}, now)
	if err != nil {
		t.Fatal(err)
	}
	c := NewHTTPFacilitator(HTTPFacilitatorConfig{URL: srv.URL})
	_, err = c.Settle(context.Background(), p, req)
	var ue *UnknownOutcomeError
	if !errors.As(err, &ue) {
		t.Fatalf("got %v; want an unknown outcome", err)
	}
	t.Logf("wire reply: %.300s", raw)
	if !strings.Contains(raw, `"settlement_pending"`) || !strings.Contains(raw, tx) {
		t.Errorf("the /settle reply names neither settlement_pending nor the transaction %s the facilitator sent; the official resource server's settleWithPendingRetry recognises only {success:false, errorReason:\"settlement_pending\", transaction}", tx)
	}
	if !strings.Contains(raw, `"success":false`) || strings.Contains(raw, `"charged"`) {
		t.Errorf("the /settle reply is not a settle answer, or says whether the payer was charged, which nobody knows yet")
	}
	if ue.Reply == nil || ue.Reply.Transaction != tx {
		t.Errorf("our own client's UnknownOutcomeError.Reply = %+v; want the named transaction %s (SentSettlement.Transaction)", ue.Reply, tx)
	}
}
