package redisstore

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// loadLogged loads a Caddyfile site block (placeholders {redis} and {port})
// in this process with Caddy's log in a file, and returns that log once
// the config is provisioned.
func loadLogged(t *testing.T, redisAddr, site string) string {
	t.Helper()
	dir := t.TempDir()
	t.Setenv("XDG_DATA_HOME", dir)
	t.Setenv("XDG_CONFIG_HOME", dir)
	logFile := filepath.Join(dir, "caddy.log")
	port := freeLoopbackPort(t)
	cfg := fmt.Sprintf("{\n\tadmin off\n\tauto_https off\n\tpersist_config off\n\tstorage file_system %s\n\tlog {\n\t\toutput file %s\n\t\tformat json\n\t}\n}\n", dir, logFile)
	cfg += strings.NewReplacer("{redis}", redisAddr, "{port}", fmt.Sprint(port)).Replace(site)
	js, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatalf("adapting: %v\n%s", err, cfg)
	}
	if err := caddy.Load(js, true); err != nil {
		t.Fatalf("loading: %v", err)
	}
	t.Cleanup(func() { caddy.Stop() })
	b, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestWalletAuthOnBadgerBesideRedisGatesWarns: a config whose x402 gates
// share their state in Redis but whose wallet_auth keeps the default
// Badger store makes nonces and paid-access records per instance. It is
// logged as a warning when the config is provisioned, whichever comes
// first; a config where both share Redis, or both use Badger, is not.
func TestWalletAuthOnBadgerBesideRedisGatesWarns(t *testing.T) {
	srv, _ := standalone(t)
	gate := func(store string) string {
		return "x402 {\n\t\t\taccept base $0.01 0xa0Ee7A142d267C1f36714E4a8F75612F20a79720\n\t\t\tfacilitator http {\n\t\t\t\turl http://127.0.0.1:9/\n\t\t\t}\n\t\t\t" + store + "\n\t\t}\n"
	}
	wallet := func(store string) string {
		return "wallet_auth optional {\n\t\t\tdomains verify.example.com\n\t\t\t" + store + "\n\t\t}\n"
	}
	const redisStore = "store redis {redis}"
	for _, c := range []struct {
		desc, handlers string
		warn           bool
	}{
		{"wallet_auth on Badger before a Redis gate", wallet("") + gate(redisStore), true},
		{"a Redis gate before wallet_auth on Badger", gate(redisStore) + wallet(""), true},
		{"both on Redis", wallet(redisStore) + gate(redisStore), false},
		{"both on Badger", wallet("") + gate(""), false},
	} {
		t.Run(c.desc, func(t *testing.T) {
			log := loadLogged(t, srv.Addr, "http://127.0.0.1:{port} {\n\tbind 127.0.0.1\n\thandle {\n\t\t"+c.handlers+"\t\trespond ok\n\t}\n}\n")
			warned := false
			for _, line := range strings.Split(log, "\n") {
				if strings.Contains(line, `"level":"warn"`) && strings.Contains(line, "keeps its state in Badger on this machine only") {
					if !strings.Contains(line, "this wallet_auth") || !strings.Contains(line, "x402.stores.redis") {
						t.Errorf("the warning names the wrong module: %s", line)
					}
					warned = true
				}
			}
			if warned != c.warn {
				t.Errorf("warned %v, want %v; log:\n%s", warned, c.warn, log)
			}
		})
	}
}
