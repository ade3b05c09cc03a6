package agentcard

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/aovhq/aov/keystore"
	"github.com/aovhq/aov/receipt"
	"github.com/aovhq/aov/signer"
)

// The tests below run certd's two endpoints in process on one key
// directory, as `certd serve` does: the signing handler and the card.

// certdKeys opens dir as `certd serve` does (see openKeys there).
func certdKeys(t *testing.T, dir string) *keystore.Store {
	t.Helper()
	s, err := keystore.Open(dir, keystore.Options{Watch: true, CurrentOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// certdEndpoints returns the signing handler and the card handler on keys.
func certdEndpoints(t *testing.T, keys *keystore.Store) (sign, card http.Handler) {
	t.Helper()
	srv, err := signer.NewServer(signer.ServerConfig{Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	h, err := NewHandler(cfg, keys, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	return srv, h
}

// signReceipt has the signing handler sign a verification response naming
// kv, and returns the status and, on 200, the full receipt.
func signReceipt(t *testing.T, srv http.Handler, kv string) (int, []byte) {
	t.Helper()
	code, _, full := signAt(t, srv, kv, time.Now())
	return code, full
}

// signAt is signReceipt with the receipt dated at; it also returns the
// answer's body.
func signAt(t *testing.T, srv http.Handler, kv string, when time.Time) (int, []byte, []byte) {
	t.Helper()
	at := when.UTC().Format("2006-01-02T15:04:05.000000+00:00")
	resp := []byte(`{"result":"pass","verified_at":"` + at + `","verify":{"key_version":"` + kv + `"}}`)
	body, err := receipt.SigningInput(receipt.ContextVerify, kv, at, resp)
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodPost, signer.PathSign, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	srv.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		return rec.Code, rec.Body.Bytes(), nil
	}
	var doc map[string]any
	if err := json.Unmarshal(resp, &doc); err != nil {
		t.Fatal(err)
	}
	doc["attestation"] = json.RawMessage(rec.Body.Bytes())
	full, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return rec.Code, rec.Body.Bytes(), full
}

// servedKeys fetches the card and parses its keys as a verifier does.
func servedKeys(t *testing.T, h http.Handler) receipt.KeySet {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/.well-known/agent-card.json", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("card: %d %s", rec.Code, rec.Body)
	}
	set, err := receipt.KeysFromCard(rec.Body.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// An index restored from a backup older than the last rotation, while
// certd serves, would have it sign again with k2, which the history it
// loaded retired (receipts a verifier refuses once the newest index is
// back), and drop k3 from the card (k3's receipts stop verifying). certd
// refuses that index: it signs nothing, the card keeps k3, and putting the
// newest index back resumes signing with k3, every receipt verifying.
func TestCertdRefusesAnIndexRestoredFromBeforeTheLastRotation(t *testing.T) {
	dir := t.TempDir()
	c := &clock{t: time.Now().UTC().Add(-3 * time.Hour)}
	operator, err := keystore.Open(dir, keystore.Options{Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := operator.Generate(); err != nil {
		t.Fatal(err)
	}
	c.t = c.t.Add(time.Hour)
	if _, err := operator.Rotate(); err != nil { // k2
		t.Fatal(err)
	}
	backup, err := os.ReadFile(filepath.Join(dir, keystore.IndexFile))
	if err != nil {
		t.Fatal(err)
	}
	c.t = c.t.Add(time.Hour)
	if _, err := operator.Rotate(); err != nil { // k3; k2 retired an hour ago
		t.Fatal(err)
	}
	newest, err := os.ReadFile(filepath.Join(dir, keystore.IndexFile))
	if err != nil {
		t.Fatal(err)
	}

	srv, card := certdEndpoints(t, certdKeys(t, dir))
	code, k3Receipt := signReceipt(t, srv, "k3")
	if code != http.StatusOK {
		t.Fatalf("sign with k3: %d", code)
	}

	if err := os.WriteFile(filepath.Join(dir, keystore.IndexFile), backup, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, kv := range []string{"k2", "k3"} {
		if code, _ := signReceipt(t, srv, kv); code != http.StatusServiceUnavailable {
			t.Errorf("sign with %s after the restore: %d; want 503 until the newest index is back", kv, code)
		}
	}
	if err := receipt.VerifyReceipt(k3Receipt, servedKeys(t, card), receipt.ContextVerify); err != nil {
		t.Errorf("the card served after the restore does not verify a receipt k3 signed: %v", err)
	}

	if err := os.WriteFile(filepath.Join(dir, keystore.IndexFile), newest, 0o644); err != nil {
		t.Fatal(err)
	}
	code, again := signReceipt(t, srv, "k3")
	if code != http.StatusOK {
		t.Fatalf("sign with k3 once the newest index is back: %d", code)
	}
	set := servedKeys(t, card)
	for _, r := range [][]byte{k3Receipt, again} {
		if err := receipt.VerifyReceipt(r, set, receipt.ContextVerify); err != nil {
			t.Errorf("a k3 receipt against the card: %v", err)
		}
	}
}

// -keys named through a symbolic link that is re-pointed (`ln -sfn keys.b
// keys`, a release or restore swap) to a copy of the directory in which k1
// is marked compromised: the next signature and card request see the
// directory the link names now, so certd refuses k1 and the card names the
// new current key.
func TestCertdFollowsASymlinkedKeyDirectoryWhenItIsRepointed(t *testing.T) {
	base := t.TempDir()
	a, b, link := filepath.Join(base, "keys.a"), filepath.Join(base, "keys.b"), filepath.Join(base, "keys")
	c := &clock{t: time.Now().UTC().Add(-2 * time.Hour)}
	op, err := keystore.Open(a, keystore.Options{Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := op.Generate(); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(b, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"k1.key", keystore.IndexFile} {
		data, err := os.ReadFile(filepath.Join(a, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(b, f), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("keys.a", link); err != nil {
		t.Fatal(err)
	}
	srv, card := certdEndpoints(t, certdKeys(t, link))
	if code, _ := signReceipt(t, srv, "k1"); code != http.StatusOK {
		t.Fatalf("sign with k1: %d", code)
	}

	c.t = c.t.Add(time.Hour)
	opB, err := keystore.Open(b, keystore.Options{Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := opB.MarkCompromised("k1", c.t.Add(-30*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("keys.b", link+".tmp"); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(link+".tmp", link); err != nil {
		t.Fatal(err)
	}

	if code, _ := signReceipt(t, srv, "k1"); code == http.StatusOK {
		t.Error("certd signed with k1, which the index -keys names now marks compromised")
	}
	code, k2Receipt := signReceipt(t, srv, "k2")
	if code != http.StatusOK {
		t.Fatalf("sign with k2, current in the directory -keys names now: %d", code)
	}
	set := servedKeys(t, card)
	if set.Current() != "k2" {
		t.Errorf("the card names current %q; the index -keys names now says k2", set.Current())
	}
	if err := receipt.VerifyReceipt(k2Receipt, set, receipt.ContextVerify); err != nil {
		t.Errorf("a k2 receipt against the card: %v", err)
	}
}

// The card is rebuilt whenever anything it publishes of a key changes, the
// public key included: a cached card that kept a replaced public key would
// fail every receipt the new key signs. A running store refuses such a
// history (keystore's checkGrowth), so the handler is given a second store
// here, holding k1 with the same times and another key pair, in place of
// its own: a stand-in for a history that changes only a public key.
func TestCardIsRebuiltWhenOnlyAPublicKeyChanges(t *testing.T) {
	c := &clock{t: time.Now().UTC().Add(-time.Hour)}
	var stores [2]*keystore.Store
	for i := range stores {
		s, err := keystore.Open(t.TempDir(), keystore.Options{Now: c.Now})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Generate(); err != nil {
			t.Fatal(err)
		}
		stores[i] = s
	}
	h, err := NewHandler(cfg, stores[0], 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if servedKeys(t, h).Current() != "k1" {
		t.Fatal("no k1 on the card")
	}
	h.keys = stores[1]
	srv, err := signer.NewServer(signer.ServerConfig{Keys: stores[1]})
	if err != nil {
		t.Fatal(err)
	}
	code, rcpt := signReceipt(t, srv, "k1")
	if code != http.StatusOK {
		t.Fatalf("sign: %d", code)
	}
	if err := receipt.VerifyReceipt(rcpt, servedKeys(t, h), receipt.ContextVerify); err != nil {
		t.Errorf("the card still publishes k1's former public key: %v", err)
	}
}
