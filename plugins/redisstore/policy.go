package redisstore

import (
	"bufio"
	"context"
	"fmt"
	"iter"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// checkPolicy checks, at start, every server that holds or may come to
// hold the store's keys: the primary (every Cluster primary), and the
// replicas a failover would promote.
//
// A maxmemory-policy other than noeviction is refused, on a replica too:
// a replica does not evict while it follows a primary, but once Sentinel
// promotes it, it evicts live claims with its own policy, and each evicted
// claim is a replay the gateway would accept. Nothing runs this check
// again after a failover, so it must hold before one.
//
// Warnings, not refusals: appendonly off (a crash loses the writes since
// the last snapshot; a deliberate choice for some, see the README), and a
// replica that cannot be reached at the address it announces, or will not
// give its INFO (it is then not checked: the gateway must not depend on a
// replica to start).
//
// Both facts are read from INFO, not CONFIG GET: Redis cannot limit an
// ACL user's CONFIG GET to some parameters, and with it the store's user
// would read requirepass and masterauth and could AUTH as the default
// user. The store's ACL rule grants no CONFIG at all.
//
// Replicas are those the primary lists as connected now (INFO
// replication; a Cluster's own node list): one that is down at start, or
// added later, is not checked. They are checked at once, all within
// replicaCheckBound of the primary's checks, whatever the store's timeout:
// one that accepts and never answers is then a warning like one that
// cannot be reached, and any number of them adds at most that to a start.
func (s *Store) checkPolicy(ctx context.Context) error {
	log := s.opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		if err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			return checkServer(ctx, c, "primary", log)
		}); err != nil {
			return err
		}
		rctx, cancel := context.WithTimeout(ctx, replicaCheckBound)
		defer cancel()
		// ForEachSlave asks every replica at once.
		return cc.ForEachSlave(rctx, func(ctx context.Context, c *redis.Client) error {
			return checkReplica(ctx, c, log)
		})
	}
	c, ok := s.rdb.(*redis.Client)
	if !ok {
		return fmt.Errorf("redisstore: unsupported client type %T", s.rdb)
	}
	if err := checkServer(ctx, c, "primary", log); err != nil {
		return err
	}
	info, err := c.Info(ctx, "replication").Result()
	if err != nil {
		return fmt.Errorf("redisstore: listing the replicas: %w", err)
	}
	addrs := replicaAddrs(info)
	rctx, cancel := context.WithTimeout(ctx, replicaCheckBound)
	defer cancel()
	errs := make([]error, len(addrs))
	var wg sync.WaitGroup
	for i, addr := range addrs {
		// The primary's connection settings (password, TLS, timeouts),
		// but the replica's address: drop a Sentinel client's dialer,
		// which always dials the current primary.
		o := *c.Options()
		// One attempt: an unreachable replica is a warning, soon.
		o.Addr, o.Dialer, o.OnConnect, o.MaxRetries = addr, nil, nil, -1
		// rctx bounds the check on a client New was given without it
		// too, however long its read timeout.
		o.ContextTimeoutEnabled = true
		wg.Go(func() {
			rc := redis.NewClient(&o)
			defer rc.Close()
			errs[i] = checkReplica(rctx, rc, log)
		})
	}
	wg.Wait()
	// The first refusal in the primary's order, so a start refused for
	// several replicas names the same one each time.
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// replicaCheckBound bounds the start's replica checks, all of them
// together (they run at once): a replica that does not answer within it
// is a warning, and the primary's checks keep their own time
// (primaryCheckBound).
const replicaCheckBound = 2 * time.Second

// checkReplica is checkServer for a replica: one it cannot ask is a
// warning.
func checkReplica(ctx context.Context, c *redis.Client, log *slog.Logger) error {
	err := checkServer(ctx, c, "replica", log)
	if err != nil && !isPolicyError(err) {
		log.Warn("redis store: replica not checked: its INFO memory and persistence could not be read at the address it announces; make sure its maxmemory-policy is noeviction and appendonly is yes, or a failover to it may lose or evict claims",
			"replica", c.Options().Addr, "error", err.Error())
		return nil
	}
	return err
}

// policyError is a server whose maxmemory-policy evicts.
type policyError struct{ msg string }

func (e *policyError) Error() string { return e.msg }

func isPolicyError(err error) bool {
	_, ok := err.(*policyError)
	return ok
}

// checkServer refuses an evicting server and warns about one without AOF,
// from its INFO memory (maxmemory_policy) and INFO persistence
// (aof_enabled, 1 exactly when appendonly is yes). A field missing is an
// error like an unanswered INFO: the server is not known to be safe.
func checkServer(ctx context.Context, c *redis.Client, role string, log *slog.Logger) error {
	addr := c.Options().Addr
	info, err := c.Info(ctx, "memory", "persistence").Result()
	if err != nil {
		return fmt.Errorf("redisstore: reading INFO memory and persistence from %s %s: %w", role, addr, err)
	}
	var policy, aof string
	var hasPolicy, hasAOF bool
	for name, val := range infoFields(info) {
		switch name {
		case "maxmemory_policy":
			policy, hasPolicy = val, true
		case "aof_enabled":
			aof, hasAOF = val, true
		}
	}
	if !hasPolicy || !hasAOF {
		return fmt.Errorf("redisstore: %s %s: INFO has no maxmemory_policy or aof_enabled", role, addr)
	}
	if policy != "noeviction" {
		return &policyError{fmt.Sprintf("redisstore: %s %s has maxmemory-policy %q; the store needs noeviction (an evicted claim is an accepted replay)", role, addr, policy)}
	}
	if aof != "1" {
		log.Warn("redis store: appendonly is off: a crash of this server loses the claims and counted calls written since its last snapshot (a lost claim lets a still-valid authorization be presented again, a lost nonce lets a proof be replayed); set appendonly yes",
			"role", role, "server", addr)
	}
	return nil
}

// replicaAddrs reads the connected replicas' addresses from the primary's
// INFO replication ("slave0:ip=10.0.0.2,port=6379,state=online,...").
func replicaAddrs(info string) []string {
	var addrs []string
	for name, val := range infoFields(info) {
		if !strings.HasPrefix(name, "slave") || strings.HasPrefix(name, "slave_") {
			continue
		}
		var ip, port string
		for kv := range strings.SplitSeq(val, ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "ip":
				ip = v
			case "port":
				port = v
			}
		}
		if ip != "" && port != "" {
			addrs = append(addrs, net.JoinHostPort(ip, port))
		}
	}
	return addrs
}

// infoFields yields the name:value lines of an INFO answer; section
// headers ("# Memory") and blank lines have no colon and are skipped.
func infoFields(info string) iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		sc := bufio.NewScanner(strings.NewReader(info))
		for sc.Scan() {
			name, val, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
			if ok && !yield(name, val) {
				return
			}
		}
	}
}
