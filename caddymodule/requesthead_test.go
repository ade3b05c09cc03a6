package caddymodule

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/verify"
	"github.com/aovhq/aov/x402"
)

// verifyCall is one request to the verify route as a client sends it:
// every part of its head that verifierd reads before it parses the body.
type verifyCall struct {
	method, contentType, contentEncoding string
	body                                 []byte
	payment                              string
}

func (c verifyCall) send(t *testing.T, url string) (*http.Response, []byte) {
	t.Helper()
	var rd io.Reader
	if c.body != nil {
		rd = bytes.NewReader(c.body)
	}
	method := c.method
	if method == "" {
		method = http.MethodPost
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if c.contentType != "" {
		req.Header.Set("Content-Type", c.contentType)
	}
	if c.contentEncoding != "" {
		req.Header.Set("Content-Encoding", c.contentEncoding)
	}
	if c.payment != "" {
		req.Header.Set(x402.HeaderPaymentSignature, c.payment)
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, body
}

// restVerifierSite is the REST verify route of realSite alone, in front
// of a real verifierd, with no method named by route (so the gate takes
// every method to the check) and no rate limit.
func restVerifierSite(vf *verifierFixture, fac string, perDay int, extra string) string {
	return fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept devnet $0.02 %[3]s
			facilitator http {
				url %[2]s
			}
			store badger {data}/gate
			validate verify_request
			rate_limit off
			free_allowance {
				pool verify
				per_day %[4]d
			}
			%[6]s
		}
		reverse_proxy %[1]s {
			header_up X-Aov-Gateway-Token %[5]s
		}
	}
}
`, strings.TrimPrefix(vf.srv.URL, "http://"), fac, payTo.Hex(), perDay, verifierToken, extra)
}

// TestSettleBeforeRefusesWhatVerifierdRefusesBeforeParsing: with settle
// before and validate verify_request, a paid request that verifierd refuses
// from its head alone (a body not declared as JSON, a method other than
// POST on a route that does not name its method) is refused by the gate
// with verifierd's own answer before the payment is settled:
// nothing charged, no PAYMENT-RESPONSE, verifierd never called. (Before: the
// gate checked only the body, settled, and the buyer paid for verifierd's
// 415 or 405.) What verifierd accepts in
// the head (a UTF-8 charset label, a +json type) the gate lets through and
// settles, but for a charset other than UTF-8, which verifierd reads as
// UTF-8 and the gate refuses (bodyNotUTF8); what it reads as a bad body (a compressed body, one over the
// limit) is the same refusal from the gate, uncharged; an empty body is the
// demand for payment, uncharged. The gate stands in front of a real
// verifierd, which answers the same request the same way when asked
// directly.
func TestSettleBeforeRefusesWhatVerifierdRefusesBeforeParsing(t *testing.T) {
	d, fac := sharedDevnet(t)
	payer := evmfacilitator.DevAccounts()[6]
	vf := startVerifier(t)
	base := startCaddy(t, restVerifierSite(vf, fac, 0, "settle before"))
	url := base + "/verify/schema"
	big := []byte(`{"task_id":"t-big","expected_schema":{"type":"string"},"submitted_output":"` + strings.Repeat("x", verify.DefaultMaxBodyBytes) + `"}`)

	for _, c := range []struct {
		desc   string
		call   verifyCall
		status int
		code   string // "" for a served, charged answer
		direct int    // verifierd's own status when it is not status
	}{
		{"a body sent as text/plain", verifyCall{contentType: "text/plain", body: []byte(validRequest)}, 415, "unsupported_media_type", 0},
		{"a body with no Content-Type", verifyCall{body: []byte(validRequest)}, 415, "unsupported_media_type", 0},
		{"a Content-Type that does not parse", verifyCall{contentType: "application/json; charset", body: []byte(validRequest)}, 415, "unsupported_media_type", 0},
		{"text/json", verifyCall{contentType: "text/json", body: []byte(validRequest)}, 415, "unsupported_media_type", 0},
		{"a PUT", verifyCall{method: http.MethodPut, contentType: "application/json", body: []byte(validRequest)}, 405, "method_not_allowed", 0},
		{"a GET with a body", verifyCall{method: http.MethodGet, contentType: "application/json", body: []byte(validRequest)}, 405, "method_not_allowed", 0},
		{"a gzip body", verifyCall{contentType: "application/json", contentEncoding: "gzip", body: gzipped(http.Header{}, []byte(validRequest))}, 422, "invalid_request", 0},
		{"a body over the limit", verifyCall{contentType: "application/json", body: big}, 413, "payload_too_large", 0},
		{"an empty body", verifyCall{contentType: "text/plain"}, 402, "", 0},
		{"a charset parameter", verifyCall{contentType: "application/json; charset=utf8", body: []byte(validRequest)}, 200, "", 0},
		{"a charset other than UTF-8", verifyCall{contentType: "application/json; charset=iso-8859-1", body: []byte(validRequest)}, 415, "unsupported_media_type", 200},
		{"a +json type", verifyCall{contentType: "application/vnd.example+json", body: []byte(validRequest)}, 200, "", 0},
	} {
		t.Run(c.desc, func(t *testing.T) {
			// verifierd's own answer to the request, asked directly.
			direct := c.call
			resp, raw := direct.send(t, vf.srv.URL+"/verify/schema")
			want := c.status
			if c.direct != 0 {
				want = c.direct
			}
			if c.status != 402 && resp.StatusCode != want {
				t.Fatalf("verifierd itself answers %d, want %d: %.300s", resp.StatusCode, want, raw)
			}

			resp, _ = verifyCall{}.send(t, url)
			call := c.call
			call.payment = signFor(t, paymentRequired(t, resp), 6)
			calls := vf.calls.Load()
			before := balance(t, d, payer.Address)
			resp, raw = call.send(t, url)
			got := charged(t, d, payer.Address, before)
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d; charged %v, verifierd called %d times: %.300s", resp.StatusCode, c.status, got, vf.calls.Load()-calls, raw)
			}
			if c.status == 200 {
				if got.Sign() == 0 || resp.Header.Get(x402.HeaderPaymentResponse) == "" {
					t.Fatalf("served, charged %v, PAYMENT-RESPONSE %q", got, resp.Header.Get(x402.HeaderPaymentResponse))
				}
				return
			}
			if got.Sign() != 0 || resp.Header.Get(x402.HeaderPaymentResponse) != "" || vf.calls.Load() != calls {
				t.Fatalf("charged %v, PAYMENT-RESPONSE %q, verifierd called %d times; want none of them",
					got, resp.Header.Get(x402.HeaderPaymentResponse), vf.calls.Load()-calls)
			}
			if c.code == "" {
				return
			}
			var e struct {
				Code    string `json:"code"`
				Charged *bool  `json:"charged"`
			}
			if err := json.Unmarshal(raw, &e); err != nil || e.Code != c.code || e.Charged == nil || *e.Charged {
				t.Fatalf("body %.300s, want code %s and charged false", raw, c.code)
			}
			if c.status == 405 && resp.Header.Get("Allow") != http.MethodPost {
				t.Errorf("Allow %q, want POST", resp.Header.Get("Allow"))
			}
		})
	}
}

// TestValidateVerifyRequestAnswersVerifierdsRefusalsOfTheHead: a body not
// declared as JSON is verifierd's 415 wherever the gate answers: the demand
// for payment is that 415, not a 402 for a request no payment can make
// succeed (Before: 402), and a free call, which verifierd checks, gets its
// 415 with the day's allowance untouched. Another method than POST is
// verifierd's 405 the same way.
func TestValidateVerifyRequestAnswersVerifierdsRefusalsOfTheHead(t *testing.T) {
	_, fac := sharedDevnet(t)
	vf := startVerifier(t)
	text := verifyCall{contentType: "text/plain", body: []byte(validRequest)}

	t.Run("the demand for payment", func(t *testing.T) {
		base := startCaddy(t, restVerifierSite(vf, fac, 0, ""))
		calls := vf.calls.Load()
		resp, raw := text.send(t, base+"/verify/schema")
		if resp.StatusCode != http.StatusUnsupportedMediaType || !strings.Contains(string(raw), `"unsupported_media_type"`) ||
			resp.Header.Get(x402.HeaderPaymentRequired) != "" || vf.calls.Load() != calls {
			t.Fatalf("status %d, PAYMENT-REQUIRED present %v, verifierd called %d times: %.300s; want verifierd's 415 from the gate",
				resp.StatusCode, resp.Header.Get(x402.HeaderPaymentRequired) != "", vf.calls.Load()-calls, raw)
		}
		// So is its 405 to another method, on a route that does not
		// name one. (Before: a GET without a body was 422, one with a
		// body the demand for payment.)
		for _, c := range []verifyCall{{method: http.MethodGet}, {method: http.MethodPut, contentType: "application/json", body: []byte(validRequest)}} {
			resp, raw := c.send(t, base+"/verify/schema")
			if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != http.MethodPost || vf.calls.Load() != calls {
				t.Fatalf("%s: status %d, Allow %q, verifierd called %d times: %.300s; want verifierd's 405 from the gate",
					c.method, resp.StatusCode, resp.Header.Get("Allow"), vf.calls.Load()-calls, raw)
			}
		}
	})
	t.Run("a free call", func(t *testing.T) {
		base := startCaddy(t, restVerifierSite(vf, fac, 2, ""))
		resp, raw := text.send(t, base+"/verify/schema")
		if resp.StatusCode != http.StatusUnsupportedMediaType || !strings.Contains(string(raw), `"unsupported_media_type"`) {
			t.Fatalf("status %d: %.300s; want 415", resp.StatusCode, raw)
		}
		resp, raw = verifyCall{contentType: "application/json", body: []byte(validRequest)}.send(t, base+"/verify/schema")
		if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderFreeRemaining) != "1" {
			t.Fatalf("the next free call: status %d, %s %q, want 200 with 1 left: %.300s",
				resp.StatusCode, HeaderFreeRemaining, resp.Header.Get(HeaderFreeRemaining), raw)
		}
	})
}

// With settle before, validate verify_request and a max_body larger than
// verifierd's 1 MiB, a paid body just over 1 MiB is verifierd's 413: the
// gate answers it before the payment is settled, nothing charged, no
// PAYMENT-RESPONSE. (Before: the gate checked the body against its own
// max_body, settled the payment, and the buyer paid for verifierd's 413.)
func TestSettleBeforeRefusesVerifierdsTooLargeWhenMaxBodyIsLarger(t *testing.T) {
	d, fac := sharedDevnet(t)
	payer := evmfacilitator.DevAccounts()[6]
	vf := startVerifier(t)
	base := startCaddy(t, restVerifierSite(vf, fac, 0, "settle before\n\t\t\tmax_body 2MiB"))
	url := base + "/verify/schema"
	big := []byte(`{"task_id":"t-big","expected_schema":{"type":"string"},"submitted_output":"` + strings.Repeat("x", verify.DefaultMaxBodyBytes) + `"}`)
	call := verifyCall{contentType: "application/json", body: big}

	// verifierd itself refuses it: 413.
	resp, raw := call.send(t, vf.srv.URL+"/verify/schema")
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("verifierd answers %d, want 413: %.200s", resp.StatusCode, raw)
	}

	resp, _ = verifyCall{}.send(t, url)
	call.payment = signFor(t, paymentRequired(t, resp), 6)
	before := balance(t, d, payer.Address)
	resp, raw = call.send(t, url)
	got := charged(t, d, payer.Address, before)
	if resp.StatusCode != http.StatusRequestEntityTooLarge || got.Sign() != 0 || resp.Header.Get(x402.HeaderPaymentResponse) != "" {
		t.Fatalf("status %d, charged %v, PAYMENT-RESPONSE present %v: %.300s; want the gate's 413 with nothing charged",
			resp.StatusCode, got, resp.Header.Get(x402.HeaderPaymentResponse) != "", raw)
	}
	var e struct {
		Code string `json:"code"`
	}
	if json.Unmarshal(raw, &e) != nil || e.Code != "payload_too_large" {
		t.Fatalf("body %.300s; want payload_too_large", raw)
	}
}
