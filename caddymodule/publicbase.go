package caddymodule

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/aovhq/aov/store"
)

// The absolute URLs the gateway writes into its answers (the resource of a
// 402, the routes of /.well-known/x402) start with the site's origin. The
// request's own Host and scheme are what the client chose (and, behind a
// TLS-terminating proxy, not even the public scheme), so a module that may
// be cached for others, or whose URLs a payer signs and a catalog records,
// takes the origin from its public_base_url instead.

// maxResourceURL bounds the URL a 402 names as its resource: the longest a
// facilitator's discovery list keeps, so a payer never signs for a URL no
// catalog takes. The gate refuses a request it could not name within it
// (414 uri_too_long) before any payment logic, so PAYMENT-REQUIRED cannot
// grow with what an unpaid client sends.
const maxResourceURL = store.MaxDiscoveryResourceBytes

// publicOrigin checks a configured public base URL when the config loads:
// placeholders known then ({env.NAME}) are expanded, and the result must be
// an http(s) origin with nothing after it (a trailing slash aside). It
// returns the origin as browsers send it (normalizeOrigin: lower case, no
// default port, an IDNA ASCII host), the form URLs are built from and
// origins compared in: kept as written, https://site.example:443 or
// https://café.example would never equal the Origin of the site's own
// pages. An error names raw as configured, never as expanded
// (configuredURL).
func publicOrigin(raw string) (string, error) {
	u, _, err := configuredURL(raw)
	if err == nil && ((u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.ForceQuery || u.Fragment != "") {
		err = errors.New("has a path, query or fragment")
	}
	var o string
	if err == nil {
		o, err = normalizeOrigin(u.Scheme + "://" + u.Host)
	}
	if err != nil {
		return "", fmt.Errorf("%q is not an http(s) origin (scheme://host[:port], no path, query or user; only placeholders known when the config loads, such as {env.NAME}): once expanded it %v", raw, err)
	}
	return o, nil
}

// configuredURL expands, when the config loads, the placeholders known
// then ({env.NAME}) in a URL the gateway names to clients, and returns it
// parsed and as text when it is an absolute http(s) URL with a host, no user and no
// placeholder left: one left would reach clients as written, since
// nothing expands it later. Otherwise the error says which rule the
// expanded URL breaks without repeating any of it: an {env.NAME} may hold
// a secret (a password in the user part), and the error is logged.
func configuredURL(raw string) (u *url.URL, s string, err error) {
	s = caddy.NewReplacer().ReplaceKnown(raw, "")
	if strings.ContainsAny(s, "{}") {
		return nil, "", errors.New("still has a placeholder (an unset {env.NAME}, or one only a request fills in)")
	}
	u, err = url.Parse(s)
	switch {
	case err != nil:
		return nil, "", errors.New("does not parse as a URL")
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, "", errors.New("has a scheme other than http or https")
	case u.Host == "":
		return nil, "", errors.New("has no host")
	case u.User != nil:
		return nil, "", errors.New("has a user part")
	}
	return u, s, nil
}

// mcpEndpoint checks, when the config loads, an mcp_url option
// (free_allowance's, aov_docs'): the 402s and the documents publish it, so
// as configuredURL expands it it must be an absolute http(s) URL without
// a user part, and is returned expanded. With requestPlaceholders (aov_docs,
// whose documents are built per request) it may hold a placeholder a
// request fills in ({http.request.host}): it is then returned as written,
// for each request to expand, and what the config loads with is checked,
// each such placeholder read as a host name: it must parse and have no
// user part (an {env.NAME} there would publish a password). The error
// names raw as written and the rule it breaks, never the expansion.
func mcpEndpoint(raw string, requestPlaceholders bool) (string, error) {
	s, known, err := raw, "", error(nil)
	if requestPlaceholders && requestPlaceholder(raw) {
		known = ", or one a request fills in, such as {http.request.host}"
		u, perr := url.Parse(anyPlaceholder.ReplaceAllString(caddy.NewReplacer().ReplaceKnown(raw, ""), "x"))
		switch {
		case perr != nil:
			err = errors.New("does not parse as a URL")
		case u.User != nil:
			err = errors.New("has a user part")
		}
	} else {
		_, s, err = configuredURL(raw)
	}
	if err != nil {
		return "", fmt.Errorf("mcp_url %q is not an absolute http(s) URL (scheme://host[:port]/path, no user; only placeholders known when the config loads, such as {env.NAME}%s): once expanded it %v", raw, known, err)
	}
	return s, nil
}

// anyPlaceholder matches a Caddy placeholder.
var anyPlaceholder = regexp.MustCompile(`\{[^{}]*\}`)

// siteBase is the origin of the URLs built for r: the configured public
// origin, or else the request's own.
func siteBase(public string, r *http.Request) string {
	if public != "" {
		return public
	}
	return requestBase(r)
}

// setDocumentCache sets the cache headers of a document the gateway
// generates from its configuration (/.well-known/x402, /llms.txt,
// /openapi.json). One that is the same for every request is publicly
// cacheable for a minute. One that names what the request chose
// (perRequest: the origin it addressed, its Host, when no public_base_url
// is set), or whose routes depend on the Host (byHost: host matchers in
// the site, siteGates), is private to that client, with Vary: Host: a
// shared cache must not hand one client's Host, or one Host's routes,
// to everyone.
func setDocumentCache(h http.Header, perRequest, byHost bool) {
	if !perRequest && !byHost {
		h.Set("Cache-Control", "public, max-age=60")
		return
	}
	h.Set("Cache-Control", "private, max-age=60")
	if !headerHasToken(h, "Vary", "Host") {
		h.Add("Vary", "Host")
	}
}

// requestBase is scheme://host of the request as the client addressed it.
func requestBase(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

// sentRequest is the method and URL of r as the client sent them, before
// handle_path, uri strip_prefix, rewrite or method changed r.Method and
// r.URL on the way to the handler. Every URL the gateway names to a client
// or a catalog (a 402's resource, a sign-in-with-x challenge, the
// paywall's URL), the path a route's agent id is read from, the request a
// payment identifier or a held settlement is bound to, and the request a
// wallet proof signs are this one: the public URL a payer sees and signs
// for, not an internal path that may be another route's or none.
func sentRequest(r *http.Request) (method string, u *url.URL) {
	if orig, ok := r.Context().Value(caddyhttp.OriginalRequestCtxKey).(http.Request); ok && orig.URL != nil {
		return orig.Method, orig.URL
	}
	return r.Method, r.URL // outside a Caddy server (never in the gateway)
}
