package redisstore

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/aovhq/aov/internal/caddyopt"
	"github.com/aovhq/aov/internal/inflight"
	"github.com/aovhq/aov/internal/secretopt"
	"github.com/aovhq/aov/store"
)

func init() {
	caddy.RegisterModule(RedisStore{})
}

// RedisStore keeps the gateway's state (free allowance counters, payment
// claims, wallet-proof nonces, sign-in-with-x paid access) in Redis, so
// several gateway instances behind one load balancer share it exactly: a
// client's free calls are granted at most per_day times across all of them,
// a payment is settled at most once, a nonce is used once.
//
// It refuses to start unless the server's maxmemory-policy is noeviction,
// and fails closed: when Redis is unreachable the gateway answers 503 with
// Retry-After, never a free call or an unguarded payment. The client is
// shared by every route with the same connection settings and survives
// config reloads.
type RedisStore struct {
	// Addresses are host:port of the server; of the Sentinels when
	// MasterName is set; of Cluster nodes when there are several (or
	// Cluster is set). Default 127.0.0.1:6379.
	Addresses []string `json:"addresses,omitempty"`
	// MasterName is the Sentinel master name: the store follows failovers.
	MasterName string `json:"master_name,omitempty"`
	// Cluster treats a single address as a Cluster node.
	Cluster bool `json:"cluster,omitempty"`
	// Username and Password authenticate to Redis; SentinelPassword
	// authenticates to the Sentinels. Give the passwords as {env.NAME} or
	// {file.PATH}, expanded at provision: a literal stays in the loaded
	// JSON config (and is warned about, secretopt).
	Username         string `json:"username,omitempty"`
	Password         string `json:"password,omitempty"`
	SentinelPassword string `json:"sentinel_password,omitempty"`
	// DB is the database number (standalone and Sentinel only).
	DB int `json:"db,omitempty"`
	// Prefix starts every key (default "aov"); several deployments can
	// share one Redis with different prefixes.
	Prefix string `json:"prefix,omitempty"`
	// WaitReplicas makes every write wait until that many replicas have
	// it (Redis WAIT); a write not acknowledged within WaitTimeout is a 503.
	// With 1 and a replica under Sentinel, a failover loses no
	// acknowledged claim or counted call.
	WaitReplicas int            `json:"wait_replicas,omitempty"`
	WaitTimeout  caddy.Duration `json:"wait_timeout,omitempty"`
	// Timeout bounds each command's network reads and writes, and each
	// store operation as a whole, go-redis's resends included
	// (Store.bounded; default 1s, or WaitTimeout + 0.5s when longer; with
	// WaitReplicas, a shorter one than that is refused); DialTimeout each
	// connection attempt (default 1s; on a Cluster, one per try). A
	// Cluster node whose host is gone is dialed again until Timeout
	// whatever DialTimeout is (go-redis tries a command's dials up to a
	// dozen times): the write fails at Timeout and the store reads the
	// slot map again (Store.reread).
	Timeout     caddy.Duration `json:"timeout,omitempty"`
	DialTimeout caddy.Duration `json:"dial_timeout,omitempty"`

	pooled   *pooledClient
	store    *Store
	uses     *inflight.Config
	holds    *inflight.Holds // Hold
	identity string          // StoreIdentity
}

// CaddyModule returns the Caddy module information.
func (RedisStore) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "x402.stores.redis",
		New: func() caddy.Module { return new(RedisStore) },
	}
}

// clients holds one go-redis client per connection setting across config
// reloads (Caddy provisions the new config before it cleans up the old).
var clients = caddy.NewUsagePool()

type pooledClient struct {
	key string
	rdb redis.UniversalClient
}

// Destruct closes the client when the last config using it is cleaned up.
func (p *pooledClient) Destruct() error { return p.rdb.Close() }

// Provision connects (or joins the shared client) and checks the server.
func (s *RedisStore) Provision(ctx caddy.Context) error {
	s.uses = inflight.For(ctx)
	s.holds = new(inflight.Holds)
	repl := caddy.NewReplacer()
	addrs := make([]string, 0, len(s.Addresses))
	for _, a := range s.Addresses {
		addrs = append(addrs, repl.ReplaceKnown(a, ""))
		secretopt.WarnIfURLCredentials(ctx.Logger(), "address", a, addrs[len(addrs)-1])
	}
	if len(addrs) == 0 {
		addrs = []string{"127.0.0.1:6379"}
	}
	if err := s.checkMode(len(addrs)); err != nil {
		return err
	}
	wait := time.Duration(s.WaitTimeout)
	if wait <= 0 {
		wait = 100 * time.Millisecond
	}
	if wait < time.Millisecond {
		// WAIT 0 would block for ever.
		return errors.New("redis store: wait_timeout must be at least 1ms")
	}
	// A read must outlive the WAIT it carries: by default it does, and
	// New refuses a timeout set shorter (checkReadTimeout).
	timeout := time.Duration(s.Timeout)
	if timeout <= 0 {
		timeout = max(time.Second, minReadTimeout(wait))
	}
	dial := time.Duration(s.DialTimeout)
	if dial <= 0 {
		dial = time.Second
	}
	password, sentinelPassword := repl.ReplaceKnown(s.Password, ""), repl.ReplaceKnown(s.SentinelPassword, "")
	secretopt.WarnIfLiteral(ctx.Logger(), "password", s.Password, password)
	secretopt.WarnIfLiteral(ctx.Logger(), "sentinel_password", s.SentinelPassword, sentinelPassword)
	opts := &redis.UniversalOptions{
		Addrs:            addrs,
		MasterName:       repl.ReplaceKnown(s.MasterName, ""),
		IsClusterMode:    s.Cluster,
		Username:         repl.ReplaceKnown(s.Username, ""),
		Password:         password,
		SentinelPassword: sentinelPassword,
		DB:               s.DB,
		DialTimeout:      dial,
		ReadTimeout:      timeout,
		WriteTimeout:     timeout,
		MaxRetries:       2,
		// A request's own deadline bounds its store calls too.
		ContextTimeoutEnabled: true,
	}
	if opts.MasterName == "" && (opts.IsClusterMode || len(opts.Addrs) > 1) {
		// A Cluster (as NewUniversalClient tells it): one dial per try.
		// go-redis's MaxRetries tries again already, each with a dial of
		// its own, and its default of 5 dials 0.1 s apart made a command
		// to a node that refuses connections take 1.2 s, the store's
		// whole deadline (timeout) gone before it learnt that the node
		// was unreachable and read the slot map again (Store.reread), and
		// its caller held all of it.
		// Under Sentinel the client's own dials find the new primary, so
		// they keep go-redis's default.
		opts.DialerRetries = 1
	}
	key, err := poolKey(opts)
	if err != nil {
		return err
	}
	v, _, err := clients.LoadOrNew(key, func() (caddy.Destructor, error) {
		return &pooledClient{key: key, rdb: redis.NewUniversalClient(opts)}, nil
	})
	if err != nil {
		return err
	}
	s.pooled = v.(*pooledClient)
	// fail gives the client back and refuses the config. A library's
	// error names the address it dialed, and an address may carry a
	// user:password expanded from {env.NAME}, which the loaded config
	// never held: none reaches the error.
	fail := func(err error) error {
		clients.Delete(key)
		s.pooled = nil
		err = fmt.Errorf("redis store: %w", err)
		for _, a := range addrs {
			err = secretopt.Scrub(err, a)
		}
		return err
	}
	// The replicas' checks have their own share (replicaCheckBound), so
	// replicas that never answer cannot use the primary's time up.
	cctx, cancel := context.WithTimeout(ctx, primaryCheckBound+replicaCheckBound)
	defer cancel()
	st, err := New(cctx, s.pooled.rdb, Options{Prefix: s.Prefix, WaitReplicas: s.WaitReplicas, WaitTimeout: wait,
		Logger: ctx.Slogger()})
	if err != nil {
		return fail(err)
	}
	id, err := keyspaceMarker(cctx, s.pooled.rdb, st.opts.Prefix)
	if err != nil {
		return fail(err)
	}
	s.store = st
	s.identity = id
	return nil
}

// checkMode refuses settings that go-redis would read as another kind of
// server than the one named: with master_name and cluster it makes a
// client that treats a Sentinel's primary and replicas as one Cluster
// shard, which the store's Sentinel and Cluster handling both assume it
// is not; and a Cluster (cluster, or several addresses without
// master_name) has only database 0, so a db there would be dropped
// silently and two configs told apart only by db would share every key.
func (s *RedisStore) checkMode(addrs int) error {
	cluster := s.MasterName == "" && (s.Cluster || addrs > 1)
	switch {
	case s.DB < 0:
		// go-redis selects a database only above 0: db -1 would share 0's keys.
		return fmt.Errorf("redis store: db %d: want a non-negative database number", s.DB)
	case s.MasterName != "" && s.Cluster:
		return errors.New("redis store: master_name (Sentinel) and cluster cannot be used together: name the Sentinels with master_name, or the Cluster nodes with cluster")
	case cluster && s.DB != 0:
		return fmt.Errorf("redis store: db %d on a Cluster (cluster, or several addresses without master_name): a Cluster has database 0 only; use prefix to keep stores apart", s.DB)
	}
	return nil
}

// primaryCheckBound bounds the primary's start checks (its INFO, its
// list of replicas, the store's marker) together: a primary that stalls
// refuses the config within it, plus replicaCheckBound, rather than
// hold Caddy's start.
const primaryCheckBound = 5 * time.Second

// StoreIdentity names the keys this store keeps its state under: the
// marker its database and prefix hold (keyspaceMarker). Stores with one
// identity share every count and claim.
func (s *RedisStore) StoreIdentity() string { return s.identity }

// keyspaceMarker returns the random value the key <prefix>:id holds,
// setting it first if no store has. One server is reached under many
// addresses (127.0.0.1 and localhost, a Sentinel set or Cluster nodes
// listed in any order or in part, a name in DNS), which no comparison of
// addresses tells apart from two servers; the marker is read from where
// the store's own keys are, so two stores read one marker exactly when
// they share one database and prefix. Its limits: a store that cannot
// write its prefix cannot start (it could not count a call either), and
// a marker deleted by hand between two stores' starts makes them two.
func keyspaceMarker(ctx context.Context, rdb redis.UniversalClient, prefix string) (string, error) {
	k := prefix + ":id"
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	if err := rdb.SetNX(ctx, k, hex.EncodeToString(b[:]), 0).Err(); err != nil {
		return "", fmt.Errorf("redisstore: writing the store's marker: %w", err)
	}
	id, err := rdb.Get(ctx, k).Result()
	if err != nil {
		return "", fmt.Errorf("redisstore: reading the store's marker: %w", err)
	}
	return prefix + " " + id, nil
}

// poolKey identifies a connection setting; the password is hashed so it is
// not kept twice in memory as a map key.
func poolKey(o *redis.UniversalOptions) (string, error) {
	b, err := json.Marshal(struct {
		Addrs              []string
		Master, User       string
		Pass, SentinelPass [32]byte
		DB                 int
		Cluster            bool
		Dial, Read, Write  time.Duration
	}{o.Addrs, o.MasterName, o.Username, sha256.Sum256([]byte(o.Password)), sha256.Sum256([]byte(o.SentinelPassword)),
		o.DB, o.IsClusterMode, o.DialTimeout, o.ReadTimeout, o.WriteTimeout})
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return "redis:" + hex.EncodeToString(sum[:]), nil
}

// Cleanup gives this config's reference to the client back once the
// config's requests in flight are done (Caddy cleans up an old config
// before its requests drain, and one may be committing a count or a
// claim), and once every holder released it (Hold); the last reference
// closes the client.
func (s *RedisStore) Cleanup() error {
	if s.pooled == nil {
		return nil
	}
	key, st, holds := s.pooled.key, s.store, s.holds
	return s.uses.AfterRequests(func() error {
		return holds.Close(func() error {
			// A served call's commit, or a refused one's release, may
			// still be retried (Store.AfterRetries).
			st.AfterRetries(func() {
				st.asks.close() // the Store's own; the client is shared
				if _, err := clients.Delete(key); err != nil {
					caddy.Log().Error("closing the Redis client", zap.Error(err))
				}
			})
			return nil
		})
	})
}

// Hold keeps the client open past this config's requests until release:
// for a facilitator whose sends, and the drops of their records, run until
// its Close, after the requests that started them (inflight.Holds).
func (s *RedisStore) Hold() (release func() error) { return s.holds.Hold() }

// Allowance returns the free allowance counters.
func (s *RedisStore) Allowance() store.Allowance { return s.store.Allowance() }

// Claims returns the payment, nonce and paid-access claims.
func (s *RedisStore) Claims() store.Claims { return s.store.Claims() }

// UnmarshalCaddyfile sets up the store from Caddyfile tokens:
//
//	store redis [<address>...] {
//	    address           <host:port>...
//	    master_name       <name>
//	    cluster
//	    username          <user>
//	    password          <password>
//	    sentinel_password <password>
//	    db                <n>
//	    prefix            <prefix>
//	    wait_replicas     <n>
//	    wait_timeout      <duration>
//	    timeout           <duration>
//	    dial_timeout      <duration>
//	}
func (s *RedisStore) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // module name
	s.Addresses = append(s.Addresses, d.RemainingArgs()...)
	seen := caddyopt.Once{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		if d.Val() != "address" {
			if err := seen.Check(d); err != nil {
				return err
			}
		}
		switch d.Val() {
		case "address":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			s.Addresses = append(s.Addresses, args...)
		case "cluster":
			if d.NextArg() {
				return d.ArgErr()
			}
			s.Cluster = true
		case "master_name", "username", "password", "sentinel_password", "prefix":
			dst := map[string]*string{"master_name": &s.MasterName, "username": &s.Username,
				"password": &s.Password, "sentinel_password": &s.SentinelPassword, "prefix": &s.Prefix}[d.Val()]
			if !d.NextArg() {
				return d.ArgErr()
			}
			*dst = d.Val()
			if d.NextArg() {
				return d.ArgErr()
			}
		case "db", "wait_replicas":
			name := d.Val()
			if !d.NextArg() {
				return d.ArgErr()
			}
			n, err := strconv.Atoi(d.Val())
			if err != nil || n < 0 {
				return d.Errf("%s: want a non-negative integer, got %q", name, d.Val())
			}
			if name == "db" {
				s.DB = n
			} else {
				s.WaitReplicas = n
			}
			if d.NextArg() {
				return d.ArgErr()
			}
		case "wait_timeout", "timeout", "dial_timeout":
			name := d.Val()
			if !d.NextArg() {
				return d.ArgErr()
			}
			dur, err := caddy.ParseDuration(d.Val())
			if err != nil || dur <= 0 {
				return d.Errf("%s: bad duration %q", name, d.Val())
			}
			*map[string]*caddy.Duration{"wait_timeout": &s.WaitTimeout, "timeout": &s.Timeout, "dial_timeout": &s.DialTimeout}[name] = caddy.Duration(dur)
			if d.NextArg() {
				return d.ArgErr()
			}
		default:
			return d.Errf("unknown redis store option %q", d.Val())
		}
	}
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner     = (*RedisStore)(nil)
	_ caddy.CleanerUpper    = (*RedisStore)(nil)
	_ caddyfile.Unmarshaler = (*RedisStore)(nil)
	_ caddy.Destructor      = (*pooledClient)(nil)
)
