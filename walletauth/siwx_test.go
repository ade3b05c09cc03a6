package walletauth

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/accounts"
	"github.com/ethereum/go-ethereum/crypto"
)

var siwxWant = SIWXExpect{Domain: "api.example.com", Scheme: "https", Path: "/data"}

// siwxProof builds a sign-in-with-x proof as the extension's client does:
// the server's challenge fields plus address, chain and signature.
func siwxProof(t testing.TB, issued time.Time, edit func(s *SIWX)) *SIWX {
	t.Helper()
	s := &SIWX{
		Domain: "api.example.com", Address: crypto.PubkeyToAddress(testKey.PublicKey).Hex(),
		Statement: "Sign in to access your content", URI: "https://api.example.com/data", Version: "1",
		ChainID: "eip155:8453", Type: "eip191", Nonce: "a1b2c3d4e5f67890a1b2c3d4e5f67890",
		IssuedAt: issued.UTC().Format("2006-01-02T15:04:05.000Z07:00"), RequestID: "req-1",
		Resources: []string{"https://api.example.com/data"},
	}
	if edit != nil {
		edit(s)
	}
	sig, err := crypto.Sign(accounts.TextHash([]byte(s.Message())), testKey)
	if err != nil {
		t.Fatal(err)
	}
	sig[64] += 27
	s.Signature = "0x" + hex.EncodeToString(sig)
	return s
}

func siwxHeader(t testing.TB, s *SIWX) string {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(b)
}

func TestSIWXMessageText(t *testing.T) {
	s := siwxProof(t, time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC), func(s *SIWX) {
		s.ExpirationTime = "2024-01-01T00:05:00.000Z"
		s.Resources = append(s.Resources, "ipfs://bafy")
	})
	want := "api.example.com wants you to sign in with your Ethereum account:\n" +
		"0x2c7536E3605D9C16a7a3D7b1898e529396a65c23\n\n" +
		"Sign in to access your content\n\n" +
		"URI: https://api.example.com/data\nVersion: 1\nChain ID: 8453\n" +
		"Nonce: a1b2c3d4e5f67890a1b2c3d4e5f67890\nIssued At: 2024-01-01T00:00:00.000Z\n" +
		"Expiration Time: 2024-01-01T00:05:00.000Z\nRequest ID: req-1\n" +
		"Resources:\n- https://api.example.com/data\n- ipfs://bafy"
	if got := s.Message(); got != want {
		t.Fatalf("message\n%q\nwant\n%q", got, want)
	}
}

func TestSIWXAcceptsAFreshProofOnce(t *testing.T) {
	v := &Verifier{Nonces: newDB(t).Claims(), Now: clock(t0.Add(time.Minute))}
	h := siwxHeader(t, siwxProof(t, t0, nil))
	p, err := v.VerifySIWX(context.Background(), h, siwxWant)
	if err != nil {
		t.Fatalf("verify: %v", err)
	}
	if p.Address != crypto.PubkeyToAddress(testKey.PublicKey) || p.ChainID != "eip155:8453" || !p.Expires.Equal(t0.Truncate(time.Millisecond).Add(SIWXMaxAge)) {
		t.Fatalf("proof %+v", p)
	}
	if _, err := v.VerifySIWX(context.Background(), h, siwxWant); !errors.Is(err, ErrReplayed) {
		t.Fatalf("replay: %v, want ErrReplayed", err)
	}
	// Unknown members are ignored (the extension may grow); the scheme
	// is not checked when the gateway cannot know it.
	v2 := &Verifier{Nonces: newDB(t).Claims(), Now: clock(t0.Add(time.Minute))}
	var m map[string]any
	raw, _ := base64.StdEncoding.DecodeString(h)
	json.Unmarshal(raw, &m)
	m["futureField"] = map[string]any{"x": 1}
	b, _ := json.Marshal(m)
	if _, err := v2.VerifySIWX(context.Background(), base64.StdEncoding.EncodeToString(b), SIWXExpect{Domain: "api.example.com", Path: "/data"}); err != nil {
		t.Fatalf("with an unknown member: %v", err)
	}
}

func TestSIWXRefusals(t *testing.T) {
	now := t0.Add(time.Minute)
	cases := []struct {
		desc   string
		issued time.Time
		edit   func(s *SIWX)          // before signing
		after  func(m map[string]any) // after signing, on the JSON
		want   SIWXExpect
		kind   error
		field  string
	}{
		{desc: "a proof for another domain is refused", edit: func(s *SIWX) { s.Domain = "evil.example" }, kind: ErrWrongRequest, field: "domain"},
		{desc: "a uri on another origin is refused", edit: func(s *SIWX) { s.URI = "https://evil.example/data" }, kind: ErrWrongRequest, field: "uri"},
		{desc: "a uri on another scheme is refused", edit: func(s *SIWX) { s.URI = "http://api.example.com/data" }, kind: ErrWrongRequest, field: "uri"},
		{desc: "a uri for another path is refused", edit: func(s *SIWX) { s.URI = "https://api.example.com/admin" }, kind: ErrWrongRequest, field: "uri"},
		{desc: "a uri for a sub-path is refused", edit: func(s *SIWX) { s.URI = "https://api.example.com/data/1" }, kind: ErrWrongRequest, field: "uri"},
		{desc: "a uri with a query is refused", edit: func(s *SIWX) { s.URI = "https://api.example.com/data?a=b" }, kind: ErrWrongRequest, field: "uri"},
		{desc: "a uri with a fragment is refused", edit: func(s *SIWX) { s.URI = "https://api.example.com/data#x" }, kind: ErrWrongRequest, field: "uri"},
		{desc: "a domain on another port is refused", want: SIWXExpect{Domain: "api.example.com:8443"}, kind: ErrWrongRequest, field: "domain"},
		{desc: "issuedAt more than five minutes ago is refused", issued: now.Add(-SIWXMaxAge - time.Second), kind: ErrExpired, field: "issuedAt"},
		{desc: "issuedAt in the future is refused", issued: now.Add(time.Minute), kind: ErrNotYetValid, field: "issuedAt"},
		{desc: "a passed expirationTime is refused", edit: func(s *SIWX) { s.ExpirationTime = rfc(now.Add(-time.Second)) }, kind: ErrExpired, field: "expirationTime"},
		{desc: "a future notBefore is refused", edit: func(s *SIWX) { s.NotBefore = rfc(now.Add(time.Minute)) }, kind: ErrNotYetValid, field: "notBefore"},
		{desc: "a signature over other fields is refused", after: func(m map[string]any) { m["statement"] = "Something else" }, kind: ErrBadSignature, field: "signature"},
		{desc: "resources added after signing are refused", after: func(m map[string]any) { m["resources"] = []any{"https://api.example.com/admin"} }, kind: ErrBadSignature, field: "signature"},
		{desc: "an address that did not sign is refused", after: func(m map[string]any) { m["address"] = crypto.PubkeyToAddress(otherKey.PublicKey).Hex() }, kind: ErrBadSignature, field: "signature"},
		{desc: "a Solana proof is refused as unsupported", after: func(m map[string]any) { m["type"] = "ed25519" }, kind: ErrMalformed, field: "type"},
		{desc: "a non-EVM chain is refused", after: func(m map[string]any) { m["chainId"] = "solana:mainnet" }, kind: ErrMalformed, field: "chainId"},
		{desc: "a resource that is not a URI is refused", after: func(m map[string]any) { m["resources"] = []any{"POST /data"} }, kind: ErrMalformed, field: "resources"},
		{desc: "resources that are not strings are refused", after: func(m map[string]any) { m["resources"] = []any{1} }, kind: ErrMalformed, field: "resources"},
		{desc: "a statement with a line break is refused", after: func(m map[string]any) { m["statement"] = "a\nURI: https://evil.example" }, kind: ErrMalformed, field: "statement"},
		{desc: "a request id with a space is refused", after: func(m map[string]any) { m["requestId"] = "a b" }, kind: ErrMalformed, field: "requestId"},
		{desc: "a missing signature is refused", after: func(m map[string]any) { delete(m, "signature") }, kind: ErrMalformed, field: "signature"},
		{desc: "a short nonce is refused", after: func(m map[string]any) { m["nonce"] = "abc" }, kind: ErrMalformed, field: "nonce"},
		{desc: "a version other than 1 is refused", after: func(m map[string]any) { m["version"] = "2" }, kind: ErrMalformed, field: "version"},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			issued := t0
			if !tc.issued.IsZero() {
				issued = tc.issued
			}
			s := siwxProof(t, issued, tc.edit)
			h := siwxHeader(t, s)
			if tc.after != nil {
				var m map[string]any
				raw, _ := base64.StdEncoding.DecodeString(h)
				json.Unmarshal(raw, &m)
				tc.after(m)
				b, _ := json.Marshal(m)
				h = base64.StdEncoding.EncodeToString(b)
			}
			w := siwxWant
			if tc.want != (SIWXExpect{}) {
				w = tc.want
			}
			v := &Verifier{Nonces: newDB(t).Claims(), Now: clock(now)}
			_, err := v.VerifySIWX(context.Background(), h, w)
			var we *Error
			if !errors.As(err, &we) || !errors.Is(err, tc.kind) {
				t.Fatalf("error %v, want kind %v", err, tc.kind)
			}
			if we.Header != SIWXHeaderName || we.Field != tc.field {
				t.Errorf("refusal names %s %q, want %s %q", we.Header, we.Field, SIWXHeaderName, tc.field)
			}
			if strings.Contains(we.APIError().Message, "evil.example") {
				t.Error("refusal echoes the proof")
			}
		})
	}
}

func TestSIWXChallengeIsSignable(t *testing.T) {
	ext := SIWXChallenge("api.example.com", "https://api.example.com/data", []string{"eip155:8453"}, t0)
	info := ext["info"].(map[string]any)
	s := siwxProof(t, t0, func(s *SIWX) {
		s.Domain, s.URI, s.Nonce = info["domain"].(string), info["uri"].(string), info["nonce"].(string)
		s.IssuedAt, s.ExpirationTime, s.Statement = info["issuedAt"].(string), info["expirationTime"].(string), info["statement"].(string)
		s.RequestID = ""
		s.Resources = []string{info["resources"].([]any)[0].(string)}
	})
	v := &Verifier{Nonces: newDB(t).Claims(), Now: clock(t0.Add(time.Second))}
	if _, err := v.VerifySIWX(context.Background(), siwxHeader(t, s), siwxWant); err != nil {
		t.Fatalf("a proof of our own challenge: %v", err)
	}
	chains := ext["supportedChains"].([]any)
	if len(chains) != 1 || chains[0].(map[string]any)["type"] != "eip191" {
		t.Errorf("supportedChains %v", chains)
	}
	if other := SIWXChallenge("api.example.com", "https://api.example.com/data", nil, t0); other["info"].(map[string]any)["nonce"] == info["nonce"] {
		t.Error("two challenges share a nonce")
	}
}

func TestPaidAccess(t *testing.T) {
	ctx := context.Background()
	db := newDB(t)
	p := PaidAccess{Claims: db.Claims()}
	payer := crypto.PubkeyToAddress(testKey.PublicKey).Hex()
	res := PaidResource("API.example.com", "/data")
	if ok, err := p.Has(ctx, payer, res); ok || err != nil {
		t.Fatalf("before any payment: %v %v", ok, err)
	}
	if err := p.Record(ctx, strings.ToLower(payer), res); err != nil {
		t.Fatal(err)
	}
	if err := p.Record(ctx, payer, res); err != nil {
		t.Fatalf("recording a second payment: %v", err)
	}
	cases := []struct {
		desc, addr, resource string
		want                 bool
	}{
		{"the payer has access in any address case", payer, PaidResource("api.example.com", "/data"), true},
		{"another wallet has none", crypto.PubkeyToAddress(otherKey.PublicKey).Hex(), res, false},
		{"another path has none", payer, PaidResource("api.example.com", "/other"), false},
		{"another host has none", payer, PaidResource("other.example.com", "/data"), false},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			if ok, err := p.Has(ctx, tc.addr, tc.resource); ok != tc.want || err != nil {
				t.Fatalf("Has = %v, %v; want %v", ok, err, tc.want)
			}
		})
	}
	if err := p.Record(ctx, "", res); err == nil {
		t.Error("a record without a payer was accepted")
	}
}

func TestSIWXFromChallengeSignEncode(t *testing.T) {
	ext := SIWXChallenge("api.example.com", "https://api.example.com/data", []string{"eip155:8453"}, t0)
	s := SIWXFromChallenge(ext["info"].(map[string]any), "eip155:8453")
	if err := s.Sign(testKey); err != nil {
		t.Fatal(err)
	}
	h, err := s.Encode()
	if err != nil {
		t.Fatal(err)
	}
	v := &Verifier{Nonces: newDB(t).Claims(), Now: clock(t0.Add(time.Second))}
	p, err := v.VerifySIWX(context.Background(), h, siwxWant)
	if err != nil || p.Address != crypto.PubkeyToAddress(testKey.PublicKey) {
		t.Fatalf("verify: %+v %v", p, err)
	}
	bad := SIWXFromChallenge(map[string]any{"domain": "api.example.com"}, "eip155:8453")
	if err := bad.Sign(testKey); err == nil {
		t.Error("an incomplete challenge was signed")
	}
}
