package caddymodule

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// storeOptsSite is a free route behind wallet_auth, both on the store in
// dir, each with its own store options (a Caddyfile block or "").
func storeOptsSite(up, fac, dir, walletStore, gateStore string) string {
	return fmt.Sprintf(`:{port} {
	route /verify/schema {
		wallet_auth optional {
			domains localhost
			store badger %[3]s %[4]s
		}
		x402 {
			accept devnet $0.02 0x1111111111111111111111111111111111111111
			facilitator http {
				url %[2]s
			}
			store badger %[3]s %[5]s
			free_allowance {
				per_day 1
			}
		}
		reverse_proxy %[1]s
	}
}
`, up, fac, dir, walletStore, gateStore)
}

// wantStoreConflict fails t unless err is the provisioning refusal of a
// no_sync that differs from the open database's, saying all an operator
// needs: the folder, the option, both values, and what to do.
func wantStoreConflict(t *testing.T, err error, dir string, asked, open bool) {
	t.Helper()
	if err == nil {
		t.Fatal("a config whose stores disagree on no_sync was loaded")
	}
	for _, part := range []string{
		"gateway store at " + dir,
		fmt.Sprintf("no_sync is %v here", asked),
		fmt.Sprintf("already open with no_sync %v", open),
		"make the modules agree",
		"restart Caddy",
	} {
		if !strings.Contains(err.Error(), part) {
			t.Errorf("error %q does not say %q", err, part)
		}
	}
}

// TestStoreOptionsRefusalAtLoad: two modules of one config naming one
// folder, one with no_sync and one without, fail to load (whichever
// provisions first opens the database; the other cannot have its no_sync).
// Made to agree, the same config loads: which also shows the refused
// config gave back the reference its first module took, or the folder
// would still be open without no_sync.
func TestStoreOptionsRefusalAtLoad(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	dir := t.TempDir()
	port := freePort(t)
	nosync := "{\n\t\t\t\tno_sync\n\t\t\t}"

	err := tryLoadCaddy(t, port, storeOptsSite(up.URL, fac, dir, "", nosync))
	if err == nil {
		caddy.Stop()
	}
	wantStoreConflict(t, err, dir, true, false)

	base := startCaddy(t, storeOptsSite(up.URL, fac, dir, nosync, nosync))
	if resp := post(t, base+"/verify/schema", validRequest, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("free call with agreeing stores: %d", resp.StatusCode)
	}
}

// TestStoreOptionsReloadRefused: a reload that changes no_sync while the
// running config holds the database is refused (Caddy keeps the old
// config), and the old config keeps serving with its state; a reload that
// agrees still works afterwards.
func TestStoreOptionsReloadRefused(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	dir := t.TempDir()
	site := storeOptsSite(up.URL, fac, dir, "", "")
	base := startCaddy(t, site)
	url := base + "/verify/schema"
	if resp := post(t, url, validRequest, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("free call: %d", resp.StatusCode)
	}
	port, _ := strconv.Atoi(base[strings.LastIndex(base, ":")+1:])

	nosync := "{\n\t\t\t\tno_sync\n\t\t\t}"
	wantStoreConflict(t, tryLoadCaddy(t, port, storeOptsSite(up.URL, fac, dir, nosync, nosync)), dir, true, false)

	waitServing(t, port)
	resp := post(t, url, validRequest, nil)
	if resp.StatusCode != http.StatusPaymentRequired || readJSON(t, resp)["free_trial"].(map[string]any)["remaining_calls_today"] != float64(0) {
		t.Fatalf("after the refused reload the old config does not serve its state: %d", resp.StatusCode)
	}

	loadCaddy(t, port, strings.Replace(site, "per_day 1", "per_day 2", 1))
	if resp := post(t, url, validRequest, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("free call after an agreeing reload raised the limit: %d", resp.StatusCode)
	}
}
