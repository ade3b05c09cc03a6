package caddymodule

import (
	"bytes"
	"encoding/json"
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
	// perRequest: the documents name what the request chose (its Host, or
	// a request placeholder in public_base_url or mcp_url), so they are
	// private to the client (setDocumentCache).
	perRequest bool
}

// docsCache keeps generated documents. They depend only on the service
// name, the base URL, the MCP URL and the site's gates (whose settings
// never change after provisioning: a reload makes new gates), so that is
// an entry's key. Sites whose routes differ by Host (host matchers in one
// site) have an entry per set of routes, so requests alternating between
// them cost no rebuild (about 4 ms and 0.9 MB under the lock).
// Without a public_base_url the base URL is each request's own origin: the
// documents are then built once with docsOrigin in its place and served
// with it replaced, each entry keeping its last origin's copy, so a client
// that sends a new Host on every request costs a substitution, not a
// rebuild, and the key never holds the Host.
type docsCache struct {
	mu      sync.Mutex
	entries map[string]*docsEntry
	builds  int // documents built, for tests
}

// docsCacheSize bounds the entries. The sets of routes are bounded by the
// configuration, but a public_base_url or mcp_url with a request
// placeholder puts what the client sent into the key, so past the bound an
// entry makes room for the next.
const docsCacheSize = 16

// docsEntry is the documents of one key.
type docsEntry struct {
	openapi, llms []byte
	// The documents for origin, when they are built with docsOrigin.
	origin                    string
	originOpenapi, originLLMs []byte
}

// docsOrigin stands for the request's origin in documents built without a
// public_base_url. The .invalid top-level domain never names a real host
// (RFC 2606), and a Host header cannot hold the characters that JSON or
// markdown would escape, other than '&' (escaped in the OpenAPI document as
// json.Marshal does).
const docsOrigin = "http://aov-request-origin.invalid"

// documents returns the OpenAPI document and llms.txt for the request.
func (d *Docs) documents(r *http.Request) (openapi, llms []byte, err error) {
	gates := siteGates(r)
	svc := d.service(r, gates)
	origin := ""
	if svc.BaseURL == "" {
		origin, svc.BaseURL = requestBase(r), docsOrigin
	}
	var key strings.Builder
	key.WriteString(svc.BaseURL + "\x00" + svc.MCPURL + "\x00" + svc.Name)
	for _, g := range gates {
		fmt.Fprintf(&key, "\x00%p", g)
	}
	d.cache.mu.Lock()
	defer d.cache.mu.Unlock()
	e := d.cache.entries[key.String()]
	if e == nil {
		if openapi, err = apidocs.OpenAPI(svc); err != nil {
			return nil, nil, err
		}
		llms = apidocs.LLMsTxt(svc)
		d.cache.builds++
		if d.cache.entries == nil {
			d.cache.entries = make(map[string]*docsEntry, docsCacheSize)
		}
		for k := range d.cache.entries {
			if len(d.cache.entries) < docsCacheSize {
				break
			}
			delete(d.cache.entries, k)
		}
		e = &docsEntry{openapi: openapi, llms: llms}
		d.cache.entries[key.String()] = e
	}
	if origin == "" {
		return e.openapi, e.llms, nil
	}
	if e.origin != origin || e.originOpenapi == nil {
		quoted, _ := json.Marshal(origin)
		e.origin = origin
		e.originOpenapi = bytes.ReplaceAll(e.openapi, []byte(docsOrigin), quoted[1:len(quoted)-1])
		e.originLLMs = bytes.ReplaceAll(e.llms, []byte(docsOrigin), []byte(origin))
	}
	return e.originOpenapi, e.originLLMs, nil
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
	d.perRequest = d.PublicBaseURL == "" || requestPlaceholder(d.PublicBaseURL) || requestPlaceholder(d.MCPURL)
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
		doc, llms, err := d.documents(r)
		if err != nil {
			apierr.Write(w, apierr.Internal(err))
			return nil
		}
		h.Set("Access-Control-Allow-Origin", "*")
		setDocumentCache(h, d.perRequest)
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
			Accepts: g.offers, Settle: g.Settle,
		}
		if f := g.Free; f != nil {
			rt.Free = &apidocs.Free{Pool: f.Pool, PerDay: f.PerDay, Key: f.Key, MaxBody: f.MaxBody, Tool: f.Tool}
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
