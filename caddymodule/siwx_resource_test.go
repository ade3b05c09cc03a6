package caddymodule

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/interop"
	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/walletauth"
	"github.com/aovhq/aov/x402"
)

// siwxOfferedSite is siwxPaidSite with the gate's 402 carrying the
// sign-in-with-x challenge (x402's siwx option), and access lasting ttl
// ("" for the default).
func siwxOfferedSite(upstream, facURL, ttl string) string {
	if ttl != "" {
		ttl = "siwx_access_ttl " + ttl
	}
	return fmt.Sprintf(`:{port} {
	route /report/* {
		wallet_auth optional {
			store badger {data}/gate
			domains 127.0.0.1:{port}
			siwx
			%[4]s
		}
		@unpaid not vars {http.auth.wallet.paid_access} true
		x402 @unpaid {
			accept devnet $0.01 %[3]s
			siwx 127.0.0.1:{port}
			facilitator http {
				url %[2]s
			}
			store badger {data}/gate
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(upstream, "http://"), facURL, payTo.Hex(), ttl)
}

// payFor pays for url with development wallet i, answering its 402.
func payFor(t *testing.T, url string, i int) {
	t.Helper()
	pr := paymentRequired(t, getWith(t, url, "", nil))
	p, err := x402.SignExactEVM(walletKey(i), pr.Accepts[0], &pr.Resource, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	sig, _ := x402.EncodeHeader(p)
	if resp := getWith(t, url, "", map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != 200 || resp.Header.Get(x402.HeaderPaymentResponse) == "" {
		t.Fatalf("payment: %d", resp.StatusCode)
	}
}

// siwxChallengeOf is the sign-in-with-x challenge info of url's 402, with
// the 402's resource.
func siwxChallengeOf(t *testing.T, url string) (map[string]any, x402.Resource) {
	t.Helper()
	pr := paymentRequired(t, getWith(t, url, "", nil))
	ext, _ := pr.Extensions[walletauth.SIWXExtension].(map[string]any)
	info, _ := ext["info"].(map[string]any)
	if info == nil {
		t.Fatalf("402 without a sign-in-with-x challenge: %v", pr.Extensions)
	}
	return info, pr.Resource
}

// TestSignInWithXOnAPathWithEscapes: a path whose decoded form holds a
// space or a non-ASCII letter (an agent id may) gets a challenge whose uri
// is the 402's resource URL, escaped as the client sent it, so the wallet
// that paid can sign it, with our signer and with the official
// @x402/extensions client, and re-enters without paying again.
func TestSignInWithXOnAPathWithEscapes(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := walletUpstream(t)
	base := startCaddy(t, siwxOfferedSite(up.URL, fac, ""))
	for _, p := range []string{"/report/seller%207", "/report/caf%C3%A9"} {
		t.Run(p, func(t *testing.T) {
			url := base + p
			payFor(t, url, 6)

			info, res := siwxChallengeOf(t, url)
			if info["uri"] != res.URL || info["uri"] != url {
				t.Fatalf("challenge uri %q, resource.url %q; want both %q", info["uri"], res.URL, url)
			}
			s := walletauth.SIWXFromChallenge(info, x402.NetworkDevnet)
			if err := s.Sign(walletKey(6)); err != nil {
				t.Fatalf("signing the offered challenge: %v", err)
			}
			h, _ := s.Encode()
			if st, _, body := walletCall(t, "GET", url, "", map[string]string{walletauth.SIWXHeaderName: h}); st != 200 || body["wallet"] != walletAddr(6) {
				t.Fatalf("the payer's sign-in: %d %v, want 200 as wallet 6", st, body)
			}

			t.Run("official client", func(t *testing.T) {
				interop.Dir(t, "@x402/extensions", "viem")
				info, _ := siwxChallengeOf(t, url)
				var out struct {
					Header string `json:"header"`
				}
				interop.Run(t, "siwx-evm.mjs", nil, map[string]any{
					"privateKey": evmfacilitator.DevAccounts()[6].PrivateKeyHex, "chainId": x402.NetworkDevnet, "info": info, "url": url,
				}, &out)
				if st, _, body := walletCall(t, "GET", url, "", map[string]string{walletauth.SIWXHeaderName: out.Header}); st != 200 || body["wallet"] != walletAddr(6) {
					t.Fatalf("the payer's sign-in with the official client: %d %v, want 200 as wallet 6", st, body)
				}
			})
		})
	}
}

// TestSignInWithXOnAPathWithBrackets: "[" and "]", which Go leaves raw in
// an escaped path (as browsers and curl send them), are encoded in the
// 402's resource URL and challenge uri, so the uri is a valid RFC 3986 URI
// the official @x402/extensions client signs, and the wallet that paid
// signs in on the path as the client sends it.
func TestSignInWithXOnAPathWithBrackets(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := walletUpstream(t)
	base := startCaddy(t, siwxOfferedSite(up.URL, fac, ""))
	url := base + "/report/a[1]"
	payFor(t, url, 6)
	info, res := siwxChallengeOf(t, url)
	if want := base + "/report/a%5B1%5D"; res.URL != want || info["uri"] != want {
		t.Fatalf("resource URL %s, challenge uri %v, want %s", res.URL, info["uri"], want)
	}
	var out struct {
		Header string `json:"header"`
	}
	interop.Run(t, "siwx-evm.mjs", nil, map[string]any{
		"privateKey": evmfacilitator.DevAccounts()[6].PrivateKeyHex, "chainId": x402.NetworkDevnet, "info": info, "url": url,
	}, &out)
	if st, _, body := walletCall(t, "GET", url, "", map[string]string{walletauth.SIWXHeaderName: out.Header}); st != 200 {
		t.Errorf("official client sign-in on /report/a[1]: %d %v", st, body)
	}
}

// TestSignInWithXAccessIsPerEscapedPath: a payment for /report/a%2Fb (a
// resource its 402 names so, which the upstream receives so) grants no
// access to /report/a/b, a resource its 402 names differently.
func TestSignInWithXAccessIsPerEscapedPath(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := walletUpstream(t)
	base := startCaddy(t, siwxOfferedSite(up.URL, fac, ""))
	payFor(t, base+"/report/a%2Fb", 5)
	if st := signInStatus(t, base+"/report/a%2Fb", 5); st != 200 {
		t.Fatalf("sign-in on the path paid for: %d, want 200", st)
	}
	if st := signInStatus(t, base+"/report/a/b", 5); st != http.StatusPaymentRequired {
		t.Errorf("sign-in on /report/a/b after paying only for /report/a%%2Fb: %d, want 402", st)
	}
}
