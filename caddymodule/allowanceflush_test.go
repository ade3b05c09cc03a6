package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

func TestStoreAllowanceFlushCaddyfile(t *testing.T) {
	site := func(opt string) string {
		return "x402 {\n\taccept base $0.02 0x1111111111111111111111111111111111111111\n\tstore badger {\n\t\t" + opt + "\n\t}\n}"
	}
	for _, c := range []struct{ opt, want string }{
		{"allowance_flush 100ms", ""},
		{"allowance_flush 100ms 50", ""},
		{"allowance_flush off", ""},
		{"allowance_flush", "wrong argument count"},
		{"allowance_flush 0", "must be a positive duration"},
		{"allowance_flush -1s", "must be a positive duration"},
		{"allowance_flush soon", "must be a positive duration"},
		{"allowance_flush 1s 0", "must be a positive number"},
		{"allowance_flush 1s many", "must be a positive number"},
		{"allowance_flush 1s 5 6", "wrong argument count"},
		{"allowance_flush off 5", "must be a positive duration"},
	} {
		t.Run(c.opt, func(t *testing.T) { wantErr(t, adaptSiteError(site(c.opt)), c.want) })
	}
}

// TestFreeAllowanceBatchedThroughCaddy: with allowance_flush the free path
// behaves exactly as with durable counts (the limit holds, an upstream
// error costs nothing), and stopping Caddy writes the counts it batched.
func TestFreeAllowanceBatchedThroughCaddy(t *testing.T) {
	up := newUpstream(t)
	dir := gateDir(t)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept base $0.02 0x1111111111111111111111111111111111111111
			facilitator http {
				url http://127.0.0.1:1
			}
			store badger %s {
				allowance_flush 1h
			}
			validate verify_request
			free_allowance {
				pool verify
				per_day 3
			}
		}
		reverse_proxy %s
	}
}
`, dir, strings.TrimPrefix(up.URL, "http://")))
	url := base + "/verify/schema"
	if resp := post(t, url, validRequest, map[string]string{"X-Test-Status": "422"}); resp.StatusCode != 422 {
		t.Fatalf("upstream 422: got %d", resp.StatusCode)
	}
	for want := 2; want >= 0; want-- {
		resp := post(t, url, validRequest, nil)
		if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderFreeRemaining) != fmt.Sprint(want) {
			t.Fatalf("free call: %d, remaining %q, want 200 and %d", resp.StatusCode, resp.Header.Get(HeaderFreeRemaining), want)
		}
	}
	if resp := post(t, url, validRequest, nil); resp.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("fourth call: %d, want 402", resp.StatusCode)
	}
	// The interval (an hour) never came: only the clean stop can have
	// written the three counted calls. (caddy.Stop can return while the
	// last call's handler is still returning, after its answer was sent:
	// the store closes after it.)
	if err := caddy.Stop(); err != nil {
		t.Fatal(err)
	}
	db := openClosed(t, dir)
	rem, err := db.Allowance().Remaining(context.Background(), "verify", "ip:127.0.0.1", time.Now(), 3)
	if err != nil || rem != 0 {
		t.Fatalf("after the stop: %d remaining (%v), want 0: the batched counts were not written", rem, err)
	}
}
