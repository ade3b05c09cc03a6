package caddymodule

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/aovhq/aov/x402"
)

// Gates sharing one store (as README asks) on one path, told apart by Host
// (two resources) or, on one Host, by a header (one resource, two prices):
// a $0.02 payment held with settle before and its settle reply lost is
// answered only by the gate of the resource and offer it paid for. Retried
// on a $1.00 gate (with the $0.02 offer it accepted, or with accepted
// rewritten to the $1.00 offer, which is not signed) it runs nothing: 402
// payment_already_used, or, rewritten, the value mismatch of an
// authorization that does not pay the offer its accepted copy names,
// found before any claim is looked at; its retry on its own gate still
// gets the call it paid for.
func TestHeldPaymentAnsweredOnlyByItsResourceAndOffer(t *testing.T) {
	sharedDevnet(t)
	basic, gold, pro := newUpstream(t), newUpstream(t), newUpstream(t)
	storeDir := filepath.Join(t.TempDir(), "shared")
	hostport := func(u *upstream) string { return strings.TrimPrefix(u.URL, "http://") }
	site := fmt.Sprintf(`:{port} {
	@basic {
		host basic.test
		header X-Tier basic
	}
	@gold {
		host basic.test
		header X-Tier gold
	}
	@pro host pro.test
	route @basic {
		x402 {
			accept devnet $0.02 %[4]s
			facilitator faulty_devnet lose_reply
			store badger %[5]s
			settle before
		}
		reverse_proxy %[1]s
	}
	route @gold {
		x402 {
			accept devnet $1.00 %[4]s
			facilitator faulty_devnet lose_reply
			store badger %[5]s
			settle before
		}
		reverse_proxy %[2]s
	}
	route @pro {
		x402 {
			accept devnet $1.00 %[4]s
			facilitator faulty_devnet lose_reply
			store badger %[5]s
			settle before
		}
		reverse_proxy %[3]s
	}
}
`, hostport(basic), hostport(gold), hostport(pro), payTo.Hex(), storeDir)
	url := startCaddy(t, site) + "/verify/schema"
	basicHdr := map[string]string{"Host": "basic.test", "X-Tier": "basic"}
	goldHdr := map[string]string{"Host": "basic.test", "X-Tier": "gold"}
	proHdr := map[string]string{"Host": "pro.test"}
	for _, tc := range []struct {
		name    string
		key     int
		hdr     map[string]string // the dear gate's request
		dear    *upstream
		rewrite bool // accepted rewritten to the dear gate's offer
	}{
		{"other_resource_cheap_offer", 3, proHdr, pro, false},
		{"other_resource_dear_offer", 4, proHdr, pro, true},
		{"same_resource_dear_offer", 5, goldHdr, gold, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b0, d0 := basic.calls.Load(), tc.dear.calls.Load()
			sig := signFor(t, paymentRequired(t, post(t, url, "", basicHdr)), tc.key)
			resp := post(t, url, validRequest, withHeader(basicHdr, x402.HeaderPaymentSignature, sig))
			if b, _ := io.ReadAll(resp.Body); resp.StatusCode != http.StatusServiceUnavailable {
				t.Fatalf("first try: %d %s", resp.StatusCode, b)
			}
			retry := sig
			if tc.rewrite {
				var pl x402.PaymentPayload
				if err := x402.DecodeHeader(sig, &pl); err != nil {
					t.Fatal(err)
				}
				pl.Accepted = paymentRequired(t, post(t, url, "", tc.hdr)).Accepts[0]
				retry, _ = x402.EncodeHeader(pl)
			}
			resp = post(t, url, validRequest, withHeader(tc.hdr, x402.HeaderPaymentSignature, retry))
			b, _ := io.ReadAll(resp.Body)
			if tc.dear.calls.Load() != d0 {
				t.Fatalf("the $1.00 upstream ran for the $0.02 payment: %d %s", resp.StatusCode, b)
			}
			want := x402.ReasonPaymentAlreadyUsed
			if tc.rewrite {
				want = x402.ReasonExactEVMValueMismatch
			}
			if resp.StatusCode != http.StatusPaymentRequired || !strings.Contains(string(b), `"reason":"`+want+`"`) {
				t.Fatalf("retry on the $1.00 gate: %d %s", resp.StatusCode, b)
			}
			resp = post(t, url, validRequest, withHeader(basicHdr, x402.HeaderPaymentSignature, sig))
			b, _ = io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK || basic.calls.Load() != b0+1 {
				t.Fatalf("retry on the gate it paid: %d %s (basic ran %d)", resp.StatusCode, b, basic.calls.Load()-b0)
			}
		})
	}
}

// withHeader is a copy of hdr with k set to v.
func withHeader(hdr map[string]string, k, v string) map[string]string {
	m := map[string]string{k: v}
	for hk, hv := range hdr {
		m[hk] = hv
	}
	return m
}

// The record's offer is compared with the gate's as a payment's accepted
// is, addresses in any letter case: a reload that only respells pay_to
// (checksummed to lower case, one address) still answers the held
// payment's retry, which was charged on chain.
func TestHeldPaymentSurvivesAReloadRespellingPayTo(t *testing.T) {
	sharedDevnet(t)
	up := newUpstream(t)
	site := pendingSite(up.URL, "lose_reply", gateDir(t), "settle before")
	port := freePort(t)
	loadCaddy(t, port, site)
	t.Cleanup(func() { caddy.Stop() })
	url := fmt.Sprintf("http://127.0.0.1:%d/verify/schema", port)
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 7)
	hdr := map[string]string{x402.HeaderPaymentSignature: sig}
	if resp := post(t, url, validRequest, hdr); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("first try, settle reply lost: %d; want 503", resp.StatusCode)
	}
	loadCaddy(t, port, strings.ReplaceAll(site, payTo.Hex(), strings.ToLower(payTo.Hex())))
	resp := post(t, url, validRequest, hdr)
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || up.calls.Load() != 1 {
		t.Fatalf("retry of the settled payment after pay_to was respelled: %d %s (runs %d); want 200, one run", resp.StatusCode, b, up.calls.Load())
	}
}

// A held payment's resource compares as origins do: the host in any
// letter case, the default port written or not. The gate's host matcher
// serves Basic.Test and basic.test:80 as basic.test, and so does the
// retry of a payment held there.
func TestHeldPaymentResourceComparesAsAnOrigin(t *testing.T) {
	sharedDevnet(t)
	up := newUpstream(t)
	site := fmt.Sprintf(`:{port} {
	@basic host basic.test
	route @basic {
		x402 {
			accept devnet $0.02 %[2]s
			facilitator faulty_devnet lose_reply
			store badger %[3]s
			settle before
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), payTo.Hex(), gateDir(t))
	url := startCaddy(t, site) + "/verify/schema"
	for i, retryHost := range []string{"Basic.Test", "basic.test:80"} {
		t.Run(retryHost, func(t *testing.T) {
			c0 := up.calls.Load()
			sig := signFor(t, paymentRequired(t, post(t, url, "", map[string]string{"Host": "basic.test"})), 8+i)
			if resp := post(t, url, validRequest, map[string]string{"Host": "basic.test", x402.HeaderPaymentSignature: sig}); resp.StatusCode != http.StatusServiceUnavailable {
				t.Fatalf("first try, settle reply lost: %d; want 503", resp.StatusCode)
			}
			resp := post(t, url, validRequest, map[string]string{"Host": retryHost, x402.HeaderPaymentSignature: sig})
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK || up.calls.Load() != c0+1 {
				t.Fatalf("retry with Host %s: %d %.300s (runs %d); want 200, one run", retryHost, resp.StatusCode, b, up.calls.Load()-c0)
			}
		})
	}
}

func TestSameResource(t *testing.T) {
	for _, c := range []struct {
		a, b string
		same bool
	}{
		{"http://basic.test/verify/schema", "http://Basic.Test/verify/schema", true},
		{"http://basic.test/verify/schema", "http://basic.test:80/verify/schema", true},
		{"https://basic.test/verify/schema", "HTTPS://basic.test:443/verify/schema", true},
		{"https://basic.test/verify/schema", "https://basic.test:8443/verify/schema", false},
		{"http://basic.test/verify/schema", "https://basic.test/verify/schema", false},
		{"http://basic.test/verify/schema", "http://pro.test/verify/schema", false},
		{"http://basic.test/report/a%2Fb", "http://basic.test/report/a/b", false},
		{"http://basic.test/Verify/schema", "http://basic.test/verify/schema", false},
	} {
		if got := sameResource(c.a, c.b); got != c.same {
			t.Errorf("sameResource(%q, %q) = %v; want %v", c.a, c.b, got, c.same)
		}
	}
}
