package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/aovhq/aov/keystore"
)

// publicHealth asks certd's public /health and reports its status code and
// the key version it names.
func publicHealth(t *testing.T, addr string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/health")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var body struct {
		KeyVersion string `json:"key_version"`
	}
	json.Unmarshal(b, &body)
	return resp.StatusCode, body.KeyVersion
}

// The public /health is asked by monitors and nothing else: it must follow
// the key directory by itself. After `certd compromise` of the current key
// it names the new key, never the compromised one, with no other request
// in between.
func TestPublicHealthFollowsACompromise(t *testing.T) {
	keys := filepath.Join(shortDir(t), "keys")
	if out, errOut, code := certd(t, "rotate", "-keys", keys); code != 0 {
		t.Fatalf("rotate: %s %s", out, errOut)
	}
	sock := filepath.Join(shortDir(t), "certd.sock")
	d := startServe(t, "-keys", keys, "-sign-socket", sock, "-public-listen", "127.0.0.1:0")
	if code, kv := publicHealth(t, d.publicAddr); code != 200 || kv != "k1" {
		t.Fatalf("health before the compromise: %d %q", code, kv)
	}
	if out, errOut, code := certd(t, "compromise", "-keys", keys, "-version", "k1", "-since", time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)); code != 0 {
		t.Fatalf("compromise: %d %s %s", code, out, errOut)
	}
	if code, kv := publicHealth(t, d.publicAddr); code != 200 || kv != "k2" {
		t.Errorf("public /health right after `certd compromise -version k1`: %d %q; want 200 naming k2", code, kv)
	}
	d.stop(t, os.Interrupt)
}

// README's `sudo certd compromise` case, watched by the public /health
// alone: 503 while the new key's file does not load, 200 naming it within
// keystore.RetryEvery of the fix.
func TestPublicHealthRecoversWhenTheKeyFileIsFixed(t *testing.T) {
	keys := filepath.Join(shortDir(t), "keys")
	if out, errOut, code := certd(t, "rotate", "-keys", keys); code != 0 {
		t.Fatalf("rotate: %s %s", out, errOut)
	}
	if out, errOut, code := certd(t, "compromise", "-keys", keys, "-version", "k1", "-since", time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)); code != 0 {
		t.Fatalf("compromise: %d %s %s", code, out, errOut)
	}
	k2 := filepath.Join(keys, "k2.key")
	if err := os.Chmod(k2, 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(shortDir(t), "certd.sock")
	d := startServe(t, "-keys", keys, "-sign-socket", sock, "-public-listen", "127.0.0.1:0")
	if code, _ := publicHealth(t, d.publicAddr); code != http.StatusServiceUnavailable {
		t.Fatalf("public /health while k2.key does not load: %d; want 503", code)
	}
	if err := os.Chmod(k2, 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(keystore.RetryEvery + 200*time.Millisecond)
	if code, kv := publicHealth(t, d.publicAddr); code != 200 || kv != "k2" {
		t.Errorf("public /health %s after the key file was fixed: %d %q; want 200 naming k2", keystore.RetryEvery+200*time.Millisecond, code, kv)
	}
	d.stop(t, os.Interrupt)
}
