package e2e

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/store"
)

// result is the part of a verification response these tests read.
type result struct {
	Summary struct {
		Result         string   `json:"result"`
		BlockingChecks []string `json:"blocking_checks"`
	} `json:"summary"`
	Result         string   `json:"result"`
	VerificationID string   `json:"verification_id"`
	AgentID        *string  `json:"agent_id"`
	Errors         []string `json:"errors"`
	ErrorsDetail   []struct {
		Check    string `json:"check"`
		Path     string `json:"path"`
		Expected string `json:"expected"`
		Found    string `json:"found"`
	} `json:"errors_detail"`
	SchemaCompliance block `json:"schema_compliance"`
	Verify           struct {
		PublicKeyURL string `json:"public_key_url"`
		KeyVersion   string `json:"key_version"`
	} `json:"verify"`
	Attestation struct {
		Algorithm  string `json:"algorithm"`
		KeyVersion string `json:"key_version"`
		Signature  string `json:"signature"`
	} `json:"attestation"`
}

type block struct {
	Ratio  float64 `json:"ratio"`
	Passed int     `json:"passed"`
	Total  int     `json:"total"`
}

func decode[T any](t *testing.T, r response) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(r.body, &v); err != nil {
		t.Fatalf("answer is not the expected JSON (%v): %.500s", err, r.body)
	}
	return v
}

func mustStatus(t *testing.T, r response, want int) {
	t.Helper()
	if r.status != want {
		t.Fatalf("status %d, want %d; body: %.800s", r.status, want, r.body)
	}
}

// verifyReceipt runs `aov receipt verify --card <card> <file>` on a saved
// response and returns the exit code and output.
func verifyReceipt(t *testing.T, s *stack, name string, body []byte) (string, int) {
	t.Helper()
	return aov(t, "receipt", "verify", "--card", s.cardURL(), writeFile(t, name, body))
}

// The worked example of SPEC §10 through the whole stack: the draft fails
// with exactly the blocking check and error the contract gives, the fixed
// invoice passes, and both receipts verify with the aov command against the
// agent card the stack serves.
func TestWorkedExampleThroughCaddy(t *testing.T) {
	s := newStack(t)

	draft := post(t, s.url("/verify/schema"), example(t, "invoice-draft.json"))
	mustStatus(t, draft, http.StatusOK)
	fixed := post(t, s.url("/verify/schema"), example(t, "invoice-fixed.json"))
	mustStatus(t, fixed, http.StatusOK)

	t.Run("the draft invoice fails on consistency:sum_equals alone, with the contract's error", func(t *testing.T) {
		r := decode[result](t, draft)
		if r.Result != "fail" || r.Summary.Result != "fail" {
			t.Fatalf("result %q / summary %q, want fail", r.Result, r.Summary.Result)
		}
		if !slices.Equal(r.Summary.BlockingChecks, []string{"consistency:sum_equals"}) {
			t.Fatalf("blocking_checks %q", r.Summary.BlockingChecks)
		}
		want := "enforce_rules: consistency:sum_equals at 'line_items[].line_total': values sum to 129.5, expected total (135.0)"
		if !slices.Equal(r.Errors, []string{want}) {
			t.Fatalf("errors %q,\nwant [%q]", r.Errors, want)
		}
		if len(r.ErrorsDetail) != 1 {
			t.Fatalf("errors_detail has %d entries, want 1", len(r.ErrorsDetail))
		}
		d := r.ErrorsDetail[0]
		if d.Check != "consistency:sum_equals" || d.Path != "$.line_items[].line_total" ||
			d.Expected != "a sum equal to total (135.0)" || d.Found != "sum 129.5" {
			t.Fatalf("errors_detail[0] = %+v", d)
		}
		if r.SchemaCompliance != (block{Ratio: 1, Passed: 22, Total: 22}) {
			t.Fatalf("schema_compliance %+v, want 22/22", r.SchemaCompliance)
		}
	})

	t.Run("the fixed invoice passes with no blocking check", func(t *testing.T) {
		r := decode[result](t, fixed)
		if r.Result != "pass" || len(r.Summary.BlockingChecks) != 0 || len(r.Errors) != 0 {
			t.Fatalf("result %q, blocking %q, errors %q", r.Result, r.Summary.BlockingChecks, r.Errors)
		}
		if r.SchemaCompliance != (block{Ratio: 1, Passed: 22, Total: 22}) {
			t.Fatalf("schema_compliance %+v, want 22/22", r.SchemaCompliance)
		}
	})

	t.Run("receipts point at the agent card the gateway serves and are signed by its current key", func(t *testing.T) {
		for _, body := range [][]byte{draft.body, fixed.body} {
			r := decode[result](t, response{body: body})
			if r.Verify.PublicKeyURL != s.cardURL() {
				t.Errorf("public_key_url %q, want %q", r.Verify.PublicKeyURL, s.cardURL())
			}
			if r.Attestation.Algorithm != "Ed25519" || r.Attestation.KeyVersion != "k1" || r.Verify.KeyVersion != "k1" {
				t.Errorf("attestation %+v / verify key_version %q, want Ed25519 k1", r.Attestation, r.Verify.KeyVersion)
			}
		}
	})

	t.Run("both receipts verify with the aov command against the served card", func(t *testing.T) {
		for name, body := range map[string][]byte{"draft.json": draft.body, "fixed.json": fixed.body} {
			if out, code := verifyReceipt(t, s, name, body); code != 0 {
				t.Errorf("aov receipt verify %s: exit %d\n%s", name, code, out)
			}
		}
	})

	t.Run("a receipt whose result was changed does not verify", func(t *testing.T) {
		forged := bytes.Replace(draft.body, []byte(`"result":"fail"`), []byte(`"result":"pass"`), -1)
		if bytes.Equal(forged, draft.body) {
			t.Fatal("the draft's answer has no \"result\":\"fail\" to alter")
		}
		if out, code := verifyReceipt(t, s, "forged.json", forged); code == 0 {
			t.Fatalf("aov accepted a forged receipt:\n%s", out)
		}
	})

	t.Run("the same check answers under its second name, /verify/deliverable", func(t *testing.T) {
		r := post(t, s.url("/verify/deliverable"), example(t, "invoice-fixed.json"))
		mustStatus(t, r, http.StatusOK)
		if got := decode[result](t, r); got.Result != "pass" {
			t.Fatalf("result %q", got.Result)
		}
	})
}

// Refusals come in the SPEC §6 shape, never echo the input, and Caddy's own
// answers (unknown path, daemon down) use the same shape as the daemons.
func TestRefusalsThroughCaddy(t *testing.T) {
	s := newStack(t)

	t.Run("a 2 MiB body is refused with 413 payload_too_large", func(t *testing.T) {
		big := append([]byte(`{"task_id":"big","pad":"`), bytes.Repeat([]byte("a"), 2<<20)...)
		big = append(big, `"}`...)
		r := post(t, s.url("/verify/schema"), big)
		mustStatus(t, r, http.StatusRequestEntityTooLarge)
		e := decode[apierr.Error](t, r)
		if e.Code != apierr.CodePayloadTooLarge || e.Charged || e.Status != 413 {
			t.Fatalf("error %+v", e)
		}
	})

	const marker = "ECHO-CANARY-5be1c7"
	tests := []struct {
		desc string
		body string
	}{
		{"malformed JSON is refused with 422 without echoing it", `{"task_id":"` + marker + `","expected_schema":{`},
		{"duplicate keys are refused with 422 without echoing them", `{"task_id":"a","task_id":"` + marker + `","expected_schema":{},"submitted_output":1}`},
		{"an unknown field is refused with 422 without echoing its value", `{"task_id":"a","expected_schema":{},"submitted_output":1,"unexpected":"` + marker + `"}`},
		{"a value of the wrong type is refused with 422 without echoing it", `{"task_id":["` + marker + `"],"expected_schema":{},"submitted_output":1}`},
		{"an invalid schema is refused with 422 without echoing it", `{"task_id":"a","expected_schema":{"type":"` + marker + `"},"submitted_output":1}`},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			r := post(t, s.url("/verify/schema"), []byte(tc.body))
			mustStatus(t, r, http.StatusUnprocessableEntity)
			e := decode[apierr.Error](t, r)
			if e.Code != apierr.CodeInvalidRequest || e.Charged || e.Retryable {
				t.Fatalf("error %+v", e)
			}
			if bytes.Contains(r.body, []byte(marker)) {
				t.Fatalf("the answer echoes the input: %s", r.body)
			}
		})
	}

	t.Run("the access log records requests without headers: no payment or wallet credential", func(t *testing.T) {
		const pay, wallet, siwx = "PAYMENT-CANARY-41d2", "WALLET-CANARY-90ae", "SIWX-CANARY-7c31"
		r := do(t, http.MethodGet, s.url("/health?probe=access-log"), nil, map[string]string{
			"Payment-Signature": pay,
			"X-Wallet-Auth":     wallet,
			"Sign-In-With-X":    siwx,
		})
		mustStatus(t, r, http.StatusOK)
		var log []byte
		waitFor(t, "the request in the access log", func() error {
			var err error
			log, err = os.ReadFile(filepath.Join(s.dir, "logs", "access.log"))
			if err != nil {
				return err
			}
			if !bytes.Contains(log, []byte("probe=access-log")) {
				return errNotYet
			}
			return nil
		})
		if bytes.Contains(log, []byte(pay)) || bytes.Contains(log, []byte(wallet)) || bytes.Contains(log, []byte(siwx)) {
			t.Fatalf("the access log holds a credential:\n%s", log)
		}
		if bytes.Contains(log, []byte(`"headers"`)) || bytes.Contains(log, []byte(`"resp_headers"`)) {
			t.Fatalf("the access log holds headers:\n%s", log)
		}
	})

	t.Run("an unknown path is a 404 in the service's error shape", func(t *testing.T) {
		r := get(t, s.url("/no/such/endpoint"))
		mustStatus(t, r, http.StatusNotFound)
		assertSameJSON(t, r.body, apierr.NotFound("endpoint"))
	})

	t.Run("a page on another origin may pay and speak MCP: preflights and a 402 carry the CORS headers", func(t *testing.T) {
		const origin = "https://buyer.example"
		has := func(list, want string) bool {
			for _, v := range strings.Split(list, ",") {
				if strings.EqualFold(strings.TrimSpace(v), want) {
					return true
				}
			}
			return false
		}
		for _, pre := range []struct{ path, method, headers string }{
			{"/verify/schema", "POST", "content-type, payment-signature, x-wallet-auth"},
			{"/score/agent-1", "GET", "sign-in-with-x"},
			{"/mcp", "POST", "content-type, mcp-protocol-version, mcp-session-id"},
			{"/mcp", "GET", "mcp-protocol-version, mcp-session-id, last-event-id"},
			{"/mcp", "DELETE", "mcp-protocol-version, mcp-session-id"},
		} {
			r := do(t, http.MethodOptions, s.url(pre.path), nil, map[string]string{
				"Origin": origin, "Access-Control-Request-Method": pre.method, "Access-Control-Request-Headers": pre.headers,
			})
			mustStatus(t, r, http.StatusNoContent)
			if got := r.header.Get("Access-Control-Allow-Origin"); got != "*" {
				t.Errorf("preflight %s %s: Access-Control-Allow-Origin %q, want *", pre.method, pre.path, got)
			}
			if !has(r.header.Get("Access-Control-Allow-Methods"), pre.method) {
				t.Errorf("preflight %s %s: Access-Control-Allow-Methods %q", pre.method, pre.path, r.header.Get("Access-Control-Allow-Methods"))
			}
			for _, h := range strings.Split(pre.headers, ", ") {
				if !has(r.header.Get("Access-Control-Allow-Headers"), h) {
					t.Errorf("preflight %s %s: %s not in Access-Control-Allow-Headers %q", pre.method, pre.path, h, r.header.Get("Access-Control-Allow-Headers"))
				}
			}
		}
		r := do(t, http.MethodGet, s.url("/score/agent-1"), nil, map[string]string{"Origin": origin})
		mustStatus(t, r, http.StatusPaymentRequired)
		if got := r.header.Get("Access-Control-Allow-Origin"); got != "*" {
			t.Errorf("the 402: Access-Control-Allow-Origin %q, want *", got)
		}
		if r.header.Get("Payment-Required") == "" || !has(r.header.Get("Access-Control-Expose-Headers"), "PAYMENT-REQUIRED") {
			t.Errorf("the 402: PAYMENT-REQUIRED %q, Access-Control-Expose-Headers %q", r.header.Get("Payment-Required"), r.header.Get("Access-Control-Expose-Headers"))
		}
		if r.header.Get("Access-Control-Allow-Credentials") != "" {
			t.Errorf("the 402 allows credentials")
		}
	})
}

// certd's signing endpoint is a unix socket (mode 0600) that only verifierd
// uses; nothing reachable through Caddy signs anything.
func TestSigningEndpointIsNotReachableThroughCaddy(t *testing.T) {
	s := newStack(t)

	fi, err := os.Stat(s.sock)
	if err != nil {
		t.Fatalf("certd's signing socket: %v", err)
	}
	if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Fatalf("signing socket is %v, want a socket with mode 0600", fi.Mode())
	}

	signReq := []byte(`{"context":"json-schema-verifier/verify-schema-attestation/v1","key_version":"k1","attested_at":"` +
		time.Now().UTC().Format("2006-01-02T15:04:05.000000+00:00") + `","response":{"result":"pass"}}`)
	paths := []string{"/v1/sign", "/v1/key", "/sign", "/certd/v1/sign", "/.well-known/v1/sign",
		"/.well-known/agent-card.json/../../v1/sign", "/%2e%2e/v1/sign", "/verify/../v1/sign"}
	for _, base := range []struct{ name, url string }{
		{"through Caddy", s.base()},
		{"on certd's public listener", "http://" + s.certdPublic},
	} {
		for _, p := range paths {
			for _, m := range []string{http.MethodPost, http.MethodGet} {
				t.Run(m+" "+p+" "+base.name+" signs nothing", func(t *testing.T) {
					var body []byte
					if m == http.MethodPost {
						body = signReq
					}
					r := do(t, m, base.url+p, body, nil)
					if r.status == http.StatusOK || bytes.Contains(r.body, []byte(`"signature"`)) || bytes.Contains(r.body, []byte(`"key_version"`)) {
						t.Fatalf("status %d, body %.300s", r.status, r.body)
					}
				})
			}
		}
	}
}

// A path Caddy's matcher cleans to a free route (/health, /reputation/*)
// is proxied as sent, with the gateway's token: verifierd must not read it
// as the paid /score/{agent_id}. The same score, asked for plainly, is a
// 402.
func TestPathsCleanedToAFreeRouteReachNoPaidRoute(t *testing.T) {
	s := newStack(t)
	for _, p := range []string{
		"/score/x/../../health",
		"/score/victim/..%2F..%2Freputation%2Fa",
		"/score/a/../../reputation/b",
	} {
		r := do(t, http.MethodGet, s.url(p), nil, nil)
		if r.status == http.StatusOK || bytes.Contains(r.body, []byte(`"score"`)) || bytes.Contains(r.body, []byte(`"attestation"`)) {
			t.Errorf("GET %s: %d %.300s", p, r.status, r.body)
		}
	}
	if r := do(t, http.MethodGet, s.url("/score/x"), nil, nil); r.status != http.StatusPaymentRequired {
		t.Errorf("GET /score/x: %d, want 402", r.status)
	}
}

// The gateway's own copy of X-Aov-* is the only one verifierd sees: a
// client cannot claim to have paid, nor pose as the gateway; a free call is
// recorded as free because the gateway says so. A client's Incremental goes
// too.
func TestClientGatewayHeadersAreStripped(t *testing.T) {
	s := newStack(t)
	forged := map[string]string{
		"X-Aov-Payment": "paid",
		"X-Aov-Payer":   "0x00000000000000000000000000000000000000aa",
		"X-Aov-Network": "eip155:8453",
		"X-Aov-Wallet":  "0x00000000000000000000000000000000000000bb",
	}
	withAgent := func(agent string) []byte {
		return bytes.Replace(example(t, "invoice-fixed.json"), []byte(`"test-seller-1"`), []byte(`"`+agent+`"`), 1)
	}

	// Control: verifierd does record these headers when the gateway token
	// is right, so their absence below is the gateway's doing.
	direct := copyMap(forged)
	direct["X-Aov-Gateway-Token"] = s.token
	mustStatus(t, do(t, http.MethodPost, "http://"+s.verifierdAddr+"/verify/schema", withAgent("e2e-direct"), direct), http.StatusOK)

	viaCaddy := copyMap(forged)
	viaCaddy["X-Aov-Gateway-Token"] = "forged-token-forged-token"
	mustStatus(t, do(t, http.MethodPost, s.url("/verify/schema"), withAgent("e2e-client"), viaCaddy), http.StatusOK)

	// The gateway reads a body whole before forwarding it (request_buffers),
	// so a client's wish to have it streamed cannot be honoured; the header
	// is dropped, and the call served, instead of reverse_proxy's 501.
	incremental := do(t, http.MethodPost, s.url("/verify/schema"), withAgent("e2e-incremental"), map[string]string{"Incremental": "?1"})

	log := s.verifierd.tail(1 << 20)
	ctl := s.history(t, "e2e-direct")
	got := s.history(t, "e2e-client")
	streamed := s.history(t, "e2e-incremental")

	t.Run("control: with the gateway token verifierd records the reported payment", func(t *testing.T) {
		if len(ctl) != 1 || ctl[0].Payment != store.PaymentPaid || ctl[0].Payer != forged["X-Aov-Payer"] {
			t.Fatalf("records %+v", ctl)
		}
	})
	t.Run("through Caddy, client-sent X-Aov-* headers never reach verifierd; the gateway's do", func(t *testing.T) {
		if len(got) != 1 {
			t.Fatalf("%d records, want 1", len(got))
		}
		r := got[0]
		if r.Payment != store.PaymentFree || r.Payer != "" || r.Network != "" || r.Wallet != "" {
			t.Fatalf("want a free call with no payer, network or wallet: %+v", r)
		}
	})
	t.Run("through Caddy, the client's forged gateway token is replaced by the real one", func(t *testing.T) {
		if strings.Contains(log, "wrong gateway token") {
			t.Fatalf("verifierd saw a wrong gateway token:\n%s", log)
		}
	})
	t.Run("through Caddy, a client's Incremental header is dropped, not refused", func(t *testing.T) {
		mustStatus(t, incremental, http.StatusOK)
		if len(streamed) != 1 {
			t.Fatalf("%d records, want 1", len(streamed))
		}
	})
}

func copyMap(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// After `certd rotate`, new receipts carry the new key version and old
// receipts still verify against the served card, which lists both keys.
func TestKeyRotation(t *testing.T) {
	s := newStack(t)
	before := post(t, s.url("/verify/schema"), example(t, "invoice-fixed.json"))
	mustStatus(t, before, http.StatusOK)
	if kv := decode[result](t, before).Attestation.KeyVersion; kv != "k1" {
		t.Fatalf("first receipt signed by %q, want k1", kv)
	}

	out, err := runCertd(t, "rotate", "-keys", s.keys)
	if err != nil {
		t.Fatalf("certd rotate: %v\n%s", err, out)
	}
	waitFor(t, "the card to name k2 as current", func() error {
		r := get(t, s.cardURL())
		if !bytes.Contains(r.body, []byte(`"currentKeyVersion":"k2"`)) {
			return errNotYet
		}
		return nil
	})

	t.Run("the card lists k1 as retired and k2 as current", func(t *testing.T) {
		var card struct {
			Capabilities struct {
				Extensions []struct {
					URI    string `json:"uri"`
					Params struct {
						PublicKeys []struct {
							KeyVersion string `json:"keyVersion"`
							Status     string `json:"status"`
						} `json:"publicKeys"`
					} `json:"params"`
				} `json:"extensions"`
			} `json:"capabilities"`
		}
		if err := json.Unmarshal(get(t, s.cardURL()).body, &card); err != nil {
			t.Fatal(err)
		}
		status := map[string]string{}
		for _, ext := range card.Capabilities.Extensions {
			if strings.HasPrefix(ext.URI, "urn:json-schema-verifier:extension:attestation:") {
				for _, k := range ext.Params.PublicKeys {
					status[k.KeyVersion] = k.Status
				}
			}
		}
		if status["k1"] != "retired" || status["k2"] != "current" || len(status) != 2 {
			t.Fatalf("key statuses %v", status)
		}
	})

	after := post(t, s.url("/verify/schema"), example(t, "invoice-fixed.json"))
	mustStatus(t, after, http.StatusOK)
	r := decode[result](t, after)
	if r.Attestation.KeyVersion != "k2" || r.Verify.KeyVersion != "k2" {
		t.Fatalf("receipt after rotation: attestation %q, verify %q, want k2", r.Attestation.KeyVersion, r.Verify.KeyVersion)
	}
	for name, body := range map[string][]byte{"k1.json": before.body, "k2.json": after.body} {
		if out, code := verifyReceipt(t, s, name, body); code != 0 {
			t.Errorf("%s does not verify after rotation: exit %d\n%s", name, code, out)
		}
	}
}

// A daemon that is down is a 503 the client may retry, with Retry-After,
// and nothing is recorded for a call that could not be signed.
func TestDaemonDown(t *testing.T) {
	s := newStack(t)
	const agent = "e2e-down-agent"
	body := bytes.Replace(example(t, "invoice-fixed.json"), []byte(`"test-seller-1"`), []byte(`"`+agent+`"`), 1)

	s.certd.stop(t)
	t.Run("certd down: a verification is 503 upstream_unavailable, retryable, with Retry-After", func(t *testing.T) {
		r := post(t, s.url("/verify/schema"), body)
		mustStatus(t, r, http.StatusServiceUnavailable)
		e := decode[apierr.Error](t, r)
		if e.Code != apierr.CodeUpstreamUnavailable || !e.Retryable || e.Charged || e.RetryAfter <= 0 {
			t.Fatalf("error %+v", e)
		}
		if r.header.Get("Retry-After") != strconv.Itoa(e.RetryAfter) {
			t.Fatalf("Retry-After header %q, body retry_after %d", r.header.Get("Retry-After"), e.RetryAfter)
		}
	})
	t.Run("certd down: the agent card is a 503 from the gateway", func(t *testing.T) {
		r := get(t, s.cardURL())
		mustStatus(t, r, http.StatusServiceUnavailable)
		assertSameJSON(t, r.body, apierr.Unavailable("backend service", 5, nil))
		if r.header.Get("Retry-After") != "5" {
			t.Fatalf("Retry-After %q", r.header.Get("Retry-After"))
		}
	})

	s.startCertd(t, false)
	var served result
	t.Run("certd back: the same request succeeds", func(t *testing.T) {
		r := post(t, s.url("/verify/schema"), body)
		mustStatus(t, r, http.StatusOK)
		served = decode[result](t, r)
	})

	s.verifierd.stop(t)
	t.Run("verifierd down: the gateway answers 503 upstream_unavailable with Retry-After", func(t *testing.T) {
		r := post(t, s.url("/verify/schema"), body)
		mustStatus(t, r, http.StatusServiceUnavailable)
		assertSameJSON(t, r.body, apierr.Unavailable("backend service", 5, nil))
		if r.header.Get("Retry-After") != "5" {
			t.Fatalf("Retry-After %q", r.header.Get("Retry-After"))
		}
	})

	t.Run("only the served call was recorded, none of the refused ones", func(t *testing.T) {
		recs := s.history(t, agent)
		if len(recs) != 1 || recs[0].ID != served.VerificationID {
			t.Fatalf("history %+v, want exactly verification %s", recs, served.VerificationID)
		}
	})
}

var errNotYet = errorString("not yet")

type errorString string

func (e errorString) Error() string { return string(e) }

func runCertd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(bin.certd, args...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// assertSameJSON checks that an answer Caddy writes from Caddyfile.example
// is exactly what apierr would write for the same error, so the gateway's
// own refusals cannot drift from the daemons'.
func assertSameJSON(t *testing.T, got []byte, want *apierr.Error) {
	t.Helper()
	wantJSON, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("answer is not JSON: %v: %.300s", err, got)
	}
	if err := json.Unmarshal(wantJSON, &w); err != nil {
		t.Fatal(err)
	}
	gb, _ := json.Marshal(g)
	wb, _ := json.Marshal(w)
	if !bytes.Equal(gb, wb) {
		t.Fatalf("answer\n  %s\nwant (apierr)\n  %s", gb, wb)
	}
}

// The Caddy that make run starts (cmd/caddy, built by TestMain) is v2.11.9
// with the gateway modules built in.
func TestCaddyBuild(t *testing.T) {
	out, err := exec.Command(bin.caddy, "version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "v2.11.9 ") {
		t.Fatalf("caddy version: %v: %s", err, out)
	}
	out, err = exec.Command(bin.caddy, "list-modules").CombinedOutput()
	if err != nil {
		t.Fatalf("caddy list-modules: %v: %s", err, out)
	}
	mods := strings.Fields(string(out))
	for _, want := range []string{"http.handlers.reverse_proxy", "http.handlers.x402", "http.handlers.x402_discovery", "x402.stores.badger"} {
		if !slices.Contains(mods, want) {
			t.Errorf("caddy list-modules lacks %s", want)
		}
	}
}

// The devnet facilitator answers the x402 facilitator API under
// /facilitator/, and its chain's JSON-RPC is on the configured address.
func TestDevnetFacilitator(t *testing.T) {
	s := newStack(t)
	r := get(t, s.url("/facilitator/supported"))
	mustStatus(t, r, http.StatusOK)
	var sup struct {
		Kinds []struct {
			X402Version int    `json:"x402Version"`
			Scheme      string `json:"scheme"`
			Network     string `json:"network"`
		} `json:"kinds"`
	}
	if err := json.Unmarshal(r.body, &sup); err != nil {
		t.Fatalf("supported: %v: %s", err, r.body)
	}
	found := false
	for _, k := range sup.Kinds {
		found = found || (k.X402Version == 2 && k.Scheme == "exact" && k.Network == "eip155:1337")
	}
	if !found {
		t.Fatalf("supported kinds %+v lack x402 v2 exact on eip155:1337", sup.Kinds)
	}

	rpc := do(t, http.MethodPost, "http://"+s.devnetRPC, []byte(`{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[]}`), nil)
	mustStatus(t, rpc, http.StatusOK)
	if !bytes.Contains(rpc.body, []byte(`"result":"0x539"`)) {
		t.Fatalf("eth_chainId answered %s, want 0x539 (1337)", rpc.body)
	}
}
