package walletauth

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestVerifierDomains: with configured site names, a proof's domain must be
// one of them, whatever the request's Host (Expect.Domain) says: a proof
// signed for another site is refused even when the client sends that
// site's name as its Host.
func TestVerifierDomains(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		desc    string
		domains []string
		host    string // Expect.Domain: what the request's Host would say
		ok      bool
	}{
		{"a proof for a configured name is accepted", []string{"other.example", "verifier.example"}, "", true},
		{"names compare without regard to case", []string{"VERIFIER.example"}, "", true},
		{"a proof for another site is refused although the Host names it", []string{"api.ours.example"}, "verifier.example", false},
		{"the port is part of the name", []string{"verifier.example:8443"}, "verifier.example", false},
	} {
		t.Run(c.desc, func(t *testing.T) {
			v := &Verifier{Nonces: newDB(t).Claims(), Now: clock(t0.Add(time.Minute)), Domains: c.domains}
			_, err := v.Verify(ctx, signed(t, envelope(t), testKey), Expect{Domain: c.host, Method: "POST", Path: "/verify/schema"})
			if c.ok && err != nil {
				t.Fatalf("refused: %v", err)
			}
			var we *Error
			if !c.ok && (!errors.Is(err, ErrWrongRequest) || !errors.As(err, &we) || we.Field != "domain") {
				t.Fatalf("error %v, want a wrong-request refusal of domain", err)
			}
		})
	}

	t.Run("sign-in-with-x follows the same names", func(t *testing.T) {
		v := &Verifier{Nonces: newDB(t).Claims(), Now: clock(t0.Add(time.Minute)), Domains: []string{"ours.example"}}
		_, err := v.VerifySIWX(ctx, siwxHeader(t, siwxProof(t, t0, nil)), SIWXExpect{Domain: "api.example.com"})
		if !errors.Is(err, ErrWrongRequest) {
			t.Fatalf("a proof for another site: %v, want ErrWrongRequest", err)
		}
		v.Domains = []string{"API.example.com"}
		if _, err := v.VerifySIWX(ctx, siwxHeader(t, siwxProof(t, t0, nil)), SIWXExpect{Domain: "evil.example", Path: "/data"}); err != nil {
			t.Fatalf("a proof for a configured name: %v", err)
		}
		other := siwxProof(t, t0, func(s *SIWX) { s.Nonce = "ffffffffffffffffffffffff"; s.URI = "https://evil.example/data" })
		if _, err := v.VerifySIWX(ctx, siwxHeader(t, other), SIWXExpect{}); !errors.Is(err, ErrWrongRequest) {
			t.Fatalf("a uri on another origin than the domain: %v, want ErrWrongRequest", err)
		}
	})

	t.Run("ValidDomain accepts what a proof's domain may be", func(t *testing.T) {
		for s, want := range map[string]bool{"verify.example.com": true, "localhost:8080": true, "127.0.0.1:8080": true, "[::1]:8080": true,
			"": false, "https://x.example": false, "x.example/path": false, "a b": false} {
			if ValidDomain(s) != want {
				t.Errorf("ValidDomain(%q) = %v", s, !want)
			}
		}
	})
}
