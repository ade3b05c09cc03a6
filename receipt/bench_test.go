package receipt

import (
	"testing"

	"github.com/gowebpki/jcs"
)

// BenchmarkCanonicalizeHashInvoice is the SPEC §10 request through the raw
// path: the gateway or verifierd holding request bytes.
func BenchmarkCanonicalizeHashInvoice(b *testing.B) {
	raw := []byte(invoiceRequest)
	b.ReportAllocs()
	b.SetBytes(int64(len(raw)))
	for b.Loop() {
		c, err := Canonicalize(raw)
		if err != nil {
			b.Fatal(err)
		}
		_ = Hash(c)
	}
}

// BenchmarkAppendCanonicalHashInvoice is the same request through the tree
// path: verify has already decoded it and hashes parts of the tree.
func BenchmarkAppendCanonicalHashInvoice(b *testing.B) {
	tree := decodeTree(b, []byte(invoiceRequest))
	b.ReportAllocs()
	b.SetBytes(int64(len(invoiceRequest)))
	buf := make([]byte, 0, 1024)
	for b.Loop() {
		c, err := AppendCanonical(buf[:0], tree)
		if err != nil {
			b.Fatal(err)
		}
		_ = Hash(c)
	}
}

// BenchmarkTransformFullResponse and BenchmarkAppendCanonicalFullResponse
// compare the two paths on a realistic full response (about 2 KB).
func BenchmarkTransformFullResponse(b *testing.B) {
	raw := fullResponse(b, "k2")
	b.ReportAllocs()
	b.SetBytes(int64(len(raw)))
	for b.Loop() {
		if _, err := jcs.Transform(raw); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCanonicalizeFullResponse is this package's raw reader on the same
// response; BenchmarkIsCanonicalSigningInput is what certd checks before it
// signs the canonical document it was sent.
func BenchmarkCanonicalizeFullResponse(b *testing.B) {
	raw := fullResponse(b, "k2")
	b.ReportAllocs()
	b.SetBytes(int64(len(raw)))
	for b.Loop() {
		if _, err := Canonicalize(raw); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkIsCanonicalSigningInput(b *testing.B) {
	msg, err := SigningInput(ContextVerify, "k2", fixtureTime, fullResponse(b, "k2"))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(msg)))
	for b.Loop() {
		if !IsCanonical(msg) {
			b.Fatal("not canonical")
		}
	}
}

func BenchmarkAppendCanonicalFullResponse(b *testing.B) {
	raw := fullResponse(b, "k2")
	tree := decodeTree(b, raw)
	b.ReportAllocs()
	b.SetBytes(int64(len(raw)))
	buf := make([]byte, 0, 4096)
	for b.Loop() {
		if _, err := AppendCanonical(buf[:0], tree); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSign(b *testing.B) {
	_, priv := seededKey(1)
	resp := fullResponse(b, "k2")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Sign(priv, ContextVerify, "k2", fixtureTime, resp); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerifyReceipt(b *testing.B) {
	pub, priv := seededKey(1)
	r := attach(b, priv, ContextVerify, "k2", fixtureTime, fullResponse(b, "k2"))
	keys := SingleKey("k2", pub)
	b.ReportAllocs()
	for b.Loop() {
		if err := VerifyReceipt(r, keys, ""); err != nil {
			b.Fatal(err)
		}
	}
}
