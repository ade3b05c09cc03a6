package caddymodule

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/walletauth"
	"github.com/aovhq/aov/x402"
)

// TestPaidAccessSignInKeepsAPaymentSentBesideItFromTheUpstream: README's
// sign-in-with-x route (wallet_auth siwx; x402 @unpaid, skipped when
// {http.auth.wallet.paid_access} is true; reverse_proxy). A client that
// does not know its wallet already paid signs in and pays in one request:
// it is let through on the sign-in, so the gate never runs. Its
// PAYMENT-SIGNATURE is unsettled and spendable by whoever holds it until
// it expires; were it forwarded, the upstream (or reverse_proxy's DEBUG
// log) could present it and be served on the buyer's money. It must not
// reach the upstream, nor be charged.
func TestPaidAccessSignInKeepsAPaymentSentBesideItFromTheUpstream(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := walletUpstream(t)
	base := startCaddy(t, siwxPaidSite(up.URL, fac))
	url := base + "/report/q9"
	host := strings.TrimPrefix(base, "http://")
	const buyer = 4
	st, hdr, body := walletCall(t, "GET", url, "", nil)
	if st != http.StatusPaymentRequired {
		t.Fatalf("unpaid: %d %v", st, body)
	}
	var pr x402.PaymentRequired
	if err := x402.DecodeHeader(hdr.Get(x402.HeaderPaymentRequired), &pr); err != nil {
		t.Fatal(err)
	}
	pay := func() string {
		p, err := x402.SignExactEVM(walletKey(buyer), pr.Accepts[0], &pr.Resource, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		sig, err := x402.EncodeHeader(p)
		if err != nil {
			t.Fatal(err)
		}
		return sig
	}
	// The buyer pays once: it has paid access from now on. The gate that
	// settles a payment does not forward it either.
	st, _, body = walletCall(t, "GET", url, "", map[string]string{x402.HeaderPaymentSignature: pay()})
	if st != http.StatusOK || body["payment"] != "paid" {
		t.Fatalf("first payment: %d %v", st, body)
	}
	if body["payment_sig"] != "" {
		t.Errorf("the upstream of a paid call received its PAYMENT-SIGNATURE")
	}

	s := walletauth.SIWXFromChallenge(walletauth.SIWXChallenge(host, url, []string{x402.NetworkDevnet}, time.Now())["info"].(map[string]any), x402.NetworkDevnet)
	if err := s.Sign(walletKey(buyer)); err != nil {
		t.Fatal(err)
	}
	signIn, err := s.Encode()
	if err != nil {
		t.Fatal(err)
	}
	payer := evmfacilitator.DevAccounts()[buyer].Address
	before := balance(t, d, payer)
	st, _, body = walletCall(t, "GET", url, "", map[string]string{
		walletauth.SIWXHeaderName:   signIn,
		x402.HeaderPaymentSignature: pay(),
	})
	if st != http.StatusOK || body["wallet"] != walletAddr(buyer) || body["payment"] != "" {
		t.Fatalf("sign-in with a payment beside it: %d %v", st, body)
	}
	if body["payment_sig"] != "" {
		t.Errorf("the upstream received the buyer's unsettled PAYMENT-SIGNATURE on a call let through on its sign-in")
	}
	if after := balance(t, d, payer); after.Cmp(before) != 0 {
		t.Errorf("a call let through on a sign-in charged the buyer: %v -> %v", before, after)
	}
}

// TestPaymentSignatureNeverReachesTheUpstreamPastWalletAuthOrAPreflight:
// the paths through wallet_auth or a gate that never reach a gate's
// payment check still take a client's PAYMENT-SIGNATURE off the request:
// a CORS preflight an mcp_tool gate passes on (so the upstream's own CORS
// answers it), and any request wallet_auth optional passes on, preflight
// or not, on a route without a gate.
func TestPaymentSignatureNeverReachesTheUpstreamPastWalletAuthOrAPreflight(t *testing.T) {
	up := walletUpstream(t)
	preflight := map[string]string{
		"Origin":                        "https://buyer.example",
		"Access-Control-Request-Method": "POST",
		x402.HeaderPaymentSignature:     "PAYSIG-MARK",
		walletauth.HeaderName:           "WALLETPROOF-MARK",
	}
	for _, tc := range []struct {
		name, site, method, path string
		hdr                      map[string]string
	}{
		{"mcp_tool gate, preflight", mcpSite(up.URL, "http://127.0.0.1:1", 0), http.MethodOptions, "/mcp", preflight},
		{"wallet_auth optional, preflight", walletSite(up.URL, "optional", ""), http.MethodOptions, "/api/items", preflight},
		{"wallet_auth optional, no proof", walletSite(up.URL, "optional", ""), http.MethodGet, "/api/items",
			map[string]string{x402.HeaderPaymentSignature: "PAYSIG-MARK"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := startCaddy(t, tc.site)
			st, _, body := walletCall(t, tc.method, base+tc.path, "", tc.hdr)
			if st != http.StatusOK {
				t.Fatalf("%s %s: %d %v, want the upstream's answer", tc.method, tc.path, st, body)
			}
			if body["payment_sig"] != "" || body["wallet_auth"] != "" {
				t.Errorf("the upstream received the client's PAYMENT-SIGNATURE %q, X-Wallet-Auth %q", body["payment_sig"], body["wallet_auth"])
			}
		})
	}
}

// Handlers Caddy orders before wallet_auth and x402 (forward_auth among
// them) see the request as the client sent it, credentials included: an
// auth service behind forward_auth receives a buyer's unsettled
// PAYMENT-SIGNATURE. README says so and gives the remedy, the three
// header_up removals of Caddyfile.example's client_credentials snippet;
// with them the service receives none, and the gate still reads the
// payment.
func TestForwardAuthBeforeAGateDropsCredentialsOnlyWhenTold(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := walletUpstream(t)
	got := make(chan string, 1)
	auth := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Test-Call") == "" {
			return // startCaddy's probe of the site
		}
		select {
		case got <- r.Header.Get(x402.HeaderPaymentSignature) + "|" + r.Header.Get(walletauth.HeaderName):
		default:
		}
	}))
	t.Cleanup(auth.Close)
	for _, tc := range []struct {
		name, drop, want string
	}{
		{"as written", "", "PAYSIG-MARK|WALLETPROOF-MARK"},
		{"with client_credentials", "header_up -Payment-Signature\n\t\theader_up -X-Wallet-Auth\n\t\theader_up -Sign-In-With-X", "|"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := startCaddy(t, fmt.Sprintf(`:{port} {
	forward_auth %[4]s {
		uri /check
		%[5]s
	}
	x402 {
		accept devnet $0.01 %[3]s
		facilitator http {
			url %[2]s
		}
		store badger {data}/gate
	}
	reverse_proxy %[1]s
}
`, strings.TrimPrefix(up.URL, "http://"), fac, payTo.Hex(), strings.TrimPrefix(auth.URL, "http://"), tc.drop))
			st, _, body := walletCall(t, "GET", base+"/report/x", "", map[string]string{
				x402.HeaderPaymentSignature: "PAYSIG-MARK",
				walletauth.HeaderName:       "WALLETPROOF-MARK",
				"X-Test-Call":               "1",
			})
			// The gate read the payment (a malformed one) either way.
			if st != http.StatusBadRequest {
				t.Fatalf("answer %d %v, want the gate's 400 for the malformed payment", st, body)
			}
			select {
			case s := <-got:
				if s != tc.want {
					t.Fatalf("the forward_auth service received %q, want %q", s, tc.want)
				}
			default:
				t.Fatal("the forward_auth service was not asked")
			}
		})
	}
}
