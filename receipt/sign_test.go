package receipt

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
)

func TestSigningInputIsTheCanonicalFiveKeyDocument(t *testing.T) {
	resp := []byte(`{ "result": "pass", "verify": {"key_version":"k1"}, "n": 10.0, "é": "\u00e9" }`)
	got, err := SigningInput(ContextVerify, "k1", "2026-11-29T21:22:28.123456+00:00", resp)
	if err != nil {
		t.Fatal(err)
	}
	// The same document built as a tree and canonicalized the slow way.
	tree := map[string]any{
		"context":     ContextVerify,
		"algorithm":   "Ed25519",
		"key_version": "k1",
		"attested_at": "2026-11-29T21:22:28.123456+00:00",
		"response":    decodeTree(t, resp),
	}
	want, err := AppendCanonical(nil, tree)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	const literal = `{"algorithm":"Ed25519","attested_at":"2026-11-29T21:22:28.123456+00:00","context":"json-schema-verifier/verify-schema-attestation/v1","key_version":"k1","response":{"n":10,"result":"pass","verify":{"key_version":"k1"},"é":"é"}}`
	if string(got) != literal {
		t.Errorf("got  %s\nwant %s", got, literal)
	}
}

func TestSigningInputRefuses(t *testing.T) {
	tests := []struct {
		desc, context, kv, at, resp string
	}{
		{desc: "a response that still carries its attestation", context: ContextVerify, kv: "k1", at: "t", resp: `{"a":1,"attestation":{"signature":"x"}}`},
		{desc: "a response that is not an object", context: ContextVerify, kv: "k1", at: "t", resp: `[1]`},
		{desc: "a response that is not JSON", context: ContextVerify, kv: "k1", at: "t", resp: `{`},
		{desc: "a response with duplicate keys", context: ContextVerify, kv: "k1", at: "t", resp: `{"result":"pass","result":"fail"}`},
		{desc: "an empty context", context: "", kv: "k1", at: "t", resp: `{}`},
		{desc: "an empty key version", context: ContextVerify, kv: "", at: "t", resp: `{}`},
		{desc: "an empty attested_at", context: ContextVerify, kv: "k1", at: "", resp: `{}`},
		{desc: "a key version that is not UTF-8", context: ContextVerify, kv: "\xff", at: "t", resp: `{}`},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			if got, err := SigningInput(tc.context, tc.kv, tc.at, []byte(tc.resp)); err == nil {
				t.Fatalf("accepted: %s", got)
			}
		})
	}
}

func TestSigningInputFindsAttestationOnlyAtTheTopLevel(t *testing.T) {
	tests := []struct {
		desc, resp string
		want       bool
	}{
		{desc: "top level", resp: `{"attestation":1}`, want: true},
		{desc: "top level after other keys", resp: `{"a":{"attestation":1},"attestation":2}`, want: true},
		{desc: "nested only", resp: `{"a":{"attestation":1}}`},
		{desc: "as a string value", resp: `{"a":"attestation","b":["\"attestation\":"]}`},
		{desc: "inside an escaped key", resp: `{"x\"attestation":1}`},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			c, err := Canonicalize([]byte(tc.resp))
			if err != nil {
				t.Fatal(err)
			}
			if got := hasTopLevelAttestation(c); got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSignProducesAVerifiableAttestation(t *testing.T) {
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	resp := []byte(`{"result":"pass","verified_at":"2026-11-29T21:22:28.123456+00:00"}`)
	att, err := Sign(priv, ContextVerify, "k7", "2026-11-29T21:22:28.123456+00:00", resp)
	if err != nil {
		t.Fatal(err)
	}
	if att.Algorithm != "Ed25519" || att.KeyVersion != "k7" || att.Timestamp != "2026-11-29T21:22:28.123456+00:00" {
		t.Errorf("attestation fields: %+v", att)
	}
	sig, err := base64.StdEncoding.DecodeString(att.Signature)
	if err != nil || len(sig) != ed25519.SignatureSize {
		t.Fatalf("signature is not std base64 of 64 bytes: %q (%v)", att.Signature, err)
	}
	msg, _ := SigningInput(ContextVerify, "k7", att.Timestamp, resp)
	if !ed25519.Verify(pub, msg, sig) {
		t.Error("signature does not verify over the signing input")
	}
	other, _ := SigningInput(ContextScore, "k7", att.Timestamp, resp)
	if ed25519.Verify(pub, other, sig) {
		t.Error("signature verifies under the other context")
	}
	if _, err := Sign(priv[:10], ContextVerify, "k7", "t", resp); err == nil || !strings.Contains(err.Error(), "private key") {
		t.Errorf("short key: %v", err)
	}
}

// Attestation.AppendJSON writes what encoding/json writes for the strings
// an attestation holds (encoding/json also escapes <, >, &, U+2028 and
// U+2029, which none of them contain), and what it writes always decodes
// back to the same attestation.
func TestAttestationAppendJSON(t *testing.T) {
	for _, a := range []Attestation{
		{Algorithm: Algorithm, KeyVersion: "k12", Timestamp: "2026-11-29T21:22:28.123456+00:00", Signature: "q83vEjRWeJA+/w=="},
		{},
		{Algorithm: "x\"y\\z", KeyVersion: "k\n\t\u0001", Timestamp: "é€😀", Signature: "AAAA"},
	} {
		want, err := json.Marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		got := a.AppendJSON([]byte("prefix"))
		if !bytes.HasPrefix(got, []byte("prefix")) || !bytes.Equal(got[len("prefix"):], want) {
			t.Errorf("AppendJSON(%+v) = %s, want %s", a, got, want)
		}
		var back Attestation
		if err := json.Unmarshal(got[len("prefix"):], &back); err != nil || back != a {
			t.Errorf("AppendJSON(%+v) decodes to %+v, %v", a, back, err)
		}
	}
}

// stringEndByteWise is the byte-at-a-time string skip stringEnd replaced:
// the reference it is held to.
func stringEndByteWise(b []byte, open int) int {
	i := open + 1
	for ; i < len(b) && b[i] != '"'; i++ {
		if b[i] == '\\' {
			i++
		}
	}
	return min(i, len(b))
}

// FuzzStringEnd: stringEnd finds the closing quote the byte-at-a-time scan
// finds, in any bytes, so hasTopLevelAttestation and objectEnd decide as
// they did.
func FuzzStringEnd(f *testing.F) {
	for _, s := range []string{`"abc"`, `"a\"b"`, `"a\\"b"`, `"a\\\"b"`, `"\\\\"`, `"unterminated`, `"ends\`, `""`, `"\u0022"x"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for open := range b {
			if b[open] != '"' {
				continue
			}
			if got, want := stringEnd(b, open), stringEndByteWise(b, open); got != want {
				t.Fatalf("%q from %d: stringEnd %d, byte-wise %d", b, open, got, want)
			}
		}
	})
}
