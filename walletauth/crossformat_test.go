package walletauth

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/apierr"
)

// asSIWX copies an X-Wallet-Auth envelope into a SIGN-IN-WITH-X proof with
// the same signed text: X-Wallet-Auth's method and agent URNs become the
// proof's resources. This is what someone who saw the header can build.
func asSIWX(e *Envelope) *SIWX {
	res := []string{MethodURN(e.Method)}
	if e.AgentID != "" {
		res = append(res, AgentURN(e.AgentID))
	}
	return &SIWX{
		Domain: e.Domain, Address: e.Address, Statement: e.Statement, URI: e.URI, Version: e.Version,
		ChainID: e.ChainID, Type: e.Type, Nonce: e.Nonce, IssuedAt: e.IssuedAt, ExpirationTime: e.ExpirationTime,
		NotBefore: e.NotBefore, Resources: res, Signature: e.Signature,
	}
}

// refusedAs checks that err is a refusal of kind on header.field, answered
// with the contract's 401 unauthorized.
func refusedAs(t *testing.T, err error, kind error, header, field string) {
	t.Helper()
	var we *Error
	if !errors.As(err, &we) || !errors.Is(err, kind) {
		t.Fatalf("error %v, want a refusal of kind %v", err, kind)
	}
	ae := we.APIError()
	if ae.Status != 401 || ae.Code != apierr.CodeUnauthorized || len(ae.Fields) != 1 || ae.Fields[0].Field != header+"."+field {
		t.Fatalf("answer %+v, want 401 unauthorized on %s.%s", ae, header, field)
	}
}

// A used X-Wallet-Auth header, its fields copied into a SIGN-IN-WITH-X
// proof (the same signed text), is refused: SIGN-IN-WITH-X may not list
// X-Wallet-Auth's resources. EVM and Solana alike.
func TestAWalletAuthProofIsNotASIWXProof(t *testing.T) {
	now := t0.Add(time.Minute)
	evm := envelope(t)
	evmHeader := signed(t, evm, testKey)
	sol, err := New(Request{Method: "POST", URL: "https://verifier.example/verify/schema", ChainID: solanaDevnet, AgentID: "seller-7", Now: t0})
	if err != nil {
		t.Fatal(err)
	}
	if err := sol.SignSolana(solanaKeyFor("a")); err != nil {
		t.Fatal(err)
	}
	solHeader, _ := sol.Encode()
	for _, c := range []struct {
		name   string
		header string
		e      *Envelope
	}{{"evm", evmHeader, evm}, {"solana", solHeader, sol}} {
		t.Run(c.name, func(t *testing.T) {
			v := &Verifier{Nonces: newDB(t).Claims(), Domains: []string{"verifier.example"}, Now: clock(now)}
			if _, err := v.Verify(context.Background(), c.header, want); err != nil {
				t.Fatalf("the header's own use: %v", err)
			}
			s := asSIWX(c.e)
			if s.Message() != c.e.Message() {
				t.Fatal("the copy does not sign the same text: the test proves nothing")
			}
			_, err := v.VerifySIWX(context.Background(), siwxHeader(t, s), SIWXExpect{})
			refusedAs(t, err, ErrMalformed, SIWXHeaderName, "resources")

			// Unused, the copy is refused all the same: the two kinds of
			// message cannot be taken for each other.
			fresh := &Verifier{Nonces: newDB(t).Claims(), Domains: []string{"verifier.example"}, Now: clock(now)}
			_, err = fresh.VerifySIWX(context.Background(), siwxHeader(t, s), SIWXExpect{})
			refusedAs(t, err, ErrMalformed, SIWXHeaderName, "resources")
		})
	}
}

// Any resource in X-Wallet-Auth's URN namespace is refused, in any letter
// case (a URN's scheme and namespace are case-insensitive), and the refusal
// does not echo it.
func TestSIWXRefusesWalletAuthResources(t *testing.T) {
	for _, r := range []string{"urn:x-wallet-auth:method:GET", "URN:X-Wallet-Auth:agent:a", "urn:x-wallet-auth:anything-else"} {
		s := siwxProof(t, t0, func(s *SIWX) { s.Resources = append(s.Resources, r) })
		_, err := ParseSIWX(siwxHeader(t, s))
		refusedAs(t, err, ErrMalformed, SIWXHeaderName, "resources")
		if strings.Contains(strings.ToLower(err.Error()), strings.ToLower(r)) {
			t.Errorf("the refusal echoes the resource: %v", err)
		}
	}
	// Other URNs are still any proof's business.
	s := siwxProof(t, t0, func(s *SIWX) { s.Resources = append(s.Resources, "urn:x-other:method:GET") })
	if _, err := ParseSIWX(siwxHeader(t, s)); err != nil {
		t.Fatalf("an ordinary URN resource: %v", err)
	}
}

// A wallet's nonce is single-use whichever header carries the proof: a
// SIGN-IN-WITH-X proof cannot reuse the nonce of an X-Wallet-Auth proof of
// the same wallet, nor the other way round. EVM and Solana alike.
func TestANonceIsSingleUseAcrossProofFormats(t *testing.T) {
	now := t0.Add(time.Minute)
	const nonce = "sharedNonce0123456789"
	siwxWantHere := SIWXExpect{Domain: "verifier.example", Path: "/data"}
	evmAuth := func(t *testing.T, nonce string) string {
		e := envelope(t)
		e.Nonce = nonce
		return signed(t, e, testKey)
	}
	evmSIWX := func(t *testing.T, nonce string) string {
		return siwxHeader(t, siwxProof(t, t0, func(s *SIWX) {
			s.Domain, s.URI, s.Resources, s.Nonce = "verifier.example", "https://verifier.example/data", []string{"https://verifier.example/data"}, nonce
		}))
	}
	solAuth := func(t *testing.T, nonce string) string {
		e, err := New(Request{Method: "POST", URL: "https://verifier.example/verify/schema", ChainID: solanaDevnet, Now: t0, Nonce: nonce})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.SignSolana(solanaKeyFor("a")); err != nil {
			t.Fatal(err)
		}
		h, _ := e.Encode()
		return h
	}
	solSIWX := func(t *testing.T, nonce string) string {
		s := &SIWX{Domain: "verifier.example", URI: "https://verifier.example/data", Version: Version, ChainID: solanaDevnet,
			Nonce: nonce, IssuedAt: t0.Format(time.RFC3339), Resources: []string{"https://verifier.example/data"}}
		if err := s.SignSolana(solanaKeyFor("a")); err != nil {
			t.Fatal(err)
		}
		return siwxHeader(t, s)
	}
	for _, c := range []struct {
		name       string
		auth, siwx func(*testing.T, string) string
	}{{"evm", evmAuth, evmSIWX}, {"solana", solAuth, solSIWX}} {
		t.Run(c.name+"/wallet-auth first", func(t *testing.T) {
			v := &Verifier{Nonces: newDB(t).Claims(), Now: clock(now)}
			if _, err := v.Verify(context.Background(), c.auth(t, nonce), want); err != nil {
				t.Fatalf("X-Wallet-Auth: %v", err)
			}
			_, err := v.VerifySIWX(context.Background(), c.siwx(t, nonce), siwxWantHere)
			refusedAs(t, err, ErrReplayed, SIWXHeaderName, "nonce")
		})
		t.Run(c.name+"/siwx first", func(t *testing.T) {
			v := &Verifier{Nonces: newDB(t).Claims(), Now: clock(now)}
			if _, err := v.VerifySIWX(context.Background(), c.siwx(t, nonce), siwxWantHere); err != nil {
				t.Fatalf("SIGN-IN-WITH-X: %v", err)
			}
			_, err := v.Verify(context.Background(), c.auth(t, nonce), want)
			refusedAs(t, err, ErrReplayed, HeaderName, "nonce")
		})
		t.Run(c.name+"/different nonces", func(t *testing.T) {
			// Each format on its own nonce: both pass, so the shared
			// namespace takes nothing legitimate away.
			v := &Verifier{Nonces: newDB(t).Claims(), Now: clock(now)}
			if _, err := v.Verify(context.Background(), c.auth(t, nonce), want); err != nil {
				t.Fatalf("X-Wallet-Auth: %v", err)
			}
			if _, err := v.VerifySIWX(context.Background(), c.siwx(t, "anotherNonce0123456789"), siwxWantHere); err != nil {
				t.Fatalf("SIGN-IN-WITH-X: %v", err)
			}
		})
	}
}
