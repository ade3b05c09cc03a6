package redisstore

import (
	"fmt"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/aovhq/aov/internal/servers"
)

// tryLoad loads a Caddyfile site block (placeholder {port}) in this
// process, its log discarded, and returns the load's error.
func tryLoad(t *testing.T, site string) error {
	t.Helper()
	dir := t.TempDir()
	t.Setenv("XDG_DATA_HOME", dir)
	t.Setenv("XDG_CONFIG_HOME", dir)
	cfg := fmt.Sprintf("{\n\tadmin off\n\tauto_https off\n\tpersist_config off\n\tstorage file_system %s\n\tlog {\n\t\toutput discard\n\t}\n}\n", dir)
	cfg += strings.ReplaceAll(site, "{port}", fmt.Sprint(freeLoopbackPort(t)))
	js, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatalf("adapting: %v\n%s", err, cfg)
	}
	err = caddy.Load(js, true)
	t.Cleanup(func() { caddy.Stop() })
	return err
}

// poolGate is a gate on POST /<path> granting per_day free calls of pool
// "default", keeping its counts in the Redis store written as store.
func poolGate(path, store string, perDay int) string {
	return fmt.Sprintf(`
	route /%[1]s {
		x402 {
			route "POST /%[1]s"
			accept base $0.01 0xa0Ee7A142d267C1f36714E4a8F75612F20a79720
			facilitator http http://127.0.0.1:9/
			store redis %[2]s
			free_allowance {
				per_day %[3]d
			}
		}
		respond ok
	}`, path, store, perDay)
}

// TestFreePoolTermsCheckedWhateverTheRedisAddressSpelling: two gates
// naming one pool in one Redis database and prefix count in one
// allowance, so their different per_day is refused however the server's
// address is spelled; gates in another database or prefix of the same
// server never meet in a count and load.
func TestFreePoolTermsCheckedWhateverTheRedisAddressSpelling(t *testing.T) {
	srv, _ := standalone(t)
	_, port, _ := strings.Cut(srv.Addr, ":")
	for _, c := range []struct {
		desc, a, b string
		refused    bool
	}{
		{"127.0.0.1 and localhost", "127.0.0.1:" + port, "localhost:" + port, true},
		{"one address and the same in a block", srv.Addr, "{\n\t\t\t\taddress localhost:" + port + "\n\t\t\t\tdb 0\n\t\t\t}", true},
		{"another database", srv.Addr, "{\n\t\t\t\taddress localhost:" + port + "\n\t\t\t\tdb 1\n\t\t\t}", false},
		{"another prefix", srv.Addr, "{\n\t\t\t\taddress localhost:" + port + "\n\t\t\t\tprefix other\n\t\t\t}", false},
	} {
		t.Run(c.desc, func(t *testing.T) {
			err := tryLoad(t, "http://127.0.0.1:{port} {\n\tbind 127.0.0.1"+poolGate("a", c.a, 1)+poolGate("b", c.b, 100)+"\n}\n")
			if c.refused && (err == nil || !strings.Contains(err.Error(), `pool "default" is one allowance in one store`)) {
				t.Errorf("per_day 1 and 100 for one pool in one store: %v, want refused", err)
			}
			if !c.refused && err != nil {
				t.Errorf("stores that never meet in a count: %v, want loaded", err)
			}
		})
	}
}

// TestFreePoolTermsCheckedWhateverTheClusterNodesListed: a Cluster named
// by all its nodes and by one of them is one store.
func TestFreePoolTermsCheckedWhateverTheClusterNodesListed(t *testing.T) {
	cl := servers.StartRedisCluster(t)
	all := "{\n\t\t\t\taddress " + strings.Join(cl.Addrs, " ") + "\n\t\t\t\tcluster\n\t\t\t}"
	one := "{\n\t\t\t\taddress " + cl.Addrs[len(cl.Addrs)-1] + "\n\t\t\t\tcluster\n\t\t\t}"
	err := tryLoad(t, "http://127.0.0.1:{port} {\n\tbind 127.0.0.1"+poolGate("a", all, 1)+poolGate("b", one, 100)+"\n}\n")
	if err == nil || !strings.Contains(err.Error(), `pool "default" is one allowance in one store`) {
		t.Errorf("per_day 1 and 100 for one pool in one Cluster: %v, want refused", err)
	}
}
