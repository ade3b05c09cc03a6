package store

import (
	"fmt"
	"reflect"
	"sync"
)

// shared is the process-wide registry of databases opened through Shared,
// keyed by absolute directory.
var shared = struct {
	sync.Mutex
	dbs map[string]*sharedDB
}{dbs: map[string]*sharedDB{}}

type sharedDB struct {
	db   *DB
	refs int
	// closed is closed once the last handle has closed Badger. Until
	// then the entry stays, with no references, so that a Shared of the
	// same folder waits for the close instead of failing on Badger's
	// directory lock; it is done outside the registry's lock, which a
	// slow close (a flush, a folder gone under it) must not hold up for
	// every other folder.
	closed chan struct{}
}

// Shared returns a handle on the database in dir, opening it on first use
// and counting references. Each handle's Close gives its reference back; the
// last one closes Badger.
//
// It exists because Badger locks its directory while a server reloading its
// configuration (Caddy provisions the new config before cleaning up the old)
// needs the same database open in both generations at once. The options of
// the open database cannot change, so a handle that asks for different
// ones (see mustAgree) is refused with an *OptionsConflictError and the open
// database is left as it was: changing them takes a restart, not a reload.
// The free allowance's AllowanceFlush and AllowanceFlushUnits may differ:
// each handle commits the shared counts as its own options say. A
// Caddy module may use this or keep a *DB from Open in a caddy.UsagePool
// (DB has the Destruct method the pool calls); both count the same way.
func Shared(dir string, opts Options) (*DB, error) {
	return sharedHandle(dir, opts, false)
}

// SharedAsOpen is Shared for a user of the folder that has no say in its
// fixed options (mustAgree): the database open in dir is joined with the
// options it was opened with, whatever opts asks of them, and only when
// none is open does it open with opts. It is for a module that uses a
// folder other modules name with their own settings (the Caddy svm
// facilitator's default store, in the gate's default folder), so that it
// never makes a config whose modules agree fail to load.
func SharedAsOpen(dir string, opts Options) (*DB, error) {
	return sharedHandle(dir, opts, true)
}

// sharedHandle is Shared, or SharedAsOpen with asOpen.
func sharedHandle(dir string, opts Options, asOpen bool) (*DB, error) {
	key, err := absPath(dir)
	if err != nil {
		return nil, err
	}
	shared.Lock()
	s, ok := shared.dbs[key]
	for ok && s.refs == 0 {
		// Its last handle is closing it: open it again once closed.
		shared.Unlock()
		<-s.closed
		shared.Lock()
		s, ok = shared.dbs[key]
	}
	defer shared.Unlock()
	if ok {
		if asOpen {
			opts = withHandleOptions(s.db.opts, opts)
		}
		if err := agree(key, s.db.opts, opts); err != nil {
			return nil, err
		}
	} else {
		// The opener's own allowance handle is never given out: each
		// handle below commits counts as its own options ask.
		base := opts
		base.AllowanceFlush, base.AllowanceFlushUnits = 0, 0
		db, err := Open(key, base)
		if err != nil {
			return nil, err
		}
		s = &sharedDB{db: db, closed: make(chan struct{})}
		shared.dbs[key] = s
	}
	s.refs++
	handle := *s.db // same Badger handle, own release
	handle.allow = s.db.allow.join(opts)
	var once sync.Once
	handle.release = func() error {
		var err error
		once.Do(func() {
			handle.allow.close() // this handle's batched counts are written first
			shared.Lock()
			s.refs--
			last := s.refs == 0
			shared.Unlock()
			if !last {
				return
			}
			err = s.db.closeBadger()
			shared.Lock()
			delete(shared.dbs, key)
			shared.Unlock()
			close(s.closed)
		})
		return err
	}
	return &handle, nil
}

// OptionsConflictError refuses a Shared handle whose options differ from
// those the database in Dir was opened with, in an option that is fixed for
// the database's lifetime (see mustAgree).
type OptionsConflictError struct {
	Dir    string // the database folder, absolute
	Option string // the Options field
	Open   any    // its value in the open database
	Asked  any    // its value in the refused handle
}

func (e *OptionsConflictError) Error() string {
	return fmt.Sprintf("store: %s is already open with %s %v, this handle asks for %s %v: "+
		"every user of one folder must ask for the same %s; changing it takes a restart "+
		"(the database stays open while anyone holds it, so a configuration reload cannot reopen it)",
		e.Dir, e.Option, e.Open, e.Option, e.Asked, e.Option)
}

// namedOption is one Options field's value, by field name.
type namedOption struct {
	name  string
	value any
}

// mustAgree lists the options fixed when the database opens, which every
// Shared handle on it must therefore ask for alike:
//   - NoSync decides whether the write-ahead log exists, and so whether
//     every write through any handle is durable: one handle cannot have it
//     otherwise.
//   - InMemory decides whether there is a folder at all.
//   - ReservationTTL is kept by the one set of allowance counts every handle
//     shares (a reservation made through one handle is released or lapses
//     through any other); zero means DefaultReservationTTL.
//   - walSize and walBuffered shape the one log, memTableSize,
//     valueLogFileSize and gcInterval the one Badger (tests only).
//
// The rest may differ per handle (perHandle).
func mustAgree(o Options) []namedOption {
	if o.ReservationTTL <= 0 {
		o.ReservationTTL = DefaultReservationTTL
	}
	return []namedOption{
		{"NoSync", o.NoSync},
		{"InMemory", o.InMemory},
		{"ReservationTTL", o.ReservationTTL},
		{"walSize", o.walSize},
		{"walBuffered", o.walBuffered},
		{"memTableSize", o.memTableSize},
		{"valueLogFileSize", o.valueLogFileSize},
		{"gcInterval", o.gcInterval},
	}
}

// perHandle lists the options each Shared handle may set its own way:
//   - AllowanceFlush and AllowanceFlushUnits: each handle commits the shared
//     counts in its own mode (allowance.go), and handles asking alike share
//     one flusher and one loss bound.
//   - Logger: only where warnings go. Badger's own lines and the store's
//     go to the opener's logger; a joining handle's is not used.
var perHandle = []string{"AllowanceFlush", "AllowanceFlushUnits", "Logger"}

// withHandleOptions is open, the options of an open database, with the
// options of perHandle taken from own: a handle joining it as it is.
func withHandleOptions(open, own Options) Options {
	v, o := reflect.ValueOf(&open).Elem(), reflect.ValueOf(own)
	for _, name := range perHandle {
		v.FieldByName(name).Set(o.FieldByName(name))
	}
	return open
}

// agree returns the first option of mustAgree in which asked differs from
// open, the options of the database open in dir, or nil.
func agree(dir string, open, asked Options) error {
	o, a := mustAgree(open), mustAgree(asked)
	for i := range o {
		if o[i].value != a[i].value {
			return &OptionsConflictError{Dir: dir, Option: o[i].name, Open: o[i].value, Asked: a[i].value}
		}
	}
	return nil
}
