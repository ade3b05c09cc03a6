package keystore

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
)

// watch lets Refresh skip its stat of the index while the kernel reports no
// change in the key directory (Options.Watch). It is exact, not a cache:
// the kernel queues the event of a rename, write or removal before that
// system call returns to the process making it, so once `certd rotate` has
// replaced the index, the next Refresh in any process finds the event,
// stats and reloads, as it would have without the watch. Checking for an
// event is one non-blocking read that finds nothing, against a stat of the
// index path and its allocations.
//
// Refresh holds mu from the check to the end of the reload, so that a
// caller that finds no event (because another one has just taken it) can
// only run after that reload: nobody signs with a key replaced before
// their call began.
//
// The watch is on the directory the path named when it began, so it is
// exact only while the path goes on naming that directory. A path with a
// symbolic link on it can be re-pointed (`ln -sfn keys.new keys`) without
// any event on the directory, so it is not watched at all: every Refresh
// stats the index through the path, which follows the link as it is now.
// A path without one can change only by a rename, removal or creation of
// one of its components, so each directory along it is watched for those
// of the one name in it that leads to the key directory (steps), and such
// an event ends the watch. Watching the link as well would not be enough:
// a link further up the path, or a link's target, can be re-pointed too.
type watch struct {
	dir string
	mu  sync.Mutex
	// fd is the inotify instance, -1 once the watch has ended (the
	// directory was moved or removed, a component of its path changed, the
	// instance failed, or Close): then every Refresh stats, as without a
	// watch.
	fd int
	// steps maps the watch of each directory along the path to the name in
	// it that leads to the key directory (see pathSteps).
	steps map[int32]string
}

// startWatch watches dir, or returns nil where it cannot (no inotify, a
// network file system, the kernel's limit of instances reached, a path
// with a symbolic link or ".." on it): the store then stats the index on
// every Refresh.
func startWatch(dir string) *watch {
	steps, ok := pathSteps(dir)
	if !ok {
		return nil
	}
	fd, wds, err := openWatch(dir, steps)
	if err != nil {
		return nil
	}
	w := &watch{dir: dir, fd: fd, steps: make(map[int32]string, len(steps))}
	for i, st := range steps {
		w.steps[wds[i]] = st.name
	}
	return w
}

// step is one component of a key directory's path: the directory that
// holds it, and its name there.
type step struct{ parent, name string }

// pathSteps splits dir into its components ("data/keys": "data" in ".",
// "keys" in "data"). A relative path starts at the working directory,
// which is an open directory, not a path: renaming it or its parents does
// not change what the path names. ok is false for a path with "..", whose
// meaning changes when the directory holding it moves.
func pathSteps(dir string) ([]step, bool) {
	dir = filepath.Clean(dir)
	parent, rest := ".", dir
	if filepath.IsAbs(dir) {
		parent, rest = string(filepath.Separator), dir[1:]
	}
	if rest == "" || rest == "." {
		return nil, true
	}
	var steps []step
	for _, name := range strings.Split(rest, string(filepath.Separator)) {
		if name == ".." {
			return nil, false
		}
		steps = append(steps, step{parent, name})
		parent = filepath.Join(parent, name)
	}
	return steps, true
}

// noLinks reports whether no component of the path steps make is a
// symbolic link (or missing).
func noLinks(steps []step) bool {
	for _, st := range steps {
		fi, err := os.Lstat(filepath.Join(st.parent, st.name))
		if err != nil || fi.Mode()&os.ModeSymlink != 0 {
			return false
		}
	}
	return true
}

// refresh is Store.Refresh through the watch: reload runs only when an
// event came (or events were lost, see rearmLocked), the watch has ended,
// or the store is broken (its last load
// failed, however it was asked for: the next Refresh tries again although
// no event came, as a Store without a watch would).
func (w *watch) refresh(reload func() (bool, error), broken func() bool) (bool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fd >= 0 {
		events, state := pollWatch(w.fd, w.steps)
		switch state {
		case watchEnded:
			w.stopLocked()
		case watchOverflowed:
			w.rearmLocked()
		}
		if !events && !broken() {
			return false, nil
		}
	}
	return reload()
}

// watchState is what pollWatch found of the watch.
type watchState int

const (
	watchHolds watchState = iota
	watchEnded
	watchOverflowed // events were lost: see rearmLocked
)

// rearmLocked replaces a watch whose kernel queue overflowed (names
// created and renamed in a busy directory on the path, such as /tmp, fill
// it) by a new one on what the path names now, built as startWatch builds
// the first: the lost events may have been a rename along the path, so the
// old watches may be on directories the path no longer leads to. The
// reload refresh then runs is the stat through the path that catches up
// with whatever the lost events were; any change after the new watch
// began is an event on it. Where the new watch cannot be made (a link is
// now on the path, the directory is gone) the watch ends.
func (w *watch) rearmLocked() {
	closeWatch(w.fd)
	w.fd = -1
	if nw := startWatch(w.dir); nw != nil {
		w.fd, w.steps = nw.fd, nw.steps
	}
}

// watching reports whether the watch still holds.
func (w *watch) watching() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.fd >= 0
}

func (w *watch) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopLocked()
}

func (w *watch) stopLocked() {
	if w.fd >= 0 {
		closeWatch(w.fd)
		w.fd = -1
	}
}

// attachWatch gives s a watch of its directory, released with s if the
// owner never calls Close.
func (s *Store) attachWatch() {
	if s.watch = startWatch(s.dir); s.watch != nil {
		runtime.AddCleanup(s, (*watch).stop, s.watch)
	}
}

// Close ends the watch of Options.Watch; the Store goes on working, with a
// stat of the index per Refresh. A Store without a watch has nothing to
// close. Calling it twice is harmless.
func (s *Store) Close() error {
	if s.watch != nil {
		s.watch.stop()
	}
	return nil
}
