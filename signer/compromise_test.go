package signer

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/keystore"
	"github.com/aovhq/aov/receipt"
)

// The operator marks the current key k1 compromised, which rotates to k2,
// and k2.key cannot be loaded by the signer (here a mode it refuses; in the
// field e.g. a root-owned file left by `sudo certd compromise`). Neither
// certd's signing endpoint nor verifierd's in-process signer may go on
// signing with k1, the key the index now marks compromised: both answer
// 503 in the error shape, for the old key version and the new one, until
// k2.key loads; then k2 signs.
func TestSigningStopsWhenTheIndexRetiresTheKeyAndTheNewOneCannotLoad(t *testing.T) {
	f := start(t, fixtureOpts{})
	c := f.client("")
	ctx := context.Background()
	l, err := NewLocal(f.keysDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if kv, err := c.CurrentKey(ctx); err != nil || kv != "k1" {
		t.Fatalf("CurrentKey = %q, %v", kv, err)
	}
	if kv, err := l.CurrentKey(ctx); err != nil || kv != "k1" {
		t.Fatalf("Local CurrentKey = %q, %v", kv, err)
	}
	operator, err := keystore.Open(f.keysDir, keystore.Options{PublicOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := operator.MarkCompromised("k1", time.Now().Add(-time.Minute)); err != nil {
		t.Fatal(err)
	}
	k2Path := filepath.Join(f.keysDir, "k2.key")
	if err := os.Chmod(k2Path, 0o644); err != nil {
		t.Fatal(err)
	}
	signers := map[string]interface {
		Sign(ctx context.Context, signContext, keyVersion, attestedAt string, response []byte) (receipt.Attestation, error)
	}{"certd": c, "in-process": l}
	for name, s := range signers {
		for _, kv := range []string{"k1", "k2"} {
			at := nowString()
			att, err := s.Sign(ctx, receipt.ContextVerify, kv, at, sampleResponse(kv, at, 256))
			var ae *apierr.Error
			if !errors.As(err, &ae) || ae.Status != http.StatusServiceUnavailable || ae.Code != apierr.CodeUpstreamUnavailable {
				t.Fatalf("%s signed or answered other than 503 for %s after the index marked k1 compromised and k2 could not load: %+v, %v", name, kv, att, err)
			}
		}
	}
	// The signing endpoint's own answers: 503 in the error shape.
	for _, path := range []string{PathKey, PathHealth} {
		if status, body := f.raw(t, http.MethodGet, path, "", "", nil); status != http.StatusServiceUnavailable || body["code"] != apierr.CodeUpstreamUnavailable {
			t.Errorf("GET %s = %d %v, want 503 %s", path, status, body, apierr.CodeUpstreamUnavailable)
		}
	}
	if err := os.Chmod(k2Path, 0o600); err != nil {
		t.Fatal(err)
	}
	for name, s := range signers {
		at := nowString()
		resp := sampleResponse("k2", at, 256)
		att, err := s.Sign(ctx, receipt.ContextVerify, "k2", at, resp)
		if err != nil {
			t.Fatalf("%s after k2.key was repaired: %v", name, err)
		}
		checkSignature(t, f.keys, receipt.ContextVerify, resp, att)
	}
}
