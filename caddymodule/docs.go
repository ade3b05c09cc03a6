package caddymodule

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/aovhq/aov/apidocs"
	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/internal/caddyopt"
)

func init() {
	caddy.RegisterModule(Docs{})
	httpcaddyfile.RegisterHandlerDirective("aov_docs", parseDocs)
	httpcaddyfile.RegisterDirectiveOrder("aov_docs", httpcaddyfile.Before, "respond")
}

// The paths the docs handler answers; every other request goes to the next
// handler.
const (
	docsLLMsPath    = "/llms.txt"
	docsOpenAPIPath = "/openapi.json"
	docsPagePath    = "/docs"
	docsAssetsPath  = "/docs/assets/"
)

// Docs serves the service's self-description (Caddyfile directive
// `aov_docs`): GET /llms.txt, GET /openapi.json (OpenAPI 3.1), GET /docs
// (interactive Swagger UI whose assets are embedded in the binary) and
// GET /docs/assets/*. All of it is generated at request time from the live
// configuration: the prices, networks, pay-to addresses and free allowance
// of every x402 route of the answering site (siteGates) that names itself
// with `route`, so a config reload is
// all it takes to change what the docs say. Any other path passes through to
// the next handler, so the directive can sit at the top of a site.
type Docs struct {
	// ServiceName is the title of the documents. Default "Agent Output
	// Verifier".
	ServiceName string `json:"service_name,omitempty"`

	// PublicBaseURL is the origin clients use (https://verify.example.com),
	// for the absolute URLs in the documents. Default: the origin of each
	// request as the client addressed it. Placeholders allowed.
	PublicBaseURL string `json:"public_base_url,omitempty"`

	// MCPURL is the Streamable HTTP MCP endpoint named in the documents.
	// Default: the mcp_url of a live free_allowance, else <base URL>/mcp.
	// Placeholders allowed.
	MCPURL string `json:"mcp_url,omitempty"`

	cache *docsCache
	// basePlaceholder, mcpPlaceholder: PublicBaseURL, MCPURL have a
	// request placeholder (requestPlaceholder).
	basePlaceholder, mcpPlaceholder bool
	// perRequest: the documents name what the request chose (its Host, or
	// a request placeholder in public_base_url or mcp_url), so they are
	// private to the client (setDocumentCache).
	perRequest bool
}

// docCache keeps documents generated from the live configuration
// (/llms.txt and /openapi.json, /.well-known/x402). They depend only on
// their handler's options, the base URL and the site's gates (whose
// settings never change after provisioning: a reload makes new gates and
// new handlers), so that is an entry's key (gatesKey). Sites whose routes
// differ by Host (host matchers in one site) have an entry per set of
// routes, so requests alternating between them cost no rebuild (for the
// docs about 4 ms and 0.9 MB under the lock).
// What a request chooses (its origin when no public_base_url is set, a
// public_base_url or mcp_url with a request placeholder as expanded for
// it) is never in the key nor in an entry: the documents are built once
// with docsOrigin and docsMCPURL in its place and served with it
// substituted (substitute), so a client that sends a new Host on every
// request costs a substitution, not a rebuild, and the cache holds the
// templates only.
type docCache[T any] struct {
	mu      sync.Mutex
	entries map[string]*T
	builds  int // documents built, for tests
}

// docsCache keeps the documents of aov_docs.
type docsCache = docCache[docsEntry]

// docsCacheSize bounds the entries. The keys are bounded by the
// configuration (its sets of routes); past the bound an entry makes room
// for the next.
const docsCacheSize = 16

// docsEntry is the documents of one key.
type docsEntry struct{ openapi, llms []byte }

// gatesKey is the cache key of documents built on base from gates: the
// gates by identity, since a gate's settings never change, and the offers
// each one shows by identity too, since a Solana offer joins them once its
// fee payer is learned (learnFeePayers).
func gatesKey(base string, gates []*Gate) string {
	var key strings.Builder
	key.WriteString(base)
	for _, g := range gates {
		var live *offerSet
		if g.live != nil {
			live = g.live.Load()
		}
		fmt.Fprintf(&key, "\x00%p %p", g, live)
	}
	return key.String()
}

// docsOrigin and docsMCPURL stand for what the request chose in documents
// built for many requests: its origin (no public_base_url, or one with a
// request placeholder) and an mcp_url with a request placeholder. The
// .invalid top-level domain never names a real host (RFC 2606).
const (
	docsOrigin = "http://aov-request-origin.invalid"
	docsMCPURL = "http://aov-request-mcp.invalid/mcp"
)

// maxDocsRequestValue bounds each value the documents take from the
// request: https:// with a DNS name's longest (253 bytes, RFC 1035) and
// :65535. It is written into every URL of both documents, so an unpaid
// request with a 1 MB Host (what net/http lets through) would make the
// gateway build and send documents many times its size.
const maxDocsRequestValue = len("https://") + 253 + len(":65535")

// errDocsRequestValue answers a request whose Host (or what a placeholder
// of public_base_url or mcp_url took from it) the documents cannot name.
// It repeats nothing of the request.
var errDocsRequestValue = apierr.Error{
	Code:        apierr.CodeInvalidRequest,
	Message:     fmt.Sprintf("The documents name this server by the origin the request addressed, and this request's is not one they can name: longer than %d bytes (a DNS name is at most 253), or with a character a URL in JSON would escape (\" & < > \\, control or non-ASCII). Send the request to the server's name.", maxDocsRequestValue),
	Status:      http.StatusBadRequest,
	NextActions: []apierr.Action{{Action: "fix_request_fields", Fields: []string{"Host"}}},
}

// documentable reports whether v, taken from the request, may be written
// into the documents as it is: within maxDocsRequestValue, and printable
// ASCII that neither JSON (json.Marshal escapes <, > and &) nor markdown
// code spans would escape, so one substitution serves both documents.
func documentable(v string) bool {
	if len(v) > maxDocsRequestValue {
		return false
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c <= ' ' || c >= 0x7f || strings.IndexByte("\"&<>\\`", c) >= 0 {
			return false
		}
	}
	return true
}

// documents returns the OpenAPI document and llms.txt for the request, and
// whether another Host could get other routes (siteGates), or
// errDocsRequestValue.
func (d *Docs) documents(r *http.Request) (openapi, llms []byte, byHost bool, err error) {
	gates, byHost := siteGates(r, d)
	svc := d.service(r, gates)
	var subst []docsSubst
	if d.PublicBaseURL == "" || d.basePlaceholder {
		origin := svc.BaseURL
		if d.PublicBaseURL == "" {
			origin = requestBase(r)
		}
		subst = append(subst, docsSubst{docsOriginBytes, origin})
		svc.BaseURL = docsOrigin
	}
	if d.mcpPlaceholder {
		subst = append(subst, docsSubst{docsMCPURLBytes, svc.MCPURL})
		svc.MCPURL = docsMCPURL
	}
	for _, p := range subst {
		if !documentable(p.new) {
			return nil, nil, false, &errDocsRequestValue
		}
	}
	e, err := d.cache.get(gatesKey(svc.BaseURL+"\x00"+svc.MCPURL+"\x00"+svc.Name, gates), func() (docsEntry, error) {
		openapi, err := apidocs.OpenAPI(svc)
		if err != nil {
			return docsEntry{}, err
		}
		return docsEntry{openapi: openapi, llms: apidocs.LLMsTxt(svc)}, nil
	})
	if err != nil {
		return nil, nil, false, err
	}
	return substitute(e.openapi, subst), substitute(e.llms, subst), byHost, nil
}

// docsSubst is one value the documents take from the request: new in
// place of old (docsOrigin or docsMCPURL).
type docsSubst struct {
	old []byte
	new string
}

var docsOriginBytes, docsMCPURLBytes = []byte(docsOrigin), []byte(docsMCPURL)

// substitute returns tmpl with each old of subst replaced by its new, in
// one pass (nothing a new brings in is replaced again) and one allocation
// of the document's size; tmpl itself when there is nothing to replace.
// Each old is searched for once per occurrence, not once per replacement.
func substitute(tmpl []byte, subst []docsSubst) []byte {
	if len(subst) == 0 {
		return tmpl
	}
	n := len(tmpl)
	var next [2]int // where each old is next found, from the start; len(subst) <= 2
	for i, p := range subst {
		n += bytes.Count(tmpl, p.old) * (len(p.new) - len(p.old))
		next[i] = bytes.Index(tmpl, p.old)
	}
	out := make([]byte, 0, n)
	done := 0
	for {
		first := -1
		for i := range subst {
			if next[i] >= 0 && (first < 0 || next[i] < next[first]) {
				first = i
			}
		}
		if first < 0 {
			return append(out, tmpl[done:]...)
		}
		p := subst[first]
		out = append(append(out, tmpl[done:next[first]]...), p.new...)
		done = next[first] + len(p.old)
		for i := range subst {
			if next[i] >= 0 && next[i] < done {
				if j := bytes.Index(tmpl[done:], subst[i].old); j >= 0 {
					next[i] = done + j
				} else {
					next[i] = -1
				}
			}
		}
	}
}

// get returns the documents of key, building them once.
func (c *docCache[T]) get(key string, build func() (T, error)) (T, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.entries[key]; e != nil {
		return *e, nil
	}
	e, err := build()
	if err != nil {
		return e, err
	}
	c.builds++
	if c.entries == nil {
		c.entries = make(map[string]*T, docsCacheSize)
	}
	for k := range c.entries {
		if len(c.entries) < docsCacheSize {
			break
		}
		delete(c.entries, k)
	}
	c.entries[key] = &e
	return e, nil
}

// CaddyModule returns the Caddy module information.
func (Docs) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.aov_docs",
		New: func() caddy.Module { return new(Docs) },
	}
}

// Provision sets up the document cache and decides whether the documents
// are the same for every request.
func (d *Docs) Provision(caddy.Context) error {
	d.cache = new(docsCache)
	if d.MCPURL != "" {
		s, err := mcpEndpoint(d.MCPURL, true)
		if err != nil {
			return fmt.Errorf("aov_docs: %v", err)
		}
		d.MCPURL = s
	}
	d.basePlaceholder, d.mcpPlaceholder = requestPlaceholder(d.PublicBaseURL), requestPlaceholder(d.MCPURL)
	d.perRequest = d.PublicBaseURL == "" || d.basePlaceholder || d.mcpPlaceholder
	return nil
}

// requestPlaceholder reports whether s has a placeholder left once those
// known when the config loads ({env.NAME}) are expanded: one that each
// request fills in, such as {http.request.host}.
func requestPlaceholder(s string) bool {
	return strings.Contains(caddy.NewReplacer().ReplaceKnown(s, ""), "{")
}

// ServeHTTP answers the docs paths and passes everything else on.
func (d *Docs) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	p := r.URL.Path
	isDocs := p == docsLLMsPath || p == docsOpenAPIPath || p == docsPagePath || p == docsPagePath+"/" || strings.HasPrefix(p, docsAssetsPath)
	if !isDocs {
		return next.ServeHTTP(w, r)
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		apierr.Write(w, apierr.MethodNotAllowed("GET", "HEAD"))
		return nil
	}
	h := w.Header()
	switch {
	case p == docsLLMsPath || p == docsOpenAPIPath:
		doc, llms, byHost, err := d.documents(r)
		if err != nil {
			if err != &errDocsRequestValue {
				err = apierr.Internal(err)
			}
			apierr.Write(w, err)
			return nil
		}
		h.Set("Access-Control-Allow-Origin", "*")
		setDocumentCache(h, d.perRequest, byHost)
		if p == docsLLMsPath {
			serveBytes(w, r, "text/plain; charset=utf-8", llms)
		} else {
			serveBytes(w, r, "application/json", doc)
		}
	case p == docsPagePath || p == docsPagePath+"/":
		h.Set("Content-Security-Policy", apidocs.PageCSP)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "public, max-age=60")
		serveBytes(w, r, "text/html; charset=utf-8", apidocs.Page(d.serviceName(), docsOpenAPIPath, docsLLMsPath, strings.TrimSuffix(docsAssetsPath, "/")))
	default:
		data, ct, ok := apidocs.Asset(strings.TrimPrefix(p, docsAssetsPath))
		if !ok {
			apierr.Write(w, apierr.NotFound("docs asset"))
			return nil
		}
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Cache-Control", "public, max-age=86400")
		h.Set("ETag", `"`+apidocs.UIVersion()+`-`+strings.TrimPrefix(p, docsAssetsPath)+`"`)
		w.Header().Set("Content-Type", ct)
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(data))
	}
	return nil
}

// serveBytes writes a generated document (HEAD gets the headers only).
func serveBytes(w http.ResponseWriter, r *http.Request, contentType string, body []byte) {
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(body))
}

func (d *Docs) serviceName() string {
	if d.ServiceName != "" {
		return d.ServiceName
	}
	return "Agent Output Verifier"
}

// service describes the live configuration, gates, for one request. Its
// BaseURL is empty when the documents name the request's own origin
// (no public_base_url): documents fills it in.
func (d *Docs) service(r *http.Request, gates []*Gate) apidocs.Service {
	repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	expand := func(s string) string {
		if repl != nil && s != "" {
			return repl.ReplaceAll(s, "")
		}
		return s
	}
	base := strings.TrimSuffix(expand(d.PublicBaseURL), "/")
	mcp := expand(d.MCPURL)
	for _, g := range gates {
		if mcp == "" && g.Free != nil && g.Free.MCPURL != "" {
			mcp = g.Free.MCPURL
		}
	}
	return apidocs.Service{
		Name:    d.serviceName(),
		BaseURL: base,
		MCPURL:  mcp,
		Routes:  liveRoutes(gates),
	}
}

// liveRoutes describes the live gates that named their route, as the docs
// need them.
func liveRoutes(gates []*Gate) []apidocs.Route {
	out := make([]apidocs.Route, 0, len(gates))
	for _, g := range gates {
		method, path, ok := apidocs.ParseRoute(g.Route)
		if !ok {
			continue
		}
		rt := apidocs.Route{
			Method: method, Path: path, Tool: g.MCPTool,
			Description: g.Description, MimeType: g.MimeType,
			Accepts: g.liveOffers().offers, Settle: g.Settle,
		}
		if f := g.Free; f != nil {
			rt.Free = &apidocs.Free{Pool: f.Pool, PerDay: f.PerDay, Key: f.Key, MaxBody: f.MaxBody, Store: f.store}
		}
		out = append(out, rt)
	}
	return out
}

func parseDocs(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	d := new(Docs)
	err := d.UnmarshalCaddyfile(h.Dispenser)
	return d, err
}

// UnmarshalCaddyfile sets up the docs handler:
//
//	aov_docs {
//	    service_name    <name>
//	    public_base_url <origin>
//	    mcp_url         <url>
//	}
func (d *Docs) UnmarshalCaddyfile(disp *caddyfile.Dispenser) error {
	disp.Next() // directive name
	if disp.NextArg() {
		return disp.ArgErr()
	}
	seen := caddyopt.Once{}
	for disp.NextBlock(0) {
		if err := seen.Check(disp); err != nil {
			return err
		}
		var err error
		switch disp.Val() {
		case "service_name":
			err = oneArg(disp, &d.ServiceName)
		case "public_base_url":
			err = oneArg(disp, &d.PublicBaseURL)
		case "mcp_url":
			err = oneArg(disp, &d.MCPURL)
		default:
			return disp.Errf("unrecognized aov_docs option '%s'", disp.Val())
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Docs)(nil)
	_ caddyhttp.MiddlewareHandler = (*Docs)(nil)
	_ caddyfile.Unmarshaler       = (*Docs)(nil)
)
