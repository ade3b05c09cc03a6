package server_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"
	dto "github.com/prometheus/client_model/go"

	"github.com/aovhq/aov/receipt"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/verify"
)

func TestVerifyInvoice(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	keys := f.keySet(t)

	for _, c := range []struct {
		desc     string
		path     string
		total    string
		result   string
		blocking []any
	}{
		{"the draft invoice of SPEC §10 fails on consistency:sum_equals", "/verify/schema", "135.0", "fail", []any{"consistency:sum_equals"}},
		{"the fixed invoice passes", "/verify/schema", "129.5", "pass", []any{}},
		{"/verify/deliverable is the same check under a second name", "/verify/deliverable", "135.0", "fail", []any{"consistency:sum_equals"}},
	} {
		t.Run(c.desc, func(t *testing.T) {
			body := invoice(c.total, "")
			w := f.do(http.MethodPost, c.path, body, nil)
			if w.Code != http.StatusOK {
				t.Fatalf("status %d: %s", w.Code, w.Body)
			}
			if cc := w.Header().Get("Cache-Control"); cc != "no-store" {
				t.Errorf("Cache-Control %q, want no-store", cc)
			}
			doc := decode(t, w)
			if doc["result"] != c.result {
				t.Fatalf("result %v, want %s", doc["result"], c.result)
			}
			summary := doc["summary"].(map[string]any)
			if !reflect.DeepEqual(summary["blocking_checks"], c.blocking) {
				t.Errorf("blocking_checks %v, want %v", summary["blocking_checks"], c.blocking)
			}
			sc := doc["schema_compliance"].(map[string]any)
			if sc["passed"] != 22.0 || sc["total"] != 22.0 {
				t.Errorf("schema_compliance %v, want 22/22", sc)
			}
			if c.result == "fail" {
				wantErr := "enforce_rules: consistency:sum_equals at 'line_items[].line_total': values sum to 129.5, expected total (135.0)"
				if errs := doc["errors"].([]any); len(errs) != 1 || errs[0] != wantErr {
					t.Errorf("errors %q, want [%q]", errs, wantErr)
				}
				d := doc["errors_detail"].([]any)[0].(map[string]any)
				for k, want := range map[string]string{
					"check": "consistency:sum_equals", "path": "$.line_items[].line_total",
					"expected": "a sum equal to total (135.0)", "found": "sum 129.5",
				} {
					if d[k] != want {
						t.Errorf("errors_detail[0].%s = %v, want %q", k, d[k], want)
					}
				}
				if d["message"] != wantErr {
					t.Errorf("errors_detail[0].message = %v, want the errors entry", d["message"])
				}
				// Every rule violation is a flag, as the original reports it.
				wantFlags := []any{map[string]any{"check": "consistency:sum_equals", "field": "line_items[].line_total",
					"severity": "error", "detail": "values sum to 129.5, expected total (135.0)"}}
				if !reflect.DeepEqual(doc["flags"], wantFlags) || doc["flags_total"] != 1.0 {
					t.Errorf("flags %v (total %v), want %v", doc["flags"], doc["flags_total"], wantFlags)
				}
			}

			// The receipt verifies against the published card, under the
			// verify context, and its hashes match the request we sent.
			if err := receipt.VerifyReceipt(w.Body.Bytes(), keys, receipt.ContextVerify); err != nil {
				t.Fatalf("receipt does not verify: %v", err)
			}
			want, err := verify.ComputeHashes(body)
			if err != nil {
				t.Fatal(err)
			}
			if err := receipt.CheckHashes(w.Body.Bytes(), want); err != nil {
				t.Fatalf("hashes: %v", err)
			}
			vb := doc["verify"].(map[string]any)
			cur, _ := f.keys.Current()
			for k, want := range map[string]string{
				"public_key_url":   baseURL + "/.well-known/agent-card.json",
				"mcp":              baseURL + "/mcp",
				"key_version":      cur.Version,
				"service":          "Agent Output Verifier",
				"canonicalization": "RFC 8785 (JCS)",
				"hash_algorithm":   "SHA-256",
			} {
				if vb[k] != want {
					t.Errorf("verify.%s = %v, want %q", k, vb[k], want)
				}
			}
			att := doc["attestation"].(map[string]any)
			if att["timestamp"] != doc["verified_at"] {
				t.Errorf("attestation.timestamp %v differs from verified_at %v", att["timestamp"], doc["verified_at"])
			}
			id, err := uuid.Parse(doc["verification_id"].(string))
			if err != nil || id.Version() != 4 {
				t.Errorf("verification_id %v is not a UUID v4", doc["verification_id"])
			}

			// And it is in the history, with the hashes and no content.
			rec, err := f.db.Verification(context.Background(), id.String())
			if err != nil {
				t.Fatalf("verification not recorded: %v", err)
			}
			if rec.Result != c.result || rec.AgentID != "seller-7" || rec.TaskID != "invoice-7731" ||
				rec.OutputHash != want.Output || rec.SchemaHash != want.Schema || rec.RulesHash != want.Rules ||
				rec.RequestHash != want.Request || rec.KeyVersion != cur.Version || rec.Payment != store.PaymentUnknown || rec.Test {
				t.Errorf("record %+v does not match the answer", rec)
			}
			if verify.FormatTime(rec.VerifiedAt) != doc["verified_at"] {
				t.Errorf("recorded time %s, answered %v", verify.FormatTime(rec.VerifiedAt), doc["verified_at"])
			}
		})
	}

	t.Run("a compact answer is signed too and keeps only the compact keys", func(t *testing.T) {
		w := f.do(http.MethodPost, "/verify/schema", invoice("135.0", `,"detail":"compact"`), nil)
		if w.Code != http.StatusOK {
			t.Fatalf("status %d: %s", w.Code, w.Body)
		}
		doc := decode(t, w)
		for _, k := range []string{"errors", "hints", "request_hash", "schema_compliance"} {
			if _, ok := doc[k]; ok {
				t.Errorf("compact answer has %q", k)
			}
		}
		if err := receipt.VerifyReceipt(w.Body.Bytes(), keys, ""); err != nil {
			t.Fatalf("compact receipt does not verify: %v", err)
		}
	})

	t.Run("the attestation is the last member and the rest is exactly what was signed", func(t *testing.T) {
		w := f.do(http.MethodPost, "/verify/schema", invoice("129.5", ""), nil)
		b := bytes.TrimSpace(w.Body.Bytes())
		i := bytes.LastIndex(b, []byte(`,"attestation":{`))
		if i < 0 || !bytes.HasSuffix(b, []byte("}}")) {
			t.Fatalf("attestation is not the last member: %s", b)
		}
		if !bytes.HasSuffix(b[:i], []byte(`"mcp":"`+baseURL+`/mcp"}`)) {
			t.Fatalf("verify block is not right before the attestation: %s", b[:i])
		}
	})
}

func TestTestAgentsAreFlagged(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	for _, c := range []struct {
		desc, agent string
		test        bool
	}{
		{"an agent_id starting with test- is verified, receipted and flagged", "test-demo", true},
		{"any other agent_id is not flagged", "seller-7", false},
	} {
		body := bytes.Replace(invoice("129.5", ""), []byte(`"seller-7"`), []byte(strconv.Quote(c.agent)), 1)
		w := f.do(http.MethodPost, "/verify/schema", body, nil)
		if w.Code != http.StatusOK {
			t.Fatalf("%s: status %d", c.desc, w.Code)
		}
		if err := receipt.VerifyReceipt(w.Body.Bytes(), f.keySet(t), receipt.ContextVerify); err != nil {
			t.Fatalf("%s: %v", c.desc, err)
		}
		id := decode(t, w)["verification_id"].(string)
		rec, err := f.db.Verification(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if rec.Test != c.test {
			t.Errorf("%s: recorded Test=%v", c.desc, rec.Test)
		}
	}
}

func TestGatewayHeaders(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	paid := map[string]string{
		"X-Aov-Payment": "paid",
		"X-Aov-Payer":   "0x1111111111111111111111111111111111111111",
		"X-Aov-Network": "eip155:8453",
		"X-Aov-Wallet":  "0x2222222222222222222222222222222222222222",
	}
	with := func(extra map[string]string) map[string]string {
		m := map[string]string{}
		for k, v := range paid {
			m[k] = v
		}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	for _, c := range []struct {
		desc    string
		agent   string
		hdr     map[string]string
		payment string
		payer   string
		network string
		wallet  string
		authn   bool
	}{
		{"without the gateway token the headers are ignored and payment is unknown", "seller-7", paid, "unknown", "", "", "", false},
		{"with a wrong token the headers are ignored", "seller-7", with(map[string]string{"X-Aov-Gateway-Token": "wrong-token-0123456789"}), "unknown", "", "", "", false},
		{"with the right token they are recorded", "seller-7", with(map[string]string{"X-Aov-Gateway-Token": gatewayToken}), "paid", paid["X-Aov-Payer"], "eip155:8453", paid["X-Aov-Wallet"], false},
		{"a free call through the gateway is recorded as free", "seller-7", map[string]string{"X-Aov-Gateway-Token": gatewayToken, "X-Aov-Payment": "free"}, "free", "", "", "", false},
		{"an unknown payment value is recorded as unknown", "seller-7", with(map[string]string{"X-Aov-Gateway-Token": gatewayToken, "X-Aov-Payment": "maybe"}), "unknown", paid["X-Aov-Payer"], "eip155:8453", paid["X-Aov-Wallet"], false},
		{"an address with spaces or control characters is dropped", "seller-7", with(map[string]string{"X-Aov-Gateway-Token": gatewayToken, "X-Aov-Payer": "0x11 11"}), "paid", "", "eip155:8453", paid["X-Aov-Wallet"], false},
		{"an EVM address matches the proven wallet in any letter case", "0x" + strings.ToUpper("aa22222222222222222222222222222222222222"), with(map[string]string{"X-Aov-Gateway-Token": gatewayToken, "X-Aov-Wallet": "0xaa22222222222222222222222222222222222222"}), "paid", paid["X-Aov-Payer"], "eip155:8453", "0xaa22222222222222222222222222222222222222", true},
		{"an agent_id naming another wallet is not authenticated", "0x3333333333333333333333333333333333333333", with(map[string]string{"X-Aov-Gateway-Token": gatewayToken}), "paid", paid["X-Aov-Payer"], "eip155:8453", paid["X-Aov-Wallet"], false},
		{"an agent_id that is the proven wallet is authenticated", "0x2222222222222222222222222222222222222222", with(map[string]string{"X-Aov-Gateway-Token": gatewayToken}), "paid", paid["X-Aov-Payer"], "eip155:8453", paid["X-Aov-Wallet"], true},
		{"a CAIP-10 agent_id ending in the proven wallet is authenticated", "eip155:8453:0x2222222222222222222222222222222222222222", with(map[string]string{"X-Aov-Gateway-Token": gatewayToken}), "paid", paid["X-Aov-Payer"], "eip155:8453", paid["X-Aov-Wallet"], true},
		{"an agent_id the wallet proof bound to the wallet is authenticated", "seller-7", with(map[string]string{"X-Aov-Gateway-Token": gatewayToken, "X-Aov-Wallet-Agent": "seller-7"}), "paid", paid["X-Aov-Payer"], "eip155:8453", paid["X-Aov-Wallet"], true},
		{"an agent_id other than the one the proof bound is not authenticated", "seller-8", with(map[string]string{"X-Aov-Gateway-Token": gatewayToken, "X-Aov-Wallet-Agent": "seller-7"}), "paid", paid["X-Aov-Payer"], "eip155:8453", paid["X-Aov-Wallet"], false},
		{"a bound agent without a proven wallet authenticates nothing", "seller-7", map[string]string{"X-Aov-Gateway-Token": gatewayToken, "X-Aov-Payment": "free", "X-Aov-Wallet-Agent": "seller-7"}, "free", "", "", "", false},
		{"a wallet header without the token authenticates nothing", "0x2222222222222222222222222222222222222222", paid, "unknown", "", "", "", false},
	} {
		t.Run(c.desc, func(t *testing.T) {
			body := bytes.Replace(invoice("129.5", ""), []byte(`"seller-7"`), []byte(strconv.Quote(c.agent)), 1)
			w := f.do(http.MethodPost, "/verify/schema", body, c.hdr)
			if w.Code != http.StatusOK {
				t.Fatalf("status %d: %s", w.Code, w.Body)
			}
			rec, err := f.db.Verification(context.Background(), decode(t, w)["verification_id"].(string))
			if err != nil {
				t.Fatal(err)
			}
			wantPayment := c.payment
			if wantPayment == "" {
				wantPayment = "unknown"
			}
			if rec.Payment != wantPayment || rec.Payer != c.payer || rec.Network != c.network || rec.Wallet != c.wallet || rec.Authenticated != c.authn {
				t.Errorf("recorded payment=%q payer=%q network=%q wallet=%q authenticated=%v; want %q %q %q %q %v",
					rec.Payment, rec.Payer, rec.Network, rec.Wallet, rec.Authenticated, wantPayment, c.payer, c.network, c.wallet, c.authn)
			}
		})
	}
}

func TestGatewayHeadersWithoutAConfiguredToken(t *testing.T) {
	f := newFixture(t, fixtureOpts{noGatewayToken: true})
	for _, tok := range []string{gatewayToken, ""} {
		w := f.do(http.MethodPost, "/verify/schema", invoice("129.5", ""), map[string]string{
			"X-Aov-Gateway-Token": tok, "X-Aov-Payment": "paid", "X-Aov-Payer": "0x1111111111111111111111111111111111111111"})
		if w.Code != http.StatusOK {
			t.Fatalf("status %d", w.Code)
		}
		rec, err := f.db.Verification(context.Background(), decode(t, w)["verification_id"].(string))
		if err != nil {
			t.Fatal(err)
		}
		if rec.Payment != store.PaymentUnknown || rec.Payer != "" {
			t.Errorf("token %q: with no token configured the headers were believed: %+v", tok, rec)
		}
	}
}

func TestRefusals(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	const secret = "SECRET-CONTENT-7f3a"
	big := append([]byte(`{"task_id":"big","submitted_output":"`), bytes.Repeat([]byte("x"), 2<<20)...)
	big = append(big, `"}`...)

	for _, c := range []struct {
		desc    string
		method  string
		path    string
		body    []byte
		hdr     map[string]string
		chunked bool
		status  int
		code    string
		allow   string
		inMsg   string
	}{
		{"a 2 MiB body is 413 naming the limit", "POST", "/verify/schema", big, nil, false, 413, "payload_too_large", "", "1048576 bytes"},
		{"a 2 MiB body without a Content-Length is 413 too", "POST", "/verify/schema", big, nil, true, 413, "payload_too_large", "", "1048576 bytes"},
		{"malformed JSON is 422 without echoing the input", "POST", "/verify/schema", []byte(`{"task_id":"` + secret + `",`), nil, false, 422, "invalid_request", "", ""},
		{"a request breaking SPEC §3 is 422", "POST", "/verify/schema", []byte(`{"task_id":"` + secret + `","expected_schema":{},"submitted_output":1,"rules":[{"type":"` + secret + `","field":"a"}]}`), nil, false, 422, "invalid_request", "", ""},
		{"an empty body is 422", "POST", "/verify/schema", []byte{}, nil, false, 422, "invalid_request", "", ""},
		{"a body sent as text/plain is 415", "POST", "/verify/schema", invoice("129.5", ""), map[string]string{"Content-Type": "text/plain"}, false, 415, "unsupported_media_type", "", ""},
		{"a body without a Content-Type is 415", "POST", "/verify/schema", invoice("129.5", ""), map[string]string{"Content-Type": ""}, false, 415, "unsupported_media_type", "", ""},
		{"an unknown path is 404", "GET", "/verify/other", nil, nil, false, 404, "not_found", "", ""},
		{"a path with a trailing slash is 404", "POST", "/verify/schema/", invoice("129.5", ""), nil, false, 404, "not_found", "", ""},
		{"GET on a verify route is 405 with Allow: POST", "GET", "/verify/schema", nil, nil, false, 405, "method_not_allowed", "POST", ""},
		{"PUT on /verify/deliverable is 405 with Allow: POST", "PUT", "/verify/deliverable", invoice("129.5", ""), nil, false, 405, "method_not_allowed", "POST", ""},
		{"POST on /health is 405 with Allow: GET, HEAD", "POST", "/health", []byte(`{}`), nil, false, 405, "method_not_allowed", "GET, HEAD", ""},
	} {
		t.Run(c.desc, func(t *testing.T) {
			r := newRequest(c.method, c.path, c.body, c.hdr)
			if c.chunked {
				r.ContentLength = -1
				r.Body = io.NopCloser(bytes.NewReader(c.body))
			}
			w := httptest.NewRecorder()
			f.h.ServeHTTP(w, r)
			if w.Code != c.status {
				t.Fatalf("status %d, want %d: %s", w.Code, c.status, w.Body)
			}
			e := decode(t, w)
			if e["code"] != c.code || e["status"] != float64(c.status) || e["charged"] != false {
				t.Errorf("error %v, want code %s", e, c.code)
			}
			if got := w.Header().Get("Allow"); got != c.allow {
				t.Errorf("Allow %q, want %q", got, c.allow)
			}
			if c.inMsg != "" && !strings.Contains(e["message"].(string), c.inMsg) {
				t.Errorf("message %q does not name %q", e["message"], c.inMsg)
			}
			if strings.Contains(w.Body.String(), secret) {
				t.Errorf("the answer echoes the input: %s", w.Body)
			}
		})
	}
	if n := len(f.allRecords(t)); n != 0 {
		t.Fatalf("%d verifications recorded by refused requests", n)
	}
	if strings.Contains(f.logs.String(), secret) {
		t.Fatal("the logs contain request content")
	}
}

func TestSignerDown(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	// One good call first, so the key version is cached: the failure must
	// come from signing itself, not only from the key lookup.
	if w := f.do(http.MethodPost, "/verify/schema", invoice("129.5", ""), nil); w.Code != 200 {
		t.Fatalf("warm-up status %d", w.Code)
	}
	before := len(f.allRecords(t))
	f.stopSigner(t)

	for _, path := range []string{"/verify/schema", "/verify/deliverable"} {
		w := f.do(http.MethodPost, path, invoice("129.5", ""), nil)
		if w.Code != http.StatusServiceUnavailable {
			t.Fatalf("%s with certd down: status %d, want 503: %s", path, w.Code, w.Body)
		}
		e := decode(t, w)
		if e["code"] != "upstream_unavailable" || e["retryable"] != true || e["charged"] != false {
			t.Errorf("error %v, want upstream_unavailable, retryable, not charged", e)
		}
		if ra, err := strconv.Atoi(w.Header().Get("Retry-After")); err != nil || ra < 1 {
			t.Errorf("Retry-After %q, want a positive number of seconds", w.Header().Get("Retry-After"))
		}
		if strings.Contains(w.Body.String(), "attestation") || strings.Contains(w.Body.String(), "verification_id") {
			t.Errorf("an unsigned result leaked: %s", w.Body)
		}
	}
	if after := len(f.allRecords(t)); after != before {
		t.Fatalf("%d verifications recorded while certd was down", after-before)
	}
	if got := counter(t, f, "aov_verifierd_signer_errors_total", map[string]string{"kind": "unavailable"}); got != 2 {
		t.Errorf("signer_errors_total{kind=unavailable} = %v, want 2", got)
	}
	w := f.do(http.MethodGet, "/health", nil, nil)
	if w.Code != http.StatusServiceUnavailable || decode(t, w)["code"] != "upstream_unavailable" {
		t.Fatalf("health with certd down: %d %s", w.Code, w.Body)
	}

	// certd back: verifications work again.
	f.startSigner(t)
	if w := f.do(http.MethodPost, "/verify/schema", invoice("129.5", ""), nil); w.Code != 200 {
		t.Fatalf("after certd came back: status %d: %s", w.Code, w.Body)
	}
}

func TestStoreDown(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	if err := f.db.Close(); err != nil {
		t.Fatal(err)
	}
	w := f.do(http.MethodPost, "/verify/schema", invoice("129.5", ""), nil)
	if w.Code != http.StatusServiceUnavailable {
		t.Fatalf("status %d with the store closed, want 503: %s", w.Code, w.Body)
	}
	e := decode(t, w)
	if e["code"] != "upstream_unavailable" || e["retryable"] != true || w.Header().Get("Retry-After") == "" {
		t.Errorf("error %v", e)
	}
	if strings.Contains(w.Body.String(), "attestation") {
		t.Fatalf("a signed but unrecorded receipt was sent: %s", w.Body)
	}
	if got := counter(t, f, "aov_verifierd_store_errors_total", nil); got != 1 {
		t.Errorf("store_errors_total = %v, want 1", got)
	}
	if w := f.do(http.MethodGet, "/health", nil, nil); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("health with the store closed: %d", w.Code)
	}
}

func TestHealth(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	for _, m := range []string{http.MethodGet, http.MethodHead} {
		w := f.do(m, "/health", nil, nil)
		if w.Code != http.StatusOK {
			t.Fatalf("%s /health = %d: %s", m, w.Code, w.Body)
		}
		if m == http.MethodHead && w.Body.Len() != 0 {
			t.Errorf("HEAD /health has a body")
		}
	}
}

func TestKeyRotationIsFollowed(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	first := decode(t, f.do(http.MethodPost, "/verify/schema", invoice("129.5", ""), nil))
	k1 := first["verify"].(map[string]any)["key_version"]

	// Rotate while the client still has the old version cached: certd
	// answers "stale key" and the handler must rebuild and re-sign.
	newKey, err := f.keys.Rotate()
	if err != nil {
		t.Fatal(err)
	}
	w := f.do(http.MethodPost, "/verify/schema", invoice("129.5", ""), nil)
	if w.Code != http.StatusOK {
		t.Fatalf("after rotation: status %d: %s", w.Code, w.Body)
	}
	doc := decode(t, w)
	if doc["verify"].(map[string]any)["key_version"] != newKey.Version || doc["attestation"].(map[string]any)["key_version"] != newKey.Version {
		t.Fatalf("after rotation signed with %v, want %s (was %v)", doc["verify"], newKey.Version, k1)
	}
	keys := f.keySet(t)
	for _, b := range [][]byte{w.Body.Bytes()} {
		if err := receipt.VerifyReceipt(b, keys, receipt.ContextVerify); err != nil {
			t.Fatalf("rotated receipt: %v", err)
		}
	}
	if got := counter(t, f, "aov_verifierd_signer_errors_total", map[string]string{"kind": "stale_key"}); got != 1 {
		t.Errorf("signer_errors_total{kind=stale_key} = %v, want 1", got)
	}
	rec, err := f.db.Verification(context.Background(), doc["verification_id"].(string))
	if err != nil || rec.KeyVersion != newKey.Version {
		t.Fatalf("record key version %q, %v", rec.KeyVersion, err)
	}
}

func TestMetricsAndLogs(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	f.do(http.MethodPost, "/verify/schema", invoice("135.0", ""), nil)
	f.do(http.MethodPost, "/verify/schema", invoice("129.5", ""), map[string]string{"X-Aov-Gateway-Token": gatewayToken, "X-Aov-Payment": "free"})
	f.do(http.MethodGet, "/nope", nil, nil)
	for _, c := range []struct {
		desc   string
		name   string
		labels map[string]string
		want   float64
	}{
		{"each answered request is counted by route and status", "aov_verifierd_requests_total", map[string]string{"route": "verify_schema", "status": "200"}, 2},
		{"unknown paths are counted under one route label", "aov_verifierd_requests_total", map[string]string{"route": "unknown", "status": "404"}, 1},
		{"verifications are counted by result and payment", "aov_verifierd_verifications_total", map[string]string{"result": "fail", "payment": "unknown"}, 1},
		{"a free call is counted as free", "aov_verifierd_verifications_total", map[string]string{"result": "pass", "payment": "free"}, 1},
	} {
		if got := counter(t, f, c.name, c.labels); got != c.want {
			t.Errorf("%s: %s%v = %v, want %v", c.desc, c.name, c.labels, got, c.want)
		}
	}
	if n := histogramCount(t, f, "aov_verifierd_request_duration_seconds", map[string]string{"route": "verify_schema"}); n != 2 {
		t.Errorf("latency histogram has %d observations, want 2", n)
	}
	logs := f.logs.String()
	for _, want := range []string{`"route":"verify_schema"`, `"status":200`, `"verification_id":`, `"result":"fail"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("access log lacks %s:\n%s", want, logs)
		}
	}
	for _, leak := range []string{"INV-7731", "A-100", "seller-7"} {
		if strings.Contains(logs, leak) {
			t.Errorf("logs contain request content %q", leak)
		}
	}
}

// counter reads one counter's value from the fixture's registry (0 when
// the series does not exist).
func counter(t testing.TB, f *fixture, name string, labels map[string]string) float64 {
	t.Helper()
	m := metric(t, f, name, labels)
	if m == nil {
		return 0
	}
	return m.GetCounter().GetValue()
}

func histogramCount(t testing.TB, f *fixture, name string, labels map[string]string) uint64 {
	t.Helper()
	m := metric(t, f, name, labels)
	if m == nil {
		return 0
	}
	return m.GetHistogram().GetSampleCount()
}

func metric(t testing.TB, f *fixture, name string, labels map[string]string) *dto.Metric {
	t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.Metric {
			got := map[string]string{}
			for _, lp := range m.Label {
				got[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue next
				}
			}
			return m
		}
	}
	return nil
}

// A 5xx is logged as an error only when the caller is still there: a
// request its caller abandoned (a client that gave up, the gateway
// cancelling for its own client) is logged at info, so an operator's error
// alerts do not fire on clients' timeouts; a failure of verifierd's own
// (here its history store closed) stays an error.
func TestAnAbandonedRequestIsNotLoggedAsAnError(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, newRequest(http.MethodPost, "/verify/schema", invoice("135.0", ""), nil).WithContext(ctx))
	if w.Code != http.StatusServiceUnavailable {
		t.Fatalf("abandoned request: status %d, want 503: %s", w.Code, w.Body)
	}
	logs := f.logs.String()
	if !strings.Contains(logs, `"level":"INFO","msg":"request abandoned by its caller"`) || strings.Contains(logs, `"level":"ERROR"`) {
		t.Fatalf("an abandoned request is not logged at info alone:\n%s", logs)
	}
	f.db.Close()
	if w := f.do(http.MethodPost, "/verify/schema", invoice("135.0", ""), nil); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("with the store closed: status %d, want 503: %s", w.Code, w.Body)
	}
	if logs := f.logs.String(); !strings.Contains(logs, `"level":"ERROR","msg":"request failed"`) {
		t.Fatalf("a failure of verifierd's own is not logged as an error:\n%s", logs)
	}
}

// A document goes out with its length, not chunked: a verification's
// answer is over net/http's 2 KiB buffer, and the gateway's proxy would
// otherwise have to decode the chunks of every answer.
func TestAnswersAreSentWithTheirLength(t *testing.T) {
	f := newFixture(t, fixtureOpts{noSync: true, localSigner: true})
	srv := httptest.NewServer(f.h)
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/verify/schema", "application/json", bytes.NewReader(invoice("135.0", "")))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || len(body) <= 2048 {
		t.Fatalf("status %d, %d bytes: want a 200 over 2 KiB to show the point", resp.StatusCode, len(body))
	}
	if len(resp.TransferEncoding) != 0 || resp.ContentLength != int64(len(body)) {
		t.Fatalf("answer sent with Transfer-Encoding %v and Content-Length %d for a %d-byte body", resp.TransferEncoding, resp.ContentLength, len(body))
	}
}
