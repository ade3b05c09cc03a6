package caddymodule

import (
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// clientAddr is the identity of the request's client wherever the gateway
// counts per client: the free allowance with key ip (as "ip:" + it) and the
// rate limit. It is Caddy's resolved client IP (honouring the server's
// trusted_proxies, never a raw header; the peer's address without it), in
// one form per client:
//
//   - an IPv4 address as it stands ("203.0.113.7");
//   - an IPv4-mapped IPv6 address as its IPv4 address, since it is the
//     same client ("::ffff:203.0.113.7" is "203.0.113.7");
//   - any other IPv6 address as its /64 ("2001:db8:1:2::/64"), the
//     smallest block a site is usually given: one client holds all 2^64
//     addresses of it, so counting each would give it an allowance and a
//     rate budget per address.
//
// A zoned address or anything that does not parse is kept as it is.
func clientAddr(r *http.Request) string {
	s, _ := caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey).(string)
	if s == "" {
		s, _, _ = net.SplitHostPort(r.RemoteAddr)
	}
	// netip parses without allocating; a plain IPv4 address (the common
	// case) is its own key as it stands, since netip accepts only the
	// canonical dotted form.
	ip, err := netip.ParseAddr(s)
	if err != nil || ip.Zone() != "" {
		return s
	}
	if ip.Is4() {
		return s
	}
	if ip.Is4In6() {
		return ip.Unmap().String()
	}
	return netip.PrefixFrom(ip, 64).Masked().Addr().String() + "/64"
}

// clientPrefix is the network of client (clientAddr) that a rate zone
// counts it in when its table of clients is full (rateZone.bucket): an
// IPv6 client's /48, an IPv4 client's /24, the blocks a site or a
// customer of a provider is commonly given, so one holder of a short
// prefix who fills the table holds few of them. An IPv6 address with a
// zone is the /48 of the address without it: a zone is a local interface
// name, which a client that can choose it could vary at will. Anything
// else (no address: a Unix socket's peer, which is one client anyway) has
// no network to widen to and is its own prefix.
func clientPrefix(client string) string {
	return string(appendClientPrefix(nil, client))
}

// maxPrefixLen is room for any prefix appendClientPrefix appends of an
// address: an IPv6 /48 is at most 19 bytes ("ffff:ffff:ffff::/48"). What
// is no address is appended as it is, and may grow the buffer.
const maxPrefixLen = 32

// appendClientPrefix appends clientPrefix(client) to dst, so that a rate
// zone finds a prefix's bucket without allocating a string of it
// (rateZone.bucket, which every newcomer to a full table reaches).
func appendClientPrefix(dst []byte, client string) []byte {
	if strings.IndexByte(client, '/') >= 0 { // an IPv6 /64; parsing anything else as a prefix costs an error
		if p, err := netip.ParsePrefix(client); err == nil {
			return netip.PrefixFrom(p.Addr(), 48).Masked().AppendTo(dst)
		}
	}
	ip, err := netip.ParseAddr(client)
	if err != nil {
		return append(dst, client...)
	}
	if ip = ip.WithZone("").Unmap(); ip.Is4() {
		return netip.PrefixFrom(ip, 24).Masked().AppendTo(dst)
	}
	return netip.PrefixFrom(ip, 48).Masked().AppendTo(dst)
}

// msgLeftmostClientIP is the warning of a module counting per client IP
// (a gate, aov_rate_limit) whose server lets a client behind an appending
// proxy choose its own client IP.
const msgLeftmostClientIP = "client IP read left to right from a trusted proxy's X-Forwarded-For: set trusted_proxies_strict"

// msgNoClientIPHeader is the warning of a module counting per client IP
// whose server got a request from a trusted proxy without any client IP
// header: the proxy appends nothing, so behind it every client can name
// itself.
const msgNoClientIPHeader = "a trusted proxy forwarded a request without a client IP header: if it does not append the peer's address, its clients choose their own client IP"

// proxyWatch warns of what lets a client choose its own client IP, for one
// module that counts per client IP (a gate's rate limit or free allowance
// with key ip, aov_rate_limit), once each per config load:
//
//   - msgLeftmostClientIP, on a server that resolves client IPs in Caddy's
//     default non-strict mode. Caddy then takes the leftmost
//     X-Forwarded-For address from a trusted proxy. A proxy that appends
//     the peer's address to the client's own header (nginx's
//     $proxy_add_x_forwarded_for, AWS ALB, Google Cloud load balancers)
//     leaves the leftmost entry to the client, which then names a new
//     client, with a new allowance and a new rate budget, in every
//     request; trusted_proxies_strict reads the header right to left and
//     stops at the first untrusted address, the one the proxy appended.
//   - msgNoClientIPHeader, strict or not, at a request from a trusted
//     proxy that carries none of the server's client IP headers. Strict
//     mode is right only behind a proxy that appends the peer's address,
//     which then adds the header to every request; one that appends
//     nothing (a TCP balancer, docker's userland proxy) forwards the
//     client's own header, which Caddy takes as it is, and a client that
//     sends none is the proxy's address, which any other client can name.
//     Such a request may also be the proxy's own (a health check), hence
//     the "if" in the warning.
//
// Whether trusted_proxies is set at all cannot be seen at provision time
// (Caddy loads and clears it before it provisions routes, keeping only an
// unexported source), so the warnings wait for a request a trusted proxy
// forwarded, which Caddy marks in the trusted_proxy variable: exact, and
// once each, so a request costs one atomic load once both are logged.
type proxyWatch struct {
	leftmost                   bool     // the server reads client IP headers left to right
	headers                    []string // the server's client IP headers
	warnedLeftmost, warnedBare atomic.Bool
	logger                     *zap.Logger
}

// watchProxies returns the watch of a module provisioned for srv (nil
// outside an HTTP server) that counts per client IP when byIP is set; nil
// when there is nothing to warn of.
func watchProxies(srv *caddyhttp.Server, byIP bool, logger *zap.Logger) *proxyWatch {
	if srv == nil || !byIP {
		return nil
	}
	pw := &proxyWatch{leftmost: srv.TrustedProxiesStrict == 0, headers: srv.ClientIPHeaders, logger: logger}
	pw.warnedLeftmost.Store(!pw.leftmost)
	return pw
}

// check logs each warning once, at the first request from a trusted proxy
// that shows its cause.
func (pw *proxyWatch) check(r *http.Request) {
	if pw == nil || pw.warnedLeftmost.Load() && pw.warnedBare.Load() {
		return
	}
	if trusted, _ := caddyhttp.GetVar(r.Context(), caddyhttp.TrustedProxyVarKey).(bool); !trusted {
		return
	}
	if !pw.warnedLeftmost.Swap(true) {
		pw.logger.Warn(msgLeftmostClientIP,
			zap.String("why", "without trusted_proxies_strict the client IP is the leftmost X-Forwarded-For address; a load balancer that appends to the header (nginx $proxy_add_x_forwarded_for, AWS ALB, Google Cloud) leaves it to the client, who then gets a new free allowance and rate budget per request"),
			zap.String("fix", "add trusted_proxies_strict to the server options (global servers block), unless the proxy overwrites X-Forwarded-For"))
	}
	if pw.warnedBare.Load() || slices.ContainsFunc(pw.headers, func(h string) bool { return r.Header.Get(h) != "" }) || pw.warnedBare.Swap(true) {
		return
	}
	pw.logger.Warn(msgNoClientIPHeader,
		zap.Strings("headers", pw.headers),
		zap.String("why", "a proxy that appends the peer's address to X-Forwarded-For adds the header to every request; one that appends nothing (a TCP load balancer, docker's userland proxy) passes on the client's own header, so every client can name itself, and name the proxy's address, which every client that sends no header has, strict mode or not"),
		zap.String("fix", "behind such a proxy remove trusted_proxies, and have the proxy pass the client's address another way (the PROXY protocol, Caddy's proxy_protocol listener wrapper) or append it; ignore this if the request was the proxy's own, such as a health check"))
}
