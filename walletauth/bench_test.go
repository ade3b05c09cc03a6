package walletauth

import (
	"context"
	"testing"
	"time"
)

// BenchmarkVerify is the per-request cost of a proof without the nonce
// write: base64 and strict JSON decoding, field checks, rebuilding the
// text, Keccak and public key recovery.
func BenchmarkVerify(b *testing.B) {
	now := time.Now()
	h, err := SignRequest(testKey, Request{Method: "POST", URL: "https://verifier.example/verify/schema", AgentID: "seller-7", Now: now})
	if err != nil {
		b.Fatal(err)
	}
	v := &Verifier{Now: func() time.Time { return now.Add(time.Second) }}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := v.Verify(ctx, h, want); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParse is the decoding and syntax checking alone.
func BenchmarkParse(b *testing.B) {
	h, err := SignRequest(testKey, Request{Method: "POST", URL: "https://verifier.example/verify/schema", AgentID: "seller-7"})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(h); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkVerifyWithNonce adds the single-use nonce claim in Badger
// (in memory, so the disk's fsync is not measured).
func BenchmarkVerifyWithNonce(b *testing.B) {
	v := &Verifier{Nonces: newDB(b).Claims()}
	headers := make([]string, b.N)
	for i := range headers {
		h, err := SignRequest(testKey, Request{Method: "POST", URL: "https://verifier.example/verify/schema"})
		if err != nil {
			b.Fatal(err)
		}
		headers[i] = h
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := v.Verify(ctx, headers[i], want); err != nil {
			b.Fatal(err)
		}
	}
}
