package signer

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gowebpki/jcs"

	"github.com/aovhq/aov/keystore"
	"github.com/aovhq/aov/receipt"
)

// BenchmarkSignRoundTripUnix is one verifierd → certd signature of a
// typical 2 KB verification response over the unix socket.
func BenchmarkSignRoundTripUnix(b *testing.B) {
	f := start(b, fixtureOpts{})
	c := f.client("")
	ctx := context.Background()
	at := nowString()
	resp := sampleResponse("k1", at, 2048)
	b.SetBytes(int64(len(resp)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := c.Sign(ctx, receipt.ContextVerify, "k1", at, resp); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSign is the signature alone (canonicalize + Ed25519) of the same
// 2 KB response, for comparison with the round trip.
func BenchmarkSign(b *testing.B) {
	ks, err := keystore.Open(b.TempDir(), keystore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	k, err := ks.Generate()
	if err != nil {
		b.Fatal(err)
	}
	at := nowString()
	resp := sampleResponse("k1", at, 2048)
	b.SetBytes(int64(len(resp)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := receipt.Sign(k.Private, receipt.ContextVerify, "k1", at, resp); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzSignRequest feeds arbitrary bodies to the sign handler: it must answer
// in the protocol's statuses and never panic, and whatever it signs must be
// a signing input exactly as receipt.SigningInput builds it, canonical by
// the reference implementation (gowebpki/jcs) too.
func FuzzSignRequest(f *testing.F) {
	ks, err := keystore.Open(f.TempDir(), keystore.Options{})
	if err != nil {
		f.Fatal(err)
	}
	if _, err := ks.Generate(); err != nil {
		f.Fatal(err)
	}
	fixed := time.Date(2026, 11, 29, 21, 0, 0, 0, time.UTC)
	srv, err := NewServer(ServerConfig{Keys: ks, Now: func() time.Time { return fixed }, MaxBodyBytes: 1 << 16})
	if err != nil {
		f.Fatal(err)
	}
	for _, c := range []string{receipt.ContextVerify, receipt.ContextScore} {
		for _, resp := range []string{`{"result":"pass"}`, `{"a":[1,2.5e300,"\u00e9"],"b":{}}`, string(sampleResponse("k1", "2026-11-29T21:00:00Z", 512))} {
			b, err := receipt.SigningInput(c, "k1", "2026-11-29T21:00:00Z", []byte(resp))
			if err != nil {
				f.Fatal(err)
			}
			f.Add(string(b))
		}
	}
	f.Add(`{"context":"json-schema-verifier/verify-schema-attestation/v1","key_version":"k1","attested_at":"2026-11-29T21:00:00Z","response":{"result":"pass"}}`)
	f.Add(`{"algorithm":"Ed25519","attested_at":"2026-11-29T21:00:00Z","context":"json-schema-verifier/verify-schema-attestation/v1","key_version":"k1","response":{"result":"pass"},"zzz":{}}`)
	f.Add(`{"algorithm":"Ed25519","attested_at":"2026-11-29T21:00:00Z","context":"json-schema-verifier/verify-schema-attestation/v1","key_version":"k1","response":{"a":"}"}}`)
	f.Add(`{"response":{"a":1,"a":2}}`)
	f.Add(`[]`)
	f.Fuzz(func(t *testing.T, body string) {
		req := httptest.NewRequest(http.MethodPost, PathSign, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, req)
		switch rec.Code {
		case 200:
		case 409, 413, 422:
			return
		default:
			t.Fatalf("status %d for %q", rec.Code, body)
		}
		if ref, err := jcs.Transform([]byte(body)); err != nil || string(ref) != body {
			t.Fatalf("signed a document the reference does not hold canonical: %q (%v)", body, err)
		}
		d, err := receipt.ParseSigningInput([]byte(body))
		if err != nil {
			t.Fatalf("signed what ParseSigningInput refuses: %v", err)
		}
		again, err := receipt.SigningInput(d.Context, d.KeyVersion, d.AttestedAt, d.Response)
		if err != nil || string(again) != body {
			t.Fatalf("signed %q, but its parts rebuild %q (%v)", body, again, err)
		}
	})
}

// benchLocal is an in-process signer over a fresh fixture's keys.
func benchLocal(b *testing.B) *Local {
	f := start(b, fixtureOpts{})
	l, err := NewLocal(f.keysDir, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	return l
}

// BenchmarkSignLocal is the same signature by the in-process signer
// (verifierd -signer-keys): the index check, canonicalization and Ed25519,
// without the round trip of BenchmarkSignRoundTripUnix.
func BenchmarkSignLocal(b *testing.B) {
	l := benchLocal(b)
	ctx := context.Background()
	at := nowString()
	resp := sampleResponse("k1", at, 2048)
	b.SetBytes(int64(len(resp)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := l.Sign(ctx, receipt.ContextVerify, "k1", at, resp); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSignLocalCanonical is BenchmarkSignLocal for a response already
// in canonical form, as verifierd signs a verification: the index check
// and Ed25519, nothing canonicalized.
func BenchmarkSignLocalCanonical(b *testing.B) {
	l := benchLocal(b)
	ctx := context.Background()
	at := nowString()
	resp, err := receipt.Canonicalize(sampleResponse("k1", at, 2048))
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(resp)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := l.SignCanonical(ctx, receipt.ContextVerify, "k1", at, resp); err != nil {
			b.Fatal(err)
		}
	}
}
