package keystore

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A clock that stepped back (an NTP correction, a restored VM) must not
// date a rotation or a compromise mark: k1 would be retired before it was
// created and k2 created before k1, and verifiers would reject k1's
// receipts. Both commands refuse, name both times, and change nothing.
func TestRotateAndCompromiseRefuseAClockBehindTheIndex(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	s := open(t, dir, c)
	k1, err := s.Generate()
	if err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(filepath.Join(dir, IndexFile))
	if err != nil {
		t.Fatal(err)
	}
	c.Add(-2 * time.Hour) // the clock steps back
	behind := c.Now()
	for name, change := range map[string]func() error{
		"rotate":     func() error { _, err := s.Rotate(); return err },
		"compromise": func() error { return s.MarkCompromised("k1", behind.Add(-time.Minute)) },
	} {
		err := change()
		if err == nil {
			t.Fatalf("%s with the clock behind the index was accepted: %s", name, versions(s.List()))
		}
		for _, want := range []string{formatTime(behind), formatTime(k1.CreatedAt), "created_at of key k1", "nothing was changed"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: error %q does not mention %q", name, err, want)
			}
		}
	}
	after, err := os.ReadFile(filepath.Join(dir, IndexFile))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		t.Errorf("the refused changes rewrote the index:\n%s", after)
	}
	if _, err := os.Stat(filepath.Join(dir, "k2.key")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused rotation left k2.key: %v", err)
	}
	// Once the clock is right again, rotation works.
	c.Add(3 * time.Hour)
	if k2, err := s.Rotate(); err != nil || k2.Version != "k2" {
		t.Fatalf("Rotate with the clock corrected = %s, %v", k2.Version, err)
	}
}

// The index is restored from a backup older than the last rotation (what
// the "index disappeared" error tells the operator to do). The next rotate
// must not take the version k2 again and overwrite k2.key, the private key
// of the k2 that already signed receipts: it refuses, names the file, and
// leaves the file and the index as they were.
func TestRotateAfterAnIndexRestoreNeverOverwritesAKeyFile(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	s := open(t, dir, c)
	if _, err := s.Generate(); err != nil {
		t.Fatal(err)
	}
	backup, err := os.ReadFile(filepath.Join(dir, IndexFile))
	if err != nil {
		t.Fatal(err)
	}
	c.Add(time.Hour)
	if _, err := s.Rotate(); err != nil {
		t.Fatal(err)
	}
	k2File, err := os.ReadFile(filepath.Join(dir, "k2.key"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, IndexFile), backup, 0o644); err != nil {
		t.Fatal(err)
	}
	restored := open(t, dir, c)
	c.Add(time.Hour)
	for name, change := range map[string]func() error{
		"rotate":     func() error { _, err := restored.Rotate(); return err },
		"compromise": func() error { return restored.MarkCompromised("k1", c.Now().Add(-time.Minute)) },
	} {
		err := change()
		var stray *StrayKeyFilesError
		if !errors.As(err, &stray) || strings.Join(stray.Files, ",") != "k2.key" {
			t.Fatalf("%s after the restore: err = %v, want a refusal naming k2.key", name, err)
		}
		if !strings.Contains(err.Error(), "k2.key") || !strings.Contains(err.Error(), "nothing was changed") {
			t.Errorf("%s: error %q does not name the file or say nothing changed", name, err)
		}
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "k2.key")); !bytes.Equal(got, k2File) {
		t.Error("the private key file of k2 was overwritten")
	}
	if got, _ := os.ReadFile(filepath.Join(dir, IndexFile)); !bytes.Equal(got, backup) {
		t.Errorf("the refused rotation rewrote the index:\n%s", got)
	}
	if got := versions(restored.List()); got != "k1:current" {
		t.Errorf("List after the refusals = %s", got)
	}
}

// With the index gone entirely, a first key (certd -dev generates one on an
// empty index) must not overwrite k1.key either.
func TestGenerateRefusesWhereAKeyFileIsLeft(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, newClock())
	if _, err := s.Generate(); err != nil {
		t.Fatal(err)
	}
	k1File, _ := os.ReadFile(filepath.Join(dir, "k1.key"))
	if err := os.Remove(filepath.Join(dir, IndexFile)); err != nil {
		t.Fatal(err)
	}
	_, err := open(t, dir, newClock()).Generate()
	var stray *StrayKeyFilesError
	if !errors.As(err, &stray) || strings.Join(stray.Files, ",") != "k1.key" {
		t.Fatalf("Generate next to k1.key without an index: err = %v, want a refusal naming k1.key", err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "k1.key")); !bytes.Equal(got, k1File) {
		t.Error("k1.key was overwritten")
	}
}

// The refusal lists the stray files in version order and caps the list.
func TestStrayKeyFilesErrorListsAtMostFive(t *testing.T) {
	e := &StrayKeyFilesError{Dir: "keys", Files: []string{"k2.key", "k3.key", "k4.key", "k5.key", "k6.key", "k7.key", "k10.key"}}
	if got := e.Error(); !strings.Contains(got, "keys holds k2.key, k3.key, k4.key, k5.key, k6.key (+2 more), which") {
		t.Errorf("Error() = %q", got)
	}
}
