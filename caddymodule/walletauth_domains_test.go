package caddymodule

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/aovhq/aov/walletauth"
)

// TestWalletAuthDomains: proofs are checked against the configured site
// names, never the request's Host. A proof signed for another site is
// refused even when the client sends that site's name as Host; a proof for
// a configured name passes whatever the Host says.
func TestWalletAuthDomains(t *testing.T) {
	up := walletUpstream(t)
	t.Setenv("WA_TEST_SECOND_SITE", "second.example:8443")
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /api/* {
		wallet_auth {
			store badger {data}/gate
			domains verify.example.com {env.WA_TEST_SECOND_SITE} secure.example.com:443
		}
		reverse_proxy %s
	}
}
`, strings.TrimPrefix(up.URL, "http://")))
	send := func(t *testing.T, host, proofURL string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest("POST", base+"/api/items", strings.NewReader("{}"))
		req.Host = host
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(walletauth.HeaderName, walletProof(t, walletKey(1), "POST", proofURL, nil))
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var m map[string]any
		json.Unmarshal(raw, &m)
		return resp.StatusCode, m
	}
	t.Run("a proof for another site is refused though the Host names that site", func(t *testing.T) {
		st, m := send(t, "other-site.example", "https://other-site.example/api/items")
		if st != 401 {
			t.Fatalf("%d %v", st, m)
		}
		if f := m["fields"].([]any)[0].(map[string]any); f["field"] != "X-Wallet-Auth.domain" {
			t.Fatalf("fields %v", m["fields"])
		}
	})
	t.Run("a proof for the request's own Host, when that is not a site name, is refused", func(t *testing.T) {
		st, m := send(t, strings.TrimPrefix(base, "http://"), base+"/api/items")
		if st != 401 {
			t.Fatalf("%d %v", st, m)
		}
	})
	t.Run("a proof for a configured name passes whatever the Host", func(t *testing.T) {
		st, m := send(t, strings.TrimPrefix(base, "http://"), "https://verify.example.com/api/items")
		if st != 200 || m["wallet"] != walletAddr(1) {
			t.Fatalf("%d %v", st, m)
		}
	})
	// Browsers and wallets sign the host without a default port; a client
	// that addressed the port signs it with it. Both match a name
	// configured with :443.
	t.Run("a name configured with :443 matches a proof without the port", func(t *testing.T) {
		st, m := send(t, "verify.example.com", "https://secure.example.com/api/items")
		if st != 200 {
			t.Fatalf("%d %v", st, m)
		}
	})
	t.Run("and a proof with it", func(t *testing.T) {
		st, m := send(t, "verify.example.com", "https://secure.example.com:443/api/items")
		if st != 200 {
			t.Fatalf("%d %v", st, m)
		}
	})
	t.Run("a name from an environment placeholder is a site name", func(t *testing.T) {
		st, m := send(t, "verify.example.com", "http://second.example:8443/api/items")
		if st != 200 {
			t.Fatalf("%d %v", st, m)
		}
	})
}

func TestWalletAuthDomainsConfig(t *testing.T) {
	for _, c := range []struct{ desc, site, want string }{
		{"domains is required", "wallet_auth {\n\tstore badger {data}/gate\n}", "domains is required"},
		{"a URL is not a site name", "wallet_auth {\n\tstore badger {data}/gate\n\tdomains https://verify.example.com\n}", "is not a host name"},
		{"an unset placeholder is not a site name", "wallet_auth {\n\tstore badger {data}/gate\n\tdomains {env.WA_TEST_UNSET_SITE_X}\n}", "is not a host name"},
	} {
		t.Run(c.desc, func(t *testing.T) {
			cfg := "{\n\tadmin off\n\tauto_https off\n\tpersist_config off\n\tstorage file_system " + t.TempDir() + "\n}\n:0 {\n" +
				strings.ReplaceAll(c.site, "{data}", t.TempDir()) + "\n}\n"
			js, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), nil)
			if err != nil {
				t.Fatal(err)
			}
			var cc caddy.Config
			if err := json.Unmarshal(js, &cc); err != nil {
				t.Fatal(err)
			}
			wantErr(t, caddy.Validate(&cc), c.want)
		})
	}
	t.Run("domains needs at least one name", func(t *testing.T) {
		wantErr(t, adaptSiteError("wallet_auth {\n\tdomains\n}"), "wrong argument count")
	})
}
