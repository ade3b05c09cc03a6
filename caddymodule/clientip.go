package caddymodule

import (
	"net"
	"net/http"
	"net/netip"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
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
