package receipt

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gowebpki/jcs"
)

// nestedObjects is one JSON value nested depth objects deep with a string
// of pad bytes at the bottom: each level holds the next under "b" and a 0
// under "a", the next level first (members out of order) when unsorted.
// top is written before the first level; the caller closes it.
func nestedObjects(depth, pad int, top string, unsorted bool) []byte {
	open, closing := `{"a":0,"b":`, `}`
	if unsorted {
		open, closing = `{"b":`, `,"a":0}`
	}
	var b bytes.Buffer
	b.WriteString(top)
	for range depth {
		b.WriteString(open)
	}
	b.WriteString(`"` + strings.Repeat("x", pad) + `"`)
	for range depth {
		b.WriteString(closing)
	}
	return b.Bytes()
}

// hostileReceipt is a receipt of size bytes (within maxReceiptBytes) nested
// as deep as the canonicalizer allows, with or without its members in order.
// It has a trust score's shape (no output_hash, a computed_at at its
// timestamp), so Verify goes as far as the signature.
func hostileReceipt(size int, unsorted bool) []byte {
	const depth = maxAppendDepth - 100
	top := `{"attestation":{"algorithm":"Ed25519","key_version":"k1","timestamp":"2026-01-01T00:00:00Z","signature":"` + strings.Repeat("A", 86) + `=="},"computed_at":"2026-01-01T00:00:00Z","x":`
	doc := nestedObjects(depth, size-depth*len(`{"b":,"a":0}`)-len(top)-len(`""}`), top, unsorted)
	return append(doc, '}')
}

// Out-of-order members are put in order, at every depth, as the reference
// implementation orders them: objects out of order inside objects in and
// out of order, inside arrays, and keys whose order needs UTF-16.
func TestCanonicalizeOrdersNestedObjectsAsTheReference(t *testing.T) {
	for _, in := range []string{
		string(nestedObjects(50, 3, "", true)),
		`{"z":{"y":{"b":1,"a":[{"d":{"f":1,"e":2},"c":3},{"b":{"a":1}}]},"x":0},"a":{"c":{"e":1,"d":2},"d":{"b":2,"a":1}},"m":[{"b":1,"a":2}]}`,
		`{"b":{"a":{"d":1,"c":2}},"a":{"b":{"d":1,"c":2},"a":{"d":1,"c":2}}}`,
		`[{"b":{"\u0062":1,"a":2},"a":0},{"a":{"b":1}},{"\ud83d\ude00":{"y":1,"x":2},"\ufb33":{"y":1,"x":2},"\u00e9":[]}]`,
		`{"a":{"c":1,"b":{"e":1,"d":1}},"b":2}`,
		` { "b" : { "d" : [ { "y" : 1 , "x" : 2 } ] , "c" : 3 } , "a" : "\n" } `,
	} {
		want, err := jcs.Transform([]byte(in))
		if err != nil {
			t.Fatalf("reference: %v", err)
		}
		got, err := Canonicalize([]byte(in))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("Canonicalize(%.80s) = %.200s, %v; want %.200s", in, got, err, want)
		}
		prefixed, err := AppendCanonicalJSON([]byte("prefix"), []byte(in))
		if err != nil || string(prefixed) != "prefix"+string(want) {
			t.Errorf("AppendCanonicalJSON after a prefix: %.200s, %v", prefixed, err)
		}
	}
	for _, in := range []string{
		`{"b":{"d":1,"c":2},"a":{"y":1,"x":2,"y":3}}`,
		`{"b":{"d":1,"c":2,"d":3},"a":0}`,
		`{"b":{"y":1,"x":2},"a":0,"b":1}`,
	} {
		if got, err := AppendCanonicalJSON([]byte("prefix"), []byte(in)); err != errDuplicateKey || string(got) != "prefix" {
			t.Errorf("AppendCanonicalJSON(%s) = %q, %v; want the prefix and a duplicate key error", in, got, err)
		}
	}
}

// Putting members in order costs time linear in the document, however
// deep the objects out of order are nested: a receipt or card nested
// thousands of levels deep, each level out of order, once made each
// level copy the whole document below it again (an 8 MiB receipt took 10
// to 19 seconds in VerifyReceipt before its signature was looked at, a
// 1 MiB card most of a second in KeysFromCard, after FetchCard's
// deadline). Each is timed against the same document with its members in
// order.
func TestNestedObjectsOutOfOrderCostWhatObjectsInOrderCost(t *testing.T) {
	pub, _, _ := ed25519.GenerateKey(nil)
	keys := SingleKey("", pub)
	timed := func(f func()) time.Duration {
		start := time.Now()
		f()
		return time.Since(start)
	}
	check := func(what string, sorted, unsorted time.Duration) {
		t.Logf("%s: members in order %v, out of order %v", what, sorted, unsorted)
		if unsorted > 4*sorted+200*time.Millisecond {
			t.Errorf("%s took %v with members out of order, %v in order", what, unsorted, sorted)
		}
	}
	var errs [2]error
	rs, ru := hostileReceipt(maxReceiptBytes, false), hostileReceipt(maxReceiptBytes, true)
	check("VerifyReceipt of an 8 MiB receipt",
		timed(func() { errs[0] = VerifyReceipt(rs, keys, "") }),
		timed(func() { errs[1] = VerifyReceipt(ru, keys, "") }))
	for _, err := range errs {
		if !errors.Is(err, ErrSignature) {
			t.Fatalf("a receipt with a made-up signature: %v, want %v", err, ErrSignature)
		}
	}
	cs := append(nestedObjects(maxAppendDepth-100, MaxCardBytes-(maxAppendDepth-100)*12-10, `{"x":`, false), '}')
	cu := append(nestedObjects(maxAppendDepth-100, MaxCardBytes-(maxAppendDepth-100)*12-10, `{"x":`, true), '}')
	check("KeysFromCard of a 1 MiB card",
		timed(func() { _, errs[0] = KeysFromCard(cs) }),
		timed(func() { _, errs[1] = KeysFromCard(cu) }))
}

// BenchmarkCanonicalizeNestedOutOfOrder is the hostile shape: a 1 MiB
// document nested thousands of objects deep, every one out of order.
func BenchmarkCanonicalizeNestedOutOfOrder(b *testing.B) {
	raw := hostileReceipt(1<<20, true)
	b.ReportAllocs()
	b.SetBytes(int64(len(raw)))
	for b.Loop() {
		if _, err := Canonicalize(raw); err != nil {
			b.Fatal(err)
		}
	}
}
