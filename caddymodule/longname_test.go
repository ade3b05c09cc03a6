package caddymodule

import (
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"strings"
	"testing"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// longNameRequest is a valid verification whose output has one member with
// a nameLen-byte name holding 60 strings that fail "type".
func longNameRequest(nameLen int) string {
	items := strings.TrimSuffix(strings.Repeat(`"x",`, 60), ",")
	return `{"task_id":"t","expected_schema":{"additionalProperties":{"items":{"type":"number"}}},` +
		`"submitted_output":{"` + strings.Repeat("k", nameLen) + `":[` + items + `]}}`
}

// A failing verification whose output has a long member name gets its
// signed fail receipt through the gate, and uses what it was given: the
// result repeated the name in every location it listed, certd refused to
// sign a 30 KB request's result, verifierd answered 500, and the free call
// was never used, so the same request could be sent forever (each costing
// verifierd about 100 MB); a paid 900 KB one was never settled, and the
// same payment bought the work again.
func TestLongMemberNamesAreAnsweredAndCharged(t *testing.T) {
	d, fac := sharedDevnet(t)

	t.Run("free allowance", func(t *testing.T) {
		vf := startVerifier(t)
		base := startCaddy(t, realSite(vf, fac, 1, ""))
		body := longNameRequest(30_000)
		var statuses []int
		for range 3 {
			resp := post(t, base+"/verify/schema", body, nil)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			statuses = append(statuses, resp.StatusCode)
			if len(statuses) == 1 && (resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"result":"fail"`)) {
				t.Fatalf("the free call: %d %.300s; want a signed fail receipt", resp.StatusCode, b)
			}
		}
		t.Logf("statuses %v; verifierd ran %d verifications", statuses, vf.calls.Load())
		if statuses[1] != http.StatusPaymentRequired || statuses[2] != http.StatusPaymentRequired {
			t.Errorf("statuses %v: the free call was not used", statuses)
		}
		if n := vf.calls.Load(); n != 1 {
			t.Errorf("one free call, %d verifications", n)
		}
	})

	t.Run("payment", func(t *testing.T) {
		vf := startVerifier(t)
		base := startCaddy(t, realSite(vf, fac, 0, ""))
		url := base + "/verify/schema"
		body := longNameRequest(900_000)
		pr := paymentRequired(t, post(t, url, "", nil))
		payer := evmfacilitator.DevAccounts()[4].Address
		before := balance(t, d, payer)
		sig := signFor(t, pr, 4)
		var statuses []int
		var replay []byte
		for range 2 {
			resp := post(t, url, body, map[string]string{x402.HeaderPaymentSignature: sig})
			replay, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			statuses = append(statuses, resp.StatusCode)
		}
		paid := new(big.Int).Sub(before, balance(t, d, payer))
		t.Logf("statuses %v; verifierd ran %d verifications; payer charged %v", statuses, vf.calls.Load(), paid)
		if statuses[0] != http.StatusOK {
			t.Fatalf("a valid paid request got %d, want 200 with a signed fail receipt", statuses[0])
		}
		if paid.Sign() <= 0 {
			t.Error("the payment was not settled")
		}
		if statuses[1] != http.StatusPaymentRequired || !strings.Contains(string(replay), "payment_already_used") {
			t.Errorf("the payment sent again: %d %.200s, want 402 payment_already_used", statuses[1], replay)
		}
	})
}

// The gate compiles a request's schema before it answers 402, unpaid. The
// compiler writes every subschema's location with the property names above
// it: 2,000 subschemas under one 400 KB name held the gate for 107 s (valid)
// or 12.8 s and a 16 MB 422 (invalid), and kept 1.5 GB in its schema
// cache. Such a schema is now refused before it compiles, with a small 422
// and a few MiB of work, and verifierd never sees it.
func TestUnpaidSchemasUnderLongNamesAreRefusedCheaply(t *testing.T) {
	_, fac := sharedDevnet(t)
	vf := startVerifier(t)
	base := startCaddy(t, realSite(vf, fac, 0, ""))
	for _, c := range []struct {
		name, sub string
		nameLen   int
	}{
		{"valid, 400 KB name", `{}`, 400_000},
		{"invalid, 400 KB name", `{"type":"nope"}`, 400_000},
		{"valid, 100 KB name", `{}`, 100_000},
	} {
		props := make([]string, 2000)
		for i := range props {
			props[i] = fmt.Sprintf(`"p%d":%s`, i, c.sub)
		}
		body := `{"task_id":"t","expected_schema":{"properties":{"` + strings.Repeat("k", c.nameLen) + `":{"properties":{` +
			strings.Join(props, ",") + `}}}},"submitted_output":{}}`
		var status int
		var answer []byte
		cost := measure(t, func() {
			resp := post(t, base+"/verify/schema", body, nil)
			status = resp.StatusCode
			answer, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
		})
		t.Logf("%s: %d bytes, status %d, answer %d bytes, allocated %d MiB, peak heap +%d MiB", c.name, len(body), status, len(answer), cost.allocated>>20, cost.peakHeap>>20)
		var e struct {
			Code   string `json:"code"`
			Fields []struct {
				Field   string `json:"field"`
				Problem string `json:"problem"`
			} `json:"fields"`
		}
		if err := json.Unmarshal(answer, &e); status != http.StatusUnprocessableEntity || err != nil || e.Code != "invalid_request" ||
			len(e.Fields) != 1 || e.Fields[0].Field != "expected_schema" || !strings.Contains(e.Fields[0].Problem, "bytes of its location") {
			t.Errorf("%s: status %d, %.300s; want 422 invalid_request refusing the locations", c.name, status, answer)
		}
		if len(answer) > 4<<10 {
			t.Errorf("%s: a refusal of %d bytes", c.name, len(answer))
		}
		if cost.allocated > 16<<20 {
			t.Errorf("%s: the gate allocated %d MiB for one unpaid %d-byte request", c.name, cost.allocated>>20, len(body))
		}
	}
	if n := vf.calls.Load(); n != 0 {
		t.Errorf("verifierd ran %d times", n)
	}
}
