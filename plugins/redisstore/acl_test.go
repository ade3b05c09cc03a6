package redisstore

import (
	"context"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/store/storetest"
)

// readmeACL returns the arguments of README's ACL SETUSER lines for the
// store's user (after "ACL SETUSER aov"), one slice per line: the rule an
// operator pastes, read from where the operator reads it.
func readmeACL(t *testing.T) [][]string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var lines [][]string
	for l := range strings.SplitSeq(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 3 && f[0] == "ACL" && f[1] == "SETUSER" && f[2] == "aov" {
			lines = append(lines, f[3:])
		}
	}
	if len(lines) != 2 {
		t.Fatalf("README has %d ACL SETUSER aov lines, want the rule and the Cluster's addition", len(lines))
	}
	return lines
}

const aclPassword = "acl-test-password"

// setACLUser creates user on the server c admins with README's rule lines,
// its password given and its key pattern ~aov:* applied to each of the
// prefixes (globs) the test's stores use.
func setACLUser(t *testing.T, c *redis.Client, user string, lines [][]string, prefixes ...string) {
	t.Helper()
	for _, l := range lines {
		args := []any{"ACL", "SETUSER", user}
		for _, a := range l {
			switch a {
			case ">PASSWORD":
				args = append(args, ">"+aclPassword)
			case "~aov:*":
				for _, p := range prefixes {
					args = append(args, "~"+p+":*")
				}
			default:
				args = append(args, a)
			}
		}
		if err := c.Do(context.Background(), args...).Err(); err != nil {
			t.Fatalf("ACL SETUSER %v: %v", l, err)
		}
	}
}

// granted is the commands a README rule line allows (+name).
func granted(lines [][]string) []string {
	var out []string
	for _, l := range lines {
		for _, a := range l {
			if c, ok := strings.CutPrefix(a, "+"); ok {
				out = append(out, c)
			}
		}
	}
	sort.Strings(out)
	return out
}

// notTheStores are commands a server counts that are not the store's:
// those every user may run (HELLO, AUTH), the replica's REPLCONF, and the
// test's own, run as the default user.
var notTheStores = []string{"hello", "auth", "replconf", "acl|log", "script|flush", "config|resetstat"}

// ran is the commands the server ran (INFO commandstats, calls > 0) but
// notTheStores.
func ran(t *testing.T, c *redis.Client) []string {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for l := range strings.SplitSeq(info, "\n") {
		name, stats, ok := strings.Cut(strings.TrimSpace(l), ":")
		name, isCmd := strings.CutPrefix(name, "cmdstat_")
		if !ok || !isCmd || strings.HasPrefix(stats, "calls=0,") || slices.Contains(notTheStores, name) {
			continue
		}
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// noDenials fails the test if the server refused any command to a user
// (ACL LOG): a refusal the client swallows is caught too.
func noDenials(t *testing.T, c *redis.Client, server string) {
	t.Helper()
	log, err := c.Do(context.Background(), "ACL", "LOG").Slice()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range log {
		t.Errorf("%s refused the store's user: %v", server, e)
	}
}

// TestREADMEACLRunsTheStore: a Redis user with exactly README's rule runs
// the store's whole life: a gateway's start through Caddy (the marker, the
// policy checks on the primary and its replica, SELECT for db), the
// allowance, claims, held calls, payment identifier bindings and the
// discovery list through their contract suites, writes waited for by a
// replica, and Ping; nothing is refused on either server. And the rule
// grants no command the store did not run, so it lists exactly the store's
// commands. The contract suites' stores use prefixes of their own (t<n>,
// held…): README's key pattern is applied to each.
func TestREADMEACLRunsTheStore(t *testing.T) {
	ctx := context.Background()
	lines := readmeACL(t)
	rule := lines[:1] // the Cluster's addition is tested on a Cluster
	primary, replica := withReplica(t)
	admin := redis.NewClient(&redis.Options{Addr: primary.Addr})
	defer admin.Close()
	radmin := redis.NewClient(&redis.Options{Addr: replica.Addr})
	defer radmin.Close()
	for _, c := range []*redis.Client{admin, radmin} {
		setACLUser(t, c, "aov", rule, "aov", "t[0-9]*", "held*")
		if err := c.Do(ctx, "ACL", "LOG", "RESET").Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := admin.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	user := func(db int) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: primary.Addr, Username: "aov", Password: aclPassword, DB: db, PoolSize: 16})
		t.Cleanup(func() { c.Close() })
		return c
	}

	log := loadLogged(t, primary.Addr, `http://127.0.0.1:{port} {
	bind 127.0.0.1
	x402 {
		accept base $0.01 0xa0Ee7A142d267C1f36714E4a8F75612F20a79720
		facilitator http http://127.0.0.1:9/
		store redis {
			address {redis}
			username aov
			password `+aclPassword+`
			db 1
			wait_replicas 1
		}
	}
	respond ok
}
`)
	if strings.Contains(log, "not checked") {
		t.Errorf("the replica was not checked as the store's user:\n%s", log)
	}

	rdb := user(0)
	t.Run("allowance", func(t *testing.T) { storetest.TestAllowance(t, backend(rdb)) })
	t.Run("claims", func(t *testing.T) { storetest.TestClaims(t, backend(rdb)) })
	t.Run("held", func(t *testing.T) { testHeld(t, rdb) })
	t.Run("payment ids", func(t *testing.T) { storetest.TestPaymentIDs(t, paymentIDBackend(rdb)) })
	t.Run("discovery", func(t *testing.T) { storetest.TestDiscovery(t, discoveryBackend(rdb)) })
	t.Run("waited writes", func(t *testing.T) {
		s, err := New(ctx, rdb, Options{Prefix: "aov", WaitReplicas: 1, WaitTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		// A fresh connection's first waited write finds its script
		// unloaded (EVALSHA, NOSCRIPT, SCRIPT LOAD, EVALSHA, WAIT).
		if err := admin.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		a := s.Allowance()
		r, err := a.Reserve(ctx, "pool", "client", time.Now(), 1)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Commit(ctx, r); err != nil {
			t.Fatal(err)
		}
		if err := s.Ping(ctx); err != nil {
			t.Fatal(err)
		}
	})

	noDenials(t, admin, "the primary")
	noDenials(t, radmin, "the replica")
	if got, want := ran(t, admin), granted(rule); !slices.Equal(got, want) {
		t.Errorf("the store ran %v;\nREADME's rule grants %v", got, want)
	}
}

// TestREADMEACLRunsTheStoreOnACluster: README's rule with its Cluster
// line, on every node, runs a gateway's start and the allowance, claims
// and held calls on a Cluster, nothing refused on any node; the Cluster
// line grants only what the client ran there.
func TestREADMEACLRunsTheStoreOnACluster(t *testing.T) {
	ctx := context.Background()
	lines := readmeACL(t)
	// Every node the Cluster was made of, each by its own client: the
	// Cluster client's view (ForEachShard) is the slots map one node gave
	// it, which can still lack a master whose gossip has not reached that
	// node, leaving that master without the user.
	addrs := cluster(t).Options().Addrs
	admins := make([]*redis.Client, len(addrs))
	for i, addr := range addrs {
		admins[i] = redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { admins[i].Close() })
	}
	for _, c := range admins {
		setACLUser(t, c, "aov", lines, "aov", "t[0-9]*", "held*")
		if err := c.Do(ctx, "ACL", "LOG", "RESET").Err(); err != nil {
			t.Fatal(err)
		}
		if err := c.ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}

	if err := tryLoad(t, `http://127.0.0.1:{port} {
	bind 127.0.0.1
	x402 {
		accept base $0.01 0xa0Ee7A142d267C1f36714E4a8F75612F20a79720
		facilitator http http://127.0.0.1:9/
		store redis `+strings.Join(addrs, " ")+` {
			username aov
			password `+aclPassword+`
		}
	}
	respond ok
}
`); err != nil {
		t.Fatalf("a store on a Cluster as README's user: %v", err)
	}

	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, Username: "aov", Password: aclPassword, PoolSize: 16})
	defer rdb.Close()
	t.Run("allowance", func(t *testing.T) { storetest.TestAllowance(t, backend(rdb)) })
	t.Run("claims", func(t *testing.T) { storetest.TestClaims(t, backend(rdb)) })
	t.Run("held", func(t *testing.T) { testHeld(t, rdb) })

	var all []string
	for i, c := range admins {
		noDenials(t, c, "node "+addrs[i])
		all = append(all, ran(t, c)...)
	}
	for _, c := range granted(lines[1:]) {
		// ASKING is sent only while a slot moves:
		// TestREADMEACLServesAWriteWhileItsSlotMoves runs it.
		if !slices.Contains(all, c) && c != "asking" {
			t.Errorf("README's Cluster line grants %s, which no node ran", c)
		}
	}
}

// aclClusterClient is a Cluster client made as the module makes it
// (moduleClusterOptions), as README's ACL user (its rule lines set on every node of cl, each line's
// key pattern applied to prefixes), and the nodes' admin clients.
func aclClusterClient(t *testing.T, ctx context.Context, cl *servers.Cluster, prefixes ...string) (*redis.ClusterClient, []*redis.Client) {
	t.Helper()
	lines := readmeACL(t)
	admins := make([]*redis.Client, len(cl.Addrs))
	for i, addr := range cl.Addrs {
		admins[i] = redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { admins[i].Close() })
		setACLUser(t, admins[i], "aov", lines, prefixes...)
		if err := admins[i].Do(ctx, "ACL", "LOG", "RESET").Err(); err != nil {
			t.Fatal(err)
		}
	}
	o := moduleClusterOptions(cl)
	o.Username, o.Password = "aov", aclPassword
	rdb := redis.NewClusterClient(o)
	t.Cleanup(func() { rdb.Close() })
	return rdb, admins
}

// TestREADMEACLServesAWriteWhileItsSlotMoves: README ("What each failure
// costs", a Cluster slot moves) says a write the old primary refuses with
// ASK is sent to the primary it names, after ASKING, which is a command
// under ACL like any other: README's rule grants it, so a one-key claim
// whose slot is moving is served as README's user, with and without
// wait_replicas, nothing refused on any node. A user without it is
// refused ASKING, and a waited write reports that refusal, not the MOVED
// the node then answered the script. (Before: README's rule lacked
// ASKING, every write answered ASK was a 503 for the whole move, and with
// wait_replicas its error was a misleading MOVED.)
func TestREADMEACLServesAWriteWhileItsSlotMoves(t *testing.T) {
	ctx := context.Background()
	cl := servers.StartRedisClusterReplicated(t)
	masters := clusterNodes(t, ctx, cl)
	rdb, admins := aclClusterClient(t, ctx, cl, "mv")
	s, err := New(ctx, rdb, Options{Prefix: "mv", WaitReplicas: 1, WaitTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	s0, err := New(ctx, rdb, Options{Prefix: "mv"})
	if err != nil {
		t.Fatal(err)
	}
	until := time.Now().Add(time.Minute)
	if _, err := s.Claims().Claim(ctx, []string{"a1"}, until); err != nil {
		t.Fatalf("a claim as README's user before the move: %v", err)
	}
	from, to, slot := slotOwner(t, ctx, masters, "mv:{c}:a1")
	migrateSlot(t, ctx, from, to, slot)

	if _, err := s.Claims().Claim(ctx, []string{"k1"}, until); err != nil {
		t.Errorf("with wait_replicas 1, as README's user: a one-key claim while its slot moves = %v, want claimed", err)
	}
	if _, err := s0.Claims().Claim(ctx, []string{"k0"}, until); err != nil {
		t.Errorf("without wait_replicas, as README's user: a one-key claim while its slot moves = %v, want claimed", err)
	}
	var all []string
	for i, c := range admins {
		noDenials(t, c, "node "+cl.Addrs[i])
		all = append(all, ran(t, c)...)
	}
	if !slices.Contains(all, "asking") {
		t.Errorf("no node ran ASKING (ran %v): the move did not take the ASK path", all)
	}

	for _, c := range admins {
		if err := c.Do(ctx, "ACL", "SETUSER", "aov", "-asking").Err(); err != nil {
			t.Fatal(err)
		}
	}
	for name, st := range map[string]*Store{"with wait_replicas 1": s, "without wait_replicas": s0} {
		_, err := st.Claims().Claim(ctx, []string{"n-" + name}, until)
		if err == nil || !strings.Contains(err.Error(), "NOPERM") || !strings.Contains(err.Error(), "asking") {
			t.Errorf("%s, as a user refused ASKING: a claim while its slot moves = %v, want the refused ASKING (NOPERM)", name, err)
		}
	}
}

// TestREADMEACLKeepsTheUserOnItsKeys: README's rule is also the store's
// user's whole reach on a server whose admin is a password (requirepass,
// and the masterauth a replica of it gives its primary). The user cannot
// read either secret (no CONFIG GET, which Redis cannot limit to some
// parameters; INFO does not carry them; no ACL listing), so it cannot AUTH as the default user; and
// it reaches no key outside its prefix, directly, through a script's
// declared or undeclared keys, nor by listing or flushing. The store still
// starts as that user, on the same server.
func TestREADMEACLKeepsTheUserOnItsKeys(t *testing.T) {
	ctx := context.Background()
	const adminPW, primaryPW = "the-admins-secret", "the-primarys-secret"
	srv := servers.StartRedis(t)
	// Set once the server is up: the harness waits for it without a
	// password.
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr})
	for _, p := range [][2]string{{"masterauth", primaryPW}, {"requirepass", adminPW}} {
		if err := admin.ConfigSet(ctx, p[0], p[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	admin.Close()
	admin = redis.NewClient(&redis.Options{Addr: srv.Addr, Password: adminPW})
	defer admin.Close()
	setACLUser(t, admin, "aov", readmeACL(t)[:1], "aov")
	if err := admin.Set(ctx, "other:secret", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	u := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "aov", Password: aclPassword})
	defer u.Close()

	if _, err := New(ctx, u, Options{Prefix: "aov"}); err != nil {
		t.Fatalf("the store as README's user: %v", err)
	}

	for _, param := range []string{"requirepass", "masterauth", "*"} {
		if got, err := u.ConfigGet(ctx, param).Result(); err == nil {
			t.Errorf("README's store user runs CONFIG GET %s: %d parameters read", param, len(got))
		}
	}
	info, err := u.Info(ctx, "everything").Result()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(info, adminPW) || strings.Contains(info, primaryPW) {
		t.Error("INFO, granted to README's store user, shows a server password")
	}
	for _, cmd := range [][]any{{"ACL", "LIST"}, {"ACL", "GETUSER", "default"}} {
		if v, err := u.Do(ctx, cmd...).Result(); err == nil {
			t.Errorf("%v ran: %v", cmd, v)
		}
	}
	// What the default user's password opens, had the user learnt it.
	if err := u.Do(ctx, "AUTH", "default", adminPW).Err(); err != nil {
		t.Fatalf("AUTH default with the admin's password: %v (the check above proves nothing)", err)
	}
	u.Close()

	u = redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "aov", Password: aclPassword})
	if v, err := u.Get(ctx, "other:secret").Result(); err == nil {
		t.Errorf("GET outside the prefix: %v", v)
	}
	if err := u.Set(ctx, "other:x", "v", 0).Err(); err == nil {
		t.Error("SET outside the prefix ran")
	}
	if v, err := u.Eval(ctx, "return redis.call('GET', KEYS[1])", []string{"other:secret"}).Result(); err == nil {
		t.Errorf("EVAL GET outside the prefix: %v", v)
	}
	if v, err := u.Eval(ctx, "return redis.call('GET', 'other:secret')", []string{"aov:x"}).Result(); err == nil {
		t.Errorf("EVAL GET of an undeclared key outside the prefix: %v", v)
	}
	for _, cmd := range [][]any{{"KEYS", "*"}, {"SCAN", "0"}, {"FLUSHDB"}, {"FLUSHALL"}} {
		if v, err := u.Do(ctx, cmd...).Result(); err == nil {
			t.Errorf("%v ran: %v", cmd, v)
		}
	}
	if n, err := admin.Exists(ctx, "other:secret").Result(); err != nil || n != 1 {
		t.Errorf("other:secret after the user's attempts: exists %d, %v", n, err)
	}
}
