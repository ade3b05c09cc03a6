package receipt

import (
	"bytes"
	"strings"
	"testing"
)

// SigningInputCanonical builds, around a response already canonical, the
// bytes SigningInput builds from any form of it, and ParseSigningInput
// accepts them; it refuses what SigningInput refuses.
func TestSigningInputCanonical(t *testing.T) {
	resp := []byte(`{ "verify": {"key_version":"k1"}, "result":"pass", "n": 1.0, "s":"caf\u00e9"}`)
	canon, err := Canonicalize(resp)
	if err != nil {
		t.Fatal(err)
	}
	want, err := SigningInput(ContextVerify, "k1", "2026-11-29T21:22:28.123456+00:00", resp)
	if err != nil {
		t.Fatal(err)
	}
	got, err := SigningInputCanonical(ContextVerify, "k1", "2026-11-29T21:22:28.123456+00:00", canon)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("SigningInputCanonical = %s, %v\nwant %s", got, err, want)
	}
	if d, err := ParseSigningInput(got); err != nil || !bytes.Equal(d.Response, canon) {
		t.Fatalf("ParseSigningInput: %+v, %v", d, err)
	}
	for _, c := range []struct{ desc, resp, ctx, want string }{
		{"not an object", `[1]`, ContextVerify, "not a JSON object"},
		{"empty", ``, ContextVerify, "not a JSON object"},
		{"an attestation", `{"attestation":{},"result":"pass"}`, ContextVerify, "already carries an attestation"},
		{"no context", `{}`, "", "are required"},
	} {
		if _, err := SigningInputCanonical(c.ctx, "k1", "t", []byte(c.resp)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want %q", c.desc, err, c.want)
		}
	}
}

// AppendNumber writes ECMAScript's form, as the canonicalizer does.
func TestAppendNumber(t *testing.T) {
	for _, c := range []struct {
		f    float64
		want string
	}{{0, "0"}, {1, "1"}, {0.954545, "0.954545"}, {1e-6, "0.000001"}, {1e-7, "1e-7"}, {1e21, "1e+21"}, {-2.5, "-2.5"}, {123456789, "123456789"}} {
		if got := string(AppendNumber([]byte("x"), c.f)); got != "x"+c.want {
			t.Errorf("AppendNumber(%v) = %s, want x%s", c.f, got, c.want)
		}
	}
}

// plain8 never calls a block plain that holds a byte AppendString must
// look at, whatever the byte and its place.
func TestPlain8(t *testing.T) {
	for pos := range 8 {
		for c := range 256 {
			b := []byte("abcdefgh")
			b[pos] = byte(c)
			look := c < 0x20 || c == '"' || c == '\\' || c >= 0x80
			if got := plain8(string(b)); got == look {
				t.Errorf("plain8(%q) = %v", b, got)
			}
		}
	}
}
