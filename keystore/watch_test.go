package keystore

import (
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// countStats counts Refresh's stats of the index while the test runs.
func countStats(t *testing.T) func() int {
	var mu sync.Mutex
	n := 0
	statIndex = func(name string) (fs.FileInfo, error) {
		mu.Lock()
		n++
		mu.Unlock()
		return os.Stat(name)
	}
	t.Cleanup(func() { statIndex = os.Stat })
	return func() int {
		mu.Lock()
		defer mu.Unlock()
		return n
	}
}

func openWatched(t *testing.T, dir string, c *clock) *Store {
	t.Helper()
	s, err := Open(dir, Options{Now: c.Now, Watch: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if runtime.GOOS == "linux" && (s.watch == nil || !s.watch.watching()) {
		t.Fatal("the key directory is not watched")
	}
	return s
}

// With a watch, a Refresh that finds no change does not stat the index;
// a rotation by another Store (as `certd rotate` is another process) is
// still seen by the very next Refresh, and a write of the store's own is
// not mistaken for a change.
func TestWatchedRefreshSeesEveryRotationWithoutAStatPerCall(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("directory watches are implemented on Linux")
	}
	dir := t.TempDir()
	c := newClock()
	serving := openWatched(t, dir, c)
	stats := countStats(t)
	if changed, err := serving.Refresh(); err != nil || changed {
		t.Fatalf("Refresh of an empty directory = %v, %v", changed, err)
	}
	operator := open(t, dir, c)
	for i, want := range []string{"k1", "k2", "k3"} {
		if _, err := operator.Rotate(); err != nil {
			t.Fatal(err)
		}
		if changed, err := serving.Refresh(); err != nil || !changed {
			t.Fatalf("Refresh right after rotation %d = %v, %v; want true", i+1, changed, err)
		}
		if cur, _ := serving.Current(); cur.Version != want {
			t.Fatalf("after rotation %d the current key is %s, want %s", i+1, cur.Version, want)
		}
		before := stats()
		for range 1000 {
			if changed, err := serving.Refresh(); err != nil || changed {
				t.Fatalf("Refresh without a change = %v, %v", changed, err)
			}
		}
		if n := stats() - before; n != 0 {
			t.Fatalf("1000 Refreshes without a change statted the index %d times", n)
		}
	}
	if _, err := serving.Rotate(); err != nil { // its own write
		t.Fatal(err)
	}
	if changed, err := serving.Refresh(); err != nil || changed {
		t.Fatalf("Refresh after the store's own rotation = %v, %v; want false", changed, err)
	}
	if got := versions(serving.List()); got != "k1:retired,k2:retired,k3:retired,k4:current" {
		t.Fatalf("List = %s", got)
	}
}

// An index edited in place (not replaced) is seen too.
func TestWatchedRefreshSeesAnIndexEditedInPlace(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	serving := openWatched(t, dir, c)
	if _, err := serving.Generate(); err != nil {
		t.Fatal(err)
	}
	// A copy of the directory, rotated: its new key, then its index
	// written over ours in place.
	other := t.TempDir()
	copyFile(t, filepath.Join(dir, "k1.key"), filepath.Join(other, "k1.key"), 0o600)
	copyFile(t, filepath.Join(dir, IndexFile), filepath.Join(other, IndexFile), 0o644)
	donor := open(t, other, c)
	c.Add(1)
	if _, err := donor.Rotate(); err != nil {
		t.Fatal(err)
	}
	copyFile(t, filepath.Join(other, "k2.key"), filepath.Join(dir, "k2.key"), 0o600)
	f, err := os.OpenFile(filepath.Join(dir, IndexFile), os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := os.ReadFile(filepath.Join(other, IndexFile))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(idx); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if changed, err := serving.Refresh(); err != nil || !changed {
		t.Fatalf("Refresh after an edit in place = %v, %v; want true", changed, err)
	}
	if cur, _ := serving.Current(); cur.Version != "k2" {
		t.Fatalf("current key %s, want k2", cur.Version)
	}
}

func copyFile(t *testing.T, from, to string, perm os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, perm); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(to, perm); err != nil {
		t.Fatal(err)
	}
}

// When the watched directory is moved away and another put in its place
// (a restore from a backup), the watch ends and Refresh goes back to a
// stat per call, so the restored directory's keys are found.
func TestWatchEndsWhenTheDirectoryIsReplaced(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "keys")
	c := newClock()
	serving := openWatched(t, dir, c)
	if _, err := serving.Generate(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(dir, filepath.Join(parent, "keys.old")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"k1.key", IndexFile} {
		copyFile(t, filepath.Join(parent, "keys.old", name), filepath.Join(dir, name), 0o600)
	}
	if _, err := open(t, dir, c).Rotate(); err != nil {
		t.Fatal(err)
	}
	if changed, err := serving.Refresh(); err != nil || !changed {
		t.Fatalf("Refresh after the directory was replaced = %v, %v; want true", changed, err)
	}
	if serving.watch != nil && serving.watch.watching() {
		t.Fatal("still watching a directory that was moved away")
	}
	if cur, _ := serving.Current(); cur.Version != "k2" {
		t.Fatalf("current key %s, want k2", cur.Version)
	}
	stats := countStats(t)
	serving.Refresh()
	if stats() != 1 {
		t.Fatal("without its watch, Refresh did not stat the index")
	}
}

// A reload that fails (a corrupt index) is retried by the next Refresh
// although no new event came, as without a watch; meanwhile nothing signs
// (the unreadable index may retire the key held) and the history loaded
// before is kept.
func TestWatchedRefreshRetriesAFailedReload(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	serving := openWatched(t, dir, c)
	if _, err := serving.Generate(); err != nil {
		t.Fatal(err)
	}
	good, err := os.ReadFile(filepath.Join(dir, IndexFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, IndexFile), []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if _, err := serving.Refresh(); err == nil {
			t.Fatalf("Refresh %d of a corrupt index succeeded", i+1)
		}
		if cur, err := serving.Current(); err == nil {
			t.Fatalf("after a failed reload: current %s; want a refusal", cur.Version)
		}
		if got := versions(serving.List()); got != "k1:current" {
			t.Fatalf("after a failed reload: List = %s; want k1 kept", got)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, IndexFile), good, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := serving.Refresh(); err != nil {
		t.Fatalf("Refresh of the repaired index: %v", err)
	}
	if cur, err := serving.Current(); err != nil || cur.Version != "k1" {
		t.Fatalf("after the repair: current %s, %v; want k1", cur.Version, err)
	}
	if _, err := serving.Refresh(); err != nil {
		t.Fatal(err)
	}
}

// Close ends the watch; the Store still follows rotations, by stat.
func TestClosedWatchFallsBackToStat(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	serving := openWatched(t, dir, c)
	if err := serving.Close(); err != nil {
		t.Fatal(err)
	}
	if err := serving.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := open(t, dir, c).Rotate(); err != nil {
		t.Fatal(err)
	}
	if changed, err := serving.Refresh(); err != nil || !changed {
		t.Fatalf("Refresh after Close and a rotation = %v, %v; want true", changed, err)
	}
}

// compromisedCopy makes next a copy of the key directory cur in which k1
// is then marked compromised (k2 current).
func compromisedCopy(t *testing.T, c *clock, cur, next string) {
	t.Helper()
	if err := os.MkdirAll(next, 0o700); err != nil {
		t.Fatal(err)
	}
	copyFile(t, filepath.Join(cur, "k1.key"), filepath.Join(next, "k1.key"), 0o600)
	copyFile(t, filepath.Join(cur, IndexFile), filepath.Join(next, IndexFile), 0o644)
	c.Add(time.Hour)
	if _, err := open(t, next, c).MarkCompromised("k1", c.Now().Add(-30*time.Minute)); err != nil {
		t.Fatal(err)
	}
}

// repoint points the symbolic link link at target as `ln -sfn` does: a new
// link renamed over the old one.
func repoint(t *testing.T, link, target string) {
	t.Helper()
	if err := os.Symlink(target, link+".tmp"); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(link+".tmp", link); err != nil {
		t.Fatal(err)
	}
}

// A key directory named through a symbolic link (the link itself, or one
// further up the path) follows the link when it is re-pointed: the next
// Refresh loads the directory the path names now, so a key its index marks
// compromised stops signing at once.
func TestRefreshFollowsASymlinkOnTheKeyPathWhenItIsRepointed(t *testing.T) {
	for _, tc := range []struct{ name, linked, keys string }{
		{"the key directory is the link", "keys", "keys"},
		{"a directory above it is the link", "current", "current/keys"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			c := newClock()
			a, b := filepath.Join(base, "release.a"), filepath.Join(base, "release.b")
			inA := filepath.Join(a, "keys")
			if tc.linked == "keys" {
				inA = a
			}
			if _, err := open(t, inA, c).Generate(); err != nil {
				t.Fatal(err)
			}
			link := filepath.Join(base, tc.linked)
			if err := os.Symlink(filepath.Base(a), link); err != nil {
				t.Fatal(err)
			}
			serving, err := Open(filepath.Join(base, tc.keys), Options{Now: c.Now, CurrentOnly: true, Watch: true})
			if err != nil {
				t.Fatal(err)
			}
			defer serving.Close()
			if cur, err := serving.Current(); err != nil || cur.Version != "k1" {
				t.Fatalf("Current = %s, %v", cur.Version, err)
			}

			compromisedCopy(t, c, inA, filepath.Join(b, strings.TrimPrefix(inA, a)))
			repoint(t, link, filepath.Base(b))
			if _, err := serving.Refresh(); err != nil {
				t.Fatalf("Refresh after the link was re-pointed: %v", err)
			}
			if cur, err := serving.Current(); err != nil || cur.Version != "k2" {
				t.Fatalf("after the link was re-pointed Current = %s, %v; want k2 (k1 is compromised there)", cur.Version, err)
			}
		})
	}
}

// With no link on the path, a directory along it renamed and another put
// in its place ends the watch, so the next Refresh loads the directory the
// path names now; other names changing in those directories do not cost
// the watch.
func TestWatchEndsWhenADirectoryOnTheKeyPathIsReplaced(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("directory watches are implemented on Linux")
	}
	base := t.TempDir()
	c := newClock()
	cur := filepath.Join(base, "current")
	dir := filepath.Join(cur, "keys")
	serving := openWatched(t, dir, c)
	if _, err := serving.Generate(); err != nil {
		t.Fatal(err)
	}
	serving.Refresh() // the events of its own write
	stats := countStats(t)
	for _, other := range []string{filepath.Join(base, "unrelated"), filepath.Join(cur, "certd.sock")} {
		if err := os.WriteFile(other, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if changed, err := serving.Refresh(); err != nil || changed || stats() != 0 || !serving.watch.watching() {
		t.Fatalf("Refresh after other names changed = %v, %v, %d stats, watching %v; want no change, no stat, still watching", changed, err, stats(), serving.watch.watching())
	}

	next := filepath.Join(base, "next")
	compromisedCopy(t, c, dir, filepath.Join(next, "keys"))
	if err := os.Rename(cur, filepath.Join(base, "previous")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(next, cur); err != nil {
		t.Fatal(err)
	}
	if _, err := serving.Refresh(); err != nil {
		t.Fatalf("Refresh after the path's directory was replaced: %v", err)
	}
	if serving.watch.watching() {
		t.Error("still watching a directory the path no longer names")
	}
	if k, err := serving.Current(); err != nil || k.Version != "k2" {
		t.Fatalf("after the path's directory was replaced Current = %s, %v; want k2 (k1 is compromised there)", k.Version, err)
	}
}

// The components of a key directory's path, each with the directory that
// holds it; a relative path starts at the working directory.
func TestPathSteps(t *testing.T) {
	for _, tc := range []struct {
		dir  string
		want string
		ok   bool
	}{
		{"data/keys", "./data,data/keys", true},
		{"./data//keys/", "./data,data/keys", true},
		{"/var/lib/aov/keys", "//var,/var/lib,/var/lib/aov,/var/lib/aov/keys", true},
		{".", "", true},
		{"/", "", true},
		{"../keys", "", false},
		{"data/../../keys", "", false},
	} {
		steps, ok := pathSteps(tc.dir)
		var got []string
		for _, st := range steps {
			got = append(got, st.parent+"/"+st.name)
		}
		if ok != tc.ok || strings.Join(got, ",") != tc.want {
			t.Errorf("pathSteps(%q) = %q, %v; want %q, %v", tc.dir, strings.Join(got, ","), ok, tc.want, tc.ok)
		}
	}
}

// overflowQueue fills the inotify queue of a watch on dir's parent with
// events about other names (more than fs.inotify.max_queued_events, 16384
// by default), as a busy parent such as /tmp does between two Refreshes.
func overflowQueue(t *testing.T, parent string) {
	t.Helper()
	junk := filepath.Join(parent, "junk")
	if err := os.Mkdir(junk, 0o700); err != nil {
		t.Fatal(err)
	}
	limit := 16384
	if b, err := os.ReadFile("/proc/sys/fs/inotify/max_queued_events"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			limit = n
		}
	}
	for i := range limit/2 + 100 { // two events each, no file left behind
		a := filepath.Join(parent, "a"+strconv.Itoa(i))
		if err := os.WriteFile(a, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(a, filepath.Join(junk, "x")); err != nil {
			t.Fatal(err)
		}
	}
}

// Unrelated names changing in a directory on the key path can overflow the
// kernel's event queue. The events lost could have been any change, so the
// next Refresh makes the watch again on what the path names now and stats
// once to catch up; after that, Refresh costs no stat again, and a
// rotation is still seen.
func TestWatchIsMadeAgainAfterItsQueueOverflows(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("directory watches are implemented on Linux")
	}
	parent := t.TempDir()
	dir := filepath.Join(parent, "keys")
	c := newClock()
	serving := openWatched(t, dir, c)
	if _, err := serving.Generate(); err != nil {
		t.Fatal(err)
	}
	serving.Refresh() // the events of its own write
	overflowQueue(t, parent)
	stats := countStats(t)
	if _, err := serving.Refresh(); err != nil || stats() != 1 {
		t.Fatalf("Refresh after an overflow = %v with %d stats; want one stat to catch up", err, stats())
	}
	serving.Refresh()
	serving.Refresh()
	if !serving.watch.watching() || stats() != 1 {
		t.Fatalf("after an overflow: watching=%v, %d stats over 3 Refreshes; want watching, 1", serving.watch.watching(), stats())
	}
	c.Add(time.Minute)
	if _, err := open(t, dir, c).Rotate(); err != nil {
		t.Fatal(err)
	}
	if changed, err := serving.Refresh(); err != nil || !changed {
		t.Fatalf("Refresh after a rotation on the new watch = %v, %v", changed, err)
	}
}

// When the lost events were the key path's directory being replaced, the
// watch made again is on the directory the path names now, and the catch-up
// stat loads its index.
func TestWatchMadeAgainAfterAnOverflowFollowsAReplacedDirectory(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("directory watches are implemented on Linux")
	}
	base := t.TempDir()
	c := newClock()
	cur := filepath.Join(base, "current")
	dir := filepath.Join(cur, "keys")
	serving := openWatched(t, dir, c)
	if _, err := serving.Generate(); err != nil {
		t.Fatal(err)
	}
	serving.Refresh()
	// Overflow first, so the replacement's events are lost behind it.
	overflowQueue(t, base)
	next := filepath.Join(base, "next")
	compromisedCopy(t, c, dir, filepath.Join(next, "keys"))
	if err := os.Rename(cur, filepath.Join(base, "previous")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(next, cur); err != nil {
		t.Fatal(err)
	}
	if _, err := serving.Refresh(); err != nil {
		t.Fatal(err)
	}
	if k, err := serving.Current(); err != nil || k.Version != "k2" {
		t.Fatalf("Current = %s, %v; want k2 from the directory the path names now", k.Version, err)
	}
	if !serving.watch.watching() {
		t.Fatal("not watching after the overflow")
	}
	// The new watch is on the new directory: a rotation there is an event.
	c.Add(time.Minute)
	if _, err := open(t, dir, c).Rotate(); err != nil {
		t.Fatal(err)
	}
	if changed, err := serving.Refresh(); err != nil || !changed {
		t.Fatalf("Refresh after a rotation in the new directory = %v, %v", changed, err)
	}
	if k, _ := serving.Current(); k.Version != "k3" {
		t.Fatalf("Current = %s; want k3", k.Version)
	}
}
