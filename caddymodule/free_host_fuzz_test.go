package caddymodule

import (
	"net"
	"net/http"
	"strings"
	"testing"
)

// FuzzFreeHostChecks: the free allowance's Host checks take shortcuts on
// every free call (sameHostAsBase compares base's host as it is before it
// normalizes anything; unrebindableHost parses an address without
// allocating), and each must judge every Host as the plain rule does: the
// Host normalized as an Origin equals base, and the host is an IP address
// (no zone) or localhost.
func FuzzFreeHostChecks(f *testing.F) {
	for _, s := range [][2]string{
		{"localhost:8080", "http://localhost:8080"},
		{"Localhost:8080", "http://localhost:8080"},
		{"site.example", "https://site.example:443"},
		{"site.example.:8443", "https://site.example.:8443"},
		{"site.example.", "http://site.example."},
		{"[::1]:8080", "http://[::1]:8080"},
		{"[fe80::1%25eth0]:80", "http://[fe80::1%25eth0]"},
		{"127.0.0.1:8080", "http://localhost:8080"},
		{"xn--bcher-kva.example", "https://bücher.example"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, host, rawBase string) {
		h := host
		if name, _, err := net.SplitHostPort(host); err == nil {
			h = name
		}
		h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
		if got, want := unrebindableHost(host), net.ParseIP(h) != nil || strings.EqualFold(strings.TrimSuffix(h, "."), "localhost"); got != want {
			t.Errorf("unrebindableHost(%q) = %v; the plain rule says %v", host, got, want)
		}
		base, err := normalizeOrigin(rawBase)
		if err != nil {
			return
		}
		scheme, _, _ := strings.Cut(base, "://")
		own, err := normalizeOrigin(scheme + "://" + withoutRootDot(host))
		if got, want := sameHostAsBase(&http.Request{Host: host}, base), err == nil && own == base; got != want {
			t.Errorf("sameHostAsBase(Host %q, base %q) = %v; normalized, %q: %v", host, base, got, own, want)
		}
	})
}
