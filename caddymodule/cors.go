package caddymodule

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"golang.org/x/net/idna"

	"github.com/aovhq/aov/internal/caddyopt"
	"github.com/aovhq/aov/walletauth"
	"github.com/aovhq/aov/x402"
)

func init() {
	caddy.RegisterModule(CORS{})
	httpcaddyfile.RegisterHandlerDirective("x402_cors", parseCORS)
	// Before basic_auth, and so before wallet_auth (after request_header)
	// and x402 (before encode): a preflight is answered before any proof or
	// payment logic runs, and every later answer, the gate's 402s included,
	// carries the CORS headers.
	httpcaddyfile.RegisterDirectiveOrder("x402_cors", httpcaddyfile.Before, "basic_auth")
}

// Headers of MCP's Streamable HTTP transport (MCP 2025-06-18 and
// 2025-11-25, basic/transports): after initialize a client sends the
// negotiated MCP-Protocol-Version on every request, and the Mcp-Session-Id
// the server gave in the initialize answer, which it must read; a client
// resuming an SSE stream sends Last-Event-ID.
const (
	headerMCPProtocolVersion = "MCP-Protocol-Version"
	headerMCPSessionID       = "Mcp-Session-Id"
	headerLastEventID        = "Last-Event-ID"
)

// Defaults of the x402_cors directive: what x402 buyers, wallet proofs and
// MCP clients (the official TypeScript SDK's StreamableHTTPClientTransport)
// send and read. DELETE ends an MCP session and GET opens its SSE stream.
// The official x402 fetch client (@x402/fetch) sends
// Access-Control-Expose-Headers as a request header on its paid retry (it
// means nothing there, and nothing here reads it), so a browser would
// refuse that retry were it not allowed. Allowing a method or header in a
// preflight only lets the browser send what any other HTTP client can
// send already; the route still decides.
var (
	corsDefaultMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodDelete, http.MethodOptions}
	corsDefaultHeaders = []string{
		x402.HeaderPaymentSignature, walletauth.HeaderName, walletauth.SIWXHeaderName, "Content-Type",
		headerMCPProtocolVersion, headerMCPSessionID, headerLastEventID,
		"Access-Control-Expose-Headers",
	}
	corsDefaultExpose = []string{
		x402.HeaderPaymentRequired, x402.HeaderPaymentResponse,
		HeaderFreeRemaining, HeaderFreeLimit, HeaderFreeResets,
		HeaderVerificationReceipt, HeaderVerificationStatus, "Retry-After",
		headerMCPSessionID,
	}
)

const corsDefaultMaxAge = 10 * time.Minute

// CORS lets web pages on other origins call the gateway (Caddyfile
// directive `x402_cors`): a browser buyer must read PAYMENT-REQUIRED from a
// 402 and send PAYMENT-SIGNATURE, which a cross-origin fetch() can do only
// with these headers. A preflight (OPTIONS with Origin and Access-Control-Request-Method)
// is answered 204 here, before any proof or payment logic. Every other
// answer, whoever writes it (the gate's 402, an upstream, handle_errors),
// carries Access-Control-Allow-Origin for an allowed origin,
// Access-Control-Expose-Headers and Vary: Origin: they are set before the
// next handler runs, and set again when the answer is written, or when the
// next handler returns an error unwritten (handle_errors then starts from
// them), because a handler (the gate, an upstream) may replace them.
//
// It is the one authority on CORS for what it wraps: when the answer is
// written, every Access-Control-* header a later handler put there is
// removed first. An upstream that reflects any Origin with credentials (a
// common permissive middleware) would otherwise let every site on the web
// read the visitor's answers, and spend a visitor's free allowance with a
// simple GET and read it. So an origin that is not listed, and a request
// without Origin, get no Access-Control-* header at all, and a listed
// origin gets this handler's grant only.
type CORS struct {
	// Origins allowed to read answers: exact origins
	// ("https://app.example.com", scheme, host and port only) or "*" for any.
	Origins []string `json:"origins,omitempty"`

	// Credentials sends Access-Control-Allow-Credentials: true, so pages
	// may send cookies and HTTP authentication. Off by default: x402 proofs
	// travel in headers, not cookies. It needs named origins: with "*" it
	// is refused, since echoing any page's origin with credentials would
	// let every site on the web act as the visitor and read the answers.
	Credentials bool `json:"credentials,omitempty"`

	// Methods answered in preflights. Default GET, HEAD, POST, DELETE,
	// OPTIONS.
	Methods []string `json:"methods,omitempty"`

	// Headers are request headers allowed in addition to PAYMENT-SIGNATURE,
	// X-Wallet-Auth, SIGN-IN-WITH-X, Content-Type and MCP's
	// MCP-Protocol-Version, Mcp-Session-Id and Last-Event-ID.
	Headers []string `json:"headers,omitempty"`

	// Expose are response headers pages may read in addition to
	// PAYMENT-REQUIRED, PAYMENT-RESPONSE, the Free-Allowance-* headers,
	// Verification-Receipt, Verification-Status, Retry-After and MCP's
	// Mcp-Session-Id.
	Expose []string `json:"expose,omitempty"`

	// MaxAge is how long a browser may cache a preflight answer. Default 10m.
	MaxAge caddy.Duration `json:"max_age,omitempty"`

	anyOrigin bool
	origins   map[string]bool
	methods   string
	headers   string
	expose    string
	maxAge    string
}

// CaddyModule returns the Caddy module information.
func (CORS) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.x402_cors", New: func() caddy.Module { return new(CORS) }}
}

// Provision checks the origins and joins the header values once.
func (c *CORS) Provision(caddy.Context) error {
	if len(c.Origins) == 0 {
		return fmt.Errorf("x402_cors: name the allowed origins (for example https://app.example.com), or write `origins *` in the block for any origin (a lone * after the directive is Caddy's match-all matcher)")
	}
	c.origins = map[string]bool{}
	for _, o := range c.Origins {
		if o == "*" {
			if c.Credentials {
				return fmt.Errorf("x402_cors: `origins *` cannot be combined with `credentials`: every web page could then send the visitor's cookies and HTTP authentication and read the answers; name the origins to allow instead (x402 payments and wallet proofs travel in headers and need no credentials)")
			}
			c.anyOrigin = true
			continue
		}
		norm, err := normalizeOrigin(o)
		if err != nil {
			return fmt.Errorf("x402_cors: origin %q: %v", o, err)
		}
		c.origins[norm] = true
	}
	methods := c.Methods
	if len(methods) == 0 {
		methods = corsDefaultMethods
	}
	for _, m := range methods {
		if m == "" || strings.ContainsAny(m, " ,\t") {
			return fmt.Errorf("x402_cors: method %q is not an HTTP method", m)
		}
	}
	c.methods = strings.Join(methods, ", ")
	c.headers = joinHeaders(corsDefaultHeaders, c.Headers)
	c.expose = joinHeaders(corsDefaultExpose, c.Expose)
	if c.MaxAge < 0 {
		return fmt.Errorf("x402_cors: max_age must not be negative")
	}
	if c.MaxAge == 0 {
		c.MaxAge = caddy.Duration(corsDefaultMaxAge)
	}
	c.maxAge = strconv.Itoa(int(time.Duration(c.MaxAge) / time.Second))
	return nil
}

// normalizeOrigin returns the serialised origin of o as browsers send it
// (RFC 6454): lower-case scheme and host, a host with non-ASCII letters in
// its IDNA ASCII form (café.example is xn--caf-dma.example), the port kept
// unless it is the scheme's default. It refuses anything with a path,
// query, fragment or user info. It is the one form origins are compared
// in, configured (public_base_url, origins lists) and sent (Origin)
// alike: an origin configured as written would never equal what a
// browser sends for it.
func normalizeOrigin(o string) (string, error) {
	u, err := url.Parse(o)
	if err != nil {
		return "", err
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("want scheme://host[:port], http or https")
	}
	if u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || strings.HasSuffix(o, "?") {
		return "", fmt.Errorf("an origin has no path, query, fragment or user info")
	}
	scheme := strings.ToLower(u.Scheme)
	host, _ := withoutDefaultPort(strings.ToLower(u.Host), defaultPorts[scheme])
	if host, err = asciiHost(host); err != nil {
		return "", err
	}
	return scheme + "://" + host, nil
}

// asciiHost returns host[:port] with a host name that has non-ASCII
// letters in its IDNA ASCII form, as a browser puts it in an Origin and a
// Host header. An ASCII name is returned as it is.
func asciiHost(hostport string) (string, error) {
	name, port := hostport, ""
	if i := strings.LastIndexByte(hostport, ':'); i >= 0 && !strings.HasSuffix(hostport, "]") {
		name, port = hostport[:i], hostport[i:]
	}
	for i := 0; i < len(name); i++ {
		if name[i] >= utf8.RuneSelf {
			a, err := idna.Lookup.ToASCII(name)
			if err != nil { // not repeated: a configured host may come from {env.NAME}
				return "", errors.New("has a host that is not a valid internationalized domain name")
			}
			return a + port, nil
		}
	}
	return hostport, nil
}

// defaultPorts are the ports a URL of each scheme implies.
var defaultPorts = map[string]string{"http": "80", "https": "443"}

// withoutDefaultPort returns host[:port] without its port when that is one
// of ports, and whether it dropped one. Browsers leave a scheme's default
// port out of an Origin (RFC 6454 serialisation), and so do wallets and
// pages writing a sign-in domain (location.host), so a name configured
// with it never equals what clients send: "https://app.example.com:443"
// would allow no page at all.
func withoutDefaultPort(hostport string, ports ...string) (string, bool) {
	i := strings.LastIndexByte(hostport, ':')
	if i < 0 || strings.HasSuffix(hostport, "]") { // no port; a bare IPv6 literal
		return hostport, false
	}
	if slices.Contains(ports, hostport[i+1:]) {
		return hostport[:i], true
	}
	return hostport, false
}

func joinHeaders(defaults, extra []string) string {
	seen := map[string]bool{}
	var out []string
	for _, h := range append(append([]string{}, defaults...), extra...) {
		k := http.CanonicalHeaderKey(h)
		if h == "" || seen[k] {
			continue
		}
		seen[k] = true
		out = append(out, h)
	}
	return strings.Join(out, ", ")
}

// allowed returns the Access-Control-Allow-Origin value for the request's
// Origin, or "" when that origin may not read the answer.
func (c *CORS) allowed(origin string) string {
	if origin == "" {
		return ""
	}
	if c.anyOrigin {
		return "*" // never with credentials (Provision)
	}
	if c.origins[origin] {
		return origin
	}
	return ""
}

// isPreflight reports whether r is a CORS preflight: the OPTIONS request
// with Origin and Access-Control-Request-Method a browser sends, without
// credentials or a body, to ask whether it may send a cross-origin request.
// It asks nothing of the resource, so it needs no proof or payment (a
// browser cannot add either to it). But any client can send those two
// headers, so a preflight is answered (x402_cors, answerPreflight), never
// passed unpaid to an upstream that may serve every method alike. Nor is
// a request that asks to switch protocols one (readUpgrade: anything but
// no Upgrade or an h2c offer, which the gate removes): a browser cannot
// send Upgrade, and passed on as a preflight (an mcp_tool gate passes
// preflights to the MCP server's own CORS) it would have reverse_proxy ask
// the upstream to switch, unpaid. Any other OPTIONS is a request like
// another.
func isPreflight(r *http.Request) bool {
	if r.Method != http.MethodOptions || r.Header.Get("Origin") == "" || r.Header.Get("Access-Control-Request-Method") == "" {
		return false
	}
	o := readUpgrade(r)
	return o == upgradeNone || o == upgradeH2C
}

// answerPreflight is the answer of the gate, and of wallet_auth where it
// requires a proof, to a preflight x402_cors did not answer first: 204
// with no body and no CORS grant (granting is x402_cors's: without it a
// page on another origin may not call the route, so the browser stops
// here), and Allow naming allow when the route names its methods.
// Passing it on with the body dropped would keep an upstream's own CORS,
// but the upstream would still do the work of an unpaid request whose
// method and headers the client chose.
func answerPreflight(w http.ResponseWriter, allow []string) error {
	if len(allow) > 0 {
		w.Header().Set("Allow", strings.Join(allow, ", "))
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// ServeHTTP answers preflights and marks every other answer.
func (c *CORS) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	allow := c.allowed(r.Header.Get("Origin"))
	h := w.Header()
	h.Add("Vary", "Origin")
	if isPreflight(r) {
		h.Add("Vary", "Access-Control-Request-Method")
		h.Add("Vary", "Access-Control-Request-Headers")
		c.clear(h)
		if allow != "" {
			c.setAllow(h, allow)
			h.Set("Access-Control-Allow-Methods", c.methods)
			h.Set("Access-Control-Allow-Headers", c.headers)
			h.Set("Access-Control-Max-Age", c.maxAge)
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	if allow != "" {
		c.mark(h, allow)
	}
	// Every answer goes through the writer, an unlisted origin's too: its
	// grants are removed when it is written, whoever wrote them.
	cw := &corsWriter{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: w}, c: c, allow: allow}
	err := next.ServeHTTP(cw, r)
	if err != nil && !cw.wroteHeader {
		// The error is answered by handle_errors, or Caddy's default error
		// answer, on the server's writer, not this one, with the header
		// map as the wrapped handlers left it (Caddy clears nothing): an
		// upstream's headers that intercept or handle_response kept are
		// still there. So the map is made this handler's own now.
		c.mark(h, allow)
	}
	return err
}

func (c *CORS) setAllow(h http.Header, allow string) {
	h.Set("Access-Control-Allow-Origin", allow)
	if c.Credentials {
		h.Set("Access-Control-Allow-Credentials", "true")
	}
}

// clear removes every Access-Control-* header from h and returns the
// values of the Access-Control-Expose-Headers among them.
func (c *CORS) clear(h http.Header) (expose []string) {
	for k, v := range h {
		if !isCORSHeader(k) {
			continue
		}
		if strings.EqualFold(k, "Access-Control-Expose-Headers") {
			expose = append(expose, v...)
		}
		delete(h, k)
	}
	return expose
}

// mark makes the CORS headers of an actual (non-preflight) answer this
// handler's own: every Access-Control-* header is removed, whoever wrote
// it, and for an allowed origin (allow not "") the grant is set. Headers
// that handlers added to Access-Control-Expose-Headers (the gate names its
// own, verify_response its receipt header, whose name is configurable) are
// still exposed to an allowed origin: the operator trusts that origin with
// the answer, and a name is not a grant to read it elsewhere.
func (c *CORS) mark(h http.Header, allow string) {
	expose := c.clear(h)
	if allow != "" {
		c.setAllow(h, allow)
		exp := c.expose
		for _, v := range expose {
			if v != c.expose {
				exp = joinHeaders(strings.Split(exp, ", "), splitList(v))
			}
		}
		h.Set("Access-Control-Expose-Headers", exp)
	}
	if !headerHasToken(h, "Vary", "Origin") {
		h.Add("Vary", "Origin")
	}
}

func splitList(v string) []string {
	var out []string
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// headerHasToken reports whether a comma-separated header has token, in
// any letter case. It allocates nothing: it runs on every answer.
func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for v != "" {
			var p string
			p, v, _ = strings.Cut(v, ",")
			if strings.EqualFold(strings.TrimSpace(p), token) {
				return true
			}
		}
	}
	return false
}

// corsWriter makes the CORS headers x402_cors's own (mark) just before the
// answer's header is written, over whatever a later handler put there. An
// answer starts with WriteHeader, Write, ReadFrom (io.Copy) or a Flush, so
// each of them comes here first; a 1xx is marked too, as net/http sends
// it with the header map. Hijack and Push pass through (Unwrap, for
// http.ResponseController): after a hijack the handler writes raw bytes,
// and browsers do not apply CORS to a WebSocket.
type corsWriter struct {
	caddyhttp.ResponseWriterWrapper // by value: one allocation per request
	c                               *CORS
	allow                           string
	wroteHeader                     bool
}

func (w *corsWriter) WriteHeader(status int) {
	if !w.wroteHeader {
		w.wroteHeader = status >= 200
		w.c.mark(w.Header(), w.allow)
	}
	w.ResponseWriterWrapper.WriteHeader(status)
}

// FlushError starts the answer, marked, before flushing it: a flush before
// anything is written sends the header as it stands.
func (w *corsWriter) FlushError() error {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Flush is FlushError for handlers that look for an http.Flusher.
func (w *corsWriter) Flush() { _ = w.FlushError() }

func (w *corsWriter) Write(b []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriterWrapper.Write(b)
}

// ReadFrom is io.Copy's path; the wrapper's own would skip WriteHeader.
func (w *corsWriter) ReadFrom(r io.Reader) (int64, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriterWrapper.ReadFrom(r)
}

// parseCORS parses
//
//	x402_cors [<origins...>] {
//		origins <origin...>|*
//		credentials
//		methods <method...>
//		headers <header...>
//		expose <header...>
//		max_age <duration>
//	}
func parseCORS(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	c := new(CORS)
	if err := c.UnmarshalCaddyfile(h.Dispenser); err != nil {
		return nil, err
	}
	return c, nil
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens.
func (c *CORS) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the directive name
	c.Origins = append(c.Origins, d.RemainingArgs()...)
	seen := caddyopt.Once{}
	for d.NextBlock(0) {
		switch d.Val() {
		case "credentials", "max_age":
			if err := seen.Check(d); err != nil {
				return err
			}
		}
		switch d.Val() {
		case "origins":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			c.Origins = append(c.Origins, args...)
		case "credentials":
			if d.NextArg() {
				return d.ArgErr()
			}
			c.Credentials = true
		case "methods", "headers", "expose":
			opt, args := d.Val(), d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			switch opt {
			case "methods":
				for _, m := range args {
					c.Methods = append(c.Methods, strings.ToUpper(m))
				}
			case "headers":
				c.Headers = append(c.Headers, args...)
			default:
				c.Expose = append(c.Expose, args...)
			}
		case "max_age":
			if !d.NextArg() {
				return d.ArgErr()
			}
			dur, err := caddy.ParseDuration(d.Val())
			if err != nil {
				return d.Errf("max_age: %v", err)
			}
			c.MaxAge = caddy.Duration(dur)
			if d.NextArg() {
				return d.ArgErr()
			}
		default:
			return d.Errf("x402_cors: unknown option %q (want origins, credentials, methods, headers, expose or max_age)", d.Val())
		}
	}
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner           = (*CORS)(nil)
	_ caddyhttp.MiddlewareHandler = (*CORS)(nil)
	_ caddyfile.Unmarshaler       = (*CORS)(nil)
)

// isCORSHeader reports whether the header field name k is one of the
// Access-Control-* response headers, in any letter case (a handler that
// writes the map directly may skip canonicalisation, and net/http sends
// the name as it is).
func isCORSHeader(k string) bool {
	const prefix = "Access-Control-"
	return len(k) > len(prefix) && strings.EqualFold(k[:len(prefix)], prefix)
}
