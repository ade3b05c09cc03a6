package caddymodule

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/servers"
)

// TestGatewayOnFullDisk: the disk holding a gate's `store badger` folder
// fills while free calls are served. A call the store cannot count is a
// 503 with Retry-After, nothing charged; routes without a gate go on, the
// process lives, and free calls are served again once space is freed.
// (Badger writes through memory maps: before the store kept a reserve
// free, the first write on a full disk was a SIGBUS that took Caddy down
// with every route.)
func TestGatewayOnFullDisk(t *testing.T) {
	servers.InChildOnTmpfs(t, "256m", gatewayOnFullDisk)
}

func gatewayOnFullDisk(t *testing.T, root string) {
	up := newUpstream(t)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept base $0.02 0x1111111111111111111111111111111111111111
			facilitator http {
				url http://127.0.0.1:1
			}
			store badger %s
			validate verify_request
			free_allowance {
				pool verify
				per_day 1000000
			}
		}
		reverse_proxy %s
	}
	respond /plain "plain" 200
}
`, filepath.Join(root, "gate"), strings.TrimPrefix(up.URL, "http://")))
	call := func() (int, http.Header, []byte) {
		t.Helper()
		resp := post(t, base+"/verify/schema", validRequest, nil)
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, b
	}
	if code, _, b := call(); code != 200 {
		t.Fatalf("free call before the disk filled: %d %s", code, b)
	}
	filler := filepath.Join(root, "filler")
	servers.FillLeaving(t, filler, 2<<20)
	time.Sleep(200 * time.Millisecond) // the store reads the free space again
	code, h, b := call()
	for i := 0; code == 200 && i < 5000; i++ {
		code, h, b = call()
	}
	var e struct {
		Charged   *bool `json:"charged"`
		Retryable bool  `json:"retryable"`
	}
	if code != 503 || h.Get("Retry-After") == "" || json.Unmarshal(b, &e) != nil || !e.Retryable || e.Charged == nil || *e.Charged {
		t.Fatalf("free call on a full disk: %d Retry-After=%q %s; want 503, retryable, charged false, with Retry-After", code, h.Get("Retry-After"), b)
	}
	if strings.Contains(string(b), root) {
		t.Fatalf("the answer names the store folder: %s", b)
	}
	resp, err := http.Get(base + "/plain")
	if err != nil {
		t.Fatalf("route without a gate on a full disk: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("route without a gate on a full disk: %d", resp.StatusCode)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if code, _, b := call(); code != 200 {
		t.Fatalf("free call once space was freed: %d %s", code, b)
	}
}
