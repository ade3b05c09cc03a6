package caddymodule

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func TestFacilitatorDiscoveryCaddyfileErrors(t *testing.T) {
	for _, tc := range []struct{ desc, option, want string }{
		{"discovery takes off or a block", "discovery maybe", "takes 'off' or a block"},
		{"off takes nothing more", "discovery off now", "takes 'off' or a block"},
		{"max_entries is positive", "discovery {\n\t\tmax_entries 0\n\t}", "max_entries: want a positive whole number"},
		{"max_entry_bytes is at most 1 MiB", "discovery {\n\t\tmax_entry_bytes 2MiB\n\t}", "max_entry_bytes: want 1 B to 1 MiB"},
		{"max_age is a duration", "discovery {\n\t\tmax_age soon\n\t}", "bad duration"},
		{"max_age is positive", "discovery {\n\t\tmax_age -1h\n\t}", "max_age must be positive"},
		{"an unknown option is named", "discovery {\n\t\tsize 1\n\t}", "unrecognized discovery option 'size'"},
		{"store needs a module", "store", "wrong argument count"},
		{"origins needs one", "discovery {\n\t\torigins\n\t}", "wrong argument count"},
		{"list_unauthenticated_settles takes nothing", "discovery {\n\t\tlist_unauthenticated_settles yes\n\t}", "wrong argument count"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			wantErr(t, adaptSiteError("x402_facilitator {\n\tpay_to "+facPayTo()+"\n\t"+tc.option+"\n\tdevnet\n}"), tc.want)
		})
	}
}

// TestFacilitatorDiscoveryOffAndStore: with discovery off nothing is
// listed (404), and naming a store as well is refused.
func TestFacilitatorDiscoveryOffAndStore(t *testing.T) {
	mod, cancel := facLoad(t, "http.handlers.x402_facilitator", `{"pay_to":["`+facPayTo()+`"],"discovery":{"off":true},"facilitator":{"type":"evm","devnet":{}}}`)
	defer cancel()
	if status, body := facServe(t, mod.(*FacilitatorHandler), "GET", "/discovery/resources", nil); status != 404 {
		t.Fatalf("discovery off: %d %s, want 404", status, body)
	}
	ctx, cancel2 := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel2()
	_, err := ctx.LoadModuleByID("http.handlers.x402_facilitator", json.RawMessage(`{"pay_to":["`+facPayTo()+`"],"discovery":{"off":true},"store":{"type":"badger","path":"`+t.TempDir()+`"},"facilitator":{"type":"evm","devnet":{}}}`))
	wantErr(t, err, "store is set but discovery is off")

	for _, o := range []string{"verify.example", "ftp://verify.example", "https://verify.example/score", "https://"} {
		_, err := ctx.LoadModuleByID("http.handlers.x402_facilitator", json.RawMessage(`{"pay_to":["`+facPayTo()+`"],"discovery":{"origins":["`+o+`"]},"store":{"type":"badger","path":"`+t.TempDir()+`"},"facilitator":{"type":"evm","devnet":{}}}`))
		wantErr(t, err, "is not an http(s) origin")
	}
}

// TestFacilitatorDiscoveryListsUnauthenticatedSettlesOnlyWhenAsked: the
// option adapts, and with a token, where no settle is unauthenticated, it
// is refused as a contradiction.
func TestFacilitatorDiscoveryListsUnauthenticatedSettlesOnlyWhenAsked(t *testing.T) {
	var fd *FacilitatorDiscovery
	for _, d := range []*caddyfile.Dispenser{caddyfile.NewTestDispenser("discovery {\n\tlist_unauthenticated_settles\n}")} {
		d.Next()
		var err error
		if fd, err = parseFacilitatorDiscovery(d); err != nil || !fd.ListUnauthenticatedSettles {
			t.Fatalf("parsed %+v, %v", fd, err)
		}
	}
	t.Setenv("FAC_DISC_TOKEN", "disc-token-0123456789")
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	_, err := ctx.LoadModuleByID("http.handlers.x402_facilitator", json.RawMessage(`{"pay_to":["`+facPayTo()+`"],"token":"{env.FAC_DISC_TOKEN}","discovery":{"list_unauthenticated_settles":true},"store":{"type":"badger","path":"`+t.TempDir()+`"},"facilitator":{"type":"evm","devnet":{}}}`))
	wantErr(t, err, "with a token no settle is unauthenticated")
}
