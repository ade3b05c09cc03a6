package caddymodule

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/aovhq/aov/x402"
)

func init() {
	caddy.RegisterModule(Discovery{})
}

// discovery is the set of live gates that named their route. Gates join in
// Provision and leave in Cleanup; during a reload the new config's gates are
// provisioned before the old ones are cleaned up, so for one route the most
// recently provisioned gate wins.
var discovery = &registry{gates: map[*Gate]uint64{}}

type registry struct {
	mu    sync.Mutex
	seq   uint64
	gates map[*Gate]uint64
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

// live returns one gate per route, newest first per route, sorted by route.
func (r *registry) live() []*Gate {
	r.mu.Lock()
	defer r.mu.Unlock()
	best := map[string]*Gate{}
	for g, seq := range r.gates {
		if cur, ok := best[g.Route]; !ok || r.gates[cur] < seq {
			best[g.Route] = g
		}
	}
	out := make([]*Gate, 0, len(best))
	for _, g := range best {
		out = append(out, g)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Route < out[j].Route })
	return out
}

// Discovery serves the x402 discovery manifest (Caddyfile directive
// `x402_discovery`, conventionally at /.well-known/x402), generated from the
// live configuration: every x402 route that names itself with `route`, with
// its live prices, networks and free allowance policy.
//
// The shape follows the open proposals for origin discovery: "version",
// "resources" (a list of "METHOD /path", as x402scan crawls) and
// "instructions", plus "items" in the facilitator discovery's resource
// envelope ({resource, type, x402Version, accepts, lastUpdated, metadata,
// extensions}): resource is the route's URL on the site's public origin,
// and extensions the bazaar extension its 402 carries.
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

	base string // PublicBaseURL as checked (publicOrigin)
}

// CaddyModule returns the Caddy module information.
func (Discovery) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.x402_discovery",
		New: func() caddy.Module { return new(Discovery) },
	}
}

// Provision checks PublicBaseURL.
func (d *Discovery) Provision(caddy.Context) error {
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
		w.Header().Set("Allow", "GET, HEAD")
		return caddyhttp.Error(http.StatusMethodNotAllowed, nil)
	}
	base := siteBase(d.base, r)
	doc := discoveryDoc{Version: 1, X402Version: x402.Version, Resources: []string{}, Items: []discoveryItem{}, Instructions: d.Instructions}
	for _, g := range discovery.live() {
		item := discoveryItem{
			Resource:    routeURL(base, g.Route),
			Type:        "http",
			X402Version: x402.Version,
			Accepts:     g.offers,
			LastUpdated: started.Format(time.RFC3339),
			Metadata:    discoveryMetadata{Description: g.Description, MimeType: g.MimeType, Settle: g.Settle},
		}
		if g.bazaar != nil {
			item.Extensions = map[string]any{"bazaar": g.bazaar}
		}
		if f := g.Free; f != nil && f.PerDay > 0 {
			item.Metadata.FreeAllowance = &freePolicy{Pool: f.Pool, CallsPerClientPerDay: f.PerDay, ClientKey: f.Key, MaxBodyBytes: f.MaxBody, Resets: "daily at 00:00 UTC"}
		}
		doc.Resources = append(doc.Resources, g.Route)
		doc.Items = append(doc.Items, item)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if d.base != "" {
		h.Set("Cache-Control", "public, max-age=60")
	} else {
		h.Set("Cache-Control", "private, max-age=60")
		h.Set("Vary", "Host")
	}
	h.Set("Access-Control-Allow-Origin", "*")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(doc)
}

// routeURL is the URL of a `route` ("METHOD /path") on origin base, its
// {name} segments written as the bazaar routeTemplate's :name.
func routeURL(base, route string) string {
	_, path, _ := strings.Cut(route, " ")
	return base + routeParam.ReplaceAllString(path, ":$1")
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Discovery)(nil)
	_ caddyhttp.MiddlewareHandler = (*Discovery)(nil)
)
