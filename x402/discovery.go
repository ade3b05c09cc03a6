package x402

import (
	"encoding/json"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aovhq/aov/apierr"
)

// The bazaar discovery list a facilitator serves at GET
// /discovery/resources: the resources it settled a payment
// for, as the official withBazaar(HTTPFacilitatorClient).listResources()
// reads them ({x402Version, items, pagination: {limit, offset, total}}).
const (
	// MaxDiscoveryResources bounds the list: past it, the resource paid
	// for longest ago is dropped, so a flood of paid-for URLs costs memory
	// once, not without limit.
	MaxDiscoveryResources = 1024
	// maxDiscoveryAccepts bounds the ways to pay kept per resource, and
	// the two sizes below what one entry holds (a request may be 1 MiB): a
	// larger way to pay is not listed, a larger bazaar extension dropped.
	maxDiscoveryAccepts        = 8
	maxDiscoveryAcceptBytes    = 4 << 10
	maxDiscoveryExtensionBytes = 32 << 10
	// DefaultDiscoveryLimit and MaxDiscoveryLimit are the page sizes of
	// GET /discovery/resources without, and at most with, ?limit.
	DefaultDiscoveryLimit = 100
	MaxDiscoveryLimit     = 1000
)

// DiscoveryResource is one item of the bazaar discovery list.
type DiscoveryResource struct {
	Resource    string                `json:"resource"`
	Type        string                `json:"type"`
	X402Version int                   `json:"x402Version"`
	Accepts     []PaymentRequirements `json:"accepts"`
	LastUpdated string                `json:"lastUpdated"`
	Description string                `json:"description,omitempty"`
	MimeType    string                `json:"mimeType,omitempty"`
	Extensions  map[string]any        `json:"extensions,omitempty"`
}

// DiscoveryResources is the GET /discovery/resources answer.
type DiscoveryResources struct {
	X402Version int                 `json:"x402Version"`
	Items       []DiscoveryResource `json:"items"`
	Pagination  DiscoveryPagination `json:"pagination"`
}

// DiscoveryPagination says which part of the list a page is.
type DiscoveryPagination struct {
	Limit  int `json:"limit"`
	Offset int `json:"offset"`
	Total  int `json:"total"`
}

// discoveryCatalog keeps the resources a facilitator handler verified or
// settled for, in memory and bounded by max.
type discoveryCatalog struct {
	mu    sync.Mutex
	max   int
	items map[string]*discoveryEntry
}

type discoveryEntry struct {
	DiscoveryResource
	at time.Time
}

// record notes a resource a payment was valid for. Only an absolute
// http(s) or mcp URL (the payload's resource, which the facilitator verified the
// payment together with) is listed; its bazaar extension, when the client
// echoed one, is kept as the description of how to call it.
func (c *discoveryCatalog) record(p PaymentPayload, req PaymentRequirements, now time.Time) {
	if p.Resource == nil {
		return
	}
	u, err := url.Parse(p.Resource.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https" && u.Scheme != "mcp") || u.Host == "" || len(p.Resource.URL) > 2048 {
		return
	}
	typ, resource := "http", p.Resource.URL
	var ext map[string]any
	if r, err := json.Marshal(req); err != nil || len(r) > maxDiscoveryAcceptBytes {
		return
	}
	if b, ok := p.Extensions["bazaar"].(map[string]any); ok && jsonSize(b) <= maxDiscoveryExtensionBytes {
		ext = map[string]any{"bazaar": b}
		// One entry per route, as the official facilitator catalogs it:
		// the origin and the route's template, not each URL.
		if tmpl, _ := b["routeTemplate"].(string); validRouteTemplate(tmpl) {
			resource = u.Scheme + "://" + u.Host + tmpl
		}
		if info, _ := b["info"].(map[string]any); info != nil {
			if in, _ := info["input"].(map[string]any); in != nil && in["type"] == "mcp" {
				typ = "mcp"
			}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.items == nil {
		c.items = map[string]*discoveryEntry{}
	}
	e, ok := c.items[resource]
	if !ok {
		if len(c.items) >= c.max {
			c.evictOldest()
		}
		e = &discoveryEntry{}
		c.items[resource] = e
	}
	e.Resource, e.Type, e.X402Version = resource, typ, Version
	e.Description, e.MimeType = truncateField(p.Resource.Description), truncateField(p.Resource.MimeType)
	if ext != nil {
		e.Extensions = ext
	}
	e.at = now
	e.LastUpdated = now.UTC().Format(time.RFC3339)
	i := slices.IndexFunc(e.Accepts, func(a PaymentRequirements) bool {
		return a.Scheme == req.Scheme && a.Network == req.Network && a.Asset == req.Asset && a.PayTo == req.PayTo
	})
	switch {
	case i >= 0:
		e.Accepts[i] = req
	case len(e.Accepts) < maxDiscoveryAccepts:
		e.Accepts = append(e.Accepts, req)
	}
}

// validRouteTemplate accepts a path template such as /score/:agent_id.
func validRouteTemplate(t string) bool {
	return strings.HasPrefix(t, "/") && !strings.HasPrefix(t, "//") && len(t) <= 512 &&
		!strings.ContainsAny(t, "?#\\ \t\r\n") && !strings.Contains(t, "..")
}

func (c *discoveryCatalog) evictOldest() {
	var oldest string
	var at time.Time
	for k, e := range c.items {
		if oldest == "" || e.at.Before(at) {
			oldest, at = k, e.at
		}
	}
	delete(c.items, oldest)
}

func jsonSize(v any) int {
	b, err := json.Marshal(v)
	if err != nil {
		return math.MaxInt
	}
	return len(b)
}

func truncateField(s string) string {
	if len(s) > 1024 {
		return s[:1024]
	}
	return s
}

// list answers one page of the catalog, newest first, filtered by the
// official client's query parameters (type, payTo, scheme, network,
// extensions, limit, offset).
func (c *discoveryCatalog) list(q url.Values) (DiscoveryResources, *apierr.Error) {
	limit, err := pageParam(q, "limit", DefaultDiscoveryLimit, 1, MaxDiscoveryLimit)
	if err != nil {
		return DiscoveryResources{}, err
	}
	offset, err := pageParam(q, "offset", 0, 0, MaxDiscoveryResources)
	if err != nil {
		return DiscoveryResources{}, err
	}
	c.mu.Lock()
	all := make([]*discoveryEntry, 0, len(c.items))
	for _, e := range c.items {
		if matchesDiscovery(e, q) {
			all = append(all, e)
		}
	}
	slices.SortFunc(all, func(a, b *discoveryEntry) int {
		if d := b.at.Compare(a.at); d != 0 {
			return d
		}
		return strings.Compare(a.Resource, b.Resource)
	})
	items := []DiscoveryResource{}
	for i := offset; i < len(all) && len(items) < limit; i++ {
		r := all[i].DiscoveryResource
		r.Accepts = slices.Clone(r.Accepts)
		items = append(items, r)
	}
	c.mu.Unlock()
	return DiscoveryResources{X402Version: Version, Items: items, Pagination: DiscoveryPagination{Limit: limit, Offset: offset, Total: len(all)}}, nil
}

func matchesDiscovery(e *discoveryEntry, q url.Values) bool {
	if t := q.Get("type"); t != "" && e.Type != t {
		return false
	}
	if x := q.Get("extensions"); x != "" {
		if _, ok := e.Extensions[x]; !ok {
			return false
		}
	}
	payTo, scheme, network := q.Get("payTo"), q.Get("scheme"), q.Get("network")
	if payTo == "" && scheme == "" && network == "" {
		return true
	}
	return slices.ContainsFunc(e.Accepts, func(a PaymentRequirements) bool {
		return (payTo == "" || strings.EqualFold(a.PayTo, payTo)) && (scheme == "" || a.Scheme == scheme) && (network == "" || a.Network == network)
	})
}

func pageParam(q url.Values, name string, def, lo, hi int) (int, *apierr.Error) {
	vs, ok := q[name]
	if !ok {
		return def, nil
	}
	n, err := strconv.Atoi(vs[0])
	if len(vs) != 1 || err != nil || n < lo || n > hi {
		return 0, &apierr.Error{
			Code:        apierr.CodeInvalidRequest,
			Message:     "The discovery query is invalid; fix the listed parameter and send it again.",
			Status:      http.StatusBadRequest,
			NextActions: []apierr.Action{{Action: "fix_request_fields", Fields: []string{name}}},
			Fields:      []apierr.Field{{Field: name, Problem: "is not one whole number from " + strconv.Itoa(lo) + " to " + strconv.Itoa(hi), Fix: "Send ?" + name + "=<n> once, or leave it out."}},
		}
	}
	return n, nil
}
