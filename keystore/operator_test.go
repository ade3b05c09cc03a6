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
// date a new key: k1 would be retired before it was created and k2 created
// before k1, and verifiers would reject k1's receipts. A rotation refuses,
// names both times, and changes nothing.
func TestRotateRefusesAClockBehindTheIndex(t *testing.T) {
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
	_, err = s.Rotate()
	var clockErr *ClockBehindError
	if !errors.As(err, &clockErr) {
		t.Fatalf("rotate with the clock behind the index: err = %v, want *ClockBehindError; keys %s", err, versions(s.List()))
	}
	for _, want := range []string{formatTime(behind), formatTime(k1.CreatedAt), "created_at of key k1", "nothing was changed"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	after, err := os.ReadFile(filepath.Join(dir, IndexFile))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		t.Errorf("the refused rotation rewrote the index:\n%s", after)
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

// In an emergency the compromise of the current key is recorded even when
// its replacement cannot be created (here the clock is behind the index):
// the key is marked and retired, so nothing signs with it again; signing
// stops (no current key) instead; and the error says the mark IS recorded,
// why the new key was refused, and to run rotate once the cause is fixed.
// The mark's time is the operator's since; retired_at, which would precede
// the key's own created_at, is its created_at (a key compromised since
// before it existed loses nothing by a service life of zero).
func TestCompromiseOfTheCurrentKeyIsRecordedWithTheClockBehind(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	s := open(t, dir, c)
	k1, err := s.Generate()
	if err != nil {
		t.Fatal(err)
	}
	c.Add(-2 * time.Hour) // the clock steps back
	since := c.Now().Add(-time.Minute)
	_, err = s.MarkCompromised("k1", since)
	var refused *ReplacementRefusedError
	var clockErr *ClockBehindError
	if !errors.As(err, &refused) || !errors.As(err, &clockErr) {
		t.Fatalf("compromise with the clock behind: err = %v, want *ReplacementRefusedError wrapping *ClockBehindError", err)
	}
	for _, want := range []string{"k1 IS marked compromised", formatTime(since), formatTime(c.Now()), formatTime(k1.CreatedAt), "Correct the clock", "rotate"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "nothing was changed") {
		t.Errorf("error %q says nothing was changed", err)
	}
	for name, st := range map[string]*Store{"live": s, "reopened": open(t, dir, c)} {
		if got := versions(st.List()); got != "k1:compromised" {
			t.Errorf("%s: List = %s, want k1:compromised", name, got)
		}
		k, _ := st.Lookup("k1")
		if !k.CompromisedSince.Equal(since) || !k.RetiredAt.Equal(k1.CreatedAt) {
			t.Errorf("%s: k1 compromised_since %v retired_at %v, want %v and its created_at %v", name, k.CompromisedSince, k.RetiredAt, since, k1.CreatedAt)
		}
		if _, err := st.Current(); !errors.Is(err, ErrNoKey) {
			t.Errorf("%s: Current after the refused replacement: %v, want ErrNoKey", name, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "k2.key")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused replacement left k2.key: %v", err)
	}
	// Once the clock is right again, rotate creates the new key.
	c.Add(3 * time.Hour)
	if k2, err := s.Rotate(); err != nil || k2.Version != "k2" {
		t.Fatalf("Rotate with the clock corrected = %s, %v", k2.Version, err)
	}
	if got := versions(s.List()); got != "k1:compromised,k2:current" {
		t.Errorf("List after the rotation = %s", got)
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
	// As `certd rotate` and `certd compromise` open it: a store that signs
	// refuses to start signing here (see NewerKeyFilesError).
	restored, err := Open(dir, Options{Now: c.Now, PublicOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	c.Add(time.Hour)
	_, err = restored.Rotate()
	var stray *StrayKeyFilesError
	if !errors.As(err, &stray) || strings.Join(stray.Files, ",") != "k2.key" {
		t.Fatalf("rotate after the restore: err = %v, want a refusal naming k2.key", err)
	}
	if !strings.Contains(err.Error(), "k2.key") || !strings.Contains(err.Error(), "nothing was changed") {
		t.Errorf("rotate: error %q does not name the file or say nothing changed", err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, IndexFile)); !bytes.Equal(got, backup) {
		t.Errorf("the refused rotation rewrote the index:\n%s", got)
	}
	if got := versions(restored.List()); got != "k1:current" {
		t.Errorf("List after the refused rotation = %s", got)
	}

	// A compromise of the current key is recorded all the same (k1 never
	// signs again); only its replacement is refused, for the same reason.
	since := c.Now().Add(-time.Minute)
	_, err = restored.MarkCompromised("k1", since)
	var refused *ReplacementRefusedError
	if !errors.As(err, &refused) || !errors.As(err, &stray) || strings.Join(stray.Files, ",") != "k2.key" {
		t.Fatalf("compromise after the restore: err = %v, want a recorded mark whose replacement was refused naming k2.key", err)
	}
	for _, want := range []string{"k1 IS marked compromised", "k2.key", "rotate"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("compromise: error %q does not mention %q", err, want)
		}
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "k2.key")); !bytes.Equal(got, k2File) {
		t.Error("the private key file of k2 was overwritten")
	}
	reopened, err := Open(dir, Options{Now: c.Now, PublicOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	for name, st := range map[string]*Store{"live": restored, "reopened": reopened} {
		if got := versions(st.List()); got != "k1:compromised" {
			t.Errorf("%s: List after the compromise = %s, want k1:compromised", name, got)
		}
		if k, _ := st.Lookup("k1"); !k.CompromisedSince.Equal(since) || !k.RetiredAt.Equal(c.Now()) {
			t.Errorf("%s: k1 compromised_since %v retired_at %v, want %v and %v", name, k.CompromisedSince, k.RetiredAt, since, c.Now())
		}
		if _, err := st.Current(); !errors.Is(err, ErrNoKey) {
			t.Errorf("%s: Current after the refused replacement: %v, want ErrNoKey", name, err)
		}
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
