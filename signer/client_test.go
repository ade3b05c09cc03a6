package signer

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/receipt"
)

// fakeCertd is a FAKE certd answering every sign request with body: it
// stands for a certd that misbehaves (a bug, a bad build, a proxy that
// rewrites bodies), a fault the real one cannot be made to produce.
func fakeCertd(t *testing.T, body string) *Client {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	return NewClient(ClientConfig{URL: srv.URL, Secret: "s"})
}

// The client passes on only an attestation every verifier takes: what it
// returns is what verifierd attaches to a receipt and bills for. A
// signature in a base64 other readers refuse (a line break, nonzero pad
// bits), or members read in another letter case, must be an error, never a
// receipt that package receipt, JavaScript or openssl refuses.
func TestClientTakesOnlyAnAttestationVerifiersTake(t *testing.T) {
	priv := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{2}, ed25519.SeedSize))
	const kv, ts = "k2", "2026-11-29T21:22:28.123456+00:00"
	resp := []byte(`{"result":"fail","output_hash":"` + strings.Repeat("ab", 32) + `","verified_at":"` + ts + `","verify":{"key_version":"` + kv + `"}}`)
	good, err := receipt.Sign(priv, receipt.ContextVerify, kv, ts, resp)
	if err != nil {
		t.Fatal(err)
	}
	answer := func(members string) string {
		return `{"algorithm":"Ed25519","key_version":"` + kv + `","timestamp":"` + ts + `",` + members + `}`
	}
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	padBits := []byte(good.Signature)
	i := len(padBits) - 3 // the last character of the 64 bytes holds 4 pad bits
	padBits[i] = alphabet[strings.IndexByte(alphabet, padBits[i])|1]

	for _, tc := range []struct {
		desc, answer string
		verifies     bool // else the client must refuse the answer
	}{
		{"the genuine signature", answer(`"signature":"` + good.Signature + `"`), true},
		{"a signature with a line break", answer(`"signature":"` + good.Signature[:10] + `\n` + good.Signature[10:] + `"`), false},
		{"a signature with a CR LF", answer(`"signature":"` + good.Signature[:10] + `\r\n` + good.Signature[10:] + `"`), false},
		{"a signature with nonzero pad bits", answer(`"signature":"` + string(padBits) + `"`), false},
		{"a signature under the name Signature", answer(`"Signature":"` + good.Signature + `"`), false},
		// An attestation has four members, and verifiers refuse any other
		// (it is not signed); certd writes none. (Before: taken.)
		{"a signature, then Signature with a line break", answer(`"signature":"` + good.Signature + `","Signature":"` + good.Signature[:10] + `\n` + good.Signature[10:] + `"`), false},
		{"a signature, then a member verified", answer(`"signature":"` + good.Signature + `","verified":true`), false},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			att, err := fakeCertd(t, tc.answer).Sign(context.Background(), receipt.ContextVerify, kv, ts, resp)
			if !tc.verifies {
				var ae *apierr.Error
				if !errors.As(err, &ae) || ae.Code != apierr.CodeInternal {
					t.Fatalf("Sign = %+v, %v; want an internal_error, not a receipt", att, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Sign: %v", err)
			}
			if att != good {
				t.Fatalf("Sign = %+v, want %+v", att, good)
			}
			rec := append(append(append(resp[:len(resp)-1:len(resp)-1], `,"attestation":`...), att.AppendJSON(nil)...), '}')
			if err := receipt.VerifyReceipt(rec, receipt.SingleKey(kv, priv.Public().(ed25519.PublicKey)), ""); err != nil {
				t.Fatalf("the receipt the client makes is refused: %v", err)
			}
		})
	}
}

// FuzzReadAttestation feeds arbitrary sign answers to the client's reader
// and checks it against package receipt's reading of the same object as a
// receipt's attestation: an answer the client takes with algorithm Ed25519
// and an RFC 3339 timestamp gets past every check Verify makes before the
// signature (so it fails only there, the key being another), and an answer
// Verify reads that far the client takes too.
func FuzzReadAttestation(f *testing.F) {
	priv := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{2}, ed25519.SeedSize))
	good, err := receipt.Sign(priv, receipt.ContextVerify, "k2", "2026-11-29T21:22:28.123456+00:00", []byte(`{}`))
	if err != nil {
		f.Fatal(err)
	}
	base := string(good.AppendJSON(nil))
	sig := good.Signature
	for _, s := range []string{
		base,
		strings.Replace(base, sig, sig[:10]+`\n`+sig[10:], 1),
		strings.Replace(base, sig, sig[:10]+`\r`+sig[10:], 1),
		strings.Replace(base, sig, sig[:len(sig)-3]+"x==", 1),
		strings.Replace(base, sig, strings.TrimRight(sig, "="), 1),
		strings.Replace(base, `"signature"`, `"Signature"`, 1),
		strings.Replace(base, `"signature"`, `"ſignature"`, 1),
		strings.Replace(base, `}`, `,"Signature":"x"}`, 1),
		strings.Replace(base, `"signature"`, `"signature":"x","signature"`, 1),
		strings.Replace(base, `"k2"`, `1`, 1),
		`[` + base + `]`, `null`, ``,
	} {
		f.Add(s)
	}
	other := receipt.SingleKey("", ed25519.NewKeyFromSeed(bytes.Repeat([]byte{3}, ed25519.SeedSize)).Public().(ed25519.PublicKey))
	f.Fuzz(func(t *testing.T, answer string) {
		att, err := readAttestation([]byte(answer))
		_, verr := receipt.Verify([]byte(`{"attestation":`+answer+`}`), other, receipt.ContextVerify)
		pastReading := errors.Is(verr, receipt.ErrSignature)
		if err != nil {
			if pastReading {
				t.Fatalf("the client refuses an answer receipt.Verify reads: %v", err)
			}
			return
		}
		if _, derr := receipt.DecodeSignature(att.Signature); derr != nil {
			t.Fatalf("took signature %q: %v", att.Signature, derr)
		}
		if _, terr := receipt.ParseTime(att.Timestamp); att.Algorithm == receipt.Algorithm && att.KeyVersion != "" && terr == nil && !pastReading {
			t.Fatalf("the client takes %+v, which receipt.Verify refuses before the signature: %v", att, verr)
		}
	})
}
