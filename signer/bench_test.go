package signer

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

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
// in the protocol's statuses and never panic.
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
	f.Add(`{"context":"json-schema-verifier/verify-schema-attestation/v1","key_version":"k1","attested_at":"2026-11-29T21:00:00Z","response":{"result":"pass"}}`)
	f.Add(`{"context":"json-schema-verifier/trust-score-attestation/v1","key_version":"k2","attested_at":"2026-11-29T21:00:00Z","response":{"a":[1,2.5e300,"\ud800"]}}`)
	f.Add(`{"context":1}`)
	f.Add(`{"response":{"a":1,"a":2}}`)
	f.Add(`[]`)
	f.Fuzz(func(t *testing.T, body string) {
		req := httptest.NewRequest(http.MethodPost, PathSign, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, req)
		switch rec.Code {
		case 200, 409, 413, 422:
		default:
			t.Fatalf("status %d for %q", rec.Code, body)
		}
	})
}
