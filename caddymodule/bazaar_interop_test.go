package caddymodule

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/interop"
	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

type bazaarResult struct {
	Pages       []x402.DiscoveryResources `json:"pages"`
	Validations []struct {
		Valid  bool     `json:"valid"`
		Errors []string `json:"errors"`
		Spec   struct {
			Valid  bool     `json:"valid"`
			Errors []string `json:"errors"`
		} `json:"spec"`
	} `json:"validations"`
	// Extracted is what the official extractDiscoveryInfo catalogs of each
	// payment: its resource URL, method or tool.
	Extracted []*struct {
		ResourceURL string `json:"resourceUrl"`
		Method      string `json:"method"`
		ToolName    string `json:"toolName"`
	} `json:"extracted"`
}

// checkValidations fails t for every extension the official helpers refuse.
func (b *bazaarResult) checkValidations(t *testing.T, exts []any) {
	t.Helper()
	if len(b.Validations) != len(exts) {
		t.Fatalf("%d validations, want %d", len(b.Validations), len(exts))
	}
	for i, v := range b.Validations {
		if !v.Valid || !v.Spec.Valid {
			t.Errorf("extension %d (%v) is invalid for the official helpers: %v %v", i, exts[i], v.Errors, v.Spec.Errors)
		}
	}
}

// TestOfficialBazaarClientListsWhatOurFacilitatorSettled: a gate whose
// facilitator is our x402_facilitator in the same Caddy; the official
// fetch client pays for a verification and for a score, then the official
// withBazaar(HTTPFacilitatorClient).listResources() pages through what the
// facilitator settled for, and validateDiscoveryExtension accepts every
// bazaar extension we hand out: the 402s of both routes, the manifest's
// items and an MCP tool's.
func TestOfficialBazaarClientListsWhatOurFacilitatorSettled(t *testing.T) {
	interop.Dir(t, "@x402/extensions", "@x402/fetch", "@x402/core")
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	site := gateSite(up.URL, "http://127.0.0.1:{port}/facilitator", 0, "")
	site = strings.Replace(site, "\tx402_discovery /.well-known/x402\n", fmt.Sprintf(`	x402_discovery /.well-known/x402
	handle_path /facilitator/* {
		x402_facilitator {
			pay_to %s
			store badger {data}/facilitator
			http %s
		}
	}
`, payTo.Hex(), fac), 1)
	base := startCaddy(t, site)

	var exts, payments []any
	for _, c := range []struct{ method, path, body string }{{"POST", "/verify/schema", validRequest}, {"GET", "/score/agent-a", ""}} {
		req, _ := http.NewRequest(c.method, base+c.path, nil)
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		pr := paymentRequired(t, resp)
		resp.Body.Close()
		b, ok := pr.Extensions["bazaar"]
		if !ok {
			t.Fatalf("%s %s: 402 without a bazaar extension: %v", c.method, c.path, pr.Extensions)
		}
		exts = append(exts, b)
		payments = append(payments, map[string]any{"url": pr.Resource.URL, "extension": b})

		in := map[string]any{"privateKey": evmfacilitator.DevAccounts()[1].PrivateKeyHex, "url": base + c.path, "method": c.method}
		if c.body != "" {
			in["body"] = c.body
		}
		var res fetchResult
		interop.Run(t, "x402-fetch-pay.mjs", nil, in, &res)
		if res.Status != 200 || res.PaymentResponse == nil || !res.PaymentResponse.Success {
			t.Fatalf("paying %s: %d %s", c.path, res.Status, res.Body)
		}
	}
	resp, err := testClient.Get(base + "/.well-known/x402")
	if err != nil {
		t.Fatal(err)
	}
	var doc discoveryDoc
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for _, it := range doc.Items {
		exts = append(exts, it.Extensions["bazaar"])
	}
	exts = append(exts, mcpBazaar("verify_schema", "Verify an agent's JSON output", toolInputSchema("verify_request")))

	var out bazaarResult
	interop.Run(t, "bazaar.mjs", nil, map[string]any{
		"facilitatorURL": base + "/facilitator",
		"lists": []any{
			map[string]any{},
			map[string]any{"limit": 1},
			map[string]any{"limit": 1, "offset": 1},
			map[string]any{"type": "mcp"},
			map[string]any{"payTo": strings.ToLower(payTo.Hex()), "network": "eip155:1337"},
			map[string]any{"network": "eip155:8453"},
		},
		"extensions": exts,
		"payments":   payments,
	}, &out)
	out.checkValidations(t, exts) // two 402s, two manifest items, one MCP tool
	all := out.Pages[0]
	if all.X402Version != 2 || all.Pagination.Total != 2 || len(all.Items) != 2 {
		t.Fatalf("the list %+v, want the two routes paid for", all)
	}
	// Newest first: the score (one entry for the route, not the URL) was paid last.
	score, verify := all.Items[0], all.Items[1]
	if score.Resource != base+"/score/:agent_id" || verify.Resource != base+"/verify/schema" {
		t.Fatalf("resources %q, %q", score.Resource, verify.Resource)
	}
	// Our facilitator lists each route as the official one catalogs it.
	if len(out.Extracted) != 2 || out.Extracted[0] == nil || out.Extracted[1] == nil ||
		out.Extracted[0].ResourceURL != verify.Resource || out.Extracted[0].Method != "POST" ||
		out.Extracted[1].ResourceURL != score.Resource || out.Extracted[1].Method != "GET" {
		t.Fatalf("official extractDiscoveryInfo: %+v, want %s and %s", out.Extracted, verify.Resource, score.Resource)
	}
	for _, it := range all.Items {
		if it.Type != "http" || len(it.Accepts) != 1 || !strings.EqualFold(it.Accepts[0].PayTo, payTo.Hex()) || it.Extensions["bazaar"] == nil || it.LastUpdated == "" {
			t.Errorf("item %+v", it)
		}
	}
	if p := out.Pages[1]; len(p.Items) != 1 || p.Items[0].Resource != score.Resource || p.Pagination != (x402.DiscoveryPagination{Limit: 1, Offset: 0, Total: 2}) {
		t.Errorf("first page of one %+v", p)
	}
	if p := out.Pages[2]; len(p.Items) != 1 || p.Items[0].Resource != verify.Resource || p.Pagination.Offset != 1 {
		t.Errorf("second page of one %+v", p)
	}
	if p := out.Pages[3]; len(p.Items) != 0 || p.Pagination.Total != 0 {
		t.Errorf("type mcp %+v, want none", p)
	}
	if p := out.Pages[4]; p.Pagination.Total != 2 {
		t.Errorf("payTo and network filter %+v, want both", p)
	}
	if p := out.Pages[5]; p.Pagination.Total != 0 {
		t.Errorf("another network %+v, want none", p)
	}

	t.Run("a payment only verified lists nothing", func(t *testing.T) {
		// Verifying is free for its sender, so a resource it names (here
		// one of its own choosing) must not reach the list.
		req, _ := http.NewRequest(http.MethodGet, base+"/score/agent-b", nil)
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		pr := paymentRequired(t, resp)
		resp.Body.Close()
		pr.Resource.URL = "https://spam.example/buy-now"
		p, err := x402.SignExactEVM(evmfacilitator.DevKey(2), pr.Accepts[0], &pr.Resource, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		body, _ := json.Marshal(map[string]any{"x402Version": 2, "paymentPayload": p, "paymentRequirements": pr.Accepts[0]})
		vresp, err := testClient.Post(base+"/facilitator/verify", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if v := readJSON(t, vresp); vresp.StatusCode != 200 || v["isValid"] != true {
			t.Fatalf("verify: %d %v", vresp.StatusCode, v)
		}
		lresp, err := testClient.Get(base + "/facilitator/discovery/resources")
		if err != nil {
			t.Fatal(err)
		}
		var list x402.DiscoveryResources
		if err := json.NewDecoder(lresp.Body).Decode(&list); err != nil {
			t.Fatal(err)
		}
		lresp.Body.Close()
		if list.Pagination.Total != 2 {
			t.Fatalf("after a verification alone the list holds %d resources, want the 2 settled: %+v", list.Pagination.Total, list.Items)
		}
	})

	t.Run("a bad page parameter is a 400 naming it", func(t *testing.T) {
		for _, q := range []string{"limit=0", "limit=abc", "offset=-1", "limit=1&limit=2", "limit=100000"} {
			resp, err := testClient.Get(base + "/facilitator/discovery/resources?" + q)
			if err != nil {
				t.Fatal(err)
			}
			m := readJSON(t, resp)
			if resp.StatusCode != 400 || !strings.Contains(fmt.Sprint(m["fields"]), strings.SplitN(q, "=", 2)[0]) {
				t.Errorf("?%s: %d %v", q, resp.StatusCode, m)
			}
		}
	})
}
