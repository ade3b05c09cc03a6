package signer

import (
	"bytes"
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/receipt"
)

// The in-process signer refuses, as a 500, exactly the responses certd
// refuses for the times they state (receipt.SigningDocument.CheckTimes),
// through Sign and SignCanonical, under either context, and signs the
// others. (Before: Local never ran the check, and signed a score
// "computed" years ahead, or with evidence dated after it, that certd
// refused and every verifier refuses.)
func TestLocalSignerRefusesWhatCertdRefuses(t *testing.T) {
	f := start(t, fixtureOpts{})
	l, err := NewLocal(f.keysDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	ctx := context.Background()
	kv, err := l.CurrentKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	at := nowString()
	t0, err := receipt.ParseTime(at)
	if err != nil {
		t.Fatal(err)
	}
	twoSecondsAhead := t0.Add(2 * time.Second).Format(time.RFC3339Nano)
	good := sampleResponse(kv, at, 256)
	swap := func(old, new string) []byte { return bytes.Replace(good, []byte(old), []byte(new), 1) }
	for _, tc := range []struct {
		desc   string
		resp   []byte
		refuse bool
	}{
		{"a response whose times are the signing instant", good, false},
		{"computed_at years ahead", swap(`"computed_at":"`+at, `"computed_at":"2029-11-29T21:00:00Z`), true},
		{"verified_at years behind", swap(`"verified_at":"`+at, `"verified_at":"2020-01-01T00:00:01Z`), true},
		{"verified_at that is a number", swap(`"verified_at":"`+at+`"`, `"verified_at":1`), true},
		{"computed_at written with an escape in its name", swap(`"computed_at":"`+at, `"computed\u005fat":"2029-11-29T21:00:00Z`), true},
		{"newest evidence years ahead", swap(`"computed_at"`, `"inputs":{"window":{"newest_evidence_at":"2029-11-29T21:00:00Z"}},"computed_at"`), true},
		{"newest evidence 2 s ahead", swap(`"computed_at"`, `"inputs":{"window":{"newest_evidence_at":"`+twoSecondsAhead+`"}},"computed_at"`), true},
		{"a window ending years ahead", swap(`"computed_at"`, `"inputs":{"owned":true,"window":{"from":null,"to":"2029-11-29T21:00:00Z"}},"computed_at"`), true},
		{"a window ending at the signing instant, with no evidence", swap(`"computed_at"`, `"inputs":{"owned":true,"window":{"from":null,"newest_evidence_at":null,"to":"`+at+`"}},"computed_at"`), false},
		{"a computed_at years ahead elsewhere than at the top", swap(`"computed_at"`, `"flags2":[{"computed_at":"2029-11-29T21:00:00Z"}],"inputs":{"window":[]},"computed_at"`), false},
	} {
		for _, sc := range []string{receipt.ContextVerify, receipt.ContextScore} {
			_, remoteErr := f.client("").Sign(ctx, sc, kv, at, tc.resp)
			if (remoteErr != nil) != tc.refuse {
				t.Fatalf("%s, %s: certd answers %v; want refused %v", tc.desc, sc, remoteErr, tc.refuse)
			}
			canon, err := receipt.Canonicalize(tc.resp)
			if err != nil {
				t.Fatal(err)
			}
			for path, sign := range map[string]func() (receipt.Attestation, error){
				"Sign":          func() (receipt.Attestation, error) { return l.Sign(ctx, sc, kv, at, tc.resp) },
				"SignCanonical": func() (receipt.Attestation, error) { return l.SignCanonical(ctx, sc, kv, at, canon) },
			} {
				att, err := sign()
				if !tc.refuse {
					if err != nil {
						t.Errorf("%s, %s, %s: certd signs it, the in-process signer refuses: %v", tc.desc, sc, path, err)
					} else {
						checkSignature(t, f.keys, sc, tc.resp, att)
					}
					continue
				}
				if ae, ok := err.(*apierr.Error); !ok || ae.Status != http.StatusInternalServerError {
					t.Errorf("%s, %s, %s: certd refuses (%v), the in-process signer answers %+v, %v; want a 500", tc.desc, sc, path, remoteErr, att, err)
				}
			}
		}
	}
}
