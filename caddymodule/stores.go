package caddymodule

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap/exp/zapslog"

	"github.com/aovhq/aov/internal/inflight"
	"github.com/aovhq/aov/store"
)

func init() {
	caddy.RegisterModule(BadgerStore{})
}

// BadgerStore keeps the gateway's state (free allowance counters, payment
// replay claims) in an embedded Badger database on this machine. One handle
// per folder is shared by every route and survives config reloads (Badger
// locks its folder, so a reload must not open it a second time).
//
// For several gateway instances behind one load balancer, use a distributed
// store module instead: the claims and counters must be shared for the
// replay guard and the allowance to hold across instances.
type BadgerStore struct {
	// Path is the database folder. Default: "x402" under Caddy's data
	// directory.
	Path string `json:"path,omitempty"`
	// NoSync skips the fsync after each commit: faster, but a power loss
	// can forget the last counters and claims (the chain still refuses a
	// second settlement of one authorization). It is the database's: every
	// store naming this folder must set it alike, and changing it takes a
	// restart (provisioning refuses otherwise, see optionsConflict).
	NoSync bool `json:"no_sync,omitempty"`
	// AllowanceFlush batches the free-allowance counts: written together
	// every interval instead of once per free call. Off (0) by default:
	// every free call's count is on disk before its answer is delivered.
	// With it, a crash loses at most AllowanceFlushUnits counted free calls
	// (and, while the disk keeps up, only those of the last interval): the
	// clients get those calls again, never fewer. Claims are never batched.
	AllowanceFlush caddy.Duration `json:"allowance_flush,omitempty"`
	// AllowanceFlushUnits bounds the counted free calls not yet on disk
	// with AllowanceFlush; commits wait for a flush past it. Default 1000.
	AllowanceFlushUnits int `json:"allowance_flush_units,omitempty"`

	// asOpen joins the database open in Path as it was opened
	// (store.SharedAsOpen), whatever NoSync says: for a module's default
	// store in a folder the gates name with their own settings.
	asOpen bool

	db    *store.DB
	uses  *inflight.Config
	holds *inflight.Holds // Hold
}

// CaddyModule returns the Caddy module information.
func (BadgerStore) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "x402.stores.badger",
		New: func() caddy.Module { return new(BadgerStore) },
	}
}

// Provision opens (or joins) the shared database handle.
func (s *BadgerStore) Provision(ctx caddy.Context) error {
	if s.Path == "" {
		s.Path = filepath.Join(caddy.AppDataDir(), "x402")
	}
	open := store.Shared
	if s.asOpen {
		open = store.SharedAsOpen
	}
	db, err := open(s.Path, store.Options{
		NoSync:              s.NoSync,
		AllowanceFlush:      time.Duration(s.AllowanceFlush),
		AllowanceFlushUnits: s.AllowanceFlushUnits,
		Logger:              slog.New(zapslog.NewHandler(ctx.Logger().Core())),
	})
	var conflict *store.OptionsConflictError
	if errors.As(err, &conflict) {
		return optionsConflict(conflict)
	}
	if err != nil {
		return fmt.Errorf("opening gateway store at %s: %v", s.Path, err)
	}
	s.db = db
	s.uses = inflight.For(ctx)
	s.holds = new(inflight.Holds)
	return nil
}

// Hold keeps the handle open past this config's requests until release:
// for a facilitator whose sends, and the drops of their records, run until
// its Close, after the requests that started them (inflight.Holds).
func (s *BadgerStore) Hold() (release func() error) { return s.holds.Hold() }

// badgerOptionNames spells store.Options fields as this module's
// directives; store.OptionsConflictError names the field.
var badgerOptionNames = map[string]string{"NoSync": "no_sync"}

// optionsConflict is the provisioning error for a store whose options the
// database already open in its folder cannot take (see store.Shared): every
// module naming one folder gets the one open database, so they must agree,
// and the database stays open while the running config holds it.
func optionsConflict(c *store.OptionsConflictError) error {
	name := badgerOptionNames[c.Option]
	if name == "" {
		name = c.Option
	}
	return fmt.Errorf("gateway store at %s: %s is %v here, but the database in that folder is already open with %s %v "+
		"(by another module of this config, by the running config, or by requests still in flight of a config a reload replaced): "+
		"every store naming one folder must set %s alike, so make the modules agree; to change %s, restart Caddy "+
		"(a reload cannot reopen a database still held), or reload again once those requests have finished",
		c.Dir, name, c.Asked, name, c.Open, name, name)
}

// Cleanup drops this config's reference once the config's requests in
// flight have finished (they may still be committing a free call's count
// or a payment's claim: Caddy cleans up an old config before its requests
// drain); the last reference closes the database. The counts batched so
// far (allowance_flush) are written at once: Caddy's exit runs Cleanup and
// exits, and a request still in flight must not hold back every count
// acknowledged before it. A holder's release (Hold) comes before the
// close too.
func (s *BadgerStore) Cleanup() error {
	if s.db == nil {
		return nil
	}
	flushErr := s.db.FlushAllowance()
	return errors.Join(flushErr, s.uses.AfterRequests(func() error { return s.holds.Close(s.db.Close) }))
}

// StoreIdentity is the database folder: stores naming one folder share one
// database (store.Shared), and with it every count.
func (s *BadgerStore) StoreIdentity() string { return s.db.Dir() }

// Allowance returns the free allowance counters.
func (s *BadgerStore) Allowance() store.Allowance { return s.db.Allowance() }

// Claims returns the payment replay claims.
func (s *BadgerStore) Claims() store.Claims { return s.db.Claims() }

// Interface guards
var (
	_ caddy.Provisioner  = (*BadgerStore)(nil)
	_ caddy.CleanerUpper = (*BadgerStore)(nil)
	_ gateStore          = (*BadgerStore)(nil)
)
