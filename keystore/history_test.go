package keystore

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// serve opens dir as a signing process does (certd serve, verifierd's
// in-process signer).
func serve(t *testing.T, dir string, c *clock) *Store {
	t.Helper()
	s, err := OpenSigner(dir, c.Now)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// publics is the history as the card publishes it: versions, statuses and
// public keys.
func publics(keys []Key) string {
	var b strings.Builder
	for i, st := range Statuses(keys, afterAll) {
		b.WriteString(keys[i].Version + ":" + st + ":" + base64.StdEncoding.EncodeToString(keys[i].Public) + ",")
	}
	return b.String()
}

// A running process never takes back part of the key history it loaded:
// an index that drops a version, gives one another public key or start,
// un-retires it, or removes or delays its compromise mark is refused like
// an index that cannot be read. Signing stops, the history stays as it
// was loaded, the error says what changed and what to do, and putting the
// newest index back resumes signing with no restart.
func TestAnIndexThatTakesBackKeyHistoryIsRefused(t *testing.T) {
	otherPub, _, _ := ed25519.GenerateKey(rand.Reader)
	cases := []struct {
		name   string
		change func(*index)
		want   string
	}{
		{"an index restored from before the last rotation", func(x *index) {
			x.Keys = x.Keys[:1]
			x.Keys[0].RetiredAt = ""
		}, "no longer names key k2"},
		{"an index with no keys", func(x *index) { x.Keys = []indexEntry{} }, "no longer names key k1"},
		{"another public key", func(x *index) {
			x.Keys[1].PublicKey = base64.StdEncoding.EncodeToString(otherPub)
		}, "gives key k2 another public_key"},
		{"another created_at", func(x *index) { x.Keys[1].CreatedAt = "2026-11-29T13:30:00Z" }, "changes the created_at of key k2"},
		{"a retirement undone", func(x *index) { x.Keys[0].RetiredAt = "" }, "no longer retires key k1"},
		{"a retirement moved", func(x *index) { x.Keys[0].RetiredAt = "2026-11-29T12:30:00Z" }, "changes the retired_at of key k1"},
		{"a compromise mark removed", func(x *index) { x.Keys[0].CompromisedSince = "" }, "no longer marks key k1 compromised"},
		{"a compromise mark moved later", func(x *index) { x.Keys[0].CompromisedSince = "2026-11-29T12:40:00Z" }, "moves the compromise mark of key k1 later"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			c := newClock()
			operator := open(t, dir, c)
			if _, err := operator.Generate(); err != nil {
				t.Fatal(err)
			}
			c.Add(time.Hour)
			if _, err := operator.Rotate(); err != nil {
				t.Fatal(err)
			}
			if _, err := operator.MarkCompromised("k1", c.Now().Add(-30*time.Minute)); err != nil {
				t.Fatal(err)
			}
			newest, err := os.ReadFile(filepath.Join(dir, IndexFile))
			if err != nil {
				t.Fatal(err)
			}
			serving := serve(t, dir, c)
			loaded := publics(serving.List())
			if cur, err := serving.Current(); err != nil || cur.Version != "k2" {
				t.Fatalf("Current = %s, %v", cur.Version, err)
			}

			rewriteIndex(t, dir, tc.change)
			for i := range 2 { // every request tries again, and is refused again
				_, err := serving.Refresh()
				if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "put the newest index back") {
					t.Fatalf("Refresh %d: err = %v; want a refusal saying it %s and what to do", i+1, err, tc.want)
				}
				if cur, err := serving.Current(); err == nil {
					t.Fatalf("Current = %s after the index took back part of the history", cur.Version)
				}
				if got := publics(serving.List()); got != loaded {
					t.Fatalf("List = %s\nwant the history loaded before, %s", got, loaded)
				}
			}

			if err := os.WriteFile(filepath.Join(dir, IndexFile), newest, 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := serving.Refresh(); err != nil {
				t.Fatalf("Refresh with the newest index back: %v", err)
			}
			if cur, err := serving.Current(); err != nil || cur.Version != "k2" || cur.Private == nil {
				t.Fatalf("Current with the newest index back = %s, %v", cur.Version, err)
			}
		})
	}
}

// What rotate and compromise write adds to the history, and loads: a new
// version, a retirement, a compromise mark, a mark moved earlier.
func TestAnIndexThatAddsToKeyHistoryLoads(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	operator := open(t, dir, c)
	if _, err := operator.Generate(); err != nil {
		t.Fatal(err)
	}
	serving := serve(t, dir, c)
	steps := []struct {
		name string
		do   func() error
		want string
	}{
		{"rotate", func() error { _, err := operator.Rotate(); return err }, "k1:retired,k2:current"},
		{"mark a retired key", func() error { _, err := operator.MarkCompromised("k1", c.Now().Add(-time.Minute)); return err }, "k1:compromised,k2:current"},
		{"move the mark earlier", func() error { _, err := operator.MarkCompromised("k1", c.Now().Add(-2*time.Hour)); return err }, "k1:compromised,k2:current"},
		{"mark the current key", func() error { _, err := operator.MarkCompromised("k2", c.Now().Add(-time.Minute)); return err }, "k1:compromised,k2:compromised,k3:current"},
	}
	for _, st := range steps {
		c.Add(time.Hour)
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if _, err := serving.Refresh(); err != nil {
			t.Fatalf("%s: Refresh: %v", st.name, err)
		}
		if got := versions(serving.List()); got != st.want {
			t.Fatalf("%s: List = %s, want %s", st.name, got, st.want)
		}
		if _, err := serving.Current(); err != nil {
			t.Fatalf("%s: Current: %v", st.name, err)
		}
	}
	if k, _ := serving.Lookup("k1"); !k.CompromisedSince.Equal(c.Now().Add(-3 * time.Hour)) {
		t.Errorf("k1's mark = %v, want it moved earlier", k.CompromisedSince)
	}
}

// A signing process that starts where a key file is numbered above the
// newest version the index names (an index restored from an older backup,
// or a rotation interrupted before it wrote the index) opens, publishes
// the history the index holds, and signs nothing, naming the file and both
// ways out, until the operator takes one; moving the file out of the
// directory (the interrupted rotation) resumes signing with no restart.
// Operator commands, which never sign, open the directory as before.
func TestAStartWithAKeyFileNewerThanTheIndexSignsNothing(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	operator := open(t, dir, c)
	if _, err := operator.Generate(); err != nil {
		t.Fatal(err)
	}
	backup, err := os.ReadFile(filepath.Join(dir, IndexFile))
	if err != nil {
		t.Fatal(err)
	}
	c.Add(time.Hour)
	if _, err := operator.Rotate(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, IndexFile), backup, 0o644); err != nil {
		t.Fatal(err)
	}

	serving := serve(t, dir, c)
	for i := range 2 {
		_, err := serving.Current()
		var newer *NewerKeyFilesError
		if !errors.As(err, &newer) || strings.Join(newer.Stray.Files, ",") != "k2.key" || newer.Newest != "k1" {
			t.Fatalf("Current %d = %v; want a refusal naming k2.key", i+1, err)
		}
		for _, want := range []string{"k2.key", "restore the newest one", "move the file out of the directory"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("the refusal %q does not say %q", err, want)
			}
		}
		if got := versions(serving.List()); got != "k1:current" {
			t.Fatalf("List = %s, want the history the index holds", got)
		}
		if _, err := serving.Refresh(); err == nil {
			t.Fatal("Refresh succeeded with k2.key still newer than the index")
		}
	}
	if ks, err := Open(dir, Options{PublicOnly: true}); err != nil || versions(ks.List()) != "k1:current" {
		t.Fatalf("an operator's store: %v", err)
	}

	if err := os.Rename(filepath.Join(dir, "k2.key"), filepath.Join(t.TempDir(), "k2.key")); err != nil {
		t.Fatal(err)
	}
	if _, err := serving.Refresh(); err != nil {
		t.Fatalf("Refresh once the file is moved out: %v", err)
	}
	if cur, err := serving.Current(); err != nil || cur.Version != "k1" {
		t.Fatalf("Current once the file is moved out = %s, %v", cur.Version, err)
	}
}

// Only a start looks for newer key files: a rotation writes its key file
// before the index that names it, and a running process that sees the file
// first goes on signing with its current key.
func TestARunningProcessSignsWhileARotationWritesItsKeyFile(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	operator := open(t, dir, c)
	if _, err := operator.Generate(); err != nil {
		t.Fatal(err)
	}
	serving := serve(t, dir, c)
	if err := os.WriteFile(filepath.Join(dir, "k2.key"), []byte("the key file of a rotation whose index is not written yet"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := serving.Refresh(); err != nil {
		t.Fatalf("Refresh: %v", err)
	}
	if cur, err := serving.Current(); err != nil || cur.Version != "k1" {
		t.Fatalf("Current = %s, %v", cur.Version, err)
	}
}

// Only what loadKeyFile could load is the trace of a newer key: a directory
// or a dangling symbolic link named k2.key does not stop a start from
// signing; a link to a regular file does.
func TestOnlyALoadableFileCountsAsANewerKeyFile(t *testing.T) {
	for _, tc := range []struct {
		name  string
		make  func(path string) error
		stops bool
	}{
		{"directory", func(p string) error { return os.Mkdir(p, 0o700) }, false},
		{"dangling link", func(p string) error { return os.Symlink(filepath.Join(filepath.Dir(p), "nowhere"), p) }, false},
		{"link to a file", func(p string) error {
			target := filepath.Join(filepath.Dir(p), "elsewhere")
			if err := os.WriteFile(target, []byte("key"), 0o600); err != nil {
				return err
			}
			return os.Symlink(target, p)
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			c := newClock()
			if _, err := open(t, dir, c).Generate(); err != nil {
				t.Fatal(err)
			}
			if err := tc.make(filepath.Join(dir, "k2.key")); err != nil {
				t.Fatal(err)
			}
			cur, err := serve(t, dir, c).Current()
			var newer *NewerKeyFilesError
			if stopped := errors.As(err, &newer); stopped != tc.stops {
				t.Fatalf("Current = %q, %v; want stopped=%v", cur.Version, err, tc.stops)
			}
			if !tc.stops && cur.Version != "k1" {
				t.Fatalf("Current = %q; want k1", cur.Version)
			}
		})
	}
}
