package signer

import (
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/keystore"
	"github.com/aovhq/aov/receipt"
)

// The in-process signer signs what certd signs, byte for byte: Ed25519 is
// deterministic, so the same response, key version and instant give the
// same signature over the socket and in process.
func TestLocalSignsLikeCertd(t *testing.T) {
	f := start(t, fixtureOpts{})
	l, err := NewLocal(f.keysDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := l.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	kv, err := l.CurrentKey(ctx)
	if err != nil || kv != "k1" {
		t.Fatalf("CurrentKey = %q, %v", kv, err)
	}
	c := f.client("")
	for _, sc := range []string{receipt.ContextVerify, receipt.ContextScore} {
		at := nowString()
		resp := sampleResponse(kv, at, 2048)
		att, err := l.Sign(ctx, sc, kv, at, resp)
		if err != nil {
			t.Fatalf("Sign: %v", err)
		}
		checkSignature(t, f.keys, sc, resp, att)
		remote, err := c.Sign(ctx, sc, kv, at, resp)
		if err != nil {
			t.Fatal(err)
		}
		if att != remote {
			t.Fatalf("in process %+v, over the socket %+v", att, remote)
		}
	}
	if _, err := l.Sign(ctx, "aov.other.v1", kv, nowString(), sampleResponse(kv, nowString(), 256)); apierr.From(err).Status != http.StatusInternalServerError {
		t.Fatalf("an unknown context: err = %v, want a 500", err)
	}
	resp := sampleResponse(kv, nowString(), 256)
	withAtt := append(resp[:len(resp)-1:len(resp)-1], `,"attestation":{}}`...)
	if _, err := l.Sign(ctx, receipt.ContextVerify, kv, nowString(), withAtt); apierr.From(err).Status != http.StatusInternalServerError {
		t.Fatalf("a response carrying an attestation: err = %v, want a 500", err)
	}
}

// A rotation by certd (another Store on the same directory, as `certd
// rotate` is another process) is picked up on the next signature: a
// response built for the old key gets StaleKeyError naming the new one,
// and the rebuilt one is signed by it.
func TestLocalFollowsRotation(t *testing.T) {
	f := start(t, fixtureOpts{})
	l, err := NewLocal(f.keysDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if kv, _ := l.CurrentKey(ctx); kv != "k1" {
		t.Fatalf("CurrentKey = %q", kv)
	}
	operator, err := keystore.Open(f.keysDir, keystore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := operator.Rotate(); err != nil {
		t.Fatal(err)
	}
	at := nowString()
	_, err = l.Sign(ctx, receipt.ContextVerify, "k1", at, sampleResponse("k1", at, 512))
	var stale *StaleKeyError
	if !errors.As(err, &stale) || stale.Current != "k2" {
		t.Fatalf("Sign with the retired key: err = %v, want StaleKeyError{k2}", err)
	}
	if kv, _ := l.CurrentKey(ctx); kv != "k2" {
		t.Fatalf("CurrentKey after the rotation = %q, want k2", kv)
	}
	resp := sampleResponse("k2", at, 512)
	att, err := l.Sign(ctx, receipt.ContextVerify, "k2", at, resp)
	if err != nil || att.KeyVersion != "k2" {
		t.Fatalf("Sign = %+v, %v", att, err)
	}
	checkSignature(t, operator, receipt.ContextVerify, resp, att)
	// A compromised current key never signs again: marking it rotates.
	if _, err := operator.MarkCompromised("k2", operator.List()[1].CreatedAt); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Sign(ctx, receipt.ContextVerify, "k2", at, resp); !errors.As(err, &stale) || stale.Current != "k3" {
		t.Fatalf("Sign with the compromised key: err = %v, want StaleKeyError{k3}", err)
	}
}

// `certd rotate` and `certd compromise` are other processes. Once one has
// returned, the very next signature in process is refused for the key it
// replaced (StaleKeyError naming the new one), with no delay: the kernel
// reports the replaced index before the other process's rename returns,
// and the signer looks for that report before every signature.
func TestLocalFollowsARotationByAnotherProcess(t *testing.T) {
	f := start(t, fixtureOpts{})
	l, err := NewLocal(f.keysDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	ctx := context.Background()
	operate := func(op string) {
		t.Helper()
		cmd := exec.Command(os.Args[0], "-test.run=^TestKeyOperatorProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), "AOV_TEST_KEYS_DIR="+f.keysDir, "AOV_TEST_KEYS_OP="+op)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("certd %s in another process: %v\n%s", op, err, out)
		}
	}
	sign := func(kv string) error {
		at := nowString()
		_, err := l.SignCanonical(ctx, receipt.ContextVerify, kv, at, canonical(t, sampleResponse(kv, at, 512)))
		return err
	}
	for range 100 {
		if err := sign("k1"); err != nil {
			t.Fatalf("Sign with k1: %v", err)
		}
	}
	for _, c := range []struct{ op, old, next string }{{"rotate", "k1", "k2"}, {"compromise", "k2", "k3"}} {
		operate(c.op)
		var stale *StaleKeyError
		if err := sign(c.old); !errors.As(err, &stale) || stale.Current != c.next {
			t.Fatalf("the first signature with %s after certd %s: err = %v, want StaleKeyError{%s}", c.old, c.op, err, c.next)
		}
		if err := sign(c.next); err != nil {
			t.Fatalf("Sign with %s: %v", c.next, err)
		}
	}
}

// TestKeyOperatorProcess is the other process of
// TestLocalFollowsARotationByAnotherProcess: it does to the key directory
// what `certd rotate` or `certd compromise` does (the same keystore calls),
// then exits.
func TestKeyOperatorProcess(t *testing.T) {
	dir := os.Getenv("AOV_TEST_KEYS_DIR")
	if dir == "" {
		t.Skip("run by TestLocalFollowsARotationByAnotherProcess")
	}
	ks, err := keystore.Open(dir, keystore.Options{PublicOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	switch op := os.Getenv("AOV_TEST_KEYS_OP"); op {
	case "rotate":
		_, err = ks.Rotate()
	case "compromise":
		cur, _ := ks.Current()
		_, err = ks.MarkCompromised(cur.Version, time.Now().Add(-time.Second))
	default:
		t.Fatalf("unknown operation %q", op)
	}
	if err != nil {
		t.Fatal(err)
	}
}

func canonical(t *testing.T, doc []byte) []byte {
	t.Helper()
	c, err := receipt.Canonicalize(doc)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Without a key the in-process signer is a retryable 503 (like an
// unreachable certd) until certd makes the first key; it never makes one.
func TestLocalWithoutKeys(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "keys")
	if _, err := NewLocal(dir, nil); err == nil {
		t.Fatal("NewLocal on a missing directory succeeded")
	}
	if _, err := os.Stat(dir); err == nil {
		t.Fatal("NewLocal created the missing key directory")
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	l, err := NewLocal(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, err := range []error{l.Ping(ctx), func() error { _, err := l.CurrentKey(ctx); return err }()} {
		if e := apierr.From(err); e.Status != http.StatusServiceUnavailable {
			t.Fatalf("without a key: err = %v, want 503", err)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("the in-process signer wrote into the key directory: %v", entries)
	}
	certd, err := keystore.Open(dir, keystore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := certd.Generate(); err != nil {
		t.Fatal(err)
	}
	if kv, err := l.CurrentKey(ctx); err != nil || kv != "k1" {
		t.Fatalf("after certd made a key: CurrentKey = %q, %v", kv, err)
	}
}

// A private key file others can read is refused, as certd refuses it.
func TestLocalRefusesAReadableKeyFile(t *testing.T) {
	f := start(t, fixtureOpts{})
	if err := os.Chmod(filepath.Join(f.keysDir, "k1.key"), 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := NewLocal(f.keysDir, nil); err == nil {
		t.Fatal("NewLocal accepted a key file readable by its group")
	}
}

// The in-process signer holds the current private key alone: a key rotated
// away is no longer in its memory.
func TestLocalHoldsOnlyTheCurrentKey(t *testing.T) {
	f := start(t, fixtureOpts{})
	l, err := NewLocal(f.keysDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := f.keys.Rotate(); err != nil {
		t.Fatal(err)
	}
	if err := l.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	for _, k := range l.keys.List() {
		if (k.Private != nil) != (k.Version == "k2") {
			t.Errorf("key %s: private held %v", k.Version, k.Private != nil)
		}
	}
}

// SignCanonical signs a response already in canonical form exactly as Sign
// signs any form of it, in process and over the socket; certd still
// refuses an input that is not canonical (the caller's word is not taken
// over the socket), and neither signer signs a response that carries an
// attestation.
func TestSignCanonicalSignsLikeSign(t *testing.T) {
	f := start(t, fixtureOpts{})
	l, err := NewLocal(f.keysDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	c := f.client("")
	kv, at := "k1", nowString()
	resp := sampleResponse(kv, at, 1024)
	loose := append([]byte("{ "), resp[1:]...) // the same document, not canonical
	canon, err := receipt.Canonicalize(resp)
	if err != nil {
		t.Fatal(err)
	}
	want, err := l.Sign(ctx, receipt.ContextVerify, kv, at, loose)
	if err != nil {
		t.Fatal(err)
	}
	checkSignature(t, f.keys, receipt.ContextVerify, loose, want)
	for name, s := range map[string]interface {
		SignCanonical(context.Context, string, string, string, []byte) (receipt.Attestation, error)
	}{"in process": l, "over the socket": c} {
		got, err := s.SignCanonical(ctx, receipt.ContextVerify, kv, at, canon)
		if err != nil || got != want {
			t.Fatalf("%s: SignCanonical = %+v, %v; Sign gave %+v", name, got, err, want)
		}
		withAtt := append(canon[:len(canon)-1:len(canon)-1], `,"attestation":{}}`...)
		if _, err := s.SignCanonical(ctx, receipt.ContextVerify, kv, at, withAtt); apierr.From(err).Status != http.StatusInternalServerError {
			t.Fatalf("%s: a response carrying an attestation: err = %v, want a 500", name, err)
		}
	}
	if _, err := c.SignCanonical(ctx, receipt.ContextVerify, kv, at, loose); apierr.From(err).Status != http.StatusInternalServerError {
		t.Fatalf("certd signed a signing input that is not canonical: err = %v, want a 500", err)
	}
}
