package caddymodule

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/accounts"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/aovhq/aov/internal/interop"
	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/walletauth"
	"github.com/aovhq/aov/x402"
)

// The wallet_auth tests run real Caddy with real Badger state, and sign
// proofs with this package's own signer, the aov command, and viem.

// walletUpstream echoes what the gateway told it about the wallet and the
// payment, and any client credential (a wallet proof, PAYMENT-SIGNATURE)
// that reached it.
func walletUpstream(t *testing.T) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]string{
			"wallet":      r.Header.Get(HeaderUpstreamWallet),
			"agent":       r.Header.Get(HeaderUpstreamWalletAgent),
			"payment":     r.Header.Get(HeaderUpstreamPayment),
			"wallet_auth": r.Header.Get(walletauth.HeaderName),
			"siwx":        r.Header.Get(walletauth.SIWXHeaderName),
			"payment_sig": r.Header.Get(x402.HeaderPaymentSignature),
		})
	}))
	t.Cleanup(s.Close)
	return s
}

// walletSite protects /api/* with wallet_auth in mode (plus extra
// options) and answers /whoami from the placeholders.
func walletSite(up, mode, extra string) string {
	return fmt.Sprintf(`:{port} {
	route /api/* {
		wallet_auth %[2]s {
			store badger {data}/gate
			domains 127.0.0.1:{port}
			%[3]s
		}
		reverse_proxy %[1]s
	}
	handle_path /stripped/* {
		wallet_auth {
			store badger {data}/gate
			domains 127.0.0.1:{port}
		}
		reverse_proxy %[1]s
	}
	route /whoami {
		wallet_auth optional {
			store badger {data}/gate
			domains 127.0.0.1:{port}
		}
		respond "{http.auth.wallet.address}|{http.auth.wallet.agent_id}|{http.auth.user.id}|{http.auth.wallet.chain_id}"
	}
}
`, strings.TrimPrefix(up, "http://"), mode, extra)
}

// walletKey is development account i's key.
func walletKey(i int) *ecdsa.PrivateKey { return evmfacilitator.DevKey(i) }

func walletAddr(i int) string { return evmfacilitator.DevAccounts()[i].Address.Hex() }

// walletProof signs an X-Wallet-Auth header for method and url.
func walletProof(t testing.TB, key *ecdsa.PrivateKey, method, url string, edit func(r *walletauth.Request)) string {
	t.Helper()
	req := walletauth.Request{Method: method, URL: url}
	if edit != nil {
		edit(&req)
	}
	h, err := walletauth.SignRequest(key, req)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// walletCall sends a request with headers (a header given twice is sent twice
// when its values are joined with "\x00").
func walletCall(t testing.TB, method, url, body string, hdr map[string]string) (int, http.Header, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		for _, one := range strings.Split(v, "\x00") {
			req.Header.Add(k, one)
		}
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var m map[string]any
	if json.Unmarshal(raw, &m) != nil {
		m = map[string]any{"text": string(raw)}
	}
	return resp.StatusCode, resp.Header, m
}

// wantUnauthorized checks a 401 in the SPEC §6 shape naming field.
func wantUnauthorized(t testing.TB, status int, hdr http.Header, body map[string]any, field string) {
	t.Helper()
	if status != http.StatusUnauthorized {
		t.Fatalf("status %d, want 401: %v", status, body)
	}
	if body["code"] != "unauthorized" || body["charged"] != false || body["retryable"] != false || hdr.Get("WWW-Authenticate") == "" {
		t.Errorf("401 body %v, headers %v", body, hdr)
	}
	fields, _ := body["fields"].([]any)
	if len(fields) != 1 || fields[0].(map[string]any)["field"] != field {
		t.Errorf("fields %v, want %s", body["fields"], field)
	}
}

func TestWalletAuthRequired(t *testing.T) {
	up := walletUpstream(t)
	base := startCaddy(t, walletSite(up.URL, "required", ""))
	url := base + "/api/items"
	used := walletProof(t, walletKey(1), "POST", url, nil)
	if st, _, body := walletCall(t, "POST", url, "{}", map[string]string{walletauth.HeaderName: used}); st != 200 {
		t.Fatalf("first use: %d %v", st, body)
	}

	cases := []struct {
		desc   string
		method string
		url    string // default /api/items
		hdr    map[string]string
		status int
		field  string // of a 401
		check  func(m map[string]any)
	}{
		{desc: "a valid proof passes and the upstream learns the wallet and agent", method: "POST",
			hdr: map[string]string{walletauth.HeaderName: walletProof(t, walletKey(1), "POST", url, func(r *walletauth.Request) { r.AgentID = "seller-7" }),
				HeaderUpstreamWallet: "0xforged", HeaderUpstreamWalletAgent: "forged-agent"},
			status: 200, check: func(m map[string]any) {
				if m["wallet"] != walletAddr(1) || m["agent"] != "seller-7" {
					t.Errorf("upstream saw wallet %v agent %v", m["wallet"], m["agent"])
				}
				if m["wallet_auth"] != "" {
					t.Error("the proof was forwarded upstream")
				}
			}},
		{desc: "without an agent the client's X-Aov-Wallet-Agent is still removed", method: "POST",
			hdr:    map[string]string{walletauth.HeaderName: walletProof(t, walletKey(2), "POST", url, nil), HeaderUpstreamWalletAgent: "forged-agent"},
			status: 200, check: func(m map[string]any) {
				if m["wallet"] != walletAddr(2) || m["agent"] != "" {
					t.Errorf("upstream saw wallet %v agent %v", m["wallet"], m["agent"])
				}
			}},
		{desc: "a request without a proof is refused", method: "POST", status: 401, field: "X-Wallet-Auth"},
		{desc: "a replayed proof is refused", method: "POST", hdr: map[string]string{walletauth.HeaderName: used}, status: 401, field: "X-Wallet-Auth.nonce"},
		{desc: "a proof for another path is refused", method: "POST",
			hdr: map[string]string{walletauth.HeaderName: walletProof(t, walletKey(1), "POST", base+"/api/other", nil)}, status: 401, field: "X-Wallet-Auth.path"},
		{desc: "a proof for another method is refused", method: "PUT",
			hdr: map[string]string{walletauth.HeaderName: walletProof(t, walletKey(1), "POST", url, nil)}, status: 401, field: "X-Wallet-Auth.method"},
		{desc: "a proof for another host is refused", method: "POST",
			hdr: map[string]string{walletauth.HeaderName: walletProof(t, walletKey(1), "POST", strings.Replace(url, "127.0.0.1", "localhost", 1), nil)}, status: 401, field: "X-Wallet-Auth.domain"},
		{desc: "an expired proof is refused", method: "POST",
			hdr: map[string]string{walletauth.HeaderName: walletProof(t, walletKey(1), "POST", url, func(r *walletauth.Request) {
				r.Now, r.TTL = time.Now().Add(-3*time.Minute), time.Minute
			})}, status: 401, field: "X-Wallet-Auth.expiration_time"},
		{desc: "a proof issued in the future is refused", method: "POST",
			hdr: map[string]string{walletauth.HeaderName: walletProof(t, walletKey(1), "POST", url, func(r *walletauth.Request) {
				r.Now = time.Now().Add(2 * time.Minute)
			})}, status: 401, field: "X-Wallet-Auth.issued_at"},
		{desc: "a proof living longer than max_lifetime is refused", method: "POST",
			hdr: map[string]string{walletauth.HeaderName: walletProof(t, walletKey(1), "POST", url, func(r *walletauth.Request) { r.TTL = time.Hour })}, status: 401, field: "X-Wallet-Auth.expiration_time"},
		{desc: "a proof signed by another wallet is refused", method: "POST",
			hdr: map[string]string{walletauth.HeaderName: forgeAddress(t, walletProof(t, walletKey(3), "POST", url, nil), walletAddr(1))}, status: 401, field: "X-Wallet-Auth.signature"},
		{desc: "a header that is not base64 JSON is refused without echoing it", method: "POST",
			hdr: map[string]string{walletauth.HeaderName: "SECRET-GARBAGE"}, status: 401, field: "X-Wallet-Auth", check: func(m map[string]any) {
				if b, _ := json.Marshal(m); bytes.Contains(b, []byte("SECRET")) {
					t.Errorf("the header was echoed: %s", b)
				}
			}},
		{desc: "two proofs in one request are refused", method: "POST",
			hdr: map[string]string{walletauth.HeaderName: walletProof(t, walletKey(1), "POST", url, nil) + "\x00" + walletProof(t, walletKey(2), "POST", url, nil)}, status: 401, field: "X-Wallet-Auth"},
		{desc: "a CORS preflight is answered without a proof, never passed on", method: "OPTIONS", status: 204,
			hdr: map[string]string{"Origin": "https://app.example", "Access-Control-Request-Method": "POST"},
			check: func(m map[string]any) {
				if len(m) != 1 || m["text"] != "" {
					t.Errorf("the preflight got a body: %v", m)
				}
			}},
		{desc: "an OPTIONS that is not a preflight needs a proof", method: "OPTIONS", status: 401, field: "X-Wallet-Auth"},
		{desc: "the proof binds the path the client sent, before handle_path strips it", method: "POST", url: base + "/stripped/x",
			hdr: map[string]string{walletauth.HeaderName: walletProof(t, walletKey(2), "POST", base+"/stripped/x", nil)}, status: 200},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			u := url
			if tc.url != "" {
				u = tc.url
			}
			st, hdr, body := walletCall(t, tc.method, u, "{}", tc.hdr)
			if tc.status == 401 {
				wantUnauthorized(t, st, hdr, body, tc.field)
			} else if st != tc.status {
				t.Fatalf("status %d, want %d: %v", st, tc.status, body)
			}
			if tc.check != nil {
				tc.check(body)
			}
		})
	}
}

// forgeAddress swaps the address of a signed header for another one.
func forgeAddress(t testing.TB, h, addr string) string {
	t.Helper()
	e, err := walletauth.Parse(h)
	if err != nil {
		t.Fatal(err)
	}
	e.Address = addr
	out, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestWalletAuthOptionalAndPlaceholders(t *testing.T) {
	up := walletUpstream(t)
	base := startCaddy(t, walletSite(up.URL, "optional", "max_lifetime 1m"))
	url := base + "/api/items"

	st, _, body := walletCall(t, "GET", url, "", map[string]string{HeaderUpstreamWallet: "0xforged"})
	if st != 200 || body["wallet"] != "" {
		t.Fatalf("no proof in optional mode: %d, upstream saw wallet %v", st, body["wallet"])
	}
	// A bad proof is refused in optional mode too: never a silent pass.
	st, hdr, body := walletCall(t, "GET", url, "", map[string]string{walletauth.HeaderName: walletProof(t, walletKey(1), "POST", url, nil)})
	wantUnauthorized(t, st, hdr, body, "X-Wallet-Auth.method")
	// max_lifetime 1m refuses the default five minutes.
	st, hdr, body = walletCall(t, "GET", url, "", map[string]string{walletauth.HeaderName: walletProof(t, walletKey(1), "GET", url, nil)})
	wantUnauthorized(t, st, hdr, body, "X-Wallet-Auth.expiration_time")

	who := base + "/whoami"
	st, _, body = walletCall(t, "GET", who, "", map[string]string{walletauth.HeaderName: walletProof(t, walletKey(4), "GET", who, func(r *walletauth.Request) {
		r.AgentID, r.ChainID = "agent-4", "eip155:84532"
	})})
	if want := walletAddr(4) + "|agent-4|" + walletAddr(4) + "|eip155:84532"; st != 200 || body["text"] != want {
		t.Fatalf("placeholders: %d %q, want %q", st, body["text"], want)
	}
	// Without a wallet the wallet placeholders are empty; http.auth.user.id
	// stays unset, as with Caddy's own authentication.
	if st, _, body = walletCall(t, "GET", who, "", nil); st != 200 || body["text"] != "||{http.auth.user.id}|" {
		t.Fatalf("placeholders without a wallet: %d %q", st, body["text"])
	}
}

// TestWalletAuthLimitsAtLoad: max_lifetime has a ceiling (a proof is
// short-lived: a captured one replays until it expires, unless its nonce
// was used, and its nonce claim is kept that long), siwx_access_ttl
// without siwx, which would be silently ignored, is refused, and so is one
// over 366 days (one past the year 2262 would fail every record).
func TestWalletAuthLimitsAtLoad(t *testing.T) {
	for _, tc := range []struct{ desc, opts, want string }{
		{"a year-long proof lifetime is refused", "max_lifetime 8760h", "max_lifetime 8760h0m0s is over 1h0m0s"},
		{"an hour is the longest", "max_lifetime 1h", ""},
		{"an hour and a second is too long", "max_lifetime 3601s", "is over 1h0m0s"},
		{"siwx_access_ttl needs siwx", "siwx_access_ttl 24h", "siwx_access_ttl needs siwx"},
		{"siwx_access_ttl with siwx loads", "siwx\n\t\tsiwx_access_ttl 24h", ""},
		{"366 days of paid access is the longest", "siwx\n\t\tsiwx_access_ttl 8784h", ""},
		{"a longer paid access is refused", "siwx\n\t\tsiwx_access_ttl 8785h", "siwx_access_ttl 8785h0m0s is over 8784h0m0s"},
		{"paid access past the store's range is refused", "siwx\n\t\tsiwx_access_ttl 2400000h", "siwx_access_ttl 2400000h0m0s is over 8784h0m0s"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			err := loadError(t, fmt.Sprintf(":0 {\n\twallet_auth {\n\t\t%s\n\t\tdomains example.com\n\t\tstore badger %s\n\t}\n\trespond ok\n}\n", tc.opts, t.TempDir()))
			wantErr(t, err, tc.want)
		})
	}
}

// TestSignedAgentIDWithSpacedEndsIsRefused: a proof whose agent_id begins
// or ends with a space would reach verifierd trimmed (HTTP trims header
// values), binding an id the wallet never signed. Such a proof, signed
// over exactly its text as a wallet would, is refused with 401 naming
// X-Wallet-Auth.agent_id, and the upstream hears nothing.
func TestSignedAgentIDWithSpacedEndsIsRefused(t *testing.T) {
	var upstreamCalls atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { upstreamCalls.Add(1) }))
	t.Cleanup(up.Close)
	base := startCaddy(t, walletSite(up.URL, "required", ""))
	url := base + "/api/x"
	for _, signed := range []string{" seller-7 ", "seller-7 ", " seller-7"} {
		e, err := walletauth.New(walletauth.Request{Method: "GET", URL: url, AgentID: signed})
		if err != nil {
			t.Fatal(err)
		}
		// walletauth's own signer refuses such an id: sign the text as
		// any other client could.
		key := walletKey(1)
		e.Address = crypto.PubkeyToAddress(key.PublicKey).Hex()
		sig, err := crypto.Sign(accounts.TextHash([]byte(e.Message())), key)
		if err != nil {
			t.Fatal(err)
		}
		sig[64] += 27
		e.Signature = hexutil.Encode(sig)
		h, err := e.Encode()
		if err != nil {
			t.Fatal(err)
		}
		st, hdr, body := walletCall(t, "GET", url, "", map[string]string{walletauth.HeaderName: h})
		wantUnauthorized(t, st, hdr, body, "X-Wallet-Auth.agent_id")
	}
	if n := upstreamCalls.Load(); n != 0 {
		t.Errorf("the upstream was called %d times", n)
	}
}

// TestFreeAllowancePerWallet: with wallet_auth before the gate and the
// allowance keyed by wallet, each wallet has its own free calls, and a
// request without a wallet gets none (all test requests come from one IP).
// The upstream hears the wallet (and agent_id) wallet_auth proved.
func TestFreeAllowancePerWallet(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := walletUpstream(t)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /verify/schema {
		wallet_auth optional {
			store badger {data}/gate
			domains 127.0.0.1:{port}
		}
		x402 {
			accept devnet $0.02 %[3]s
			facilitator http {
				url %[2]s
			}
			store badger {data}/gate
			validate verify_request
			free_allowance {
				key wallet
				per_day 1
			}
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), fac, payTo.Hex()))
	url := base + "/verify/schema"
	auth := func(i int) map[string]string {
		return map[string]string{walletauth.HeaderName: walletProof(t, walletKey(i), "POST", url, nil)}
	}
	steps := []struct {
		desc   string
		hdr    map[string]string
		status int
		check  func(hdr http.Header, m map[string]any)
	}{
		{"wallet 1's first call is free", auth(1), 200, func(hdr http.Header, m map[string]any) {
			if m["payment"] != "free" || m["wallet"] != walletAddr(1) || hdr.Get(HeaderFreeRemaining) != "0" {
				t.Errorf("upstream %v, remaining %q", m, hdr.Get(HeaderFreeRemaining))
			}
		}},
		{"wallet 1's second call needs payment", auth(1), 402, func(hdr http.Header, m map[string]any) {
			ft, _ := m["free_trial"].(map[string]any)
			if ft["code"] != "free_trial_exhausted" || !strings.Contains(ft["client"].(string), "wallet") {
				t.Errorf("free_trial %v", ft)
			}
		}},
		// The gate keeps what wallet_auth set, the agent_id bind included.
		{"wallet 2 has its own free call", map[string]string{walletauth.HeaderName: walletProof(t, walletKey(2), "POST", url,
			func(r *walletauth.Request) { r.AgentID = "seller-7" })}, 200, func(hdr http.Header, m map[string]any) {
			if m["payment"] != "free" || m["wallet"] != walletAddr(2) || m["agent"] != "seller-7" {
				t.Errorf("upstream %v", m)
			}
		}},
		{"a request without a wallet gets no free call", nil, 402, func(hdr http.Header, m map[string]any) {
			if ft, _ := m["free_trial"].(map[string]any); ft["available"] != false {
				t.Errorf("free_trial %v", ft)
			}
		}},
	}
	for _, s := range steps {
		t.Run(s.desc, func(t *testing.T) {
			st, hdr, body := walletCall(t, "POST", url, validRequest, s.hdr)
			if st != s.status {
				t.Fatalf("status %d, want %d: %v", st, s.status, body)
			}
			s.check(hdr, body)
		})
	}
}

// siwxPaidSite is a site whose /report/* route lets a wallet that paid for
// a path in through sign-in-with-x, and asks everyone else to pay through
// the facilitator at facURL, with upstream behind.
func siwxPaidSite(upstream, facURL string) string {
	return fmt.Sprintf(`:{port} {
	route /report/* {
		wallet_auth optional {
			store badger {data}/gate
			domains 127.0.0.1:{port}
			siwx
		}
		@unpaid not vars {http.auth.wallet.paid_access} true
		x402 @unpaid {
			accept devnet $0.01 %[3]s
			facilitator http {
				url %[2]s
			}
			store badger {data}/gate
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(upstream, "http://"), facURL, payTo.Hex())
}

// TestSignInWithXGrantsWhatWasPaid: a wallet that paid for a path once is
// let through the gate by a sign-in-with-x proof; another wallet, an
// unpaid path or a replayed proof is not.
func TestSignInWithXGrantsWhatWasPaid(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := walletUpstream(t)
	base := startCaddy(t, siwxPaidSite(up.URL, fac))
	url := base + "/report/q3"
	host := strings.TrimPrefix(base, "http://")
	signIn := func(i int, uri string) string {
		s := walletauth.SIWXFromChallenge(walletauth.SIWXChallenge(host, uri, []string{x402.NetworkDevnet}, time.Now())["info"].(map[string]any), x402.NetworkDevnet)
		if err := s.Sign(walletKey(i)); err != nil {
			t.Fatal(err)
		}
		h, err := s.Encode()
		if err != nil {
			t.Fatal(err)
		}
		return h
	}

	// Signed in but never paid: the gate still asks for payment.
	st, hdr, body := walletCall(t, "GET", url, "", map[string]string{walletauth.SIWXHeaderName: signIn(6, url)})
	if st != http.StatusPaymentRequired {
		t.Fatalf("signed in before paying: %d %v", st, body)
	}
	var pr x402.PaymentRequired
	if err := x402.DecodeHeader(hdr.Get(x402.HeaderPaymentRequired), &pr); err != nil {
		t.Fatal(err)
	}
	// Wallet 6 pays once.
	p, err := x402.SignExactEVM(walletKey(6), pr.Accepts[0], &pr.Resource, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	sig, _ := x402.EncodeHeader(p)
	if st, _, body := walletCall(t, "GET", url, "", map[string]string{x402.HeaderPaymentSignature: sig}); st != 200 || body["payment"] != "paid" {
		t.Fatalf("payment: %d %v", st, body)
	}

	again := signIn(6, url)
	cases := []struct {
		desc   string
		url    string
		hdr    map[string]string
		status int
		check  func(hdr http.Header, m map[string]any)
	}{
		{"the payer signs in and is let through without paying again", url,
			map[string]string{walletauth.SIWXHeaderName: again, HeaderUpstreamPayment: "paid"}, 200, func(hdr http.Header, m map[string]any) {
				if m["wallet"] != walletAddr(6) || m["payment"] != "" || m["siwx"] != "" || hdr.Get(x402.HeaderPaymentResponse) != "" {
					t.Errorf("upstream %v, PAYMENT-RESPONSE %q", m, hdr.Get(x402.HeaderPaymentResponse))
				}
			}},
		{"the same sign-in proof cannot be replayed", url,
			map[string]string{walletauth.SIWXHeaderName: again}, 401, func(hdr http.Header, m map[string]any) {
				wantUnauthorized(t, 401, hdr, m, "SIGN-IN-WITH-X.nonce")
			}},
		{"another wallet that never paid must pay", url,
			map[string]string{walletauth.SIWXHeaderName: signIn(7, url)}, 402, nil},
		{"the payer must pay for another path", base + "/report/q4",
			map[string]string{walletauth.SIWXHeaderName: signIn(6, base+"/report/q4")}, 402, nil},
		{"a proof for another origin is refused", url,
			map[string]string{walletauth.SIWXHeaderName: signIn(6, "http://other.example/report/q3")}, 401, func(hdr http.Header, m map[string]any) {
				wantUnauthorized(t, 401, hdr, m, "SIGN-IN-WITH-X.uri")
			}},
		{"a sign-in and an X-Wallet-Auth of different wallets are refused", url,
			map[string]string{walletauth.SIWXHeaderName: signIn(6, url), walletauth.HeaderName: walletProof(t, walletKey(7), "GET", url, nil)}, 401, func(hdr http.Header, m map[string]any) {
				wantUnauthorized(t, 401, hdr, m, "SIGN-IN-WITH-X.address")
			}},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			st, hdr, body := walletCall(t, "GET", tc.url, "", tc.hdr)
			if st != tc.status {
				t.Fatalf("status %d, want %d: %v", st, tc.status, body)
			}
			if tc.check != nil {
				tc.check(hdr, body)
			}
		})
	}
}

// TestSignInWithXOnThePublicOrigin: behind a proxy the gate sees any Host
// (here the client's forged one), yet with public_base_url the challenge
// asks for a proof on the public origin, and that proof is what
// wallet_auth, listing only the public name, accepts: the wallet that
// paid signs the challenge as offered and re-enters without paying. The
// domain check is unchanged: a proof for the Host the client sent is
// refused.
func TestSignInWithXOnThePublicOrigin(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := walletUpstream(t)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /report/* {
		wallet_auth optional {
			store badger {data}/gate
			domains verify.example.com
			siwx
		}
		@unpaid not vars {http.auth.wallet.paid_access} true
		x402 @unpaid {
			accept devnet $0.01 %[3]s
			public_base_url https://verify.example.com
			siwx
			facilitator http {
				url %[2]s
			}
			store badger {data}/gate
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), fac, payTo.Hex()))
	url := base + "/report/q3"
	call := func(host string, hdr map[string]string) *http.Response {
		t.Helper()
		return getWith(t, url, host, hdr)
	}
	demand := func() x402.PaymentRequired {
		t.Helper()
		resp := call("attacker.example", nil)
		if resp.StatusCode != http.StatusPaymentRequired {
			t.Fatalf("unpaid: %d", resp.StatusCode)
		}
		return paymentRequired(t, resp)
	}
	signIn := func(info map[string]any) string {
		t.Helper()
		s := walletauth.SIWXFromChallenge(info, x402.NetworkDevnet)
		if err := s.Sign(walletKey(6)); err != nil {
			t.Fatal(err)
		}
		h, err := s.Encode()
		if err != nil {
			t.Fatal(err)
		}
		return h
	}

	pr := demand()
	p, err := x402.SignExactEVM(walletKey(6), pr.Accepts[0], &pr.Resource, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	sig, _ := x402.EncodeHeader(p)
	if resp := call("attacker.example", map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != http.StatusOK {
		t.Fatalf("payment: %d", resp.StatusCode)
	}

	info, _ := demand().Extensions[walletauth.SIWXExtension].(map[string]any)["info"].(map[string]any)
	if info["domain"] != "verify.example.com" || info["uri"] != "https://verify.example.com/report/q3" {
		t.Fatalf("challenge %v: not on the public origin", info)
	}
	resp := call("attacker.example", map[string]string{walletauth.SIWXHeaderName: signIn(info)})
	if resp.StatusCode != http.StatusOK || resp.Header.Get(x402.HeaderPaymentResponse) != "" {
		t.Fatalf("the payer's sign-in on the public origin: %d, PAYMENT-RESPONSE %q", resp.StatusCode, resp.Header.Get(x402.HeaderPaymentResponse))
	}

	forged := maps.Clone(demand().Extensions[walletauth.SIWXExtension].(map[string]any)["info"].(map[string]any))
	forged["domain"], forged["uri"] = "attacker.example", "http://attacker.example/report/q3"
	forged["resources"] = []any{forged["uri"]}
	resp = call("attacker.example", map[string]string{walletauth.SIWXHeaderName: signIn(forged)})
	b, _ := io.ReadAll(resp.Body)
	var m map[string]any
	json.Unmarshal(b, &m)
	wantUnauthorized(t, resp.StatusCode, resp.Header, m, "SIGN-IN-WITH-X.domain")
}

// TestHeadersFromOtherSignersPass: a header made by the aov command and
// one made by viem (a real peer) both pass the handler.
func TestHeadersFromOtherSignersPass(t *testing.T) {
	up := walletUpstream(t)
	base := startCaddy(t, walletSite(up.URL, "required", ""))
	url := base + "/api/verify"
	keyHex := "0x" + common.Bytes2Hex(crypto.FromECDSA(walletKey(5)))

	t.Run("aov wallet-auth", func(t *testing.T) {
		keyFile := filepath.Join(t.TempDir(), "wallet.hex")
		os.WriteFile(keyFile, []byte(keyHex), 0o600)
		out, err := exec.Command(aovCommand(t), "wallet-auth", "--key-file", keyFile, "--method", "POST", "--url", url, "--agent-id", "cli-agent", "--chain", "eip155:1337").Output()
		if err != nil {
			t.Fatalf("aov wallet-auth: %v", err)
		}
		st, _, body := walletCall(t, "POST", url, "{}", map[string]string{walletauth.HeaderName: strings.TrimSpace(string(out))})
		if st != 200 || body["wallet"] != walletAddr(5) || body["agent"] != "cli-agent" {
			t.Fatalf("status %d, upstream %v", st, body)
		}
	})
	t.Run("viem", func(t *testing.T) {
		h := viemHeader(t, map[string]any{"kind": "x-wallet-auth", "privateKey": keyHex, "method": "POST", "url": url, "chainId": 1337, "agentId": "viem agent", "statement": "Prove my wallet"})
		st, _, body := walletCall(t, "POST", url, "{}", map[string]string{walletauth.HeaderName: h})
		if st != 200 || body["wallet"] != walletAddr(5) || body["agent"] != "viem agent" {
			t.Fatalf("status %d, upstream %v", st, body)
		}
	})
}

// viemHeader runs interop/wallet-auth-viem.mjs. Without the npm peers the
// test is skipped, except under CI (CI set), where that is a failure.
func viemHeader(t *testing.T, input map[string]any) string {
	t.Helper()
	interop.Dir(t, "viem")
	var res struct{ Header string }
	interop.Run(t, "wallet-auth-viem.mjs", nil, input, &res)
	return res.Header
}

func TestWalletAuthCaddyfileErrors(t *testing.T) {
	cases := []struct{ desc, caddyfile, want string }{
		{"an unknown option is named", "wallet_auth {\n\tcolour red\n}", "unrecognized wallet_auth option 'colour'"},
		{"a bad duration is refused", "wallet_auth {\n\tmax_lifetime soon\n}", "bad duration"},
		{"siwx takes no argument", "wallet_auth {\n\tsiwx yes\n}", "wrong argument count"},
		{"at most one inline argument", "wallet_auth optional extra", "wrong argument count"},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			wantErr(t, adaptSiteError(tc.caddyfile), tc.want)
		})
	}
	// A mode other than required or optional fails at load.
	wa := &WalletAuth{Mode: "sometimes"}
	if err := wa.Validate(); err == nil || !strings.Contains(err.Error(), "required or optional") {
		t.Errorf("Validate: %v", err)
	}
}

// TestContractWalletThroughChainRPC: with chain_rpc, a contract wallet
// (EIP-1271) proves itself with its owner's signature, here signed by the
// aov command; without chain_rpc the same kind of proof is refused.
func TestContractWalletThroughChainRPC(t *testing.T) {
	d, err := evmfacilitator.StartDevnet(evmfacilitator.DevnetConfig{RPCListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatalf("starting devnet: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	owner := walletKey(3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wallet, err := d.DeployTestWallet(ctx, crypto.PubkeyToAddress(owner.PublicKey))
	if err != nil {
		t.Fatal(err)
	}

	up := walletUpstream(t)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /api/* {
		wallet_auth {
			store badger {data}/gate
			domains 127.0.0.1:{port}
			chain_rpc %[2]s
		}
		reverse_proxy %[1]s
	}
	route /plain/* {
		wallet_auth {
			store badger {data}/gate
			domains 127.0.0.1:{port}
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), d.RPCURL()))
	keyFile := filepath.Join(t.TempDir(), "owner.hex")
	os.WriteFile(keyFile, []byte(common.Bytes2Hex(crypto.FromECDSA(owner))), 0o600)
	sign := func(url, chain string) string {
		out, err := exec.Command(aovCommand(t), "wallet-auth", "--key-file", keyFile, "--method", "GET", "--url", url, "--chain", chain, "--address", wallet.Hex()).Output()
		if err != nil {
			t.Fatalf("aov wallet-auth: %v", err)
		}
		return strings.TrimSpace(string(out))
	}
	cases := []struct {
		desc   string
		url    string
		chain  string
		status int
	}{
		{"the owner's signature proves the contract wallet", base + "/api/x", "eip155:1337", 200},
		{"a proof naming another chain is refused", base + "/api/x", "eip155:8453", 401},
		{"without chain_rpc a contract wallet cannot prove itself", base + "/plain/x", "eip155:1337", 401},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			st, hdr, body := walletCall(t, "GET", tc.url, "", map[string]string{walletauth.HeaderName: sign(tc.url, tc.chain)})
			if tc.status == 401 {
				wantUnauthorized(t, st, hdr, body, "X-Wallet-Auth.signature")
				return
			}
			if st != tc.status || body["wallet"] != wallet.Hex() {
				t.Fatalf("status %d, upstream %v", st, body)
			}
		})
	}

	// The devnet's token has code but no isValidSignature: the eth_call
	// reverts, the chain's own refusal, so the proof is a 401 (not an
	// outage: TestWalletAuthChainRefusalIsA503).
	t.Run("a contract whose isValidSignature reverts refuses the proof", func(t *testing.T) {
		url := base + "/api/x"
		e, err := walletauth.Parse(walletProof(t, owner, "GET", url, func(r *walletauth.Request) { r.ChainID = "eip155:1337" }))
		if err != nil {
			t.Fatal(err)
		}
		e.Address = d.Token().Hex()
		h, _ := e.Encode()
		st, hdr, body := walletCall(t, "GET", url, "", map[string]string{walletauth.HeaderName: h})
		wantUnauthorized(t, st, hdr, body, "X-Wallet-Auth.signature")
	})

	// The identity precompile (0x…04) echoes its calldata, which begins
	// with isValidSignature's selector, the EIP-1271 magic value. Nobody
	// holds a key for it: a proof for it with a signature of zeros, here
	// binding an agent_id, is refused, and the upstream hears of neither.
	t.Run("the identity precompile cannot be claimed", func(t *testing.T) {
		url := base + "/api/x"
		e, err := walletauth.New(walletauth.Request{Method: "GET", URL: url, ChainID: "eip155:1337", AgentID: "victim-agent", Now: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		e.Address = "0x0000000000000000000000000000000000000004"
		e.Signature = "0x" + strings.Repeat("00", 65)
		h, err := e.Encode()
		if err != nil {
			t.Fatal(err)
		}
		st, hdr, body := walletCall(t, "GET", url, "", map[string]string{walletauth.HeaderName: h})
		wantUnauthorized(t, st, hdr, body, "X-Wallet-Auth.signature")
	})
}

// An upstream that is itself an x402 client (a seller's agent calling
// another paid API) answers with its own PAYMENT-RESPONSE, naming its own
// payer, and PAYMENT-REQUIRED. Neither reaches the client on an answer the
// gate hands over uncharged (here the upstream refuses the paid call: an
// error answer is never charged), a free one or one that carried a
// payment; and sign-in-with-x records no paid access from it: only the
// gate's own settlement counts.
func TestUpstreamPaymentHeadersAreNotTheGates(t *testing.T) {
	_, fac := sharedDevnet(t)
	forged, _ := x402.EncodeHeader(x402.SettleResponse{Success: true, Payer: walletAddr(6), Transaction: "0xforged", Network: x402.NetworkDevnet})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(x402.HeaderPaymentResponse, forged)
		w.Header().Set(x402.HeaderPaymentRequired, "forged")
		w.Header().Set("Content-Type", "application/json")
		if r.Header.Get(HeaderUpstreamPayment) == "paid" {
			w.WriteHeader(http.StatusConflict)
		}
		json.NewEncoder(w).Encode(map[string]string{"payment": r.Header.Get(HeaderUpstreamPayment)})
	}))
	t.Cleanup(up.Close)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /report/* {
		wallet_auth optional {
			store badger {data}/gate
			domains 127.0.0.1:{port}
			siwx
		}
		@unpaid not vars {http.auth.wallet.paid_access} true
		x402 @unpaid {
			accept devnet $0.01 %[3]s
			facilitator http {
				url %[2]s
			}
			store badger {data}/gate
			free_allowance {
				per_day 5
				max_body 16
			}
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), fac, payTo.Hex()))
	url := base + "/report/q3"
	host := strings.TrimPrefix(base, "http://")
	noPaymentHeaders := func(desc string, hdr http.Header) {
		t.Helper()
		if v := hdr.Values(x402.HeaderPaymentResponse); len(v) > 0 {
			t.Errorf("%s: the upstream's PAYMENT-RESPONSE reached the client: %q", desc, v)
		}
		if v := hdr.Values(x402.HeaderPaymentRequired); len(v) > 0 {
			t.Errorf("%s: the upstream's PAYMENT-REQUIRED reached the client: %q", desc, v)
		}
	}

	st, hdr, body := walletCall(t, "GET", url, "", nil)
	if st != 200 || body["payment"] != "free" {
		t.Fatalf("free call: %d %v", st, body)
	}
	noPaymentHeaders("free call", hdr)

	st, hdr, _ = walletCall(t, "POST", url, `{"too large to be free": true}`, nil) // the gate's own demand
	var pr x402.PaymentRequired
	if err := x402.DecodeHeader(hdr.Get(x402.HeaderPaymentRequired), &pr); st != 402 || err != nil {
		t.Fatalf("demand: %d %v", st, err)
	}
	p, err := x402.SignExactEVM(walletKey(7), pr.Accepts[0], &pr.Resource, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	sig, _ := x402.EncodeHeader(p)
	st, hdr, body = walletCall(t, "GET", url, "", map[string]string{x402.HeaderPaymentSignature: sig})
	if st != http.StatusConflict || body["payment"] != "paid" {
		t.Fatalf("paid call: %d %v", st, body)
	}
	noPaymentHeaders("paid call, not charged", hdr)

	// Wallet 6, which the forged receipt names, signs in: it paid nothing,
	// so it is not let past the gate (which serves it from the allowance).
	s := walletauth.SIWXFromChallenge(walletauth.SIWXChallenge(host, url, []string{x402.NetworkDevnet}, time.Now())["info"].(map[string]any), x402.NetworkDevnet)
	if err := s.Sign(walletKey(6)); err != nil {
		t.Fatal(err)
	}
	proof, err := s.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if st, _, body = walletCall(t, "GET", url, "", map[string]string{walletauth.SIWXHeaderName: proof}); st != 200 || body["payment"] != "free" {
		t.Fatalf("the forged payer signed in: %d %v (payment \"\": let through as having paid)", st, body)
	}
}

// On a charged answer, buffered (settle after) or streamed (settle before),
// the client's PAYMENT-RESPONSE is the gate's, once, whatever receipt the
// upstream added.
func TestChargedAnswerCarriesOnlyTheGatesReceipt(t *testing.T) {
	_, fac := sharedDevnet(t)
	forged, _ := x402.EncodeHeader(x402.SettleResponse{Success: true, Payer: walletAddr(6), Transaction: "0xforged", Network: x402.NetworkDevnet})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(x402.HeaderPaymentResponse, forged)
		w.Header().Set(x402.HeaderPaymentRequired, "forged")
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"ok":true}`))
	}))
	t.Cleanup(up.Close)
	route := func(path, mode string) string {
		return fmt.Sprintf(`route %[1]s {
		x402 {
			accept devnet $0.01 %[4]s
			facilitator http {
				url %[3]s
			}
			store badger {data}/gate
			settle %[2]s
		}
		reverse_proxy %[5]s
	}`, path, mode, fac, payTo.Hex(), strings.TrimPrefix(up.URL, "http://"))
	}
	base := startCaddy(t, ":{port} {\n\t"+route("/after", "after")+"\n\t"+route("/before", "before")+"\n}\n")
	for i, path := range []string{"/after", "/before"} {
		url := base + path
		payer := 9 - i
		sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), payer)
		resp := post(t, url, "", map[string]string{x402.HeaderPaymentSignature: sig})
		io.Copy(io.Discard, resp.Body)
		var sr x402.SettleResponse
		v := resp.Header.Values(x402.HeaderPaymentResponse)
		if resp.StatusCode != 200 || len(v) != 1 || x402.DecodeHeader(v[0], &sr) != nil || sr.Transaction == "0xforged" || sr.Payer != walletAddr(payer) {
			t.Errorf("%s: status %d, PAYMENT-RESPONSE %q (%+v)", path, resp.StatusCode, v, sr)
		}
		if v := resp.Header.Values(x402.HeaderPaymentRequired); len(v) > 0 {
			t.Errorf("%s: PAYMENT-REQUIRED %q", path, v)
		}
	}
}
