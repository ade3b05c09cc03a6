package verify

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/aovhq/aov/receipt"
)

// sameAsCanonicalized fails unless r's direct canonical writer gives exactly
// the bytes of the one canonicalizer run over r's JSON.
func sameAsCanonicalized(t testing.TB, r *Result) {
	t.Helper()
	want, err := receipt.AppendCanonicalJSON(nil, r.AppendJSON(nil))
	if err != nil {
		t.Fatalf("canonicalizing AppendJSON: %v", err)
	}
	if got := r.AppendCanonical(nil); !bytes.Equal(got, want) {
		t.Fatalf("AppendCanonical differs from AppendCanonicalJSON(AppendJSON)\n got %s\nwant %s", got, want)
	}
	// Appending after existing bytes leaves them alone.
	if got := r.AppendCanonical([]byte("x")); !bytes.Equal(got, append([]byte("x"), want...)) {
		t.Fatal("AppendCanonical does not append")
	}
}

// The results of real checks: the SPEC §5 request_hash vectors and the
// SPEC §10 worked example passing and failing, in full and compact detail,
// unsigned (as they are signed) and with an attestation.
func TestAppendCanonicalOfSpecResults(t *testing.T) {
	v := New(Config{VerifierVersion: "test"})
	requests := []string{invoiceRequest("135.0"), invoiceRequest("129.5")}
	for _, vec := range specVectors {
		requests = append(requests, vec.request)
	}
	for _, body := range requests {
		for _, detail := range []string{"full", "compact"} {
			r := check(t, v, body[:len(body)-1]+`,"detail":"`+detail+`"}`)
			sameAsCanonicalized(t, r)
			sameAsCanonicalized(t, signed(r))
		}
	}
}

// The failing worked example, canonical, with the attestation left out as
// signing leaves it out: every object's keys sorted, ratios as ECMAScript
// prints them ("1", not "1.0").
func TestAppendCanonicalWorkedExampleBytes(t *testing.T) {
	r := signed(check(t, New(Config{VerifierVersion: "test"}), invoiceRequest("135.0")))
	r.Attestation = nil
	got := string(r.AppendCanonical(nil))
	for _, want := range []string{
		`{"agent_id":"seller-7","enforce_rules":true,"errors":[`,
		`"integrity_checks":{"passed":0,"ratio":0,"total":1},"next_actions":[{"action":"repair_and_reverify","using":"hints"}],`,
		`"schema_compliance":{"passed":`,
		`"summary":{"blocking_checks":["consistency:sum_equals"],"result":"fail"},"task_id":"invoice-7731",`,
		`"verify":{"canonicalization":"RFC 8785 (JCS)","hash_algorithm":"SHA-256","key_version":"k1","mcp":"https://v.example/mcp","public_key_url":"https://v.example/.well-known/agent-card.json","service":"aov"}}`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("canonical result lacks %s\n%s", want, got)
		}
	}
	if strings.Contains(got, "attestation") || strings.Contains(got, ".0,") {
		t.Errorf("canonical result has an attestation or a non-canonical number:\n%s", got)
	}
}

// oddStrings are the strings that canonical form writes in a particular
// way: escapes, controls, invalid UTF-8 (written as U+FFFD), characters
// JavaScript escapes but RFC 8785 does not, and characters outside the BMP
// (a surrogate pair in UTF-16).
var oddStrings = []string{"", `"`, `\`, "\x00", "\x1f", "\x7f", "\b\f\n\r\t", "\xff", "a\xc3", "\xed\xa0\x80",
	"\u2028\u2029", "café ✓", "😀", "\U0010ffff", "</script>", "line_items[0].line_total", "é\u0301", "\ufeff"}

func randString(rng *rand.Rand) string {
	var b strings.Builder
	for n := rng.IntN(4); n >= 0; n-- {
		if rng.IntN(3) == 0 {
			b.WriteString(oddStrings[rng.IntN(len(oddStrings))])
		} else {
			b.WriteByte(byte(rng.IntN(256)))
		}
	}
	return b.String()
}

func randInt(rng *rand.Rand) int {
	switch rng.IntN(4) {
	case 0:
		return 0
	case 1:
		return rng.IntN(10)
	case 2:
		return rng.IntN(1 << 20)
	default:
		return rng.IntN(1<<53) - 1<<52 // every safe integer, negative too
	}
}

func randStrings(rng *rand.Rand) []string {
	var l []string
	for n := rng.IntN(4); n > 0; n-- {
		l = append(l, randString(rng))
	}
	return l
}

// randResult fills every field of a Result at random, including the ones a
// real check never produces (negative counts, more passed than total).
func randResult(rng *rand.Rand) *Result {
	s := func() string { return randString(rng) }
	r := &Result{
		VerificationID: s(), TaskID: s(), BlockingChecks: randStrings(rng),
		Hashes:     receipt.Hashes{Output: s(), Schema: s(), Rules: s(), Request: s()},
		VerifiedAt: s(), VerifierVersion: s(),
		EnforceRules: rng.IntN(2) == 0, StrictContentCheck: rng.IntN(2) == 0,
		Errors: randStrings(rng), ErrorsTotal: randInt(rng),
		ErrorsDetailTotal: randInt(rng), FlagsTotal: randInt(rng), HintsTotal: randInt(rng),
		Verify: receipt.VerifyBlock{PublicKeyURL: s(), KeyVersion: s(), Canonicalization: s(), HashAlgorithm: s(), Service: s(), MCP: s()},
	}
	r.Result = []string{ResultPass, ResultFail, s()}[rng.IntN(3)]
	r.Detail = []string{DetailFull, DetailCompact, ""}[rng.IntN(3)]
	if rng.IntN(2) == 0 {
		a := s()
		r.AgentID = &a
	}
	for n := rng.IntN(3); n > 0; n-- {
		r.ErrorsDetail = append(r.ErrorsDetail, ErrorDetail{Check: s(), Path: s(), Expected: s(), Found: s(), Message: s()})
		r.Flags = append(r.Flags, Flag{Check: s(), Field: s(), Severity: s(), Detail: s()})
		r.Hints = append(r.Hints, Hint{Source: s(), Check: s(), Path: s(), Expected: s(), Found: s()})
	}
	tally := func() Tally {
		total := []int{0, 1, 3, 7, 999_999, 1_000_001, 3_000_000, randInt(rng)}[rng.IntN(8)]
		return Tally{Passed: rng.IntN(max(total, 0) + 2), Total: total}
	}
	r.Schema, r.Integrity, r.Overall = tally(), tally(), tally()
	if rng.IntN(2) == 0 {
		r.Attestation = &receipt.Attestation{Algorithm: s(), KeyVersion: s(), Timestamp: s(), Signature: s()}
	}
	return r
}

func TestAppendCanonicalOfRandomResults(t *testing.T) {
	rng := rand.New(rand.NewPCG(16, 3))
	for range 5000 {
		sameAsCanonicalized(t, randResult(rng))
	}
}

// FuzzAppendCanonical drives the random results from the fuzzer's seed and
// puts its strings in every string field.
func FuzzAppendCanonical(f *testing.F) {
	f.Add(uint64(1), "", "", 0, 0)
	f.Add(uint64(2), "café ✓\u2028", "\xff\"\\", 1, 3)
	f.Add(uint64(3), "😀", "\x00\x1f", 999_999, 1_000_001)
	f.Fuzz(func(t *testing.T, seed uint64, a, b string, passed, total int) {
		r := randResult(rand.New(rand.NewPCG(seed, 0)))
		r.TaskID, r.VerifiedAt, r.Verify.Service = a, b, a+b
		r.Errors = append(r.Errors, a, b)
		r.Flags = append(r.Flags, Flag{Check: a, Field: b, Severity: a, Detail: b})
		if passed >= -1<<53 && passed <= 1<<53 && total >= -1<<53 && total <= 1<<53 {
			r.Overall = Tally{Passed: passed, Total: total}
		}
		sameAsCanonicalized(t, r)
	})
}

// BenchmarkSignedForm is what a verification writes to be signed and sent,
// the two ways: "canonicalize" writes the response and canonicalizes it
// (the way before AppendCanonical), "direct" writes the response and its
// canonical form each directly. The result is the failing SPEC §10 example,
// whose response is about 4 KB.
func BenchmarkSignedForm(b *testing.B) {
	r := signed(New(Config{VerifierVersion: "test"}).Check(mustParse(b, invoiceRequest("135.0")), "6f1c2a4e-8d3b-4c5a-9e7f-0a1b2c3d4e5f", verifiedAt))
	r.Attestation = nil
	doc, canon := make([]byte, 0, 8<<10), make([]byte, 0, 8<<10)
	b.Run("canonicalize", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			doc = r.AppendJSON(doc[:0])
			var err error
			if canon, err = receipt.AppendCanonicalJSON(canon[:0], doc); err != nil {
				b.Fatal(err)
			}
		}
		b.SetBytes(int64(len(doc)))
	})
	b.Run("direct", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			doc = r.AppendJSON(doc[:0])
			canon = r.AppendCanonical(canon[:0])
		}
		b.SetBytes(int64(len(doc)))
	})
}

func mustParse(b *testing.B, body string) *Request {
	req, err := New(Config{VerifierVersion: "test"}).Parse([]byte(body))
	if err != nil {
		b.Fatal(err)
	}
	return req
}
