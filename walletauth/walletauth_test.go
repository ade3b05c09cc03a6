package walletauth

import (
	"context"
	"crypto/ecdsa"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/accounts"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/store"
)

// testKey is a fixed key (the well-known Ethereum test key from the
// go-ethereum documentation); nothing here ever holds value.
var testKey, _ = crypto.HexToECDSA("4c0883a69102937d6231471b5dbb6204fe5129617082792ae468d01a3f362318")

var otherKey, _ = crypto.HexToECDSA("8a1f9a8f95be41cd7ccb6168179afb4504aefe388d1e14474d32c45c72ce7b7a")

// t0 is when the test proofs are issued: in the future, because the nonce
// store checks claim expiries against the real clock.
var t0 = time.Now().UTC().Truncate(time.Hour).Add(2 * time.Hour)

func rfc(t time.Time) string { return t.UTC().Format(time.RFC3339) }

var want = Expect{Domain: "verifier.example", Method: "POST", Path: "/verify/schema"}

func newDB(t testing.TB) *store.DB {
	t.Helper()
	db, err := store.Open("", store.Options{InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// envelope returns a fresh unsigned envelope for want, issued at t0.
func envelope(t testing.TB) *Envelope { return envelopeNaming(t, "seller-7") }

// envelopeNaming is envelope naming agentID, which New takes as it is:
// only signing and verifying judge an id.
func envelopeNaming(t testing.TB, agentID string) *Envelope {
	t.Helper()
	e, err := New(Request{Method: "post", URL: "https://verifier.example/verify/schema?x=1", AgentID: agentID, Now: t0, Nonce: "abcdefghijklmnop1234"})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func signed(t testing.TB, e *Envelope, key *ecdsa.PrivateKey) string {
	t.Helper()
	if err := e.Sign(key); err != nil {
		t.Fatal(err)
	}
	h, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func clock(at time.Time) func() time.Time { return func() time.Time { return at } }

// signedAnyway returns e's header signed by otherKey over e's message as
// it stands, without the checks Sign makes on it, as another client would
// sign it: so a test sees what Verify does with a proof Sign refuses.
func signedAnyway(t testing.TB, e *Envelope) string {
	t.Helper()
	e.Address, e.Type = crypto.PubkeyToAddress(otherKey.PublicKey).Hex(), TypeEIP191
	sig, err := crypto.Sign(textHash(e.Message()), otherKey)
	if err != nil {
		t.Fatal(err)
	}
	sig[64] += 27
	e.Signature = "0x" + hex.EncodeToString(sig)
	hdr, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return hdr
}

// verifyAfterIssue verifies hdr against want a second after t0, within
// the proofs' lifetime.
func verifyAfterIssue(hdr string) (Proof, error) {
	v := &Verifier{Now: clock(t0.Add(time.Second))}
	return v.Verify(context.Background(), hdr, want)
}

// agentIDRefusal returns err as the 401 refusal naming agent_id
// (malformed), or nil when err is anything else.
func agentIDRefusal(err error) *Error {
	var we *Error
	if !errors.As(err, &we) || we.Kind != ErrMalformed || we.Field != "agent_id" {
		return nil
	}
	return we
}

func TestNewFillsTheFormat(t *testing.T) {
	e := envelope(t)
	got := map[string]string{"domain": e.Domain, "uri": e.URI, "version": e.Version, "chain_id": e.ChainID,
		"issued_at": e.IssuedAt, "expiration_time": e.ExpirationTime, "method": e.Method, "path": e.Path, "agent_id": e.AgentID, "type": e.Type}
	wantFields := map[string]string{"domain": "verifier.example", "uri": "https://verifier.example/verify/schema", "version": "1",
		"chain_id": "eip155:8453", "issued_at": rfc(t0), "expiration_time": rfc(t0.Add(5 * time.Minute)),
		"method": "POST", "path": "/verify/schema", "agent_id": "seller-7", "type": "eip191"}
	for k, v := range wantFields {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	if n := NewNonce(); !nonceRE.MatchString(n) || n == NewNonce() {
		t.Errorf("nonce %q is not a fresh alphanumeric nonce", n)
	}
}

// TestMessageText pins the signed text of the package documentation's
// example: any change to the layout breaks every client.
func TestMessageText(t *testing.T) {
	e := &Envelope{Domain: "verifier.example", Address: "0x9858EfFD232B4033E47d90003D41EC34EcaEda94",
		URI: "https://verifier.example/verify/schema", Version: "1", ChainID: "eip155:8453",
		Nonce: "3f9c0d1e7a2b4c5d6e7f8091", IssuedAt: "2026-11-29T21:22:28Z", ExpirationTime: "2026-11-29T21:27:28Z",
		NotBefore: "2026-11-29T21:22:28Z", Statement: "Verify my agent's output", Method: "POST", Path: "/verify/schema",
		AgentID: "seller-7", Type: "eip191"}
	want := "verifier.example wants you to sign in with your Ethereum account:\n" +
		"0x9858EfFD232B4033E47d90003D41EC34EcaEda94\n\n" +
		"Verify my agent's output\n\n" +
		"URI: https://verifier.example/verify/schema\nVersion: 1\nChain ID: 8453\n" +
		"Nonce: 3f9c0d1e7a2b4c5d6e7f8091\nIssued At: 2026-11-29T21:22:28Z\n" +
		"Expiration Time: 2026-11-29T21:27:28Z\nNot Before: 2026-11-29T21:22:28Z\n" +
		"Resources:\n- urn:x-wallet-auth:method:POST\n- urn:x-wallet-auth:agent:seller-7"
	if got := e.Message(); got != want {
		t.Fatalf("message\n%s\nwant\n%s", got, want)
	}
	e.Statement, e.NotBefore, e.AgentID = "", "", ""
	want = "verifier.example wants you to sign in with your Ethereum account:\n" +
		"0x9858EfFD232B4033E47d90003D41EC34EcaEda94\n\n\n" +
		"URI: https://verifier.example/verify/schema\nVersion: 1\nChain ID: 8453\n" +
		"Nonce: 3f9c0d1e7a2b4c5d6e7f8091\nIssued At: 2026-11-29T21:22:28Z\n" +
		"Expiration Time: 2026-11-29T21:27:28Z\n" +
		"Resources:\n- urn:x-wallet-auth:method:POST"
	if got := e.Message(); got != want {
		t.Fatalf("message without statement\n%q\nwant\n%q", got, want)
	}
}

func TestAgentURNEscapesAllButUnreserved(t *testing.T) {
	cases := []struct{ desc, id, want string }{
		{"unreserved characters stay", "seller-7.a_b~", "urn:x-wallet-auth:agent:seller-7.a_b~"},
		{"space and sub-delimiters are escaped", "a b!'()*:/", "urn:x-wallet-auth:agent:a%20b%21%27%28%29%2A%3A%2F"},
		{"UTF-8 is escaped byte by byte", "café", "urn:x-wallet-auth:agent:caf%C3%A9"},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			if got := AgentURN(tc.id); got != tc.want {
				t.Errorf("AgentURN(%q) = %q, want %q", tc.id, got, tc.want)
			}
		})
	}
}

func TestAValidProofIsAccepted(t *testing.T) {
	db := newDB(t)
	v := &Verifier{Nonces: db.Claims(), Now: clock(t0.Add(time.Minute))}
	h := signed(t, envelope(t), testKey)
	p, err := v.Verify(context.Background(), h, Expect{Domain: "Verifier.Example", Method: "POST", Path: "/verify/schema"})
	if err != nil {
		t.Fatalf("verify: %v", err)
	}
	if p.Address != crypto.PubkeyToAddress(testKey.PublicKey) || p.AgentID != "seller-7" || p.ChainID != "eip155:8453" || p.Contract || !p.Expires.Equal(t0.Add(5*time.Minute)) {
		t.Fatalf("proof %+v", p)
	}
	// The same header again is a replay.
	_, err = v.Verify(context.Background(), h, want)
	if !errors.Is(err, ErrReplayed) {
		t.Fatalf("replay: %v, want ErrReplayed", err)
	}
	// Another wallet may use the same nonce: nonces are per address.
	if _, err := v.Verify(context.Background(), signed(t, envelope(t), otherKey), want); err != nil {
		t.Fatalf("another wallet with the same nonce: %v", err)
	}
}

// TestASpentNonceIsCheckedNotClaimed: with Expect.NonceSpent a proof
// whose nonce the caller already claimed for this request passes every
// other check again, and the check claims nothing: a second check by other
// settings (a gateway's nested wallet_auth) neither refuses the proof as a
// replay nor accepts what those settings refuse.
func TestASpentNonceIsCheckedNotClaimed(t *testing.T) {
	db := newDB(t)
	v := &Verifier{Nonces: db.Claims(), Now: clock(t0.Add(time.Minute))}
	spent := want
	spent.NonceSpent = true
	h := signed(t, envelope(t), testKey)
	if _, err := v.Verify(context.Background(), h, want); err != nil {
		t.Fatalf("verify: %v", err)
	}
	if _, err := v.Verify(context.Background(), h, spent); err != nil {
		t.Fatalf("checked again with its nonce spent: %v", err)
	}
	other := &Verifier{Nonces: db.Claims(), Now: v.Now, Domains: []string{"other.example"}}
	if _, err := other.Verify(context.Background(), h, spent); !errors.Is(err, ErrWrongRequest) {
		t.Fatalf("checked again by settings that refuse its domain: %v, want ErrWrongRequest", err)
	}
	// Checking with the nonce spent claims nothing: the proof's own
	// first check still claims it, once.
	fresh := signed(t, envelope(t), otherKey)
	if _, err := v.Verify(context.Background(), fresh, spent); err != nil {
		t.Fatalf("verify with the nonce spent: %v", err)
	}
	if _, err := v.Verify(context.Background(), fresh, want); err != nil {
		t.Fatalf("the first claim after a check with the nonce spent: %v", err)
	}
	if _, err := v.Verify(context.Background(), fresh, want); !errors.Is(err, ErrReplayed) {
		t.Fatalf("replay: %v, want ErrReplayed", err)
	}
}

// TestReleasedNonceCanBeSentAgain: ReleaseNonce gives back the claim a
// check made, so the same proof passes once more and is then a replay
// again; releasing a check that claimed nothing (NonceSpent) gives back
// nothing.
func TestReleasedNonceCanBeSentAgain(t *testing.T) {
	db := newDB(t)
	v := &Verifier{Nonces: db.Claims(), Now: clock(t0.Add(time.Minute))}
	ctx := context.Background()
	h := signed(t, envelope(t), testKey)
	p, err := v.Verify(ctx, h, want)
	if err != nil {
		t.Fatalf("verify: %v", err)
	}
	if err := v.ReleaseNonce(ctx, p); err != nil {
		t.Fatalf("release: %v", err)
	}
	if _, err := v.Verify(ctx, h, want); err != nil {
		t.Fatalf("sent again after its release: %v", err)
	}
	spent := want
	spent.NonceSpent = true
	again, err := v.Verify(ctx, h, spent)
	if err != nil {
		t.Fatalf("checked again with its nonce spent: %v", err)
	}
	if err := v.ReleaseNonce(ctx, again); err != nil {
		t.Fatalf("release of a check that claimed nothing: %v", err)
	}
	if _, err := v.Verify(ctx, h, want); !errors.Is(err, ErrReplayed) {
		t.Fatalf("replay: %v, want ErrReplayed", err)
	}
}

func TestRefusals(t *testing.T) {
	at := t0.Add(time.Minute)
	cases := []struct {
		desc   string
		mutate func(e *Envelope) // applied before signing
		header func(t *testing.T) string
		want   Expect
		now    time.Time
		kind   error
		field  string
	}{
		{desc: "a proof for another domain is refused", mutate: func(e *Envelope) { e.Domain, e.URI = "evil.example", "https://evil.example/verify/schema" }, kind: ErrWrongRequest, field: "domain"},
		{desc: "a proof for another method is refused", mutate: func(e *Envelope) { e.Method = "GET" }, kind: ErrWrongRequest, field: "method"},
		{desc: "a proof for another path is refused", mutate: func(e *Envelope) { e.Path, e.URI = "/score/x", "https://verifier.example/score/x" }, kind: ErrWrongRequest, field: "path"},
		{desc: "an expired proof is refused", now: t0.Add(5 * time.Minute), kind: ErrExpired, field: "expiration_time"},
		{desc: "a proof issued in the future is refused", now: t0.Add(-time.Minute), kind: ErrNotYetValid, field: "issued_at"},
		{desc: "a proof before its not_before is refused", mutate: func(e *Envelope) { e.NotBefore = rfc(t0.Add(3 * time.Minute)) }, kind: ErrNotYetValid, field: "not_before"},
		{desc: "a proof living longer than the maximum is refused", mutate: func(e *Envelope) { e.ExpirationTime = rfc(t0.Add(10 * time.Minute)) }, kind: ErrLifetime, field: "expiration_time"},
		{desc: "a proof expiring before it is issued is refused", mutate: func(e *Envelope) { e.ExpirationTime = rfc(t0.Add(-time.Second)) }, kind: ErrMalformed, field: "expiration_time"},
		{desc: "a signature by another key is refused", header: func(t *testing.T) string {
			e := envelope(t)
			signed(t, e, otherKey)
			e.Address = crypto.PubkeyToAddress(testKey.PublicKey).Hex()
			h, _ := e.Encode()
			return h
		}, kind: ErrBadSignature, field: "signature"},
		{desc: "a field changed after signing is refused", header: func(t *testing.T) string {
			e := envelope(t)
			signed(t, e, testKey)
			e.AgentID = "someone-else"
			h, _ := e.Encode()
			return h
		}, kind: ErrBadSignature, field: "signature"},
		{desc: "a high-s twin of a valid signature is refused", header: func(t *testing.T) string {
			e := envelope(t)
			signed(t, e, testKey)
			sig := common.FromHex(e.Signature)
			s := new(big.Int).SetBytes(sig[32:64])
			s.Sub(crypto.S256().Params().N, s)
			copy(sig[32:64], common.LeftPadBytes(s.Bytes(), 32))
			sig[64] ^= 1
			e.Signature = "0x" + common.Bytes2Hex(sig)
			h, _ := e.Encode()
			return h
		}, kind: ErrBadSignature, field: "signature"},
		{desc: "a lower-case address is not EIP-55", header: func(t *testing.T) string {
			e := envelope(t)
			signed(t, e, testKey)
			e.Address = strings.ToLower(e.Address)
			h, _ := e.Encode()
			return h
		}, kind: ErrMalformed, field: "address"},
		{desc: "a short nonce is refused", header: func(t *testing.T) string {
			return encodeRaw(t, func(m map[string]any) { m["nonce"] = "abc123" })
		}, kind: ErrMalformed, field: "nonce"},
		{desc: "a statement with a line break is refused", header: func(t *testing.T) string {
			return encodeRaw(t, func(m map[string]any) { m["statement"] = "one\nURI: https://evil.example/" })
		}, kind: ErrMalformed, field: "statement"},
		{desc: "a uri off the domain is refused", header: func(t *testing.T) string {
			return encodeRaw(t, func(m map[string]any) { m["uri"] = "https://evil.example/verify/schema" })
		}, kind: ErrMalformed, field: "uri"},
		{desc: "a uri with a query is refused", header: func(t *testing.T) string {
			return encodeRaw(t, func(m map[string]any) { m["uri"] = "https://verifier.example/verify/schema?a=b" })
		}, kind: ErrMalformed, field: "uri"},
		{desc: "a chain neither EVM nor Solana is refused", header: func(t *testing.T) string {
			return encodeRaw(t, func(m map[string]any) { m["chain_id"] = "cosmos:cosmoshub-4" })
		}, kind: ErrMalformed, field: "chain_id"},
		{desc: "an EVM address on a Solana chain is refused", header: func(t *testing.T) string {
			return encodeRaw(t, func(m map[string]any) { m["chain_id"] = "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp" })
		}, kind: ErrMalformed, field: "address"},
		{desc: "another signature type is refused", header: func(t *testing.T) string {
			return encodeRaw(t, func(m map[string]any) { m["type"] = "eip712" })
		}, kind: ErrMalformed, field: "type"},
		{desc: "a lower-case method is refused", header: func(t *testing.T) string {
			return encodeRaw(t, func(m map[string]any) { m["method"] = "post" })
		}, kind: ErrMalformed, field: "method"},
		{desc: "an agent_id over 200 characters is refused", header: func(t *testing.T) string {
			return encodeRaw(t, func(m map[string]any) { m["agent_id"] = strings.Repeat("a", 201) })
		}, kind: ErrMalformed, field: "agent_id"},
		// HTTP trims a header value's ends on the way to verifierd
		// (X-Aov-Wallet-Agent): the id bound would not be the one signed.
		{desc: "an agent_id with a leading space is refused", header: func(t *testing.T) string {
			return encodeRaw(t, func(m map[string]any) { m["agent_id"] = " seller-7" })
		}, kind: ErrMalformed, field: "agent_id"},
		{desc: "an agent_id with a trailing space is refused", header: func(t *testing.T) string {
			return encodeRaw(t, func(m map[string]any) { m["agent_id"] = "seller-7 " })
		}, kind: ErrMalformed, field: "agent_id"},
		{desc: "an agent_id ending in another kind of space is refused", header: func(t *testing.T) string {
			return encodeRaw(t, func(m map[string]any) { m["agent_id"] = "seller-7 " })
		}, kind: ErrMalformed, field: "agent_id"},
		{desc: "a missing member is refused", header: func(t *testing.T) string {
			return encodeRaw(t, func(m map[string]any) { delete(m, "nonce") })
		}, kind: ErrMalformed, field: "nonce"},
		{desc: "an unknown member is refused", header: func(t *testing.T) string {
			return encodeRaw(t, func(m map[string]any) { m["message"] = "trust me" })
		}, kind: ErrMalformed},
		{desc: "a member spelled in another case is refused", header: func(t *testing.T) string {
			return encodeRaw(t, func(m map[string]any) { m["Address"] = m["address"]; delete(m, "address") })
		}, kind: ErrMalformed},
		{desc: "a number where a string belongs is refused", header: func(t *testing.T) string {
			return encodeRaw(t, func(m map[string]any) { m["chain_id"] = 8453 })
		}, kind: ErrMalformed, field: "chain_id"},
		{desc: "duplicate members are refused", header: func(t *testing.T) string {
			raw := rawJSON(t)
			raw = strings.Replace(raw, `"path":`, `"path":"/other","path":`, 1)
			return base64.StdEncoding.EncodeToString([]byte(raw))
		}, kind: ErrMalformed},
		{desc: "URL-safe base64 is refused", header: func(t *testing.T) string {
			return base64.URLEncoding.EncodeToString([]byte(rawJSON(t) + "\xff\xfe"))
		}, kind: ErrMalformed},
		{desc: "unpadded base64 is refused", header: func(t *testing.T) string {
			return strings.TrimRight(base64.StdEncoding.EncodeToString([]byte(rawJSON(t)+" ")), "=")
		}, kind: ErrMalformed},
		{desc: "base64 with a line break is refused", header: func(t *testing.T) string {
			h := base64.StdEncoding.EncodeToString([]byte(rawJSON(t)))
			return h[:10] + "\n" + h[10:]
		}, kind: ErrMalformed},
		{desc: "a JSON array is refused", header: func(t *testing.T) string { return base64.StdEncoding.EncodeToString([]byte(`[]`)) }, kind: ErrMalformed},
		{desc: "an empty header is refused", header: func(t *testing.T) string { return "" }, kind: ErrMalformed},
		{desc: "an oversized header is refused", header: func(t *testing.T) string { return strings.Repeat("A", MaxHeaderBytes+4) }, kind: ErrMalformed},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			var h string
			if tc.header != nil {
				h = tc.header(t)
			} else {
				e := envelope(t)
				if tc.mutate != nil {
					tc.mutate(e)
				}
				h = signed(t, e, testKey)
			}
			now := at
			if !tc.now.IsZero() {
				now = tc.now
			}
			w := want
			if tc.want != (Expect{}) {
				w = tc.want
			}
			db := newDB(t)
			v := &Verifier{Nonces: db.Claims(), Now: clock(now)}
			_, err := v.Verify(context.Background(), h, w)
			var we *Error
			if !errors.As(err, &we) || !errors.Is(err, tc.kind) {
				t.Fatalf("error %v, want kind %v", err, tc.kind)
			}
			if tc.field != "" && we.Field != tc.field {
				t.Errorf("field %q, want %q (%v)", we.Field, tc.field, err)
			}
			ae := we.APIError()
			if ae.Status != 401 || ae.Code != apierr.CodeUnauthorized || len(ae.Fields) != 1 || !strings.HasPrefix(ae.Fields[0].Field, HeaderName) {
				t.Errorf("API error %+v", ae)
			}
			body, _ := json.Marshal(ae)
			for _, secret := range []string{"trust me", "evil.example", "someone-else", "/other"} {
				if strings.Contains(string(body), secret) {
					t.Errorf("refusal echoes the header: %s", body)
				}
			}
			// A refused proof never burns its nonce.
			if _, err := db.Claims().Lookup(context.Background(), "wallet-auth/nonce/"+strings.ToLower(crypto.PubkeyToAddress(testKey.PublicKey).Hex())+"/abcdefghijklmnop1234"); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("the nonce of a refused proof was claimed (%v)", err)
			}
		})
	}
}

// rawJSON is the JSON of a validly signed envelope.
func rawJSON(t *testing.T) string {
	t.Helper()
	e := envelope(t)
	signed(t, e, testKey)
	b, _ := json.Marshal(e)
	return string(b)
}

// encodeRaw edits the JSON of a validly signed envelope.
func encodeRaw(t *testing.T, edit func(map[string]any)) string {
	t.Helper()
	var m map[string]any
	json.Unmarshal([]byte(rawJSON(t)), &m)
	edit(m)
	b, _ := json.Marshal(m)
	return base64.StdEncoding.EncodeToString(b)
}

// failingClaims is a fake store that is down: the one fault (an
// unreachable nonce store) a real Badger cannot be made to show on demand.
type failingClaims struct{ store.Claims }

func (failingClaims) Claim(context.Context, []string, time.Time) (store.Claim, error) {
	return store.Claim{}, errors.New("store down")
}

func TestAStoreFailureIsNotARefusal(t *testing.T) {
	v := &Verifier{Nonces: failingClaims{}, Now: clock(t0.Add(time.Minute))}
	_, err := v.Verify(context.Background(), signed(t, envelope(t), testKey), want)
	var we *Error
	if err == nil || errors.As(err, &we) {
		t.Fatalf("error %v: a store outage must not look like a bad proof", err)
	}
}

func TestSignRequestRoundTrip(t *testing.T) {
	h, err := SignRequest(testKey, Request{Method: "GET", URL: "http://127.0.0.1:8080/score/agent%20x", ChainID: "eip155:1337", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	e, err := Parse(h)
	if err != nil {
		t.Fatal(err)
	}
	if e.Path != "/score/agent%20x" || e.URI != "http://127.0.0.1:8080/score/agent%20x" || e.Domain != "127.0.0.1:8080" {
		t.Errorf("envelope %+v", e)
	}
	v := &Verifier{Nonces: newDB(t).Claims()}
	if _, err := v.Verify(context.Background(), h, Expect{Domain: "127.0.0.1:8080", Method: "GET", Path: "/score/agent%20x"}); err != nil {
		t.Fatalf("verify: %v", err)
	}
	if _, err := SignRequest(testKey, Request{Method: "GET", URL: "ftp://x/y"}); err == nil {
		t.Error("an ftp URL was accepted")
	}
	if _, err := SignRequest(testKey, Request{Method: "GET", URL: "https://x/y", TTL: time.Minute, AgentID: "a\nb"}); err == nil {
		t.Error("an agent id with a line break was signed")
	}
}

func textHash(text string) []byte { return accounts.TextHash([]byte(text)) }

// A proof's path is the request's path escaped, as sent: one signed for
// /a%2Fb has path and uri /a%2Fb and is refused (path) for /a/b, and the
// other way round. (Before: SignRequest signed the decoded path, and
// Verify compared it with the decoded request path, so /a%2Fb and /a/b
// were one path.)
func TestProofPathIsTheEscapedPath(t *testing.T) {
	v := &Verifier{Nonces: newDB(t).Claims()}
	for _, c := range []struct{ signed, sent string }{
		{"/a%2Fb", "/a/b"},
		{"/a/b", "/a%2Fb"},
		{"/a%2Fb", "/a%2fb"}, // hex case does not matter: the same path
		{"/caf%C3%A9", "/caf%c3%a9"},
	} {
		h, err := SignRequest(testKey, Request{Method: "GET", URL: "http://h" + c.signed, ChainID: "eip155:1337", TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		e, _ := Parse(h)
		if e.Path != CanonicalPath(c.signed) || e.URI != "http://h"+CanonicalPath(c.signed) {
			t.Errorf("signed %s: path %q uri %q", c.signed, e.Path, e.URI)
		}
		_, err = v.Verify(context.Background(), h, Expect{Domain: "h", Method: "GET", Path: c.sent})
		var we *Error
		same := CanonicalPath(c.signed) == CanonicalPath(c.sent)
		switch {
		case same && err != nil:
			t.Errorf("signed %s, sent %s: %v, want accepted", c.signed, c.sent, err)
		case !same && (!errors.As(err, &we) || we.Field != "path"):
			t.Errorf("signed %s, sent %s: %v, want refused naming path", c.signed, c.sent, err)
		}
	}
}

// The path member and the signed uri must name one path, escaped: a path
// written decoded is the same path only where decoding changes nothing
// RFC 3986 tells apart (é, a space), never for an encoded "/".
func TestEnvelopePathAndURIAreOnePath(t *testing.T) {
	for _, c := range []struct {
		path, uri string
		ok        bool
	}{
		{"/a%2Fb", "http://h/a%2Fb", true},
		{"/café x", "http://h/caf%C3%A9%20x", true},
		{"/a/b", "http://h/a%2Fb", false},
		{"/a%2Fb", "http://h/a/b", false},
	} {
		e, err := New(Request{Method: "GET", URL: "http://h/x", ChainID: "eip155:1337", TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		e.Path, e.URI = c.path, c.uri
		err = e.Sign(testKey)
		var we *Error
		if c.ok && err != nil || !c.ok && (!errors.As(err, &we) || we.Field != "uri") {
			t.Errorf("path %q, uri %q: %v, want accepted %v", c.path, c.uri, err, c.ok)
		}
	}
}

// A proof's agent_id holds only characters that show (SPEC §9): an id with an
// invisible format character (zero-width space, byte-order mark, word
// joiner, right-to-left override) renders exactly as another's, such as a
// victim's address, and its binder would hold an owned, authenticated
// score under a name nobody can tell from the victim's account. A proof
// naming one is refused when signed and, signed all the same (as another
// client would), refused 401 naming agent_id. (Before: only control
// characters were refused; then variation selectors, the combining
// grapheme joiner, Hangul fillers and the blank Braille pattern were still
// admitted, as unicode.IsPrint has them printable.)
func TestAgentIDInvisibleCharactersRefused(t *testing.T) {
	victim := "0x52908400098527886E0F7030069857D2E4169EE7"
	for _, id := range []string{
		victim + "\u200b", // zero-width space
		"\ufeff" + victim, // byte-order mark
		victim + "\u2060", // word joiner
		"\u202e" + victim, // right-to-left override
		"seller\u00a07",   // no-break space
		"seller\ue0007",   // private use
		victim + "\ufe0f", // variation selector-16
		victim + "\u034f", // combining grapheme joiner
		victim + "\u3164", // Hangul filler
		victim + "\u2800", // Braille pattern blank
		"0x52908400098527886\u04150F7030069857D2E4169EE7", // the victim's address with a Cyrillic Е
	} {
		e := envelopeNaming(t, id)
		if err := e.Sign(otherKey); err == nil {
			t.Errorf("agent_id %q: signed, want refused", id)
		}
		p, err := verifyAfterIssue(signedAnyway(t, e))
		if agentIDRefusal(err) == nil {
			t.Errorf("agent_id %q: accepted (AgentID %q, wallet %s), err %v; want 401 malformed naming X-Wallet-Auth.agent_id (not printable)", id, p.AgentID, p.Wallet(), err)
		}
	}
	// Printable ids, a space inside and letters of any script among them,
	// stay bindable.
	for _, id := range []string{"my agent", "café-✓", "代理人", "seller-7"} {
		if p, err := verifyAfterIssue(signed(t, envelopeNaming(t, id), otherKey)); err != nil || p.AgentID != id {
			t.Errorf("agent_id %q: %v (AgentID %q), want accepted", id, err, p.AgentID)
		}
	}
}

// A proof naming an address written in lookalikes is refused 401 with
// agent_id's "writes an address in lookalike characters", a Solana address
// with no digit too (GbYbVXrgs…, its X written as Cyrillic Х), and an EVM
// one with a Hangul ieung ㅇ, drawn as a circle, for a 0; one whose id
// merely holds an ASCII address or hash beside a character that is not
// ASCII is accepted, as its ASCII twin is. (Before: the Solana lookalike
// was accepted, as its run held no digit, so was the Hangul one, as Korean
// letters ended the run of hex digits, and 代理人-0x<address> and
// café-build-<sha1> were refused as lookalikes.)
func TestAgentIDLookalikeAddressRefused(t *testing.T) {
	for _, imitation := range []string{
		"GbYbV\u0425rgsSRzBaoBZiJjLxkUaJawVYAGCWvqRmgQGnkP", // reads as GbYbVXrgs…, a Solana wallet
		"0x529\u31478400098527886E0F7030069857D2E4169EE7",   // reads as 0x52908400…
	} {
		e := envelopeNaming(t, imitation)
		if err := e.Sign(otherKey); err == nil {
			t.Errorf("agent_id %q: signed, want refused", imitation)
		}
		p, err := verifyAfterIssue(signedAnyway(t, e))
		if we := agentIDRefusal(err); we == nil || we.Problem != "writes an address in lookalike characters" {
			t.Errorf("agent_id %q: accepted (AgentID %q), err %v; want 401 malformed agent_id, an address in lookalike characters", imitation, p.AgentID, err)
		}
	}
	for _, id := range []string{"代理人-0x9858EfFD232B4033E47d90003D41EC34EcaEda94", "café-build-3f9a1c2e4b5d6f708192a3b4c5d6e7f8a9b0c1d2"} {
		if p, err := verifyAfterIssue(signed(t, envelopeNaming(t, id), otherKey)); err != nil || p.AgentID != id {
			t.Errorf("agent_id %q: %v (AgentID %q), want accepted", id, err, p.AgentID)
		}
	}
}

// A proof naming an id that reads as a reserved test- id without being
// one (tеst-agent with a Cyrillic е) is refused 401 naming agent_id, as
// such an id would hold an owned score under a name that reads as an
// example nobody owns; test-agent itself is accepted (verifierd never
// binds it). (Before: the lookalike was accepted and bound.)
func TestAgentIDTestPrefixLookalikeRefused(t *testing.T) {
	for _, c := range []struct {
		id string
		ok bool
	}{{"t\u0435st-agent", false}, {"test-agent", true}, {"my-t\u0435st-agent", true}} {
		e := envelopeNaming(t, c.id)
		if err := e.Sign(otherKey); (err == nil) != c.ok {
			t.Errorf("agent_id %q: signing: %v, want accepted %v", c.id, err, c.ok)
		}
		if c.ok {
			continue
		}
		p, err := verifyAfterIssue(signedAnyway(t, e))
		if we := agentIDRefusal(err); we == nil || we.Problem != "writes test- in lookalike characters" {
			t.Errorf("agent_id %q: accepted (AgentID %q), err %v; want 401 malformed agent_id, test- in lookalike characters", c.id, p.AgentID, err)
		}
	}
}

// A proof naming an id that reads as an account id or a test- id through
// a character no table maps is refused 401 naming agent_id: an EVM address
// with Devanagari danda U+0964 (a bare stroke, drawn as the | read as 1)
// for its 1, one with the db digraph ȸ U+0238 for its "db", and
// test-agent with an Armenian hyphen U+058A. (Before: each was accepted
// and its id bound to the signer, as the danda and the hyphen read only as
// ':' and the digraph as one letter.)
func TestAgentIDUnmappedLookalikeRefused(t *testing.T) {
	for _, c := range []struct{ id, problem string }{
		{"0x52908400098527886E0F7030069857D2E4\u096469EE7", "writes an address in lookalike characters"}, // 0x…E4169EE7
		{"0x27b1f\u023804752bbc536007a920d24acb045561c26", "writes an address in lookalike characters"},  // 0x27b1fdb0…
		{"test\u058aagent", "writes test- in lookalike characters"},
	} {
		e := envelopeNaming(t, c.id)
		if err := e.Sign(otherKey); err == nil {
			t.Errorf("agent_id %q: signed, want refused", c.id)
		}
		p, err := verifyAfterIssue(signedAnyway(t, e))
		if we := agentIDRefusal(err); we == nil || we.Problem != c.problem {
			t.Errorf("agent_id %q: accepted (AgentID %q, bound to %s), err %v; want 401 malformed agent_id, %s", c.id, p.AgentID, p.Address, err, c.problem)
		}
	}
}
