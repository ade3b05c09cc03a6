package keystore

import (
	"runtime"
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
type watch struct {
	mu sync.Mutex
	// fd is the inotify instance, -1 once the watch has ended (the
	// directory was moved or removed, the instance failed, or Close): then
	// every Refresh stats, as without a watch.
	fd int
}

// startWatch watches dir, or returns nil where it cannot (no inotify, a
// network file system, the kernel's limit of instances reached): the
// store then stats the index on every Refresh.
func startWatch(dir string) *watch {
	fd, err := openWatch(dir)
	if err != nil {
		return nil
	}
	return &watch{fd: fd}
}

// refresh is Store.Refresh through the watch: reload runs only when an
// event came, the watch has ended, or the store is broken (its last load
// failed, however it was asked for: the next Refresh tries again although
// no event came, as a Store without a watch would).
func (w *watch) refresh(reload func() (bool, error), broken func() bool) (bool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fd >= 0 {
		events, alive := pollWatch(w.fd)
		if !alive {
			w.stopLocked()
		}
		if !events && !broken() {
			return false, nil
		}
	}
	return reload()
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
