package store

import (
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
}

// Shared returns a handle on the database in dir, opening it on first use
// and counting references. Each handle's Close gives its reference back; the
// last one closes Badger.
//
// It exists because Badger locks its directory while a server reloading its
// configuration (Caddy provisions the new config before cleaning up the old)
// needs the same database open in both generations at once. The options of
// the first opener win (changing them takes a restart, not a reload),
// except the free allowance's AllowanceFlush and AllowanceFlushUnits: each
// handle commits the shared counts as its own options say. A
// Caddy module may use this or keep a *DB from Open in a caddy.UsagePool
// (DB has the Destruct method the pool calls); both count the same way.
func Shared(dir string, opts Options) (*DB, error) {
	key, err := absPath(dir)
	if err != nil {
		return nil, err
	}
	shared.Lock()
	defer shared.Unlock()
	s, ok := shared.dbs[key]
	if !ok {
		// The opener's own allowance handle is never given out: each
		// handle below commits counts as its own options ask.
		base := opts
		base.AllowanceFlush, base.AllowanceFlushUnits = 0, 0
		db, err := Open(key, base)
		if err != nil {
			return nil, err
		}
		s = &sharedDB{db: db}
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
			defer shared.Unlock()
			s.refs--
			if s.refs == 0 {
				delete(shared.dbs, key)
				err = s.db.closeBadger()
			}
		})
		return err
	}
	return &handle, nil
}
