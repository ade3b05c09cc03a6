package caddymodule

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/aovhq/aov/apidocs"
	"github.com/aovhq/aov/x402"
)

// docsSite is a gateway with the verify route (price and free allowance
// given), the never-free score route, liveness, discovery and aov_docs.
// docsOptions go inside the aov_docs block.
func docsSite(up, fac, price string, perDay int, docsOptions string) string {
	return fmt.Sprintf(`:{port} {
	aov_docs {
		%[6]s
	}
	route /verify/schema {
		x402 {
			accept devnet %[3]s %[4]s
			description "Verify an agent's JSON output"
			route "POST /verify/schema"
			facilitator http {
				url %[2]s
			}
			store badger {data}/gate
			validate verify_request
			max_body 8KiB
			free_allowance {
				pool verify
				per_day %[5]d
				max_body 2KiB
			}
		}
		reverse_proxy %[1]s
	}
	route /score/* {
		x402 {
			accept devnet $0.01 %[4]s
			route "GET /score/{agent_id}"
			facilitator http {
				url %[2]s
			}
			store badger {data}/gate
		}
		reverse_proxy %[1]s
	}
	x402_discovery /.well-known/x402
	respond /health `+"`"+`{"status":"ok"}`+"`"+` 200
}
`, strings.TrimPrefix(up, "http://"), fac, price, payTo.Hex(), perDay, docsOptions)
}

// docsReload loads a new config into the running Caddy on base's port, as
// an operator's reload does.
func docsReload(t *testing.T, base, sites string) {
	t.Helper()
	port, err := strconv.Atoi(base[strings.LastIndex(base, ":")+1:])
	if err != nil {
		t.Fatal(err)
	}
	loadCaddy(t, port, sites)
}

// docsOpenAPI fetches and decodes /openapi.json.
func docsOpenAPI(t *testing.T, base string) (map[string]any, []byte) {
	t.Helper()
	resp, raw := getBody(t, base+"/openapi.json", nil)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("/openapi.json: status %d, type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("/openapi.json is not JSON: %v", err)
	}
	return doc, raw
}

func docsPaymentInfo(t *testing.T, doc map[string]any, path, method string) map[string]any {
	t.Helper()
	item, _ := doc["paths"].(map[string]any)[path].(map[string]any)
	op, _ := item[method].(map[string]any)
	info, _ := op["x-payment-info"].(map[string]any)
	if info == nil {
		t.Fatalf("%s %s has no x-payment-info", method, path)
	}
	return info
}

// docsLiveOffer is what a real 402 of the route asks for.
func docsLiveOffer(t *testing.T, base string) x402.PaymentRequirements {
	t.Helper()
	resp := post(t, base+"/verify/schema", "", nil) // the discovery probe
	if resp.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("discovery probe: status %d", resp.StatusCode)
	}
	return paymentRequired(t, resp).Accepts[0]
}

func TestDocsFollowTheLiveConfiguration(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, docsSite(up.URL, fac, "$0.02", 3, ""))

	check := func(t *testing.T, usd, display string, perDay int) {
		t.Helper()
		offer := docsLiveOffer(t, base)
		doc, _ := docsOpenAPI(t, base)
		info := docsPaymentInfo(t, doc, "/verify/schema", "post")
		price := info["price"].(map[string]any)
		for k, want := range map[string]any{
			"amount": offer.Amount, "network": offer.Network, "asset": offer.Asset, "payTo": offer.PayTo,
			"usd": usd, "display": display, "maxTimeoutSeconds": float64(offer.MaxTimeoutSeconds),
		} {
			if price[k] != want {
				t.Errorf("openapi price.%s = %v, the live 402 says %v", k, price[k], want)
			}
		}
		free := info["freeAllowance"].(map[string]any)
		if free["callsPerClientPerDay"] != float64(perDay) || free["maxBodyBytes"] != 2048.0 || free["pool"] != "verify" || free["clientKey"] != "ip" {
			t.Errorf("openapi freeAllowance = %v", free)
		}
		if s := docsPaymentInfo(t, doc, "/score/{agent_id}", "get"); s["freeAllowance"] != nil || s["price"].(map[string]any)["amount"] != "10000" {
			t.Errorf("score x-payment-info = %v", s)
		}
		if servers := doc["servers"].([]any); servers[0].(map[string]any)["url"] != base {
			t.Errorf("servers = %v, want the request's origin %s", servers, base)
		}

		resp, txt := getBody(t, base+"/llms.txt", nil)
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/plain; charset=utf-8" {
			t.Fatalf("/llms.txt: status %d, type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		for _, want := range []string{
			fmt.Sprintf("| `POST /verify/schema` | %s (`%s` atomic units of `%s` on `%s`, pay to `%s`); %d free calls per client per day |", display, offer.Amount, offer.Asset, offer.Network, offer.PayTo, perDay),
			fmt.Sprintf("**%d free calls per client per UTC day**", perDay),
			"Largest request body served free: 2048 bytes",
			"| `GET /score/{agent_id}` | $0.01 USDC",
			"- Endpoint: `" + base + "/mcp`",
		} {
			if !strings.Contains(string(txt), want) {
				t.Errorf("llms.txt lacks %q", want)
			}
		}
	}
	t.Run("as first configured", func(t *testing.T) { check(t, "0.02", "$0.02 USDC", 3) })

	docsReload(t, base, docsSite(up.URL, fac, "$0.05", 7, ""))
	t.Run("after a reload with a new price and allowance", func(t *testing.T) { check(t, "0.05", "$0.05 USDC", 7) })
}

// TestDocsDescribeTheGatesAnswers validates the gate's real answers against
// the schemas of the document it serves.
func TestDocsDescribeTheGatesAnswers(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, docsSite(up.URL, fac, "$0.02", 1, ""))
	_, raw := docsOpenAPI(t, base)
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	docTree, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.AddResource(base+"/openapi.json", docTree); err != nil {
		t.Fatal(err)
	}
	schema := func(name string) *jsonschema.Schema {
		s, err := c.Compile(base + "/openapi.json#/components/schemas/" + name)
		if err != nil {
			t.Fatalf("compiling %s: %v", name, err)
		}
		return s
	}
	big := `{"task_id":"t","expected_schema":{},"submitted_output":"` + strings.Repeat("x", 9<<10) + `"}`
	cases := []struct {
		desc, body, schema string
		status             int
	}{
		{"a free answer's headers are the documented ones", validRequest, "", 200},
		{"a 402 after the allowance has the documented body with free_trial", validRequest, "PaymentRequiredBody", 402},
		{"a 422 is the documented error shape", `{"task_id":""}`, "Error", 422},
		{"a 413 is the documented error shape", big, "Error", 413},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			resp := post(t, base+"/verify/schema", tc.body, nil)
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, body)
			}
			if tc.status == 200 {
				for _, h := range []string{apidocs.HeaderFreeRemaining, apidocs.HeaderFreeLimit, apidocs.HeaderFreeResets} {
					if resp.Header.Get(h) == "" {
						t.Errorf("the free answer lacks the documented header %s", h)
					}
				}
				return
			}
			v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			if err := schema(tc.schema).Validate(v); err != nil {
				t.Fatalf("the answer does not match the documented %s: %v\n%s", tc.schema, err, body)
			}
			if tc.status == 402 && !bytes.Contains(body, []byte(`"code":"free_trial_exhausted"`)) {
				t.Errorf("the 402 after the allowance lacks free_trial_exhausted: %s", body)
			}
		})
	}
}

var docsOtherOrigin = regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.\[\]:-]+`)

func TestDocsPageAndAssets(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, docsSite(up.URL, fac, "$0.02", 3, ""))

	resp, page := getBody(t, base+"/docs", nil)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/html; charset=utf-8" {
		t.Fatalf("/docs: status %d, type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if resp.Header.Get("Content-Security-Policy") != apidocs.PageCSP {
		t.Errorf("/docs CSP = %q", resp.Header.Get("Content-Security-Policy"))
	}
	for _, m := range docsOtherOrigin.FindAllString(string(page), -1) {
		if !strings.HasPrefix(base, m) && !strings.HasPrefix(strings.TrimPrefix(base, "http:"), m) {
			t.Errorf("/docs loads from another origin: %q", m)
		}
	}
	srcs := regexp.MustCompile(`(?:src|href)="([^"]+)"`).FindAllStringSubmatch(string(page), -1)
	if len(srcs) < 3 {
		t.Fatalf("the page links %d assets:\n%s", len(srcs), page)
	}
	for _, m := range srcs {
		if !strings.HasPrefix(m[1], "/docs/assets/") {
			continue
		}
		t.Run("asset "+m[1], func(t *testing.T) {
			resp, body := getBody(t, base+m[1], nil)
			name := strings.TrimPrefix(m[1][:strings.Index(m[1]+"?", "?")], "/docs/assets/")
			want, ct, _ := apidocs.Asset(name)
			if resp.StatusCode != 200 || !bytes.Equal(body, want) || resp.Header.Get("Content-Type") != ct {
				t.Fatalf("status %d, %d bytes (want %d), type %q", resp.StatusCode, len(body), len(want), resp.Header.Get("Content-Type"))
			}
			etag := resp.Header.Get("ETag")
			again, body := getBody(t, base+m[1], map[string]string{"If-None-Match": etag})
			if etag == "" || again.StatusCode != http.StatusNotModified || len(body) != 0 {
				t.Errorf("revalidation with ETag %q: status %d", etag, again.StatusCode)
			}
		})
	}

	cases := []struct {
		desc, method, path string
		status             int
		code, contains     string
	}{
		{"an unknown asset is a 404 in the error shape", "GET", "/docs/assets/secret.env", 404, "not_found", ""},
		{"the update script is not served", "GET", "/docs/assets/update.sh", 404, "not_found", ""},
		{"a POST to the document is a 405", "POST", "/openapi.json", 405, "method_not_allowed", ""},
		{"/docs/ is the page too", "GET", "/docs/", 200, "", "swagger-ui"},
		{"HEAD gets the headers only", "HEAD", "/llms.txt", 200, "", ""},
		{"other paths pass through to the next handler", "GET", "/health", 200, "", `{"status":"ok"}`},
		{"paths that only look alike pass through (to Caddy's empty answer)", "GET", "/docsx", 200, "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, base+tc.path, nil)
			resp, err := testClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, body)
			}
			if tc.code != "" && !bytes.Contains(body, []byte(`"code":"`+tc.code+`"`)) {
				t.Errorf("body %s, want code %s", body, tc.code)
			}
			if tc.contains != "" && !bytes.Contains(body, []byte(tc.contains)) {
				t.Errorf("body lacks %q", tc.contains)
			}
			if (tc.method == "HEAD" || tc.path == "/docsx") && len(body) != 0 {
				t.Errorf("HEAD got %d bytes of body", len(body))
			}
			if tc.status == 405 && resp.Header.Get("Allow") != "GET, HEAD" {
				t.Errorf("Allow = %q", resp.Header.Get("Allow"))
			}
		})
	}
}

func TestDocsOptions(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, docsSite(up.URL, fac, "$0.02", 3, `service_name "Invoice Checker"
		public_base_url https://verify.example.com/
		mcp_url https://mcp.example.com/{http.request.host}`))

	doc, _ := docsOpenAPI(t, base)
	if got := doc["servers"].([]any)[0].(map[string]any)["url"]; got != "https://verify.example.com" {
		t.Errorf("servers[0].url = %v, want the configured public base URL without its slash", got)
	}
	if got := doc["info"].(map[string]any)["title"]; got != "Invoice Checker" {
		t.Errorf("title = %v", got)
	}
	_, txt := getBody(t, base+"/llms.txt", nil)
	for _, want := range []string{"# Invoice Checker\n", "- Endpoint: `https://mcp.example.com/127.0.0.1`", "[OpenAPI 3.1](https://verify.example.com/openapi.json)"} {
		if !strings.Contains(string(txt), want) {
			t.Errorf("llms.txt lacks %q", want)
		}
	}
	_, page := getBody(t, base+"/docs", nil)
	if !bytes.Contains(page, []byte("<title>Invoice Checker: API docs</title>")) {
		t.Error("the page does not carry the service name")
	}

	// Without mcp_url, the free allowance's MCP URL (the one its 402s
	// name) is the one the docs name.
	site := strings.Replace(docsSite(up.URL, fac, "$0.02", 3, ""), "max_body 2KiB\n", "max_body 2KiB\n\t\t\t\tmcp_url https://tools.example.com/mcp\n", 1)
	docsReload(t, base, site)
	_, txt = getBody(t, base+"/llms.txt", nil)
	if !strings.Contains(string(txt), "- Endpoint: `https://tools.example.com/mcp`") {
		t.Error("llms.txt does not name the free allowance's MCP URL")
	}
}

func TestDocsHeaderNamesAgreeWithTheGate(t *testing.T) {
	for _, p := range [][2]string{
		{apidocs.HeaderFreeRemaining, HeaderFreeRemaining},
		{apidocs.HeaderFreeLimit, HeaderFreeLimit},
		{apidocs.HeaderFreeResets, HeaderFreeResets},
	} {
		if p[0] != p[1] {
			t.Errorf("the docs name %q, the gate sends %q", p[0], p[1])
		}
	}
}

func TestDocsCaddyfileErrors(t *testing.T) {
	cases := []struct{ desc, caddyfile, want string }{
		{"an unknown option is named", "aov_docs {\n\tcolour red\n}", "unrecognized aov_docs option 'colour'"},
		{"aov_docs takes no inline arguments", "aov_docs extra", "wrong argument count"},
		{"an option takes one value", "aov_docs {\n\tservice_name a b\n}", "wrong argument count"},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			wantErr(t, adaptSiteError(tc.caddyfile), tc.want)
		})
	}
}

func TestDocsCacheKeysOnTheOrigin(t *testing.T) {
	d := &Docs{cache: new(docsCache)}
	for _, host := range []string{"a.example.com", "b.example.com", "a.example.com"} {
		r, _ := http.NewRequest(http.MethodGet, "http://"+host+"/openapi.json", nil)
		doc, llms, _, err := d.documents(r)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(doc, []byte(`"url": "http://`+host+`"`)) || !bytes.Contains(llms, []byte("Base URL: http://"+host+".")) {
			t.Fatalf("the documents for %s name another origin", host)
		}
	}
}

// BenchmarkDocsDocuments measures a request for the documents when the
// cache holds them (the common case: the configuration changes on reloads
// only) and when every request comes with another Host.
func BenchmarkDocsDocuments(b *testing.B) {
	d := &Docs{cache: new(docsCache)}
	r, _ := http.NewRequest(http.MethodGet, "http://verify.example.com/openapi.json", nil)
	b.Run("cached", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, _, err := d.documents(r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("rebuilt", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			r.Host = fmt.Sprintf("h%d.example.com", i)
			if _, _, _, err := d.documents(r); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestDocsDescribeTheFreeRateLimit: the 429 aov_rate_limit answers on a
// free route is the one the document it limits describes: the Error schema
// and the Retry-After header.
func TestDocsDescribeTheFreeRateLimit(t *testing.T) {
	base := startCaddy(t, `:{port} {
	route /openapi.json {
		aov_rate_limit 1 1m {
			zone docs429
		}
		aov_docs
	}
}
`)
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	now = func() time.Time { return t0 }
	t.Cleanup(func() { now = time.Now })
	doc, raw := docsOpenAPI(t, base)
	resp, body := getBody(t, base+"/openapi.json", nil)
	wantRateLimited(t, resp, body, "60")

	documented, _ := doc["paths"].(map[string]any)["/openapi.json"].(map[string]any)["get"].(map[string]any)["responses"].(map[string]any)["429"].(map[string]any)
	ref, _ := documented["$ref"].(string)
	rl, _ := doc["components"].(map[string]any)["responses"].(map[string]any)[strings.TrimPrefix(ref, "#/components/responses/")].(map[string]any)
	if headers, _ := rl["headers"].(map[string]any); headers["Retry-After"] == nil {
		t.Fatalf("GET /openapi.json documents no 429 with Retry-After: %v", documented)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	docTree, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.AddResource(base+"/openapi.json", docTree); err != nil {
		t.Fatal(err)
	}
	schemaRef := rl["content"].(map[string]any)["application/json"].(map[string]any)["schema"].(map[string]any)["$ref"].(string)
	s, err := c.Compile(base + "/openapi.json" + schemaRef)
	if err != nil {
		t.Fatal(err)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Validate(v); err != nil {
		t.Fatalf("the 429 does not match the documented %s: %v\n%s", schemaRef, err, body)
	}
}

// A wrong method on the documents' paths is 405 in SPEC §6's shape, with
// Allow, from x402_discovery as from aov_docs. (Before: x402_discovery
// returned a bare Caddy error, answered with an empty body.)
func TestDocsWrongMethodHasTheErrorShape(t *testing.T) {
	base := startCaddy(t, ":{port} {\n\tx402_discovery /.well-known/x402\n\taov_docs\n}\n")
	for _, path := range []string{"/.well-known/x402", "/openapi.json"} {
		req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader("{}"))
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed || !strings.Contains(string(b), `"code":"method_not_allowed"`) || resp.Header.Get("Allow") == "" {
			t.Errorf("POST %s: %d, Content-Type %q, Allow %q, body %q; want 405 with Allow and the error shape (code method_not_allowed)",
				path, resp.StatusCode, resp.Header.Get("Content-Type"), resp.Header.Get("Allow"), b)
		}
	}
}
