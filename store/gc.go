package store

import (
	"errors"
	"fmt"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// Values of ValueThreshold (1 MiB) and more (saved answers of payment
// identifiers under a large max_answer) are kept in Badger's value log,
// not in its tables, and Badger gives the space of those that expired or
// were replaced back only when asked (RunValueLogGC): each call rewrites
// the live values of one value-log file whose compactions found mostly
// garbage, and deletes the file. The store asks every gcInterval, up to
// gcFilesPerRound files a round, so that a round's work (and the disk
// space its rewrites take first: one value-log file, within the reserve,
// space.go) stays bounded.
const (
	gcInterval      = 5 * time.Minute
	gcFilesPerRound = 16
	// gcDiscardRatio is the share of a file that must be garbage for it
	// to be rewritten: Badger's recommended half, so a rewrite moves at
	// most as much as it frees.
	gcDiscardRatio = 0.5
)

// collectValueLog runs value-log GC rounds every interval until the store
// closes; Close waits for the round under way (it ends after its current
// file).
func (db *DB) collectValueLog(interval time.Duration, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-db.life.closed:
			return
		case <-t.C:
		}
		if _, err := db.gcRound(); err != nil && db.opts.Logger != nil {
			db.opts.Logger.Warn("store: value-log garbage collection", "dir", db.dir, "error", err)
		}
	}
}

// gcRound rewrites up to gcFilesPerRound value-log files, stopping when
// none is worth it, when the store closes, or when the disk is below its
// reserve (a rewrite writes before it frees). It returns how many it
// rewrote.
//
// Badger deletes a rewritten file at once, while the values it moved are
// in its unsynced files (the store syncs them itself, wal.go): each
// rewrite is followed by a sync of every Badger file, so that only a power
// loss in that instant can lose a moved value.
func (db *DB) gcRound() (int, error) {
	n := 0
	for n < gcFilesPerRound {
		select {
		case <-db.life.closed:
			return n, nil
		default:
		}
		if err := db.commits.space.admit(0); err != nil {
			return n, nil // ErrDiskFull: writes are refused, GC waits too
		}
		err := db.bdb.RunValueLogGC(gcDiscardRatio)
		if errors.Is(err, badger.ErrNoRewrite) || errors.Is(err, badger.ErrRejected) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		n++
		if err := syncBadger(db.bdb, db.dir); err != nil {
			return n, fmt.Errorf("after a value-log rewrite: %w", err)
		}
	}
	return n, nil
}
