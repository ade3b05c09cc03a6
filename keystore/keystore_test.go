package keystore

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 11, 29, 12, 0, 0, 123456000, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func open(t *testing.T, dir string, c *clock) *Store {
	t.Helper()
	s, err := Open(dir, Options{Now: c.Now})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s
}

// afterAll is an instant after every time a test's index holds: the
// statuses at it are those the history settles on.
var afterAll = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)

func versions(keys []Key) string {
	var v []string
	for i, st := range Statuses(keys, afterAll) {
		v = append(v, keys[i].Version+":"+st)
	}
	return strings.Join(v, ",")
}

func TestEmptyDirectoryHasNoCurrentKey(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "keys")
	s := open(t, dir, newClock())
	if _, err := s.Current(); !errors.Is(err, ErrNoKey) {
		t.Fatalf("Current on empty dir: err = %v, want ErrNoKey", err)
	}
	if got := s.List(); len(got) != 0 {
		t.Fatalf("List on empty dir = %v", got)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o700 {
		t.Errorf("created key directory has mode %04o, want 0700", fi.Mode().Perm())
	}
}

func TestGenerateCreatesK1AndRefusesASecondFirstKey(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	s := open(t, dir, c)
	k, err := s.Generate()
	if err != nil {
		t.Fatalf("Generate: %v", err)
	}
	if st := Statuses([]Key{k}, c.Now()); k.Version != "k1" || st[0] != StatusCurrent || !k.CreatedAt.Equal(c.Now()) {
		t.Fatalf("Generate = %s %s created %v", k.Version, st, k.CreatedAt)
	}
	cur, err := s.Current()
	if err != nil || cur.Version != "k1" {
		t.Fatalf("Current = %v, %v", cur.Version, err)
	}
	msg := []byte("signed by k1")
	if !ed25519.Verify(cur.Public, msg, ed25519.Sign(cur.Private, msg)) {
		t.Fatal("the loaded private key does not match its public key")
	}
	if _, err := s.Generate(); !errors.Is(err, ErrKeysExist) {
		t.Fatalf("second Generate: err = %v, want ErrKeysExist", err)
	}
	fi, err := os.Stat(filepath.Join(dir, "k1.key"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("k1.key has mode %04o, want 0600", fi.Mode().Perm())
	}
	leftovers, _ := filepath.Glob(filepath.Join(dir, ".*.tmp-*"))
	if len(leftovers) != 0 {
		t.Errorf("temp files left behind: %v", leftovers)
	}
}

func TestRotationKeepsEveryOldKeyAndRetiresThePrevious(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	s := open(t, dir, c)
	k1, err := s.Generate()
	if err != nil {
		t.Fatal(err)
	}
	c.Add(time.Hour)
	k2, err := s.Rotate()
	if err != nil {
		t.Fatal(err)
	}
	c.Add(time.Hour)
	k3, err := s.Rotate()
	if err != nil {
		t.Fatal(err)
	}
	if k2.Version != "k2" || k3.Version != "k3" {
		t.Fatalf("rotations made %s and %s, want k2 and k3", k2.Version, k3.Version)
	}
	if got, want := versions(s.List()), "k1:retired,k2:retired,k3:current"; got != want {
		t.Fatalf("List = %s, want %s", got, want)
	}
	cur, _ := s.Current()
	if cur.Version != "k3" {
		t.Fatalf("Current = %s, want k3", cur.Version)
	}
	old, ok := s.Lookup("k1")
	if !ok || !old.Public.Equal(k1.Public) || old.Private == nil {
		t.Fatal("k1 is no longer usable after two rotations")
	}
	if want := k1.CreatedAt.Add(time.Hour); !old.RetiredAt.Equal(want) {
		t.Errorf("k1 retired_at = %v, want the instant of the first rotation %v", old.RetiredAt, want)
	}

	// Reopen from disk: the same history comes back.
	again := open(t, dir, c)
	if got, want := versions(again.List()), "k1:retired,k2:retired,k3:current"; got != want {
		t.Fatalf("after reopen List = %s, want %s", got, want)
	}
	for i, k := range again.List() {
		orig := s.List()[i]
		if !k.Public.Equal(orig.Public) || !k.CreatedAt.Equal(orig.CreatedAt) || !k.RetiredAt.Equal(orig.RetiredAt) {
			t.Errorf("after reopen %s differs: %+v vs %+v", k.Version, k, orig)
		}
	}
}

func TestRotateOnEmptyDirectoryCreatesTheFirstKey(t *testing.T) {
	s := open(t, t.TempDir(), newClock())
	k, err := s.Rotate()
	if err != nil || k.Version != "k1" {
		t.Fatalf("Rotate on empty = %s, %v", k.Version, err)
	}
}

// TestMarkCompromisedKeepsTheEarliestMark: marking a marked key again
// moves its mark earlier, never later. A later mark would trust again the
// receipts dated between the two instants, which a thief may have signed.
func TestMarkCompromisedKeepsTheEarliestMark(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	s := open(t, dir, c)
	if _, err := s.Rotate(); err != nil {
		t.Fatal(err)
	}
	c.Add(time.Hour)
	first := c.Now().Add(-30 * time.Minute)
	for _, step := range []struct {
		desc    string
		since   time.Time
		want    time.Time
		changes bool
	}{
		{"the first mark", first, first, true},
		{"a later mark changes nothing", c.Now().Add(-time.Minute), first, false},
		{"the same mark changes nothing", first, first, false},
		{"an earlier mark moves it earlier", first.Add(-10 * time.Minute), first.Add(-10 * time.Minute), true},
	} {
		before, err := os.Stat(filepath.Join(dir, IndexFile))
		if err != nil {
			t.Fatal(err)
		}
		stands, err := s.MarkCompromised("k1", step.since)
		if err != nil {
			t.Fatalf("%s: %v", step.desc, err)
		}
		if !stands.Equal(step.want) {
			t.Fatalf("%s: MarkCompromised reports the mark %v; want %v", step.desc, stands, step.want)
		}
		// A mark that changes nothing leaves index.json as it was: no
		// rewrite, so no reload or card rebuild anywhere.
		after, err := os.Stat(filepath.Join(dir, IndexFile))
		if err != nil {
			t.Fatal(err)
		}
		if rewritten := !os.SameFile(before, after); rewritten != step.changes {
			t.Fatalf("%s: index.json rewritten = %v, want %v", step.desc, rewritten, step.changes)
		}
		for name, st := range map[string]*Store{"live": s, "reopened": open(t, dir, c)} {
			k, ok := st.Lookup("k1")
			if !ok || !k.CompromisedSince.Equal(step.want) {
				t.Fatalf("%s: %s: compromised_since = %v (found %v); want %v", step.desc, name, k.CompromisedSince, ok, step.want)
			}
		}
	}
	if got := versions(s.List()); got != "k1:compromised,k2:current" {
		t.Errorf("List = %s: marking k1 again must not rotate again", got)
	}
}

func TestMarkCompromised(t *testing.T) {
	pre1970 := time.Date(1969, 12, 31, 23, 59, 59, 0, time.UTC)
	for _, tc := range []struct {
		desc       string
		mark       string
		since      time.Duration // relative to the clock
		at         *time.Time    // instead of since, when set
		wantErr    string
		wantList   string
		wantActive string
	}{
		{desc: "a retired key marked compromised keeps its place and becomes compromised", mark: "k1", since: -90 * time.Minute, wantList: "k1:compromised,k2:current", wantActive: "k2"},
		{desc: "marking the current key compromised rotates to a new key so it never signs again", mark: "k2", since: -time.Minute, wantList: "k1:retired,k2:compromised,k3:current", wantActive: "k3"},
		{desc: "an unknown version is refused", mark: "k9", since: -time.Minute, wantErr: `no key version "k9"`, wantList: "k1:retired,k2:current", wantActive: "k2"},
		{desc: "a compromise time in the future is refused", mark: "k1", since: time.Hour, wantErr: "in the future", wantList: "k1:retired,k2:current", wantActive: "k2"},
		// The zero time ("from the start" to an operator) was stored, and
		// read back as no mark at all.
		{desc: "the zero time is refused", mark: "k2", at: &time.Time{}, wantErr: "is before 1970, and no key existed then; to distrust every receipt the key signed, give 2026-11-29T12:55:00.123456Z", wantList: "k1:retired,k2:current", wantActive: "k2"},
		{desc: "a time before 1970 is refused", mark: "k1", at: &pre1970, wantErr: "is before 1970", wantList: "k1:retired,k2:current", wantActive: "k2"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			dir := t.TempDir()
			c := newClock()
			s := open(t, dir, c)
			if _, err := s.Generate(); err != nil {
				t.Fatal(err)
			}
			c.Add(time.Hour)
			if _, err := s.Rotate(); err != nil {
				t.Fatal(err)
			}
			c.Add(time.Hour)
			since := c.Now().Add(tc.since)
			if tc.at != nil {
				since = *tc.at
			}
			before, err := os.Stat(filepath.Join(dir, IndexFile))
			if err != nil {
				t.Fatal(err)
			}
			_, err = s.MarkCompromised(tc.mark, since)
			if after, _ := os.Stat(filepath.Join(dir, IndexFile)); tc.wantErr != "" && !os.SameFile(before, after) {
				t.Errorf("a refused mark rewrote index.json")
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want it to mention %q", err, tc.wantErr)
				}
			} else if err != nil {
				t.Fatalf("MarkCompromised: %v", err)
			}
			// Check both the live store and a fresh open of the directory.
			for name, st := range map[string]*Store{"live": s, "reopened": open(t, dir, c)} {
				if got := versions(st.List()); got != tc.wantList {
					t.Errorf("%s: List = %s, want %s", name, got, tc.wantList)
				}
				cur, err := st.Current()
				if err != nil || cur.Version != tc.wantActive {
					t.Errorf("%s: Current = %s, %v; want %s", name, cur.Version, err, tc.wantActive)
				}
				if tc.wantErr == "" {
					k, _ := st.Lookup(tc.mark)
					if !k.CompromisedSince.Equal(since) {
						t.Errorf("%s: compromised_since = %v, want %v", name, k.CompromisedSince, since)
					}
				}
			}
		})
	}
}

// TestAStoredZeroMarkIsCompromisedFromTheStart: before MarkCompromised
// refused it, the zero time could be stored as a mark, and it read back as
// no mark: certd published a plain retired key (or signed with it, when it
// was current). Such a mark is a mark with no time: nothing the key signed
// is trusted, and a later mark cannot move it.
func TestAStoredZeroMarkIsCompromisedFromTheStart(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	s := open(t, dir, c)
	if _, err := s.Generate(); err != nil {
		t.Fatal(err)
	}
	c.Add(time.Hour)
	rewriteIndex(t, dir, func(idx *index) { idx.Keys[0].CompromisedSince = "0001-01-01T00:00:00Z" })
	for name, st := range map[string]*Store{"reloaded": s, "reopened": open(t, dir, c)} {
		if err := st.Reload(); err != nil {
			t.Fatal(err)
		}
		if got := versions(st.List()); got != "k1:compromised" {
			t.Errorf("%s: List = %s, want k1:compromised", name, got)
		}
		if k, err := st.Current(); !errors.Is(err, ErrNoKey) {
			t.Errorf("%s: Current = %s, %v; a key marked compromised never signs", name, k.Version, err)
		}
	}
	stands, err := s.MarkCompromised("k1", c.Now().Add(-time.Minute))
	if err != nil || !stands.IsZero() {
		t.Errorf("a later mark over a mark with no time: %v, %v; want it to stand (the zero time)", stands, err)
	}
}

func TestLoadingRefusesAPrivateKeyReadableByOthers(t *testing.T) {
	for _, tc := range []struct {
		desc string
		mode os.FileMode
		ok   bool
	}{
		{desc: "mode 0600 loads", mode: 0o600, ok: true},
		{desc: "mode 0400 loads", mode: 0o400, ok: true},
		{desc: "group-readable 0640 is refused", mode: 0o640},
		{desc: "world-readable 0644 is refused", mode: 0o644},
		{desc: "world-writable 0602 is refused", mode: 0o602},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir, newClock())
			if _, err := s.Generate(); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, "k1.key")
			if err := os.Chmod(path, tc.mode); err != nil {
				t.Fatal(err)
			}
			// The history opens all the same (the card must publish it);
			// the key does not sign.
			ks, err := Open(dir, Options{})
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			defer ks.Close()
			_, err = ks.Current()
			if tc.ok {
				if err != nil {
					t.Fatalf("Current: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("a private key readable by others signs")
			}
			if _, ok := errors.AsType[*KeyFileError](err); !ok {
				t.Errorf("Current: %v, want a *KeyFileError", err)
			}
			if got := versions(ks.List()); got != "k1:current" {
				t.Errorf("List = %s, want the history", got)
			}
			if !strings.Contains(err.Error(), "chmod 600 "+path) {
				t.Errorf("error %q does not name the fix `chmod 600 %s`", err, path)
			}
		})
	}
}

func TestLoadingRefusesACorruptDirectory(t *testing.T) {
	for _, tc := range []struct {
		desc    string
		corrupt func(t *testing.T, dir string)
		wantErr string
	}{
		{desc: "a key file that does not match the index is refused", wantErr: "does not match the public key", corrupt: func(t *testing.T, dir string) {
			other := open(t, t.TempDir(), newClock())
			k, err := other.Generate()
			if err != nil {
				t.Fatal(err)
			}
			pemBytes, _ := MarshalPrivateKey(k.Private)
			if err := os.WriteFile(filepath.Join(dir, "k1.key"), pemBytes, 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{desc: "a missing key file is refused", wantErr: "loading key k1", corrupt: func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, "k1.key"))
		}},
		{desc: "a key file that is not PEM is refused", wantErr: "PEM", corrupt: func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, "k1.key"), []byte("not a key"), 0o600)
		}},
		{desc: "an index that is not JSON is refused", wantErr: "reading key index", corrupt: func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, IndexFile), []byte("{"), 0o644)
		}},
		{desc: "an index with a bad version label is refused", wantErr: "not of the form k1", corrupt: func(t *testing.T, dir string) {
			rewriteIndex(t, dir, func(idx *index) { idx.Keys[0].Version = "k01" })
		}},
		{desc: "an index listing a version twice is refused", wantErr: "listed twice", corrupt: func(t *testing.T, dir string) {
			rewriteIndex(t, dir, func(idx *index) { idx.Keys = append(idx.Keys, idx.Keys[0]) })
		}},
		{desc: "an index with another algorithm is refused", wantErr: "want Ed25519", corrupt: func(t *testing.T, dir string) {
			rewriteIndex(t, dir, func(idx *index) { idx.Keys[0].Algorithm = "ES256" })
		}},
		{desc: "an index with a bad time is refused", wantErr: "bad created_at", corrupt: func(t *testing.T, dir string) {
			rewriteIndex(t, dir, func(idx *index) { idx.Keys[0].CreatedAt = "yesterday" })
		}},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir, newClock())
			if _, err := s.Generate(); err != nil {
				t.Fatal(err)
			}
			tc.corrupt(t, dir)
			if err := startErr(dir, Options{}); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Open: err = %v, want it to mention %q", err, tc.wantErr)
			}
		})
	}
}

// startErr is why a process starting on dir cannot sign: Open's error (an
// index it cannot read), or Current's (a key file it cannot load: the
// history opens all the same).
func startErr(dir string, opts Options) error {
	s, err := Open(dir, opts)
	if err != nil {
		return err
	}
	defer s.Close()
	_, err = s.Current()
	return err
}

func rewriteIndex(t *testing.T, dir string, change func(*index)) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, IndexFile))
	if err != nil {
		t.Fatal(err)
	}
	var idx index
	if err := json.Unmarshal(data, &idx); err != nil {
		t.Fatal(err)
	}
	change(&idx)
	data, _ = json.Marshal(idx)
	if err := os.WriteFile(filepath.Join(dir, IndexFile), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// A crash between writing k2.key and the index leaves k2.key unnamed: it
// is ignored on load, and the next rotation refuses rather than overwrite
// it (the store cannot tell it from the key of an index restored from an
// older backup). Once the operator moves it away, rotation makes k2.
func TestAnOrphanKeyFileFromACrashedRotationIsIgnoredAndNeverOverwritten(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, newClock())
	if _, err := s.Generate(); err != nil {
		t.Fatal(err)
	}
	orphan := filepath.Join(dir, "k2.key")
	if err := os.WriteFile(orphan, []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	again := open(t, dir, newClock())
	if got := versions(again.List()); got != "k1:current" {
		t.Fatalf("List = %s, want only k1", got)
	}
	var stray *StrayKeyFilesError
	if _, err := again.Rotate(); !errors.As(err, &stray) {
		t.Fatalf("Rotate over the orphan: err = %v, want *StrayKeyFilesError", err)
	}
	if got, _ := os.ReadFile(orphan); string(got) != "half" {
		t.Fatalf("the orphan was overwritten: %q", got)
	}
	if err := os.Rename(orphan, filepath.Join(t.TempDir(), "k2.key")); err != nil {
		t.Fatal(err)
	}
	k2, err := again.Rotate()
	if err != nil || k2.Version != "k2" {
		t.Fatalf("Rotate = %s, %v", k2.Version, err)
	}
	if _, err := Open(dir, Options{}); err != nil {
		t.Fatalf("reopen after rotation: %v", err)
	}
}

func TestRefreshPicksUpARotationByAnotherProcess(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	serving := open(t, dir, c)
	if _, err := serving.Generate(); err != nil {
		t.Fatal(err)
	}
	changed, err := serving.Refresh()
	if err != nil || changed {
		t.Fatalf("Refresh with no change = %v, %v; want false, nil", changed, err)
	}
	// The operator's `certd rotate` opens its own Store on the same directory.
	operator := open(t, dir, c)
	c.Add(time.Minute)
	if _, err := operator.Rotate(); err != nil {
		t.Fatal(err)
	}
	if cur, _ := serving.Current(); cur.Version != "k1" {
		t.Fatalf("before Refresh the serving store already moved to %s", cur.Version)
	}
	changed, err = serving.Refresh()
	if err != nil || !changed {
		t.Fatalf("Refresh after rotation = %v, %v; want true, nil", changed, err)
	}
	if got := versions(serving.List()); got != "k1:retired,k2:current" {
		t.Fatalf("after Refresh List = %s", got)
	}
	// A writer that started from a stale view still appends after k2.
	c.Add(time.Minute)
	k3, err := operator.Rotate()
	if err != nil || k3.Version != "k3" {
		t.Fatalf("Rotate = %s, %v", k3.Version, err)
	}
	c.Add(time.Minute)
	k4, err := serving.Rotate()
	if err != nil || k4.Version != "k4" {
		t.Fatalf("Rotate from the stale store = %s, %v; want k4", k4.Version, err)
	}
}

func TestConcurrentReadersDuringRotation(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, newClock())
	if _, err := s.Generate(); err != nil {
		t.Fatal(err)
	}
	other := open(t, dir, newClock())
	const rotations = 10
	var wg sync.WaitGroup
	stop := make(chan struct{})
	errs := make(chan error, 16)
	for r := 0; r < 4; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			msg := []byte("m")
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := s.Refresh(); err != nil {
					errs <- err
					return
				}
				cur, err := s.Current()
				if err != nil {
					errs <- err
					return
				}
				if !ed25519.Verify(cur.Public, msg, ed25519.Sign(cur.Private, msg)) {
					errs <- errors.New("current key halves do not match")
					return
				}
				list := s.List()
				if Statuses(list, afterAll)[len(list)-1] != StatusCurrent {
					errs <- errors.New("the newest key is not current")
					return
				}
			}
		}()
	}
	for i := 0; i < rotations; i++ {
		st := s
		if i%2 == 1 {
			st = other
		}
		if _, err := st.Rotate(); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if _, err := s.Refresh(); err != nil {
		t.Fatal(err)
	}
	if n := len(s.List()); n != rotations+1 {
		t.Fatalf("after %d rotations List has %d keys, want %d", rotations, n, rotations+1)
	}
}

// A vanished index never makes the store forget its keys (the card keeps
// publishing them, so old receipts stay verifiable), but nothing signs
// until it is back: an index that cannot be read may be one that retires
// the key held.
func TestAVanishedIndexKeepsTheKeysAndStopsSigning(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, newClock())
	if _, err := s.Generate(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, IndexFile)
	saved, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Refresh(); err == nil || !strings.Contains(err.Error(), "disappeared") {
		t.Fatalf("Refresh after the index vanished: err = %v", err)
	}
	if cur, err := s.Current(); err == nil || !strings.Contains(err.Error(), "disappeared") {
		t.Fatalf("Current after the index vanished = %s, %v; want a refusal naming the cause", cur.Version, err)
	}
	if got := versions(s.List()); got != "k1:current" {
		t.Fatalf("List after the index vanished = %s; want k1 kept", got)
	}
	if err := os.WriteFile(path, saved, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Refresh(); err != nil {
		t.Fatalf("Refresh after the index was restored: %v", err)
	}
	if cur, err := s.Current(); err != nil || cur.Version != "k1" {
		t.Fatalf("Current after the index was restored = %s, %v", cur.Version, err)
	}
}

func TestPublicOnlyOpensWithoutReadingPrivateKeys(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	s := open(t, dir, c)
	k1, err := s.Generate()
	if err != nil {
		t.Fatal(err)
	}
	// The key file's mode is wrong: signing refuses it, operator commands
	// must still work so the key can be marked and replaced.
	if err := os.Chmod(filepath.Join(dir, "k1.key"), 0o644); err != nil {
		t.Fatal(err)
	}
	if signing, err := Open(dir, Options{}); err != nil {
		t.Fatal(err)
	} else if _, err := signing.Current(); err == nil {
		t.Fatal("setup: a signing store signs with the 0644 key")
	}
	op, err := Open(dir, Options{Now: c.Now, PublicOnly: true})
	if err != nil {
		t.Fatalf("PublicOnly Open: %v", err)
	}
	k, _ := op.Lookup("k1")
	if k.Private != nil || !k.Public.Equal(k1.Public) {
		t.Fatalf("PublicOnly key: private %v, public matches %v", k.Private != nil, k.Public.Equal(k1.Public))
	}
	c.Add(time.Minute)
	if _, err := op.MarkCompromised("k1", c.Now().Add(-time.Hour)); err != nil {
		t.Fatalf("MarkCompromised: %v", err)
	}
	if got := versions(op.List()); got != "k1:compromised,k2:current" {
		t.Fatalf("List = %s", got)
	}
}

// CurrentOnly holds the private key of the current version alone: older
// key files are never read (one with a wrong mode does not stop it), and a
// key rotated away is forgotten on the next refresh.
func TestCurrentOnlyHoldsOnlyTheCurrentPrivateKey(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	certd := open(t, dir, c)
	if _, err := certd.Generate(); err != nil {
		t.Fatal(err)
	}
	c.Add(time.Minute)
	if _, err := certd.Rotate(); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "k1.key"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := Open(dir, Options{CurrentOnly: true})
	if err != nil {
		t.Fatalf("CurrentOnly Open with a retired key file of mode 0644: %v", err)
	}
	privates := func() string {
		var out []string
		for _, k := range s.List() {
			if k.Private != nil {
				out = append(out, k.Version)
			}
		}
		return strings.Join(out, ",")
	}
	if got := privates(); got != "k2" {
		t.Fatalf("private keys held: %q, want k2", got)
	}
	cur, err := s.Current()
	if err != nil || cur.Version != "k2" || cur.Private == nil {
		t.Fatalf("Current = %s (private %v), %v", cur.Version, cur.Private != nil, err)
	}
	c.Add(time.Minute)
	if _, err := certd.Rotate(); err != nil {
		t.Fatal(err)
	}
	if changed, err := s.Refresh(); err != nil || !changed {
		t.Fatalf("Refresh = %v, %v", changed, err)
	}
	if got := privates(); got != "k3" {
		t.Fatalf("after a rotation, private keys held: %q, want k3", got)
	}
	if got := versions(s.List()); got != "k1:retired,k2:retired,k3:current" {
		t.Fatalf("List = %s", got)
	}
	// The current key's file is still checked like certd checks it.
	c.Add(time.Minute)
	if _, err := certd.Rotate(); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "k4.key"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := startErr(dir, Options{CurrentOnly: true}); err == nil {
		t.Fatal("CurrentOnly accepted a current key file of mode 0640")
	}
}
