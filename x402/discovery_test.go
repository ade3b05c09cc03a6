package x402

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/store"
)

// discoveryStore is a real embedded store in a fresh folder.
func discoveryStore(t testing.TB, l store.DiscoveryLimits) store.Discovery {
	db, err := store.Open(t.TempDir(), store.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db.Discovery(l)
}

func discoveryHandler(t testing.TB, l store.DiscoveryLimits) *facilitatorHandler {
	return NewFacilitatorHandlerWith(&fakeFacilitator{}, FacilitatorHandlerConfig{Discovery: discoveryStore(t, l), Callers: CallersAuthenticated}).(*facilitatorHandler)
}

// httpBazaar is the bazaar extension of a GET route, as
// declareDiscoveryExtension writes it.
func httpBazaar() map[string]any {
	return map[string]any{
		"info": map[string]any{"input": map[string]any{"type": "http", "method": "GET"}},
		"schema": map[string]any{
			"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object", "required": []any{"input"},
			"properties": map[string]any{"input": map[string]any{
				"type": "object", "required": []any{"type", "method"}, "additionalProperties": false,
				"properties": map[string]any{
					"type":       map[string]any{"type": "string", "const": "http"},
					"method":     map[string]any{"type": "string", "enum": []any{"GET"}},
					"pathParams": map[string]any{"type": "object"},
				},
			}},
		},
	}
}

func mcpToolBazaar(tool string) map[string]any {
	return map[string]any{
		"info": map[string]any{"input": map[string]any{"type": "mcp", "toolName": tool, "inputSchema": map[string]any{"type": "object"}}},
		"schema": map[string]any{"type": "object", "properties": map[string]any{"input": map[string]any{
			"type": "object", "required": []any{"type", "toolName", "inputSchema"},
		}}},
	}
}

func catalogPayload(u string, bazaar map[string]any) PaymentPayload {
	p := PaymentPayload{X402Version: 2, Resource: &Resource{URL: u, Description: "d", MimeType: "application/json"}}
	if bazaar != nil {
		p.Extensions = map[string]any{"bazaar": bazaar}
	}
	return p
}

var catalogReq = PaymentRequirements{Scheme: SchemeExact, Network: NetworkDevnet, Amount: "10000", Asset: "0x1", PayTo: "0xa0Ee7A142d267C1f36714E4a8F75612F20a79720"}

// settledAt is the answer of a settlement by transaction tx.
func settledAt(tx string) SettleResponse {
	return SettleResponse{Success: true, Transaction: tx, Network: catalogReq.Network}
}

func withMember(m map[string]any, k string, v any) map[string]any {
	m[k] = v
	return m
}

// TestDiscoveryEntryChecksWhatThePayerChose: the resource URL and the
// bazaar extension are the payer's; only an absolute http(s) URL with a
// bazaar extension that is valid against its own schema is listed, as its
// origin and path or route template; MCP tools are one entry per tool.
func TestDiscoveryEntryChecksWhatThePayerChose(t *testing.T) {
	h := discoveryHandler(t, store.DiscoveryLimits{})
	badInfo := httpBazaar()
	badInfo["info"] = map[string]any{"input": map[string]any{"type": "http", "method": "POST"}}
	for _, c := range []struct {
		name, url string
		bazaar    map[string]any
		want      string // the store key; "" lists nothing
		typ       string
	}{
		{"a GET route", "https://a.example/x?q=1#f", httpBazaar(), "https://a.example/x", "http"},
		{"the host in lower case", "https://A.Example:8443/x", httpBazaar(), "https://a.example:8443/x", "http"},
		{"a route template", "https://a.example/score/a", withMember(httpBazaar(), "routeTemplate", "/score/:agent_id"), "https://a.example/score/:agent_id", "http"},
		{"a template with ..", "https://a.example/score/a", withMember(httpBazaar(), "routeTemplate", "/x/%2e%2e/admin"), "https://a.example/score/a", "http"},
		{"a template with a scheme", "https://a.example/score/a", withMember(httpBazaar(), "routeTemplate", "/x/http://evil"), "https://a.example/score/a", "http"},
		{"an MCP tool", "https://a.example/mcp", mcpToolBazaar("verify_schema"), "https://a.example/mcp verify_schema", "mcp"},
		{"no bazaar extension", "https://a.example/x", nil, "", ""},
		{"info against its schema fails", "https://a.example/x", badInfo, "", ""},
		{"an input type of neither http nor mcp", "https://a.example/x", map[string]any{"info": map[string]any{"input": map[string]any{"type": "ftp"}}, "schema": map[string]any{}}, "", ""},
		{"an MCP tool without a name", "https://a.example/mcp", mcpToolBazaar(""), "", ""},
		{"an MCP tool name with a space", "https://a.example/mcp", mcpToolBazaar("a b"), "", ""},
		{"an mcp: URL", "mcp://tool/verify_schema", mcpToolBazaar("verify_schema"), "", ""},
		{"a relative URL", "/x", httpBazaar(), "", ""},
		{"javascript:", "javascript:alert(1)", httpBazaar(), "", ""},
		{"ftp:", "ftp://a.example/x", httpBazaar(), "", ""},
		{"user info", "https://u:p@a.example/x", httpBazaar(), "", ""},
		{"no host", "https:///x", httpBazaar(), "", ""},
		{"a control character", "https://a.example/x\n", httpBazaar(), "", ""},
		{"a URL over 2 KiB", "https://a.example/" + strings.Repeat("x", store.MaxDiscoveryResourceBytes), httpBazaar(), "", ""},
		{"an extension over the item bound", "https://a.example/x", withMember(httpBazaar(), "pad", strings.Repeat("x", store.DefaultDiscoveryItemBytes)), "", ""},
		{"a schema with a remote $ref", "https://a.example/x", withMember(httpBazaar(), "schema", map[string]any{"$ref": "https://evil.example/s.json"}), "", ""},
		{"a schema reading a file", "https://a.example/x", withMember(httpBazaar(), "schema", map[string]any{"$ref": "file:///etc/passwd"}), "", ""},
	} {
		e, ok := h.discoveryEntry(catalogPayload(c.url, c.bazaar), catalogReq)
		if ok != (c.want != "") || (ok && (e.Resource != c.want || e.Type != c.typ)) {
			t.Errorf("%s: %q %v, want %q (%s)", c.name, e.Resource, ok, c.want, c.typ)
		}
	}

	t.Run("an oversized way to pay lists nothing", func(t *testing.T) {
		big := catalogReq
		big.Extra = map[string]any{"pad": strings.Repeat("x", store.MaxDiscoveryAcceptBytes)}
		if _, ok := h.discoveryEntry(catalogPayload("https://a.example/x", httpBazaar()), big); ok {
			t.Fatal("listed a way to pay over the bound")
		}
	})
	t.Run("a description with control characters or over 1 KiB is dropped", func(t *testing.T) {
		for _, d := range []string{"a\x1b[31mred", strings.Repeat("x", 1025), "\xff"} {
			p := catalogPayload("https://a.example/x", httpBazaar())
			p.Resource.Description = d
			e, ok := h.discoveryEntry(p, catalogReq)
			if !ok || strings.Contains(string(e.Item), `"description"`) {
				t.Errorf("%q: item %s, %v", d, e.Item, ok)
			}
		}
	})
	t.Run("with origins, only resources on them are listed", func(t *testing.T) {
		h := NewFacilitatorHandlerWith(&fakeFacilitator{}, FacilitatorHandlerConfig{Discovery: discoveryStore(t, store.DiscoveryLimits{}), Callers: CallersAuthenticated,
			Origins: []string{"https://Verify.example/", "http://localhost:8080"}}).(*facilitatorHandler)
		for u, want := range map[string]bool{
			"https://verify.example/score/a": true,
			"http://localhost:8080/mcp":      true,
			"https://spam.example/buy-now":   false,
			"http://verify.example/score/a":  false,
			"http://localhost:8081/x":        false,
		} {
			if _, ok := h.discoveryEntry(catalogPayload(u, httpBazaar()), catalogReq); ok != want {
				t.Errorf("%s: listed %v, want %v", u, ok, want)
			}
		}
	})
	t.Run("payTo is filtered without regard to a 0x address's case", func(t *testing.T) {
		e, _ := h.discoveryEntry(catalogPayload("https://a.example/x", httpBazaar()), catalogReq)
		if e.Accepts[0].PayTo != strings.ToLower(catalogReq.PayTo) {
			t.Fatalf("payTo key %q", e.Accepts[0].PayTo)
		}
	})
}

// TestDiscoveryThroughTheHandler: a settled payment lists its resource, a
// verified one does not, and the list pages and filters as the official
// client asks.
func TestDiscoveryThroughTheHandler(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	h := NewFacilitatorHandlerWith(&fakeFacilitator{now: now}, FacilitatorHandlerConfig{Discovery: discoveryStore(t, store.DiscoveryLimits{}), Callers: CallersAuthenticated})
	srv := httptest.NewServer(h)
	defer srv.Close()
	post := func(path string, u string, bazaar map[string]any) map[string]any {
		t.Helper()
		req := devnetRequirements()
		p, err := SignExactEVM(testKey(t), req, &Resource{URL: u}, now)
		if err != nil {
			t.Fatal(err)
		}
		if bazaar != nil {
			p.Extensions = map[string]any{"bazaar": bazaar}
		}
		body, _ := json.Marshal(FacilitatorRequest{X402Version: 2, PaymentPayload: p, PaymentRequirements: req})
		resp, err := http.Post(srv.URL+path, "application/json", strings.NewReader(string(body)))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m map[string]any
		json.NewDecoder(resp.Body).Decode(&m)
		return m
	}
	list := func(q string) (DiscoveryResources, int) {
		t.Helper()
		resp, err := http.Get(srv.URL + "/discovery/resources?" + q)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var l DiscoveryResources
		json.NewDecoder(resp.Body).Decode(&l)
		return l, resp.StatusCode
	}
	if v := post("/verify", "https://spam.example/buy-now", httpBazaar()); v["isValid"] != true {
		t.Fatalf("verify: %v", v)
	}
	if l, _ := list(""); l.Pagination.Total != 0 {
		t.Fatalf("a verification listed %+v", l.Items)
	}
	if s := post("/settle", "https://a.example/x", httpBazaar()); s["success"] != true {
		t.Fatalf("settle: %v", s)
	}
	if s := post("/settle", "https://a.example/mcp", mcpToolBazaar("verify_schema")); s["success"] != true {
		t.Fatalf("settle: %v", s)
	}
	l, status := list("")
	if status != 200 || l.X402Version != 2 || l.Pagination != (DiscoveryPagination{Limit: DefaultDiscoveryLimit, Total: 2}) ||
		l.Items[0].Resource != "https://a.example/mcp" || l.Items[0].Type != "mcp" || l.Items[1].Resource != "https://a.example/x" ||
		len(l.Items[1].Accepts) != 1 || l.Items[1].Accepts[0].Amount != devnetRequirements().Amount || l.Items[1].Extensions["bazaar"] == nil {
		t.Fatalf("list %d %+v", status, l)
	}
	if l, _ := list("type=mcp&limit=1"); l.Pagination.Total != 1 || l.Items[0].Type != "mcp" {
		t.Fatalf("type=mcp: %+v", l)
	}
	if l, _ := list("payTo=" + strings.ToUpper(devnetRequirements().PayTo[2:]) + "&offset=1"); l.Pagination.Total != 0 {
		t.Fatalf("a payTo without 0x matched: %+v", l)
	}
	if l, _ := list("payTo=0x" + strings.ToUpper(devnetRequirements().PayTo[2:]) + "&offset=1"); l.Pagination.Total != 2 || len(l.Items) != 1 {
		t.Fatalf("payTo in upper case, second page: %+v", l)
	}
	for _, q := range []string{"limit=0", "limit=abc", "offset=-1", "limit=1&limit=2", "limit=100000"} {
		if _, status := list(q); status != 400 {
			t.Errorf("?%s: %d, want 400", q, status)
		}
	}

	t.Run("a settle answers the bazaar outcome in EXTENSION-RESPONSES", func(t *testing.T) {
		settle := func(u string, bazaar map[string]any) map[string]any {
			t.Helper()
			req := devnetRequirements()
			p, err := SignExactEVM(testKey(t), req, &Resource{URL: u}, now)
			if err != nil {
				t.Fatal(err)
			}
			if bazaar != nil {
				p.Extensions = map[string]any{"bazaar": bazaar}
			}
			body, _ := json.Marshal(FacilitatorRequest{X402Version: 2, PaymentPayload: p, PaymentRequirements: req})
			rec := httptest.NewRecorder()
			r := httptest.NewRequest("POST", "/settle", strings.NewReader(string(body)))
			r.Header.Set("Content-Type", "application/json")
			h.ServeHTTP(rec, r)
			if rec.Code != 200 {
				t.Fatalf("settle: %d %s", rec.Code, rec.Body)
			}
			v := rec.Header().Get(HeaderExtensionResponses)
			if v == "" {
				return nil
			}
			raw, err := base64.StdEncoding.DecodeString(v)
			var m map[string]any
			if err != nil || json.Unmarshal(raw, &m) != nil {
				t.Fatalf("EXTENSION-RESPONSES %q", v)
			}
			return m
		}
		if m := settle("https://a.example/y", httpBazaar()); fmt.Sprint(m) != "map[bazaar:map[status:success]]" {
			t.Errorf("listed: %v", m)
		}
		if m := settle("mcp://tool/x", mcpToolBazaar("x")); fmt.Sprint(m["bazaar"].(map[string]any)["status"]) != "rejected" ||
			!strings.Contains(fmt.Sprint(m), "http(s)") {
			t.Errorf("an mcp: URL: %v", m)
		}
		if m := settle("https://a.example/z", nil); m != nil {
			t.Errorf("without a bazaar extension: %v, want no header", m)
		}
	})
	t.Run("without a store the endpoint is 404", func(t *testing.T) {
		rec := httptest.NewRecorder()
		NewFacilitatorHandler(&fakeFacilitator{}).ServeHTTP(rec, httptest.NewRequest("GET", "/discovery/resources", nil))
		if rec.Code != 404 {
			t.Fatalf("%d", rec.Code)
		}
	})
}

// FuzzDiscoveryQuery: any query string is a page within bounds or a 400,
// never a panic.
func FuzzDiscoveryQuery(f *testing.F) {
	for _, s := range []string{"", "limit=1&offset=1", "limit=0", "offset=-1", "type=mcp&payTo=0x2", "limit=1&limit=2", "limit=%zz"} {
		f.Add(s)
	}
	h := discoveryHandler(f, store.DiscoveryLimits{})
	for i := range 4 {
		e, ok := h.discoveryEntry(catalogPayload(fmt.Sprintf("https://a.example/%d", i), httpBazaar()), catalogReq)
		if !ok {
			f.Fatal("not listed")
		}
		if err := h.discovery.Record(context.Background(), e); err != nil {
			f.Fatal(err)
		}
	}
	f.Fuzz(func(t *testing.T, s string) {
		if _, err := url.ParseQuery(s); err != nil {
			return
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/discovery/resources?"+url.PathEscape(s), nil))
		if rec.Code != 200 {
			var e apierr.Error
			if rec.Code != 400 || json.Unmarshal(rec.Body.Bytes(), &e) != nil || e.Code != apierr.CodeInvalidRequest {
				t.Fatalf("%q: %d %s", s, rec.Code, rec.Body)
			}
			return
		}
		var l DiscoveryResources
		if err := json.Unmarshal(rec.Body.Bytes(), &l); err != nil {
			t.Fatalf("%q: %v: %s", s, err, rec.Body)
		}
		if l.Pagination.Limit < 1 || l.Pagination.Limit > MaxDiscoveryLimit || len(l.Items) > l.Pagination.Limit || l.Pagination.Total > 4 {
			t.Fatalf("%q: %+v", s, l.Pagination)
		}
	})
}

// BenchmarkDiscoveryRecord is what a settlement adds for the list: the
// checks (the bazaar schema compiled once, then cached) and the store
// write of a known resource, against the checks alone.
func BenchmarkDiscoveryRecord(b *testing.B) {
	h := discoveryHandler(b, store.DiscoveryLimits{})
	p := catalogPayload("https://a.example/score/a", withMember(httpBazaar(), "routeTemplate", "/score/:agent_id"))
	b.Run("checks", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := h.discoveryEntry(p, catalogReq); !ok {
				b.Fatal("not listed")
			}
		}
	})
	b.Run("checks_and_badger_write", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			h.record(context.Background(), p, catalogReq, settledAt("0x1"))
		}
	})
}

// FuzzDiscoveryEntry: whatever resource URL and bazaar extension a payer
// sends (the URL doubling as its description), the entry is refused or
// within every bound, at an http(s) URL without control characters, with
// no invisible character in its description and an MCP tool name of MCP's
// characters, never keyed (by its URL or routeTemplate) as a route the
// operator's gate serves unless the gate describes it, and the store takes
// it.
func FuzzDiscoveryEntry(f *testing.F) {
	seed, _ := json.Marshal(withMember(httpBazaar(), "routeTemplate", "/score/:agent_id"))
	mcpSeed, _ := json.Marshal(mcpToolBazaar("verify_schema"))
	for _, s := range []struct{ u, ext string }{
		{"https://a.example/score/a", string(seed)},
		{"https://a.example/mcp", string(mcpSeed)},
		{"http://A.example:80/x?y#z", `{"info":{"input":{"type":"http"}},"schema":{}}`},
		{"https://a.example/x", `{"info":{"input":{"type":"http"}},"schema":{"$ref":"#/$defs/a","$defs":{"a":{"$ref":"#/$defs/a"}}}}`},
		{"https://a.example/x?\u202egnp.exe", `{"info":{"input":{"type":"http"}},"schema":{}}`},
		{"https://a.example/mcp", `{"info":{"input":{"type":"mcp","toolName":"verify\u200bschema","inputSchema":{}}},"schema":{}}`},
		{"https://verify.example/elsewhere", string(seed)},
		{"https://verify.example/elsewhere", strings.Replace(string(seed), "/score/:agent_id", "/score/x", 1)},
	} {
		f.Add(s.u, s.ext)
	}
	h := discoveryHandler(f, store.DiscoveryLimits{})
	h.operator = scoreRoute
	f.Fuzz(func(t *testing.T, u, ext string) {
		var bz map[string]any
		dec := json.NewDecoder(strings.NewReader(ext))
		dec.UseNumber()
		if dec.Decode(&bz) != nil {
			return
		}
		p := catalogPayload(u, bz)
		p.Resource.Description = u
		e, ok := h.discoveryEntry(p, catalogReq)
		if !ok {
			return
		}
		if err := store.CheckDiscoveryEntry(e, store.DiscoveryLimits{}.WithDefaults()); err != nil {
			t.Fatalf("%q: %v", u, err)
		}
		var it discoveryItem
		if err := json.Unmarshal(e.Item, &it); err != nil {
			t.Fatalf("item %s: %v", e.Item, err)
		}
		lu, err := url.Parse(it.Resource)
		if err != nil || (lu.Scheme != "http" && lu.Scheme != "https") || lu.Host == "" || lu.RawQuery != "" || lu.Fragment != "" {
			t.Fatalf("listed resource %q from %q", it.Resource, u)
		}
		if strings.ContainsFunc(it.Description, invisible) {
			t.Fatalf("listed description %q", it.Description)
		}
		res, tool, mcp := strings.Cut(e.Resource, " ")
		if mcp && !validToolName(tool) {
			t.Fatalf("listed tool %q", tool)
		}
		// A caller's entry never takes a key of the operator's route.
		scheme, rest, _ := strings.Cut(res, "://")
		host, path, _ := strings.Cut(rest, "/")
		if _, ok := h.operator(scheme+"://"+host, "/"+path, ""); ok && e.Rank != rankOperator {
			t.Fatalf("a caller's entry %q (from %q) is keyed as the operator's route", e.Resource, u)
		}
		if err := h.discovery.Record(context.Background(), e); err != nil {
			t.Fatalf("Record: %v", err)
		}
	})
}

// stalledDiscovery is a fake for a fault: a store whose List does not
// answer until released (a real one cannot be made to stall on demand).
type stalledDiscovery struct {
	store.Discovery
	entered chan struct{}
	release chan struct{}
}

func (s *stalledDiscovery) List(ctx context.Context, q store.DiscoveryQuery) (store.DiscoveryPage, error) {
	s.entered <- struct{}{}
	<-s.release
	return s.Discovery.List(ctx, q)
}

// TestDiscoveryListsAreBounded: at most discoveryListers lists are read
// from the store at once; one more waits its turn, or gets 429 with
// Retry-After when the wait is over.
func TestDiscoveryListsAreBounded(t *testing.T) {
	st := &stalledDiscovery{Discovery: discoveryStore(t, store.DiscoveryLimits{}), entered: make(chan struct{}, 8), release: make(chan struct{})}
	h := NewFacilitatorHandlerWith(&fakeFacilitator{}, FacilitatorHandlerConfig{Discovery: st}).(*facilitatorHandler)
	h.listWait = 50 * time.Millisecond
	done := make(chan int, discoveryListers)
	for range discoveryListers {
		go func() {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest("GET", "/discovery/resources", nil))
			done <- rec.Code
		}()
		<-st.entered
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/discovery/resources", nil))
	if rec.Code != 429 || rec.Header().Get("Retry-After") != "1" || len(st.entered) != 0 {
		t.Fatalf("a list over the bound: %d %q, %d reads entered the store", rec.Code, rec.Header().Get("Retry-After"), len(st.entered))
	}
	close(st.release)
	for range discoveryListers {
		if c := <-done; c != 200 {
			t.Fatalf("a list within the bound: %d", c)
		}
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/discovery/resources", nil))
	if rec.Code != 200 {
		t.Fatalf("after the others finished: %d", rec.Code)
	}
}
