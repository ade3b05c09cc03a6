package keystore

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// `certd compromise` (a PublicOnly store) marks the current key k1 and
// writes k2.key, which the serving store cannot load (here a mode it
// refuses; in the field e.g. a root-owned file left by `sudo certd
// compromise`). The serving store must not go on signing with k1, the key
// the index on disk now marks compromised: Current refuses and names the
// cause, List already publishes the new history, and signing resumes with
// k2 once its file loads.
func TestAReloadThatCannotLoadTheNewKeyStopsSigning(t *testing.T) {
	for _, watched := range []bool{false, true} {
		dir := t.TempDir()
		c := newClock()
		serving, err := Open(dir, Options{Now: c.Now, CurrentOnly: true, Watch: watched})
		if err != nil {
			t.Fatal(err)
		}
		defer serving.Close()
		if _, err := serving.Generate(); err != nil {
			t.Fatal(err)
		}
		operator, err := Open(dir, Options{Now: c.Now, PublicOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		c.Add(time.Hour)
		if _, err := operator.MarkCompromised("k1", c.Now().Add(-time.Minute)); err != nil {
			t.Fatal(err)
		}
		k2Path := filepath.Join(dir, "k2.key")
		if err := os.Chmod(k2Path, 0o644); err != nil {
			t.Fatal(err)
		}
		for i := range 2 { // the failure holds, it is not a one-off error
			if _, err := serving.Refresh(); err == nil || !strings.Contains(err.Error(), "loading key k2") {
				t.Fatalf("watched %v: Refresh %d with k2.key unloadable: err = %v", watched, i+1, err)
			}
			cur, err := serving.Current()
			if err == nil {
				t.Fatalf("watched %v: Current = %s after the index marked k1 compromised and k2 could not be loaded", watched, cur.Version)
			}
			if !strings.Contains(err.Error(), "chmod 600 "+k2Path) {
				t.Errorf("watched %v: Current's error %q does not carry the cause", watched, err)
			}
		}
		if got := versions(serving.List()); got != "k1:compromised,k2:current" {
			t.Errorf("watched %v: List = %s; the compromise must be published although k2 cannot sign", watched, got)
		}
		for _, k := range serving.List() {
			if k.Private != nil {
				t.Errorf("watched %v: the store still holds the private key of %s", watched, k.Version)
			}
		}
		if err := os.Chmod(k2Path, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := serving.Refresh(); err != nil {
			t.Fatalf("watched %v: Refresh after the repair: %v", watched, err)
		}
		if cur, err := serving.Current(); err != nil || cur.Version != "k2" || cur.Private == nil {
			t.Fatalf("watched %v: after the repair Current = %s, %v", watched, cur.Version, err)
		}
	}
}

// An index that cannot even be stat'ed stops signing too, until it can.
// The stat error is a fake (statIndex replaced): an I/O error on the key
// directory cannot be caused portably, and a directory without search
// permission does not stop root.
func TestAnIndexThatCannotBeCheckedStopsSigning(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, newClock())
	if _, err := s.Generate(); err != nil {
		t.Fatal(err)
	}
	fakeIOError := &os.PathError{Op: "stat", Path: filepath.Join(dir, IndexFile), Err: syscall.EIO}
	statIndex = func(string) (os.FileInfo, error) { return nil, fakeIOError }
	t.Cleanup(func() { statIndex = os.Stat })
	if _, err := s.Refresh(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("Refresh with the index unreadable: err = %v", err)
	}
	if cur, err := s.Current(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("Current with the index unreadable = %s, %v; want a refusal carrying the cause", cur.Version, err)
	}
	statIndex = os.Stat
	if _, err := s.Refresh(); err != nil {
		t.Fatalf("Refresh once the index can be read: %v", err)
	}
	if cur, err := s.Current(); err != nil || cur.Version != "k1" {
		t.Fatalf("Current once the index can be read = %s, %v", cur.Version, err)
	}
}
