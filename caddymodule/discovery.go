package caddymodule

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/x402"
)

func init() {
	caddy.RegisterModule(Discovery{})
}

// siteGates returns the gates the documents of r's site describe: those
// that named their route and that a request to r's host can reach in the
// server answering r, one per route and MCP tool (the first in route
// order, as Caddy tries them; the tools of one endpoint all name its
// route), sorted by route and tool.
//
// The documents are generated from the config that answers, not from every
// gate in the process: one Caddy serves many sites, and one site's
// documents must not publish another's routes, pay-to addresses and prices
// on its own origin. Sites on different ports are different servers; sites
// on one port are that server's top-level routes told apart by their host
// matchers (as the Caddyfile adapts them, or as a JSON config writes them),
// so the walk keeps the routes whose matchers that read only the host
// (hostOnly) match r and ignores every other matcher: the documents list
// every path of the origin. Walking at
// request time, rather than recording a site when a gate is provisioned,
// sees the same routes Caddy routes r through, reloads included, and needs
// no registry for gates to join and leave.
//
// byHost reports whether another request reaching self (the handler
// answering r) could get other gates: the walk read a host matcher that
// not every such request satisfies. A route that leads to self does not
// count (every request reaching self took it), nor one whose plain host
// names none of the routes leading to self has (no request reaching self
// can take it: a site block of its own on the same port).
func siteGates(r *http.Request, self caddyhttp.MiddlewareHandler) (gates []*Gate, byHost bool) {
	srv, _ := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	if srv == nil {
		return nil, false
	}
	w := siteWalk{r: r, srv: srv, self: self, gates: map[string]*Gate{}, invoked: map[string]bool{}}
	w.scope, _ = w.pathTo(srv.Routes, map[string]bool{})
	if w.scope == nil && srv.Errors != nil {
		w.scope, _ = w.pathTo(srv.Errors.Routes, map[string]bool{})
	}
	w.routes(srv.Routes)
	if srv.Errors != nil {
		w.routes(srv.Errors.Routes)
	}
	out := make([]*Gate, 0, len(w.gates))
	for _, g := range w.gates {
		out = append(out, g)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Route != out[j].Route {
			return out[i].Route < out[j].Route
		}
		return out[i].MCPTool < out[j].MCPTool
	})
	return out, w.byHost
}

// siteWalk collects the gates of a server's route tree for one request.
type siteWalk struct {
	r       *http.Request
	srv     *caddyhttp.Server
	self    caddyhttp.MiddlewareHandler
	gates   map[string]*Gate // by route and MCP tool
	invoked map[string]bool  // named routes already walked
	// scope is the host names a request must have to reach self, by the
	// routes leading to it (nil: any host); byHost is siteGates's.
	scope  []string
	byHost bool
}

// routes walks a route list as Caddy would route r through it, host
// matchers alone considered: it stops after a terminal route every request
// to r's host matches.
func (w *siteWalk) routes(list caddyhttp.RouteList) {
	for _, rt := range list {
		matches, always := hostMatch(rt.MatcherSets, w.r)
		if !w.byHost && readsHost(rt.MatcherSets) && !w.leadsToSelf(rt) && w.reachable(rt.MatcherSets) {
			w.byHost = true
		}
		if !matches {
			continue
		}
		for _, h := range rt.Handlers {
			w.handler(h)
		}
		if rt.Terminal && always {
			return
		}
	}
}

// handler collects h if it is a gate, and walks the routes it leads to.
func (w *siteWalk) handler(h caddyhttp.MiddlewareHandler) {
	switch h := h.(type) {
	case *Gate:
		k := h.Route + "\x00" + h.MCPTool
		if _, ok := w.gates[k]; !ok && h.Route != "" {
			w.gates[k] = h
		}
	case *caddyhttp.Subroute:
		w.routes(h.Routes)
		if h.Errors != nil {
			w.routes(h.Errors.Routes)
		}
	case *caddyhttp.Invoke:
		if rt := w.srv.NamedRoutes[h.Name]; rt != nil && !w.invoked[h.Name] {
			w.invoked[h.Name] = true
			w.routes(caddyhttp.RouteList{*rt})
		}
	}
}

// readsHost reports whether some matcher of sets reads the host.
func readsHost(sets caddyhttp.MatcherSets) bool {
	for _, set := range sets {
		for _, m := range set {
			if hostOnly(m) {
				return true
			}
		}
	}
	return false
}

// pathTo reports whether a route of list leads to w.self, and returns the
// plain host names (hostNames) of the innermost route on the way that
// names them: every request reaching w.self has one of those (nil: any).
func (w *siteWalk) pathTo(list caddyhttp.RouteList, seen map[string]bool) ([]string, bool) {
	for _, rt := range list {
		for _, h := range rt.Handlers {
			scope, ok := w.handlerPath(h, seen)
			if !ok {
				continue
			}
			if names := hostNames(rt.MatcherSets); names != nil && scope == nil {
				scope = names
			}
			return scope, true
		}
	}
	return nil, false
}

func (w *siteWalk) handlerPath(h caddyhttp.MiddlewareHandler, seen map[string]bool) ([]string, bool) {
	if h == w.self {
		return nil, true
	}
	switch h := h.(type) {
	case *caddyhttp.Subroute:
		if scope, ok := w.pathTo(h.Routes, seen); ok {
			return scope, true
		}
		if h.Errors != nil {
			return w.pathTo(h.Errors.Routes, seen)
		}
	case *caddyhttp.Invoke:
		if rt := w.srv.NamedRoutes[h.Name]; rt != nil && !seen[h.Name] {
			seen[h.Name] = true
			return w.pathTo(caddyhttp.RouteList{*rt}, seen)
		}
	}
	return nil, false
}

// leadsToSelf reports whether rt's handlers lead to w.self.
func (w *siteWalk) leadsToSelf(rt caddyhttp.Route) bool {
	_, ok := w.pathTo(caddyhttp.RouteList{rt}, map[string]bool{})
	return ok
}

// reachable reports whether a request reaching w.self could take a route
// with matcher sets: unless both name plain hosts and share none.
func (w *siteWalk) reachable(sets caddyhttp.MatcherSets) bool {
	names := hostNames(sets)
	if w.scope == nil || names == nil {
		return true
	}
	for _, n := range names {
		for _, s := range w.scope {
			if strings.EqualFold(n, s) {
				return true
			}
		}
	}
	return false
}

// hostNames returns the host names of sets when each set is one `host`
// matcher of plain names (no wildcard, no placeholder), else nil.
func hostNames(sets caddyhttp.MatcherSets) []string {
	var names []string
	for _, set := range sets {
		if len(set) != 1 {
			return nil
		}
		var hosts caddyhttp.MatchHost
		switch m := set[0].(type) {
		case caddyhttp.MatchHost:
			hosts = m
		case *caddyhttp.MatchHost:
			hosts = *m
		default:
			return nil
		}
		for _, h := range hosts {
			if h == "" || strings.ContainsAny(h, "*{") {
				return nil
			}
			names = append(names, h)
		}
	}
	return names
}

// hostMatch reports whether r's host can take a route with matcher sets
// sets (some set's host matchers all match r, or there are no sets) and
// whether it always does (that set has no other matcher). A host matcher
// is one that reads nothing of a request but its host (hostOnly): those are
// evaluated on r with Caddy's own matchers, since every request to the
// route has r's host; any other matcher is taken as matching.
func hostMatch(sets caddyhttp.MatcherSets, r *http.Request) (matches, always bool) {
	if len(sets) == 0 {
		return true, true
	}
	for _, set := range sets {
		ok, hostOnlySet := true, true
		for _, m := range set {
			me, isMatcher := m.(caddyhttp.RequestMatcherWithError)
			if !isMatcher || !hostOnly(m) {
				hostOnlySet = false
				continue
			}
			if match, err := me.MatchWithError(r); err != nil || !match {
				ok = false
			}
		}
		if ok {
			matches = true
			always = always || hostOnlySet
		}
	}
	return matches, always
}

// hostOnly reports whether matcher m reads nothing of a request but its
// host: `host`; `header Host`; an `expression` whose every word is its
// host (hostOnlyExpr); a `not` of sets of those. Anything else (a path,
// a method, another header, vars) differs between the request for the
// documents and the route's own requests, so it is not evaluated.
func hostOnly(m any) bool {
	switch m := m.(type) {
	case caddyhttp.MatchHost, *caddyhttp.MatchHost:
		return true
	case caddyhttp.MatchHeader:
		return headerHostOnly(m)
	case *caddyhttp.MatchHeader:
		return headerHostOnly(*m)
	case caddyhttp.MatchExpression:
		return hostOnlyExpr(m.Expr)
	case *caddyhttp.MatchExpression:
		return hostOnlyExpr(m.Expr)
	case caddyhttp.MatchNot:
		return hostOnlySets(m.MatcherSets)
	case *caddyhttp.MatchNot:
		return hostOnlySets(m.MatcherSets)
	}
	return false
}

func hostOnlySets(sets []caddyhttp.MatcherSet) bool {
	for _, set := range sets {
		for _, m := range set {
			if !hostOnly(m) {
				return false
			}
		}
	}
	return true
}

func headerHostOnly(h caddyhttp.MatchHeader) bool {
	for k := range h {
		if http.CanonicalHeaderKey(k) != "Host" {
			return false
		}
	}
	return len(h) > 0
}

// hostExprWords are the words a host-only expression may use besides its
// string literals: the host matcher function, and CEL's string methods and
// operators.
var hostExprWords = map[string]bool{"host": true, "in": true, "startsWith": true, "endsWith": true,
	"contains": true, "matches": true, "size": true, "lowerAscii": true, "true": true, "false": true}

// hostOnlyExpr reports, conservatively, whether a CEL expression (as the
// expression matcher takes it, Caddy placeholders included) reads nothing
// of a request but its host: its placeholders are {host} or
// {http.request.host}, its words hostExprWords, and the rest string
// literals, numbers and operators. Anything else (req, path(), another
// placeholder, an unknown function) is not host-only.
func hostOnlyExpr(expr string) bool {
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '\'' || c == '"':
			j := i + 1
			for ; j < len(expr) && expr[j] != c; j++ {
				if expr[j] == '\\' {
					j++
				}
			}
			if j >= len(expr) {
				return false
			}
			i = j + 1
		case c == '{':
			j := strings.IndexByte(expr[i:], '}')
			if j < 0 {
				return false
			}
			if ph := expr[i+1 : i+j]; ph != "host" && ph != "http.request.host" {
				return false
			}
			i += j + 1
		case c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z':
			j := i
			for j < len(expr) && (expr[j] == '_' || 'a' <= expr[j] && expr[j] <= 'z' || 'A' <= expr[j] && expr[j] <= 'Z' || '0' <= expr[j] && expr[j] <= '9') {
				j++
			}
			if !hostExprWords[expr[i:j]] {
				return false
			}
			i = j
		case strings.IndexByte(" \t\r\n=!&|()[],.<>+0123456789", c) >= 0:
			i++
		default:
			return false
		}
	}
	return true
}

// discovery is the set of live gates of the process that named their route,
// for the facilitator's discovery list (listing): a settlement reaches the
// facilitator without a site, so it is matched to the gate serving its
// resource by origin, path and MCP tool, not by the walk of one server's
// routes that the documents of a site use (siteGates). Gates join in
// Provision and leave in Cleanup; during a reload the new config's gates
// are provisioned before the old ones are cleaned up.
//
// Every live gate is kept, not one per route: the MCP tools of one
// endpoint all name one route ("POST /mcp"), and sites of one Caddy may
// name the same route at their own prices.
var discovery = &registry{gates: map[*Gate]uint64{}}

type registry struct {
	mu    sync.Mutex
	seq   uint64
	gates map[*Gate]uint64 // the order each gate was provisioned in
}

func (r *registry) add(g *Gate) {
	if g.Route == "" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	r.gates[g] = r.seq
}

func (r *registry) remove(g *Gate) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.gates, g)
}

// listing is how the live gate serving path (as escaped in the URL) on
// origin lists its resource in the facilitator's discovery list: all from
// the gate's configuration (x402.OperatorListing), false when no live gate
// with a route serves it. tool picks among the MCP tools of one endpoint
// (a gate pricing that tool before one pricing the whole endpoint). A gate
// with a public_base_url serves that origin only, and is preferred there
// to gates without one; the facilitator has already held origin to its
// discovery origins.
//
// A gate without a public_base_url serves whatever origin its site's
// requests name, which the registry does not know: when several such gates
// match and describe the resource differently (the same route on two
// sites, or a reload's old and new gates for the moment both are live),
// the listing is Ambiguous rather than one site's prices on another's URL.
// Among gates that agree, the most recently provisioned is listed.
func (r *registry) listing(origin, path, tool string) (x402.OperatorListing, bool) {
	// In the form a gate's public_base_url is kept in: a settled URL on
	// https://site.example:443 or https://café.example is the site's
	// https://site.example or https://xn--caf-dma.example, which browsers
	// and the gate serve as the same origin.
	if norm, err := normalizeOrigin(origin); err == nil {
		origin = norm
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	// before orders the matching gates: on this origin's public_base_url,
	// then pricing this very tool, then the most recently provisioned.
	before := func(a, b *Gate) bool {
		if (a.base != "") != (b.base != "") {
			return a.base != ""
		}
		if (a.MCPTool != "") != (b.MCPTool != "") {
			return a.MCPTool != ""
		}
		return r.gates[a] > r.gates[b]
	}
	var best *Gate
	var match []*Gate
	for g := range r.gates {
		if g.Resource != "" || (g.base != "" && g.base != origin) {
			continue // a configured resource URL is not the route's path
		}
		_, route := splitRoute(g.Route)
		if route == "" || !routeMatches(route, path) || (g.MCPTool != "" && g.MCPTool != tool) {
			continue
		}
		match = append(match, g)
		if best == nil || before(g, best) {
			best = g
		}
	}
	if best == nil {
		return x402.OperatorListing{}, false
	}
	l := best.operatorListing(origin)
	if best.base == "" {
		for _, g := range match {
			if g != best && g.MCPTool == best.MCPTool && !reflect.DeepEqual(g.operatorListing(origin), l) {
				return x402.OperatorListing{Ambiguous: true}, true
			}
		}
	}
	return l, true
}

// listType is the discovery item type of g's resource: "mcp" for a tool
// (an item per endpoint and tool), else "http".
func (g *Gate) listType() string {
	if g.MCPTool != "" {
		return "mcp"
	}
	return "http"
}

// operatorListing is how g lists its route on origin.
func (g *Gate) operatorListing(origin string) x402.OperatorListing {
	return x402.OperatorListing{Resource: routeURL(origin, g.Route), Tool: g.MCPTool, Description: g.Description,
		MimeType: g.MimeType, Bazaar: g.bazaar, Accepts: g.liveOffers().offers}
}

// routeMatches reports whether path (a URL's escaped path, or a bazaar
// routeTemplate) is one the `route` path names: the same segments, each
// {name} standing for one non-empty segment. Both are compared as Caddy's
// path matcher (caddyhttp.MatchPath) compares a request's path to its
// pattern, because that matcher decides which gate answers a URL: decoded,
// in any letter case, with dot segments and doubled slashes cleaned away;
// a trailing slash is the same route, as a `route /thing/*` serves it.
// Compared byte for byte instead, /THING/b, /%74hing/b or /thing/b/ is
// answered by the operator's gate yet would be listed as a stranger's
// settle describes it.
//
// An encoded slash reads two ways, and path is the route's when either
// reading makes it so: split on its literal slashes before each segment
// is decoded, /thing/a%2Fb is one id, as a `route /thing/*` serves it;
// decoded before it is cleaned, as Caddy's matcher cleans the decoded
// path, /other/..%2Fthing%2Fb is /thing/b. Read only one way, the other's
// aliases are answered by the operator's gate and listed as strangers
// describe them.
func routeMatches(route, path string) bool {
	rs, ok := matcherSegments(route, true)
	if !ok {
		return false
	}
	for _, splitFirst := range []bool{true, false} {
		if ps, ok := matcherSegments(path, splitFirst); ok && segmentsMatch(rs, ps) {
			return true
		}
	}
	return false
}

// segmentsMatch reports whether a path's segments ps are the route's rs,
// a {name} in rs standing for any one segment.
func segmentsMatch(rs, ps []string) bool {
	if len(rs) != len(ps) {
		return false
	}
	for i, r := range rs {
		if r != ps[i] && routeParam.FindString(r) != r {
			return false
		}
	}
	return true
}

// matcherSegments is p's segments as Caddy's path matcher sees a request's
// path: each percent-decoded and in lower case, with empty and "."
// segments dropped and ".." removing the one before (caddyhttp.CleanPath
// with slashes merged; a trailing slash is dropped with them). With
// splitFirst p is split on its literal slashes before each segment is
// decoded (an encoded slash stays inside its segment), else decoded
// whole first (an encoded slash splits, and may follow a ".."): see
// routeMatches. False when p does not decode.
func matcherSegments(p string, splitFirst bool) ([]string, bool) {
	unescape := func(s string) (string, error) { return s, nil }
	if splitFirst {
		unescape = url.PathUnescape
	} else {
		var err error
		if p, err = url.PathUnescape(p); err != nil {
			return nil, false
		}
	}
	var segs []string
	for _, raw := range strings.Split(p, "/") {
		seg, err := unescape(raw)
		if err != nil {
			return nil, false
		}
		switch seg = strings.ToLower(seg); seg {
		case "", ".":
		case "..":
			if len(segs) > 0 {
				segs = segs[:len(segs)-1]
			}
		default:
			segs = append(segs, seg)
		}
	}
	return segs, true
}

// Discovery serves the x402 discovery manifest (Caddyfile directive
// `x402_discovery`, conventionally at /.well-known/x402), generated from the
// live configuration: every x402 route of the answering site (siteGates)
// that names itself with `route`, with its live prices, networks and free
// allowance policy.
//
// The shape follows the open proposals for origin discovery: "version",
// "resources" (a list of "METHOD /path", as x402scan crawls) and
// "instructions", plus "items" in the facilitator discovery's resource
// envelope ({resource, type, x402Version, accepts, lastUpdated, metadata,
// extensions}): resource is the route's URL on the site's public origin,
// and extensions the bazaar extension its 402 carries. The MCP tools of
// one endpoint are an item each (type mcp, the tool named in the bazaar
// extension's info.input.toolName), their route one resource.
type Discovery struct {
	// Instructions is free text for agents: how to pay, where the docs are.
	Instructions string `json:"instructions,omitempty"`

	// PublicBaseURL is the site's public origin (https://verify.example.com)
	// the route URLs are on. With it the manifest is the same for every
	// request and is served publicly cacheable; without it the URLs are on
	// the origin each request addressed (its Host, the client's choice), so
	// the manifest is private to that client: a shared cache must not hand
	// one client's Host to everyone. Env placeholders are expanded when the
	// config loads.
	PublicBaseURL string `json:"public_base_url,omitempty"`

	base  string            // PublicBaseURL as checked (publicOrigin)
	cache *docCache[[]byte] // the encoded manifest, as the docs are kept
}

// CaddyModule returns the Caddy module information.
func (Discovery) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.x402_discovery",
		New: func() caddy.Module { return new(Discovery) },
	}
}

// Provision checks PublicBaseURL and sets up the manifest's cache.
func (d *Discovery) Provision(caddy.Context) error {
	d.cache = new(docCache[[]byte])
	if d.PublicBaseURL == "" {
		return nil
	}
	var err error
	if d.base, err = publicOrigin(d.PublicBaseURL); err != nil {
		return fmt.Errorf("x402_discovery: public_base_url: %v", err)
	}
	return nil
}

type discoveryDoc struct {
	Version      int             `json:"version"`
	X402Version  int             `json:"x402Version"`
	Resources    []string        `json:"resources"`
	Items        []discoveryItem `json:"items"`
	Instructions string          `json:"instructions,omitempty"`
}

type discoveryItem struct {
	Resource    string                     `json:"resource"`
	Type        string                     `json:"type"`
	X402Version int                        `json:"x402Version"`
	Accepts     []x402.PaymentRequirements `json:"accepts"`
	LastUpdated string                     `json:"lastUpdated"`
	Metadata    discoveryMetadata          `json:"metadata"`
	Extensions  map[string]any             `json:"extensions,omitempty"`
}

type discoveryMetadata struct {
	Description   string      `json:"description,omitempty"`
	MimeType      string      `json:"mimeType,omitempty"`
	Settle        string      `json:"settle"`
	FreeAllowance *freePolicy `json:"freeAllowance,omitempty"`
}

type freePolicy struct {
	Pool                 string `json:"pool"`
	CallsPerClientPerDay int    `json:"callsPerClientPerDay"`
	ClientKey            string `json:"clientKey"`
	MaxBodyBytes         int64  `json:"maxBodyBytes"`
	Resets               string `json:"resets"`
}

// started is when this process loaded its gateway config, for lastUpdated.
var started = time.Now().UTC()

// ServeHTTP writes the manifest; it never calls next.
func (d *Discovery) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		apierr.Write(w, apierr.MethodNotAllowed("GET", "HEAD"))
		return nil
	}
	body, byHost, err := d.manifest(r)
	if err != nil {
		if err != &errDocsRequestValue {
			err = apierr.Internal(err)
		}
		apierr.Write(w, err)
		return nil
	}
	h := w.Header()
	setDocumentCache(h, d.base == "", byHost)
	h.Set("Access-Control-Allow-Origin", "*")
	serveBytes(w, r, "application/json", body)
	return nil
}

// manifest returns the manifest for r, and whether another Host could get
// other routes (siteGates), or errDocsRequestValue. It is built and
// encoded once per set of routes (the bazaar schemas of 40 verify routes
// are some 500 KB and 18,000 allocations) and kept as the docs are
// (docCache): without a public_base_url it is built on docsOrigin and the
// request's origin is substituted at serve time.
func (d *Discovery) manifest(r *http.Request) ([]byte, bool, error) {
	base := siteBase(d.base, r)
	if !documentable(base) {
		return nil, false, &errDocsRequestValue
	}
	var subst []docsSubst
	if d.base == "" {
		subst = []docsSubst{{docsOriginBytes, base}}
		base = docsOrigin
	}
	gates, byHost := siteGates(r, d)
	body, err := d.cache.get(gatesKey(base, gates), func() ([]byte, error) {
		return d.build(base, gates)
	})
	if err != nil {
		return nil, false, err
	}
	return substitute(body, subst), byHost, nil
}

// build encodes the manifest of gates with their routes on base.
func (d *Discovery) build(base string, gates []*Gate) ([]byte, error) {
	doc := discoveryDoc{Version: 1, X402Version: x402.Version, Resources: []string{}, Items: []discoveryItem{}, Instructions: d.Instructions}
	for _, g := range gates {
		item := discoveryItem{
			Resource:    routeURL(base, g.Route),
			Type:        g.listType(),
			X402Version: x402.Version,
			Accepts:     g.liveOffers().offers,
			LastUpdated: started.Format(time.RFC3339),
			Metadata:    discoveryMetadata{Description: g.Description, MimeType: g.MimeType, Settle: g.Settle},
		}
		if g.bazaar != nil {
			item.Extensions = map[string]any{"bazaar": g.bazaar}
		}
		if f := g.Free; f != nil && f.PerDay > 0 {
			item.Metadata.FreeAllowance = &freePolicy{Pool: f.Pool, CallsPerClientPerDay: f.PerDay, ClientKey: f.Key, MaxBodyBytes: f.MaxBody, Resets: "daily at 00:00 UTC"}
		}
		if n := len(doc.Resources); n == 0 || doc.Resources[n-1] != g.Route {
			doc.Resources = append(doc.Resources, g.Route) // once for the tools of one endpoint
		}
		doc.Items = append(doc.Items, item)
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encoding the x402 manifest: %w", err)
	}
	return append(b, '\n'), nil
}

// routeURL is the URL of a `route` ("METHOD /path") on origin base, its
// {name} segments written as the bazaar routeTemplate's :name.
func routeURL(base, route string) string {
	_, path := splitRoute(route)
	return base + routeParam.ReplaceAllString(path, ":$1")
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Discovery)(nil)
	_ caddyhttp.MiddlewareHandler = (*Discovery)(nil)
)
