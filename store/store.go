// Package store holds the service's durable state in an embedded Badger
// database: the verification history behind reputation and scores
// (verifierd), and the gateway's money-relevant primitives (the per-client
// free allowance and the replay guard for payments and wallet-auth nonces).
//
// The gateway primitives are interfaces (Allowance, Claims) whose contracts
// are written so that a distributed implementation (Redis with one Lua script
// per operation) can offer exactly the same atomicity; *DB is the embedded
// implementation. The package is not a general key-value API: every key it
// writes has a layout documented in keys.go, and nothing else writes there.
//
// Durability: by default every write is on disk before it returns (see
// Options.NoSync for the trade-off). Concurrent writes share one commit and
// one synced write to the store's write-ahead log (group commit, commit.go;
// the log, wal.go).
package store

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// now is the store's clock. Tests move it to expire reservations and claims
// without sleeping; nothing else may assign it.
var now = time.Now

// elapsed is the store's monotonic clock: time since the process started,
// which does not follow steps of the wall clock. A reservation's lifetime
// is measured on it, so that a clock set an hour forward does not lapse the
// reservations of calls still running and grant their units again. Tests
// move it with now (fakeClock.Advance), or alone for a wall-clock step.
var elapsed = func() time.Duration { return time.Since(started) }

var started = time.Now()

// ErrClosed is returned by every operation on a closed database, so a caller
// racing a shutdown gets a clear answer instead of a Badger panic.
var ErrClosed = errors.New("store: database is closed")

// Options tune the embedded database. The zero value is the safe default.
type Options struct {
	// NoSync turns off the write-ahead log (wal.go) whose synced write
	// otherwise ends every commit.
	//
	// With the log (the default) a write that returned survives a power
	// loss or kernel crash. Writes that arrive while a commit is under way
	// are committed together by the next one, so concurrent writers share
	// one synced write (group commit): a lone writer pays one disk write
	// per write (about 0.1 ms on an idle SSD, several ms on a busy disk),
	// many writers far less each. Without it, a process
	// crash still loses nothing (Badger's write-ahead log is in the
	// kernel's page cache), but a power loss can drop the last commits: a
	// free call not counted, a verification missing from the history, a
	// replay-guard entry forgotten (the chain's own nonce check still
	// refuses a second settlement of one authorization). The store holds money-relevant data, so it is durable
	// unless the operator says otherwise.
	//
	// A log left by an earlier durable run is replayed and emptied by a
	// NoSync Open too, so switching between the two never replays old
	// records over newer writes.
	NoSync bool

	// Logger receives Badger's warnings and errors; its chatty info and
	// debug lines are dropped. Nil discards everything. A Caddy module
	// passes its zap logger through go.uber.org/zap/exp/zapslog.
	Logger *slog.Logger

	// ReservationTTL is how long an allowance reservation holds a unit
	// before it lapses if it is neither committed nor released (a crashed
	// or hung request). It must exceed the longest upstream call. Zero
	// means DefaultReservationTTL.
	ReservationTTL time.Duration

	// AllowanceFlush, when set, batches the free-allowance counts instead of
	// writing each before Commit returns: Commit counts the unit in memory,
	// and every AllowanceFlush one synced commit writes every count that
	// changed. It is the one weaker promise the store offers, and only for
	// the free-allowance counter (never for claims or history): a crash
	// (kill, power loss) loses at most AllowanceFlushUnits acknowledged
	// units in total and, while the disk keeps up, only those committed in
	// the last AllowanceFlush plus one flush's duration. A lost unit gives
	// a free call back (the client may get that many free calls over its
	// daily limit on the day of a crash); it never takes one away. Close
	// writes everything. Zero (the default): every Commit is durable
	// before it returns.
	AllowanceFlush time.Duration
	// AllowanceFlushUnits bounds the acknowledged units not yet on disk
	// with AllowanceFlush: when that many wait, a flush starts at once and
	// further commits wait for it. Zero means DefaultAllowanceFlushUnits.
	AllowanceFlushUnits int

	// InMemory keeps everything in memory (nothing on disk, dir ignored).
	// For tests and throwaway runs only.
	InMemory bool

	// walSize is the write-ahead log's capacity before it wraps (zero:
	// walMinSize or more); tests make it small to wrap often.
	walSize int64
	// walBuffered keeps the log's records off O_DIRECT, as on a file
	// system that refuses it: tests run both ways.
	walBuffered bool
	// memTableSize, when set, replaces the memtable size below: tests
	// that need Badger to flush memtables to tables and compact them
	// make it small.
	memTableSize int64
	// valueLogFileSize, when set, replaces the value-log file size below:
	// tests make it small to fill a disk, or to see the value log's GC
	// reclaim files.
	valueLogFileSize int64
	// gcInterval, when set, replaces gcInterval (gc.go): tests run
	// value-log GC rounds often.
	gcInterval time.Duration
}

// DefaultReservationTTL covers the slowest free call the gateway allows
// with a margin: the x402 gate refuses an upstream_timeout and a
// verify_response verifier_timeout that together could reach it.
const DefaultReservationTTL = 5 * time.Minute

// DefaultAllowanceFlushUnits is the loss bound of AllowanceFlush when
// AllowanceFlushUnits is not set.
const DefaultAllowanceFlushUnits = 1000

// DB is an open store. It is safe for concurrent use. It implements
// Allowance and Claims, and the verification history.
type DB struct {
	bdb     *badger.DB
	vers    *versions   // which version each transaction reads and commits
	commits *committer  // every read-write transaction goes through it
	allow   *allowances // the live free-allowance counters
	dir     string
	opts    Options
	life    *lifecycle // shared by every handle on this Badger database

	// release is set on handles obtained from Shared: Close gives the
	// reference back instead of closing Badger.
	release func() error
}

// Exists reports whether dir holds a store, without creating anything:
// Badger's manifest is the first file Open writes there. A directory that
// holds a store's data but no manifest is an error (checkManifest).
func Exists(dir string) (bool, error) {
	_, err := os.Stat(filepath.Join(dir, badger.ManifestFilename))
	if errors.Is(err, fs.ErrNotExist) {
		return false, checkManifest(dir)
	}
	return err == nil, err
}

// checkManifest refuses a directory that holds data files of a store
// (Badger's tables, value logs and memtable logs, or the store's log) but
// not Badger's manifest, which lists the tables that hold the data and is
// written before any of them. Badger would open such a directory as a new,
// empty database: every payment claim, id binding, allowance count and
// nonce silently gone, replays accepted and agent ids free to take. Only a
// whole copy of the directory brings them back.
func checkManifest(dir string) error {
	if _, err := os.Stat(filepath.Join(dir, badger.ManifestFilename)); !errors.Is(err, fs.ErrNotExist) {
		return err // there, or unreadable: Badger says which
	}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("store: reading the store directory: %w", err)
	}
	for _, e := range entries {
		switch n := e.Name(); {
		case n == walFile, strings.HasSuffix(n, ".sst"), strings.HasSuffix(n, ".vlog"), strings.HasSuffix(n, ".mem"):
			return fmt.Errorf("store in %s holds data (%s) but not Badger's %s, which lists where the data is: opened, it would be an empty store. "+
				"Stop every process using it and restore the whole directory from a backup; to start an empty store on purpose, move the directory away",
				dir, n, badger.ManifestFilename)
		}
	}
	return nil
}

// Open opens (creating if needed) the database in dir. Badger locks the
// directory: a second Open of the same dir in any process fails until the
// first is closed; processes that must share a handle across reloads use
// Shared instead.
func Open(dir string, opts Options) (*DB, error) {
	if opts.ReservationTTL <= 0 {
		opts.ReservationTTL = DefaultReservationTTL
	}
	// Badger never syncs on its own: with the log, the log makes each
	// commit durable; with NoSync nothing does.
	bo := badger.DefaultOptions(dir).
		WithSyncWrites(false).
		WithLogger(badgerLogger{opts.Logger}).
		// Sized for a small service on a small machine: Badger's defaults
		// (64 MiB memtables, 256 MiB block cache, 1 GiB value-log files)
		// assume a dedicated database server.
		WithMemTableSize(16 << 20).
		WithNumMemtables(3).
		WithBlockCacheSize(32 << 20).
		WithValueLogFileSize(64 << 20).
		WithNumCompactors(2).
		WithNumGoroutines(2).
		WithMetricsEnabled(false).
		// Writes are serial (committer): there is nothing for Badger's
		// optimistic conflict detection to find.
		WithDetectConflicts(false)
	if opts.memTableSize > 0 {
		bo = bo.WithMemTableSize(opts.memTableSize)
	}
	if opts.valueLogFileSize > 0 {
		bo = bo.WithValueLogFileSize(opts.valueLogFileSize)
	}
	var space *spaceGuard // nil (no guard) in memory, or where the size is unknown
	if opts.InMemory {
		bo = bo.WithInMemory(true).WithDir("").WithValueDir("")
	} else {
		if err := checkManifest(dir); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("creating store directory: %w", err)
		}
		var err error
		if space, err = checkFiles(dir, bo); err != nil {
			return nil, err
		}
		if space == nil && opts.Logger != nil {
			opts.Logger.Warn("store: the file system holding the store reports no size (a tmpfs without a size limit?): the free-space reserve is not kept, and a write that finds it full can kill the process", "dir", dir)
		}
	}
	bdb, err := badger.OpenManaged(bo) // versions are the store's: versions.go
	if err != nil {
		space.close()
		return nil, fmt.Errorf("opening store in %s: %w", dir, err)
	}
	vers := newVersions(bdb)
	var log *wal
	// A NoSync store keeps no log, but one a durable run left behind is
	// replayed and checkpointed all the same: the replay brings back what
	// Badger lost, and a log left in place past a period it did not cover
	// would be replayed by the next durable Open over everything written
	// since (counts, claims and outcomes set back).
	_, statErr := os.Stat(filepath.Join(dir, walFile))
	if !opts.InMemory && (!opts.NoSync || statErr == nil) {
		// Before anything reads the database: the replay brings back
		// what Badger's unsynced files lost in a crash.
		size := opts.walSize
		if size <= 0 {
			size = max(walMinSize, 4*bdb.MaxBatchSize())
		}
		var replayed int
		log, replayed, err = openWAL(dir, size, !opts.walBuffered && !opts.NoSync,
			func() error { return syncBadger(bdb, dir) },
			func(p []byte) error { return replayRecord(vers, p) })
		if err != nil {
			space.close()
			bdb.Close()
			return nil, fmt.Errorf("opening store in %s: %w", dir, err)
		}
		if replayed > 0 && opts.Logger != nil {
			opts.Logger.Info("store: replayed the write-ahead log", "dir", dir, "records", replayed)
		}
		if log.reset && opts.Logger != nil {
			// Expected only after a crash during a checkpoint, when
			// Badger was already synced: nothing was lost.
			opts.Logger.Warn("store: the write-ahead log's header was torn; started a new log", "dir", dir)
		}
		if opts.NoSync {
			// Checkpointed (empty, at a new epoch): nothing in it for
			// a later Open to replay.
			if err := log.close(); err != nil {
				space.close()
				bdb.Close()
				return nil, fmt.Errorf("opening store in %s: %w", dir, err)
			}
			log = nil
		}
	}
	db := &DB{bdb: bdb, vers: vers, commits: newCommitter(vers, log, space), dir: dir, opts: opts, life: &lifecycle{closed: make(chan struct{}), session: rand.Text()}}
	db.allow = newAllowances(db)
	if err := db.checkLayout(); err != nil {
		if errors.Is(err, ErrDiskFull) {
			// A new store's first write, or a migration's: say what
			// it needs, as the other refusals of Open do.
			err = fmt.Errorf("opening store in %s: %w", dir, space.refused("its key-layout version must be written before the store is used"))
		}
		db.allow.close()
		db.commits.close()
		bdb.Close()
		if log != nil {
			log.close()
		}
		space.close()
		return nil, err
	}
	if !opts.InMemory {
		interval := gcInterval
		if opts.gcInterval > 0 {
			interval = opts.gcInterval
		}
		db.life.gcDone = make(chan struct{})
		go db.collectValueLog(interval, db.life.gcDone)
	}
	return db, nil
}

// checkFiles runs the checks that read the store's files before Badger
// opens them (checkTables; walReplayBytes, memtableBytes and admitReplay,
// which admit what Badger writes as it opens) and returns the store's
// space guard (newSpaceGuard). The checks run under Badger's directory
// lock (lockDir), given back just before Badger takes it: the files of a
// store open in another process change under a reader, and its live log
// is no crash's to replay, so such a store is neither judged damaged nor
// refused for the disk space its log would take. The checks are skipped then, and Badger's Open
// reports the lock, the refusal the callers explain ("a verifierd still
// running on it holds it").
func checkFiles(dir string, bo badger.Options) (*spaceGuard, error) {
	unlock, locked := lockDir(dir)
	if locked {
		defer unlock()
		if err := checkTables(dir, bo); err != nil {
			return nil, err
		}
	}
	space, err := newSpaceGuard(dir, bo)
	if err == nil && locked {
		var n, mem uint64
		if n, err = walReplayBytes(dir); err == nil {
			mem, err = memtableBytes(dir)
		}
		if err == nil {
			err = space.admitReplay(n, mem)
		}
		if err != nil {
			space.close()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("opening store in %s: %w", dir, err)
	}
	return space, nil
}

// Close flushes and closes the database (or, for a handle from Shared,
// gives the reference back). Calling it twice is harmless.
func (db *DB) Close() error {
	if db.release != nil {
		return db.release()
	}
	return db.closeBadger()
}

// Destruct is Close under the name caddy.UsagePool expects of its values,
// so a Caddy module can keep one handle across config reloads without this
// package importing Caddy.
func (db *DB) Destruct() error { return db.Close() }

// lifecycle closes Badger exactly once, however many goroutines or
// handles call Close.
type lifecycle struct {
	once   sync.Once
	closed chan struct{}
	err    error
	// session names this opening of the database (HeldClaims.Session).
	session string
	// gcDone is closed when the value-log GC (gc.go) has stopped; nil
	// in memory.
	gcDone chan struct{}
}

func (db *DB) closeBadger() error {
	db.life.once.Do(func() {
		db.allow.close() // batched allowance counts are written first
		close(db.life.closed)
		if db.life.gcDone != nil {
			<-db.life.gcDone // a rewrite under way ends first
		}
		db.commits.close() // the group being committed finishes first
		var errs []error
		log := db.commits.log
		if log != nil && !log.empty() && db.commits.brokenErr() == nil {
			// Badger made durable and the log emptied, so the next Open
			// has nothing to replay. A broken store keeps its log: the
			// next Open replays what Badger may lack.
			errs = append(errs, log.checkpoint())
		}
		errs = append(errs, db.bdb.Close())
		if log != nil {
			errs = append(errs, log.close())
		}
		errs = append(errs, db.commits.space.close())
		if err := errors.Join(errs...); err != nil {
			db.life.err = fmt.Errorf("closing store: %w", err)
		}
	})
	return db.life.err
}

// Ping reports whether the database is open, readable and taking writes,
// for health checks: a store whose writes are refused (ErrDiskFull,
// ErrWritesHalted) cannot record, and the service in front of it should
// not be sent work until it can.
func (db *DB) Ping(ctx context.Context) error {
	err := db.view(ctx, func(txn *tx) error {
		_, err := txn.Get(keyLayoutVersion)
		return err
	})
	if err != nil {
		return err
	}
	return db.commits.refusal()
}

// Dir reports the directory the database lives in ("" in memory).
func (db *DB) Dir() string { return db.dir }

func (db *DB) usable(ctx context.Context) error {
	select {
	case <-db.life.closed:
		return ErrClosed
	default:
	}
	return ctx.Err()
}

// update runs fn in a read-write transaction: in the next commit group (see
// committer), after the writes of the groups before it and of the fns
// before it in its group, and returns once that commit has returned. fn's
// error is returned with nothing of fn written. fn may run more than once
// (when another fn of its group fails, the group is run again without it),
// so it must be free of side effects outside txn, apart from setting
// results that the last run overwrites; and it runs on the committer, so it
// must not call update itself.
func (db *DB) update(ctx context.Context, fn func(txn *tx) error) error {
	if err := db.usable(ctx); err != nil {
		return err
	}
	return db.commits.do(ctx, fn)
}

func (db *DB) view(ctx context.Context, fn func(txn *tx) error) error {
	if err := db.usable(ctx); err != nil {
		return err
	}
	if db.bdb.IsClosed() { // as badger.DB.View checks
		return ErrClosed
	}
	b := db.vers.read()
	defer db.vers.done(b)
	err := fn(&tx{b: b})
	if errors.Is(err, badger.ErrDBClosed) {
		return ErrClosed
	}
	return err
}

// checkLayout writes the key-layout version into a new database, migrates
// one written with an older layout, and refuses one written with a layout
// this build does not know, so an accidental downgrade fails loudly
// instead of misreading keys.
func (db *DB) checkLayout() error {
	from := byte(layoutVersion)
	err := db.update(context.Background(), func(txn *tx) error {
		item, err := txn.Get(keyLayoutVersion)
		if errors.Is(err, badger.ErrKeyNotFound) {
			return txn.Set(keyLayoutVersion, []byte{layoutVersion})
		}
		if err != nil {
			return fmt.Errorf("reading store layout version: %w", err)
		}
		return item.Value(func(v []byte) error {
			if len(v) == 1 && v[0] < layoutVersion {
				from = v[0]
				return nil
			}
			if len(v) != 1 || v[0] != layoutVersion {
				return fmt.Errorf("store in %s has key layout version %v; this build reads version %d", db.dir, v, layoutVersion)
			}
			return nil
		})
	})
	if err != nil || from == layoutVersion {
		return err
	}
	return db.migrateLayout(from)
}

// badgerLogger adapts Badger's printf-style logger to slog, keeping only
// warnings and errors.
type badgerLogger struct{ l *slog.Logger }

func (b badgerLogger) Errorf(f string, a ...any) {
	if b.l != nil {
		b.l.Error(trimNewline(fmt.Sprintf(f, a...)), "component", "badger")
	}
}

func (b badgerLogger) Warningf(f string, a ...any) {
	if b.l != nil {
		b.l.Warn(trimNewline(fmt.Sprintf(f, a...)), "component", "badger")
	}
}

func (badgerLogger) Infof(string, ...any)  {}
func (badgerLogger) Debugf(string, ...any) {}

func trimNewline(s string) string {
	for len(s) > 0 && (s[len(s)-1] == '\n' || s[len(s)-1] == ' ') {
		s = s[:len(s)-1]
	}
	return s
}

// absPath is the key of the Shared registry: one database per directory,
// however the path was spelled.
func absPath(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("resolving store directory: %w", err)
	}
	return filepath.Clean(abs), nil
}

// Interface guards
var (
	_ Allowance = (*allowances)(nil)
	_ Claims    = claims{}
)
