package redisstore

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/aovhq/aov/caddymodule"
	"github.com/aovhq/aov/internal/jsontree"
)

// TestMultiInstanceExampleAdapts checks that the multi-instance Caddyfile
// the README shows parses, and that every gate and wallet_auth in it uses
// the Redis store with the documented settings.
func TestMultiInstanceExampleAdapts(t *testing.T) {
	b, err := os.ReadFile("../../examples/multi-instance/Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	out, warns, err := caddyconfig.GetAdapter("caddyfile").Adapt(b, map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatalf("adapting: %v", err)
	}
	for _, w := range warns {
		t.Logf("warning: %s", w)
	}
	var cfg any
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	var stores []RedisStore
	for _, v := range jsontree.Objects(cfg) {
		if v["type"] != "redis" {
			continue
		}
		b, _ := json.Marshal(v)
		var s RedisStore
		if err := json.Unmarshal(b, &s); err != nil {
			t.Fatal(err)
		}
		stores = append(stores, s)
	}
	// Two x402 gates and one wallet_auth.
	if len(stores) != 3 {
		t.Fatalf("%d redis stores in the adapted config, want 3:\n%s", len(stores), out)
	}
	// Client copies of the headers verifierd trusts from the gateway alone
	// are dropped site-wide, as Caddyfile.example drops them; so is a
	// client's Incremental, which the buffered proxy would refuse.
	// Behind the load balancer, X-Forwarded-For is read right to left, so
	// a client cannot name itself by writing the header's first entry.
	for _, want := range []string{`"delete":["X-Aov-*"]`, `"delete":["Incremental"]`, `"request_buffers":1048576`, `"trusted_proxies_strict":1`} {
		if !strings.Contains(string(out), want) {
			t.Errorf("adapted config lacks %s:\n%s", want, out)
		}
	}
	for _, s := range stores {
		if s.MasterName != "aov" || len(s.Addresses) != 3 || s.WaitReplicas != 1 || !strings.Contains(s.Password, "{env.") {
			t.Errorf("store %+v, want Sentinel master aov over 3 addresses, wait_replicas 1, password from the environment", s)
		}
	}
}
