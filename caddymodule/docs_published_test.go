package caddymodule

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
)

// The contract's own MCP endpoint (route "POST /mcp") priced by an
// mcp_tool gate at a price and free allowance of its own: /openapi.json,
// /llms.txt and /.well-known/x402 state what that gate charges and grants,
// not what the tool's REST twin costs, and a contract tool no gate prices
// is documented as not priced.
func TestDocsStateEachMCPToolsOwnGate(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newMCPUpstream(t)
	rest := newUpstream(t)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	aov_docs
	x402_discovery /.well-known/x402
	route /mcp {
		x402 {
			mcp_tool verify_schema
			route "POST /mcp"
			accept devnet $0.05 %[3]s
			facilitator http {
				url %[2]s
			}
			store badger {data}/gate
			free_allowance {
				pool mcp
				per_day 2
			}
		}
		reverse_proxy %[1]s
	}
	route /verify/schema {
		x402 {
			route "POST /verify/schema"
			accept devnet $0.02 %[3]s
			facilitator http {
				url %[2]s
			}
			store badger {data}/gate
			free_allowance {
				pool verify
				per_day 5
			}
		}
		reverse_proxy %[4]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), fac, payTo.Hex(), strings.TrimPrefix(rest.URL, "http://")))
	host := strings.TrimPrefix(base, "http://")

	// What the gate charges for the tool once its two free calls are used.
	s := mcpSession(t, base+"/mcp")
	for range 2 {
		if r := callTool(t, s, "verify_schema", verifyArgs, nil); r.IsError {
			t.Fatalf("a free call of the tool failed: %+v", r)
		}
	}
	charged := demandOf(t, callTool(t, s, "verify_schema", verifyArgs, nil)).Accepts[0].Amount
	if charged != "50000" {
		t.Fatalf("the gate charges %s for the tool, want 50000 (test setup)", charged)
	}

	doc := siteManifest(t, base, host)
	for _, it := range doc.Items {
		if it.Type == "mcp" && it.Accepts[0].Amount != charged {
			t.Errorf("the manifest advertises %s for the tool, the gate charges %s", it.Accepts[0].Amount, charged)
		}
	}

	var api map[string]any
	if err := json.Unmarshal(siteGet(t, base, host, "/openapi.json"), &api); err != nil {
		t.Fatal(err)
	}
	tools, _ := docsPaymentInfo(t, api, "/mcp", "post")["tools"].(map[string]any)
	vs, _ := tools["verify_schema"].(map[string]any)
	price, _ := vs["price"].(map[string]any)
	free, _ := vs["freeAllowance"].(map[string]any)
	if price["amount"] != charged || free["pool"] != "mcp" || free["callsPerClientPerDay"] != 2.0 {
		t.Errorf("openapi.json documents verify_schema as %v (free %v); its gate charges %s with 2 free calls a day in pool mcp", price["amount"], free, charged)
	}
	if gr, _ := tools["get_verification_record"].(map[string]any); gr["configured"] != false || gr["price"] != nil {
		t.Errorf("openapi.json prices get_verification_record, which no gate prices: %v", gr)
	}

	llms := string(siteGet(t, base, host, "/llms.txt"))
	for _, want := range []string{
		"| `POST /mcp` (MCP tool `verify_schema`) | $0.05 USDC (`50000` atomic units",
		"- `verify_schema`: the same input and output as `POST /verify/schema`. Price: $0.05 USDC (`50000` atomic units",
		"; 2 free calls per client per day (pool `mcp`).",
		"- `get_verification_record`: the same input and output as `GET /score/{agent_id}`. Price: not priced on this server.",
		"- Pool `mcp`: **2 free calls per client per UTC day**, shared by `POST /mcp` (MCP tool `verify_schema`).",
		"- Pool `verify`: **5 free calls per client per UTC day**, shared by `POST /verify/schema`.",
	} {
		if !strings.Contains(llms, want) {
			t.Errorf("llms.txt lacks %q", want)
		}
	}
	if strings.Contains(llms, "REST twins") {
		t.Error("llms.txt still says the tools are priced as their REST twins")
	}
}

// freePoolSite is a site with routes /a and /b, each a gate whose free
// allowance names pool verify with the given per_day and key, both in one
// store.
func freePoolSite(t *testing.T, perDayA, perDayB int, keyA, keyB string) string {
	dir := t.TempDir()
	gate := func(path string, perDay int, key string) string {
		return fmt.Sprintf(`
	route /%[1]s {
		x402 {
			route "POST /%[1]s"
			accept devnet $0.02 %[2]s
			facilitator http http://127.0.0.1:1
			store badger %[3]s
			free_allowance {
				pool verify
				per_day %[4]d
				key %[5]s
			}
		}
		respond ok
	}`, path, payTo.Hex(), dir, perDay, key)
	}
	return ":0 {" + gate("a", perDayA, keyA) + gate("b", perDayB, keyB) + "\n}\n"
}

// A free pool is one allowance (one count per pool, client and day): a
// config whose gates give one pool in one store different per_day or key,
// which the store would enforce as each gate's own limit on the other's
// count, is refused at load, naming both routes. The same terms load, and
// a reload may change a pool's terms (the old config's gates are not the
// new one's).
func TestFreePoolIsOneAllowance(t *testing.T) {
	for _, tc := range []struct {
		desc       string
		a, b       int
		keyA, keyB string
		want       string
	}{
		{"different per_day", 100, 1, "ip", "ip", `pool "verify" is one allowance in one store, and route "POST /a" of server srv0 (:0) gives it per_day 100, key ip, max_body 65536, while route "POST /b" of server srv0 (:0) gives it per_day 1, key ip`},
		{"different key", 5, 5, "ip", "wallet", `route "POST /b" of server srv0 (:0) gives it per_day 5, key wallet`},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			err := loadError(t, freePoolSite(t, tc.a, tc.b, tc.keyA, tc.keyB))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("load error %v, want one saying %q", err, tc.want)
			}
		})
	}
	if err := loadError(t, freePoolSite(t, 5, 5, "ip", "ip")); err != nil {
		t.Fatalf("one pool with the same terms on two routes is refused: %v", err)
	}

	// A reload from per_day 5 to per_day 6: the running config's gates
	// still give the pool 5 while the new one's are provisioned.
	startCaddy(t, `:{port} {
	route /a {
		x402 {
			route "POST /a"
			accept devnet $0.02 `+payTo.Hex()+`
			facilitator http http://127.0.0.1:1
			store badger {data}/gate
			free_allowance {
				pool verify
				per_day 5
			}
		}
		respond ok
	}
}
`)
	if err := loadError(t, freePoolSite(t, 6, 6, "ip", "ip")); err != nil {
		t.Fatalf("a reload changing a pool's per_day is refused: %v", err)
	}
}

// free_allowance's mcp_url takes {env.NAME} as public_base_url does,
// expanded when the config loads: the 402's free_trial.url and llms.txt's
// MCP endpoint name the URL, not the placeholder. An expansion that is not
// an absolute http(s) URL (an unset variable, a request placeholder that
// nothing would expand, another scheme) is refused at load.
func TestFreeMCPURLIsExpandedAtLoad(t *testing.T) {
	t.Setenv("AOV_TEST_MCP_URL", "https://verify.example.com/mcp")
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	site := func(mcpURL string) string {
		return fmt.Sprintf(`:{port} {
	aov_docs
	route /verify/schema {
		x402 {
			route "POST /verify/schema"
			accept devnet $0.02 %s
			facilitator http {
				url %s
			}
			store badger {data}/gate
			free_allowance {
				per_day 1
				mcp_url %s
			}
		}
		reverse_proxy %s
	}
}
`, payTo.Hex(), fac, mcpURL, strings.TrimPrefix(up.URL, "http://"))
	}
	base := startCaddy(t, site("{env.AOV_TEST_MCP_URL}"))
	host := strings.TrimPrefix(base, "http://")
	post(t, base+"/verify/schema", `{"a":1}`, nil).Body.Close() // the one free call
	resp := post(t, base+"/verify/schema", `{"a":1}`, nil)
	var body struct {
		FreeTrial struct {
			URL string `json:"url"`
		} `json:"free_trial"`
	}
	err := json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 402 || body.FreeTrial.URL != "https://verify.example.com/mcp" {
		t.Errorf("402 free_trial.url = %q (status %d, %v), want https://verify.example.com/mcp", body.FreeTrial.URL, resp.StatusCode, err)
	}
	llms := string(siteGet(t, base, host, "/llms.txt"))
	if !strings.Contains(llms, "- Endpoint: `https://verify.example.com/mcp` (Streamable HTTP).") || strings.Contains(llms, "{env.") {
		t.Errorf("llms.txt does not name the expanded MCP URL")
	}

	for _, bad := range []string{"{env.AOV_TEST_UNSET_MCP_URL}/mcp", "{http.request.host}/mcp", "ftp://verify.example.com/mcp", "https://user@verify.example.com/mcp"} {
		err := loadError(t, strings.NewReplacer(":{port}", ":0", "{data}", t.TempDir()).Replace(site(bad)))
		if err == nil || !strings.Contains(err.Error(), "mcp_url") || !strings.Contains(err.Error(), "is not an absolute http(s) URL") {
			t.Errorf("mcp_url %s: load error %v, want a refusal", bad, err)
		}
	}
}

// A refused mcp_url or public_base_url says which rule it breaks and names
// the URL as configured, never as expanded: an {env.NAME} may hold a
// secret, and the load error is logged.
func TestConfiguredURLRefusalNamesRuleNotExpandedValue(t *testing.T) {
	const secret = "s3cr3t-token-value"
	t.Setenv("AOV_TEST_URL_SECRET", secret)
	site := func(option, url string) string {
		free := ""
		if option == "mcp_url" {
			free = "free_allowance {\n\t\t\tper_day 5\n\t\t\tmcp_url " + url + "\n\t\t}"
		} else {
			free = "public_base_url " + url
		}
		return fmt.Sprintf(`:0 {
	x402 {
		accept base $0.02 0x1111111111111111111111111111111111111111
		facilitator instant_benchmark_only
		store badger %s/gate
		%s
	}
	respond "ok"
}
`, t.TempDir(), free)
	}
	for _, c := range []struct{ url, rule string }{
		{"https://mcp:{env.AOV_TEST_URL_SECRET}@verify.example.com/mcp", "has a user part"},
		{"ftp://{env.AOV_TEST_URL_SECRET}.example.com/mcp", "has a scheme other than http or https"},
		{"https://{env.AOV_TEST_URL_SECRET}.example.com/{http.request.host}", "still has a placeholder"},
	} {
		for _, option := range []string{"mcp_url", "public_base_url"} {
			err := loadError(t, site(option, c.url))
			if err == nil {
				t.Errorf("%s %s loaded", option, c.url)
				continue
			}
			msg := err.Error()
			if strings.Contains(msg, secret) {
				t.Errorf("%s %s: the load error repeats the expanded value: %v", option, c.url, err)
			}
			if !strings.Contains(msg, c.rule) || !strings.Contains(msg, c.url) {
				t.Errorf("%s %s: load error %v, want the configured URL and %q", option, c.url, err, c.rule)
			}
		}
	}
}

// freePoolGate is a gate on route POST /<path> keeping its counts in the
// Badger store at dir, its free allowance in the default pool with per_day
// and extra options.
func freePoolGate(path, dir string, perDay int, extra string) string {
	return fmt.Sprintf(`
	route /%[1]s {
		x402 {
			route "POST /%[1]s"
			accept devnet $0.02 %[2]s
			facilitator http http://127.0.0.1:1
			store badger %[3]s
			free_allowance {
				per_day %[4]d
				%[5]s
			}
		}
		respond ok
	}`, path, payTo.Hex(), dir, perDay, extra)
}

// A pool is one allowance only within one store: sites whose gates keep
// their counts in stores of their own never meet in a count, so their
// pools of one name may have their own terms. Two servers of one config
// sharing a store are held to one pool's terms, and the refusal names
// each route with its server. A gate with per_day 0 grants nothing and
// counts nothing, so it loads next to any per_day.
func TestFreePoolIsOneAllowancePerStore(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	if err := loadError(t, "http://a.example:0 {"+freePoolGate("v", a, 100, "")+"\n}\n"+
		"http://b.example:0 {"+freePoolGate("v", b, 5, "")+"\n}\n"); err != nil {
		t.Errorf("two sites with their own stores, one pool name each with its per_day, are refused: %v", err)
	}

	p1, p2 := freePort(t), freePort(t)
	err := loadError(t, fmt.Sprintf("http://:%d {", p1)+freePoolGate("v", a, 100, "")+"\n}\n"+
		fmt.Sprintf("http://:%d {", p2)+freePoolGate("v", a, 1, "")+"\n}\n")
	// Caddy names the servers srv0 and srv1 in an order of its own: each
	// route is named with its server, whichever that is.
	msg := fmt.Sprint(err)
	var servers []string
	for _, w := range []struct{ port, perDay int }{{p1, 100}, {p2, 1}} {
		re := regexp.MustCompile(fmt.Sprintf(`route "POST /v" of server (srv[01]) \(:%d\) gives it per_day %d,`, w.port, w.perDay))
		m := re.FindStringSubmatch(msg)
		if err == nil || m == nil {
			t.Errorf("two servers sharing a store and pool with per_day 100 and 1: load error %v, want one matching %q", err, re)
			continue
		}
		servers = append(servers, m[1])
	}
	if len(servers) == 2 && servers[0] == servers[1] {
		t.Errorf("both routes named with server %s: %v", servers[0], err)
	}

	if err := loadError(t, ":0 {"+freePoolGate("a", a, 10, "")+freePoolGate("b", a, 0, "")+"\n}\n"); err != nil {
		t.Errorf("a gate with per_day 0 next to per_day 10 in one pool is refused: %v", err)
	}
}

// A pool's documents state one largest body served free, so the gates of
// a pool in one store must agree on max_body as on per_day and key.
func TestFreePoolMaxBodyIsOneTerm(t *testing.T) {
	dir := t.TempDir()
	err := loadError(t, ":0 {"+freePoolGate("a", dir, 5, "max_body 100B")+freePoolGate("b", dir, 5, "max_body 64KiB")+"\n}\n")
	want := `route "POST /a" of server srv0 (:0) gives it per_day 5, key ip, max_body 100, while route "POST /b" of server srv0 (:0) gives it per_day 5, key ip, max_body 65536`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("one pool with max_body 100B and 64KiB: load error %v, want one saying %q", err, want)
	}
}

// x402_facilitator's discovery origins, expanded when the config loads as
// public_base_url is, are held to its rule: an http(s) origin without a
// user part, refused by the rule it breaks and named as configured, never
// as expanded (an {env.NAME} may hold a password).
func TestFacilitatorOriginRefusalNamesRuleNotExpandedValue(t *testing.T) {
	const secret = "s3cr3t-token-value"
	t.Setenv("AOV_TEST_URL_SECRET", secret)
	for _, c := range []struct{ origin, rule string }{
		{"https://ops:{env.AOV_TEST_URL_SECRET}@verify.example.com", "has a user part"},
		{"ftp://{env.AOV_TEST_URL_SECRET}.example.com", "has a scheme other than http or https"},
		{"https://{env.AOV_TEST_URL_SECRET}.example.com/x", "has a path, query or fragment"},
	} {
		err := loadError(t, ":0 {\n\tx402_facilitator {\n\t\tpay_to "+facPayTo()+"\n\t\tdiscovery {\n\t\t\torigins "+c.origin+
			"\n\t\t}\n\t\tstore badger "+t.TempDir()+"\n\t\tdevnet\n\t}\n}\n")
		if err == nil {
			t.Errorf("origin %s loaded", c.origin)
			continue
		}
		if msg := err.Error(); strings.Contains(msg, secret) || !strings.Contains(msg, c.rule) || !strings.Contains(msg, c.origin) {
			t.Errorf("origin %s: load error %v, want the configured origin and %q, not the expanded value", c.origin, err, c.rule)
		}
	}
}

// aov_docs mcp_url is held to free_allowance mcp_url's rule when the
// config loads: the documents publish it, so one with a user part is
// refused, by the rule it breaks and named as configured, never as
// expanded; with a placeholder a request fills in, what the config loads
// with is checked. A valid one is published as expanded.
func TestDocsMCPURLRefusesUserPart(t *testing.T) {
	const secret = "s3cr3t-token-value"
	t.Setenv("AOV_TEST_URL_SECRET", secret)
	t.Setenv("AOV_TEST_MCP_URL", "https://ops:"+secret+"@verify.example.com/mcp")
	for _, c := range []struct{ url, rule string }{
		{"{env.AOV_TEST_MCP_URL}", "has a user part"},
		{"https://ops:{env.AOV_TEST_URL_SECRET}@{http.request.host}/mcp", "has a user part"},
		{"ftp://{env.AOV_TEST_URL_SECRET}.example.com/mcp", "has a scheme other than http or https"},
	} {
		err := loadError(t, ":0 {\n\taov_docs {\n\t\tmcp_url "+c.url+"\n\t}\n\trespond ok\n}\n")
		if err == nil {
			t.Errorf("mcp_url %s loaded", c.url)
			continue
		}
		if msg := err.Error(); strings.Contains(msg, secret) || !strings.Contains(msg, c.rule) || !strings.Contains(msg, c.url) {
			t.Errorf("mcp_url %s: load error %v, want the configured URL and %q, not the expanded value", c.url, err, c.rule)
		}
	}
	t.Setenv("AOV_TEST_MCP_URL", "https://mcp.example.com/v1/mcp")
	base := startCaddy(t, "http://127.0.0.1:{port} {\n\taov_docs {\n\t\tmcp_url {env.AOV_TEST_MCP_URL}\n\t}\n\trespond ok\n}\n")
	for _, p := range []string{"/llms.txt", "/openapi.json"} {
		if _, body := getBody(t, base+p, nil); !strings.Contains(string(body), "https://mcp.example.com/v1/mcp") {
			t.Errorf("%s does not name the expanded mcp_url", p)
		}
	}
}

// The documents state a pool per store: two gates naming pool "default"
// in stores of their own never meet in a count, so each is stated with
// its own terms and routes, not as one allowance shared by both; gates of
// one pool in one store are stated once, shared.
func TestDocsStateAPoolPerStore(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	base := startCaddy(t, "http://127.0.0.1:{port} {\n\taov_docs"+
		freePoolGate("a", a, 1, "max_body 100B")+freePoolGate("b", b, 100, "")+freePoolGate("c", a, 1, "max_body 100B")+"\n}\n")
	_, llms := getBody(t, base+"/llms.txt", nil)
	_, openapi := getBody(t, base+"/openapi.json", nil)
	for _, want := range []string{
		"- Pool `default`: **1 free calls per client per UTC day**, shared by `POST /a` and `POST /c`.",
		"- Pool `default` (another store: its count is not the other's): **100 free calls per client per UTC day**, shared by `POST /b`.",
		"- Largest request body served free: 100 bytes",
		"- Largest request body served free: 65536 bytes",
	} {
		if !strings.Contains(string(llms), want) {
			t.Errorf("llms.txt lacks %q:\n%s", want, llms)
		}
	}
	for _, want := range []string{
		"1 free calls per client per day (per client IP address, an IPv6 client per /64) on `POST /a` and `POST /c`, bodies up to 100 bytes",
		"100 free calls per client per day (per client IP address, an IPv6 client per /64) on `POST /b`, bodies up to 65536 bytes",
	} {
		if !strings.Contains(string(openapi), want) {
			t.Errorf("openapi.json's description lacks %q", want)
		}
	}
}

// A gate on POST /mcp without mcp_tool charges every message: llms.txt's
// MCP section states that price for each tool and every other message,
// and its rate-limit section calls no MCP message free; openapi.json
// gives the endpoint the price.
func TestDocsEndpointGatePricesEveryMCPMessage(t *testing.T) {
	base := startCaddy(t, "http://127.0.0.1:{port} {\n\taov_docs\n\troute /mcp {\n\t\tx402 {\n\t\t\troute \"POST /mcp\"\n\t\t\taccept devnet $0.05 "+payTo.Hex()+
		"\n\t\t\tfacilitator http http://127.0.0.1:1\n\t\t\tstore badger {data}\n\t\t}\n\t\trespond ok\n\t}\n}\n")
	call, err := http.Post(base+"/mcp", "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"verify_schema","arguments":{}}}`))
	if err != nil {
		t.Fatal(err)
	}
	call.Body.Close()
	if call.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("an unpaid tools/call: %d, want 402", call.StatusCode)
	}
	_, body := getBody(t, base+"/llms.txt", nil)
	llms := string(body)
	for _, tool := range []string{"verify_schema", "get_verification_record"} {
		want := "- `" + tool + "`: the same input and output as"
		i := strings.Index(llms, want)
		if i < 0 {
			t.Fatalf("llms.txt has no line for %s", tool)
		}
		line, _, _ := strings.Cut(llms[i:], "\n")
		if !strings.Contains(line, "Price: every message to this endpoint: $0.05 USDC") || strings.Contains(line, "not priced") {
			t.Errorf("llms.txt, tool %s: %s", tool, line)
		}
	}
	if !strings.Contains(llms, "- Every message to this endpoint") {
		t.Error("llms.txt's MCP section does not say every message is priced")
	}
	if strings.Contains(llms, "every MCP message that is not a priced tool call") {
		t.Error("llms.txt's rate limits call MCP messages free on an endpoint that prices every one")
	}
	_, body = getBody(t, base+"/openapi.json", nil)
	if !strings.Contains(string(body), "Every message to this endpoint is priced") || !strings.Contains(string(body), "No price of its own: a call of it is a message to this endpoint") {
		t.Error("openapi.json does not price the endpoint, or its tools by it")
	}
}
