package x402

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/crypto"
)

// fakeFacilitator is an honest in-memory facilitator, a fake only for the
// chain: it verifies with the real off-chain checks (CheckExactEVM) and
// "settles" by recording each (payer, nonce) once. The real EVM facilitator
// lives in its own package; this one exists to drive the HTTP layer, and to
// cause faults (verifyErr, settleErr) a real one cannot be made to produce
// on demand.
type fakeFacilitator struct {
	now       time.Time
	verifyErr error
	settleErr error
	calls     atomic.Int32
	mu        sync.Mutex
	used      map[string]bool
}

func (f *fakeFacilitator) Verify(_ context.Context, p PaymentPayload, req PaymentRequirements) (VerifyResponse, error) {
	f.calls.Add(1)
	if f.verifyErr != nil {
		return VerifyResponse{}, f.verifyErr
	}
	c, err := CheckExactEVM(p, req, f.now)
	if err != nil {
		return InvalidResponse(err, c.Values.From), nil
	}
	return VerifyResponse{IsValid: true, Payer: c.Values.From.Hex()}, nil
}

func (f *fakeFacilitator) Settle(ctx context.Context, p PaymentPayload, req PaymentRequirements) (SettleResponse, error) {
	f.calls.Add(1)
	if f.settleErr != nil {
		return SettleResponse{}, f.settleErr
	}
	v, err := f.Verify(ctx, p, req)
	f.calls.Add(-1)
	if err != nil {
		return SettleResponse{}, err
	}
	if !v.IsValid {
		return SettleResponse{Success: false, ErrorReason: v.InvalidReason, Network: req.Network}, nil
	}
	ep, _ := ParseExactEVMPayload(p.Payload)
	key := v.Payer + ep.Authorization.Nonce
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.used == nil {
		f.used = map[string]bool{}
	}
	if f.used[key] {
		return SettleResponse{Success: false, ErrorReason: ReasonExactEVMNonceAlreadyUsed, Payer: v.Payer, Network: req.Network}, nil
	}
	f.used[key] = true
	tx := crypto.Keccak256Hash([]byte(key)).Hex()
	return SettleResponse{Success: true, Payer: v.Payer, Transaction: tx, Network: req.Network}, nil
}

func (f *fakeFacilitator) Supported(context.Context) (SupportedResponse, error) {
	return SupportedResponse{Kinds: []SupportedKind{{X402Version: 2, Scheme: SchemeExact, Network: NetworkBaseSepolia}}}, nil
}

func TestFacilitatorRoundTrip(t *testing.T) {
	key := testKey(t)
	now := time.Unix(1_800_000_000, 0)
	fake := &fakeFacilitator{now: now}
	mux := http.NewServeMux()
	mux.Handle("/facilitator/", http.StripPrefix("/facilitator", NewFacilitatorHandler(fake)))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	c := NewHTTPFacilitator(HTTPFacilitatorConfig{URL: srv.URL + "/facilitator", Backoff: time.Millisecond})
	ctx := context.Background()
	req := devnetRequirements()
	p, err := SignExactEVM(key, req, &Resource{URL: "https://a.example/r"}, now)
	if err != nil {
		t.Fatal(err)
	}
	payer := crypto.PubkeyToAddress(key.PublicKey).Hex()

	t.Run("a signed payment verifies through the handler", func(t *testing.T) {
		v, err := c.Verify(ctx, p, req)
		if err != nil || !v.IsValid || v.Payer != payer {
			t.Fatalf("got %+v, %v", v, err)
		}
	})
	t.Run("a payment for a different amount is an isValid:false answer with the reason", func(t *testing.T) {
		other := req
		other.Amount = "30000"
		v, err := c.Verify(ctx, p, other)
		if err != nil || v.IsValid || v.InvalidReason != ReasonExactEVMValueMismatch || v.Payer != payer {
			t.Fatalf("got %+v, %v", v, err)
		}
	})
	t.Run("settling succeeds once and names the transaction", func(t *testing.T) {
		s, err := c.Settle(ctx, p, req)
		if err != nil || !s.Success || s.Transaction == "" || s.Network != req.Network || s.Payer != payer {
			t.Fatalf("got %+v, %v", s, err)
		}
	})
	t.Run("settling the same authorization again is a success:false answer", func(t *testing.T) {
		s, err := c.Settle(ctx, p, req)
		if err != nil || s.Success || s.ErrorReason != ReasonExactEVMNonceAlreadyUsed {
			t.Fatalf("got %+v, %v", s, err)
		}
	})
	t.Run("supported lists the kinds with empty lists instead of null", func(t *testing.T) {
		s, err := c.Supported(ctx)
		if err != nil || len(s.Kinds) != 1 || s.Extensions == nil || s.Signers == nil {
			t.Fatalf("got %+v, %v", s, err)
		}
	})
	t.Run("a facilitator error is a 503, which the client reports as no answer after its retries", func(t *testing.T) {
		fake.verifyErr = errors.New("rpc down")
		defer func() { fake.verifyErr = nil }()
		fake.calls.Store(0)
		_, err := c.Verify(ctx, p, req)
		var fe *FacilitatorError
		if !errors.As(err, &fe) || fe.Status != http.StatusServiceUnavailable {
			t.Fatalf("got %v", err)
		}
		if n := fake.calls.Load(); n != 1+DefaultRetries {
			t.Fatalf("verify reached the facilitator %d times", n)
		}
	})
	t.Run("an unknown settlement outcome stays unknown across HTTP", func(t *testing.T) {
		fake.settleErr = &UnknownOutcomeError{Op: "settle", Err: errors.New("receipt timeout")}
		defer func() { fake.settleErr = nil }()
		fake.calls.Store(0)
		_, err := c.Settle(ctx, p, req)
		var ue *UnknownOutcomeError
		if !errors.As(err, &ue) {
			t.Fatalf("got %v", err)
		}
		if n := fake.calls.Load(); n != 1 {
			t.Fatalf("settle reached the facilitator %d times", n)
		}
	})
}

func TestFacilitatorHandlerRefusals(t *testing.T) {
	var whole map[string]json.RawMessage
	json.Unmarshal([]byte(validPayloadJSON), &whole)
	pp := validPayloadJSON
	reqJSON := string(whole["accepted"])
	body := func(members ...string) string { return "{" + strings.Join(members, ",") + "}" }
	v2 := `"x402Version":2`
	payM := `"paymentPayload":` + pp
	reqM := `"paymentRequirements":` + reqJSON
	h := NewFacilitatorHandler(&fakeFacilitator{now: time.Unix(1_700_000_000, 0)})
	for _, tc := range []struct {
		desc, method, path, ctype, body string
		status                          int
		field                           string
	}{
		{"a well-formed verify request is answered 200", "POST", "/verify", "application/json", body(v2, payM, reqM), 200, ""},
		{"a content type with a charset is fine", "POST", "/settle", "application/json; charset=utf-8", body(v2, payM, reqM), 200, ""},
		{"GET /verify is 405", "GET", "/verify", "", "", 405, ""},
		{"POST /supported is 405", "POST", "/supported", "application/json", "{}", 405, ""},
		{"an unknown path is 404", "POST", "/discovery", "application/json", "{}", 404, ""},
		{"a body that is not declared JSON is 415", "POST", "/verify", "text/plain", body(v2, payM, reqM), 415, ""},
		{"a body over the limit is 413", "POST", "/verify", "application/json", `{"x":"` + strings.Repeat("a", MaxFacilitatorRequestBytes) + `"}`, 413, ""},
		{"a body that is not JSON is 400", "POST", "/verify", "application/json", "x402", 400, "(body)"},
		{"a JSON array is 400", "POST", "/verify", "application/json", "[]", 400, "(body)"},
		{"duplicate members are 400", "POST", "/verify", "application/json", body(v2, v2, payM, reqM), 400, "(body)"},
		{"an extra member is 400", "POST", "/verify", "application/json", body(v2, payM, reqM, `"x":1`), 400, "(body)"},
		{"version 1 is 400", "POST", "/verify", "application/json", body(`"x402Version":1`, payM, reqM), 400, "x402Version"},
		{"a missing version is 400", "POST", "/verify", "application/json", body(payM, reqM), 400, "x402Version"},
		{"a missing paymentPayload is 400", "POST", "/verify", "application/json", body(v2, reqM), 400, "paymentPayload"},
		{"a paymentPayload of version 1 is 400", "POST", "/verify", "application/json", body(v2, `"paymentPayload":`+strings.Replace(pp, `"x402Version":2`, `"x402Version":1`, 1), reqM), 400, "paymentPayload.x402Version"},
		{"a paymentPayload without accepted is 400", "POST", "/settle", "application/json", body(v2, `"paymentPayload":{"x402Version":2,"payload":{}}`, reqM), 400, "paymentPayload.accepted"},
		{"a missing paymentRequirements is 400", "POST", "/settle", "application/json", body(v2, payM), 400, "paymentRequirements"},
		{"requirements with a decimal amount are 400", "POST", "/verify", "application/json", body(v2, payM, `"paymentRequirements":`+strings.Replace(reqJSON, `"20000"`, `"0.02"`, 1)), 400, "paymentRequirements.amount"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			r := httptest.NewRequest(tc.method, tc.path, strings.NewReader(tc.body))
			if tc.ctype != "" {
				r.Header.Set("Content-Type", tc.ctype)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != tc.status {
				t.Fatalf("status %d, want %d: %s", w.Code, tc.status, w.Body.String())
			}
			if ct := w.Header().Get("Content-Type"); ct != "application/json" {
				t.Fatalf("content type %q", ct)
			}
			var got map[string]any
			if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
				t.Fatalf("body is not JSON: %v", err)
			}
			if tc.status == 200 {
				if _, ok := got["isValid"]; !ok && tc.path == "/verify" {
					t.Fatalf("no verdict: %v", got)
				}
				return
			}
			if got["error"] != got["code"] || got["code"] == nil || got["charged"] != false {
				t.Fatalf("not the error shape: %v", got)
			}
			if tc.status == 405 && w.Header().Get("Allow") == "" {
				t.Fatal("405 without Allow")
			}
			if tc.field != "" {
				fields, _ := got["fields"].([]any)
				if len(fields) != 1 || fields[0].(map[string]any)["field"] != tc.field {
					t.Fatalf("fields %v, want %s", got["fields"], tc.field)
				}
			}
			if strings.Contains(w.Body.String(), "0x2c7536") || strings.Contains(w.Body.String(), "aaaa") {
				t.Fatal("the error echoes the request")
			}
		})
	}
}

// TestFacilitatorHandlerUnknownSettlement: an unknown outcome whose
// transaction the facilitator cannot name (the evm facilitator's) is still
// a settle answer, settlement_pending with the payment's payer and network
// and no transaction, never the error shape that says charged false
// (Before: 503 upstream_unavailable, "charged": false); any other settle
// error, nothing sent, is a settle answer too: success false,
// facilitator_unavailable, which a remote gate's client reads as the plain
// "nothing settled" error an embedded facilitator returns (the gate answers
// 503 and releases the payment). (Before: 503 with Retry-After, which the
// client reads as an unknown outcome, holding a payment never sent; then
// the answer success false itself, which the gate took for a refusal of
// the payment: 402 and a new offer.)
func TestFacilitatorHandlerUnknownSettlement(t *testing.T) {
	var whole map[string]json.RawMessage
	json.Unmarshal([]byte(validPayloadJSON), &whole)
	p := `{"x402Version":2,"paymentPayload":` + validPayloadJSON + `,"paymentRequirements":` + string(whole["accepted"]) + `}`
	var accepted PaymentRequirements
	json.Unmarshal(whole["accepted"], &accepted)
	pl, err := ParseExactEVMPayload(whole["payload"])
	if err != nil {
		t.Fatal(err)
	}
	serve := func(settleErr error) *httptest.ResponseRecorder {
		h := NewFacilitatorHandler(&fakeFacilitator{settleErr: settleErr})
		r := httptest.NewRequest("POST", "/settle", strings.NewReader(p))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	w := serve(fmt.Errorf("wrapped: %w", &UnknownOutcomeError{Op: "settle", Err: errors.New("x")}))
	var got SettleResponse
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil || w.Code != http.StatusOK {
		t.Fatalf("status %d, body %s", w.Code, w.Body)
	}
	if got.Success || got.ErrorReason != ReasonSettlementPending || got.Transaction != "" || got.Network != accepted.Network ||
		!strings.EqualFold(got.Payer, pl.Authorization.From) || !strings.Contains(got.ErrorMessage, "do not pay again") {
		t.Fatalf("body %s; want settlement_pending for the payment's payer and network", w.Body)
	}
	if strings.Contains(w.Body.String(), "wrapped") || strings.Contains(w.Body.String(), "charged") {
		t.Fatalf("body %s: the internal cause leaked, or it claims to know whether the payer was charged", w.Body)
	}
	w = serve(errors.New("signer unavailable"))
	got = SettleResponse{}
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil || w.Code != http.StatusOK || got.Success ||
		got.ErrorReason != ReasonFacilitatorUnavailable || !strings.EqualFold(got.Payer, pl.Authorization.From) || strings.Contains(w.Body.String(), "signer") {
		t.Fatalf("a settle error with nothing sent: status %d, body %s; want 200, success false, facilitator_unavailable, no cause", w.Code, w.Body)
	}
	// Through the HTTP client a remote gate uses: nothing settled, neither
	// an unknown outcome nor a refusal of the payment.
	srv := httptest.NewServer(NewFacilitatorHandler(&fakeFacilitator{settleErr: errors.New("signer unavailable")}))
	defer srv.Close()
	c := NewHTTPFacilitator(HTTPFacilitatorConfig{URL: srv.URL, Backoff: time.Millisecond})
	sr, err := c.Settle(context.Background(), PaymentPayload{X402Version: 2, Accepted: accepted, Payload: whole["payload"]}, accepted)
	var fe *FacilitatorError
	var unknown *UnknownOutcomeError
	if !errors.As(err, &fe) || errors.As(err, &unknown) || sr.ErrorReason != "" || fe.RetryAfter != 0 {
		t.Fatalf("the remote client read a settle error with nothing sent as %+v, %v; want a *FacilitatorError (nothing settled), no answer", sr, err)
	}
}

// TestFacilitatorHandlerNothingSentRelaysRetryAfter: a facilitator in
// front of another (facilitator http) whose /settle is refused with 429
// and Retry-After answers facilitator_unavailable with that Retry-After,
// and the client a gate in front uses returns it with the "nothing
// settled" error, so the gate's 503 tells its buyer when to come back.
// (Before: the wait was dropped, and the buyer, told 2 s, came back to be
// refused again.)
func TestFacilitatorHandlerNothingSentRelaysRetryAfter(t *testing.T) {
	var whole map[string]json.RawMessage
	json.Unmarshal([]byte(validPayloadJSON), &whole)
	var accepted PaymentRequirements
	json.Unmarshal(whole["accepted"], &accepted)
	pl, _ := ParseExactEVMPayload(whole["payload"])
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "7")
		http.Error(w, `{"error":"rate_limited"}`, http.StatusTooManyRequests)
	}))
	defer upstream.Close()
	front := httptest.NewServer(NewFacilitatorHandler(NewHTTPFacilitator(HTTPFacilitatorConfig{URL: upstream.URL})))
	defer front.Close()
	p := `{"x402Version":2,"paymentPayload":` + validPayloadJSON + `,"paymentRequirements":` + string(whole["accepted"]) + `}`
	resp, err := http.Post(front.URL+"/settle", "application/json", strings.NewReader(p))
	if err != nil {
		t.Fatal(err)
	}
	var got SettleResponse
	json.NewDecoder(resp.Body).Decode(&got)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || got.ErrorReason != ReasonFacilitatorUnavailable || resp.Header.Get("Retry-After") != "7" ||
		!strings.EqualFold(got.Payer, pl.Authorization.From) {
		t.Fatalf("settle refused upstream with 429, Retry-After 7: %d %+v, Retry-After %q; want 200 facilitator_unavailable with Retry-After 7",
			resp.StatusCode, got, resp.Header.Get("Retry-After"))
	}
	c := NewHTTPFacilitator(HTTPFacilitatorConfig{URL: front.URL})
	_, err = c.Settle(context.Background(), PaymentPayload{X402Version: 2, Accepted: accepted, Payload: whole["payload"]}, accepted)
	var fe *FacilitatorError
	if !errors.As(err, &fe) || fe.RetryAfter != 7*time.Second {
		t.Fatalf("the client read it as %v; want a *FacilitatorError with RetryAfter 7s", err)
	}
}
