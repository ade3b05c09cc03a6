package caddymodule

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aovhq/aov/x402"
)

// slowReportUpstream is reportingUpstream whose report endpoint takes
// 300 ms (a verifierd under load), so reports queue behind one another.
type slowReportUpstream struct {
	*httptest.Server
	name    string
	mu      sync.Mutex
	reports []string
	n       atomic.Int64
}

func newSlowReportUpstream(t *testing.T, name string) *slowReportUpstream {
	u := &slowReportUpstream{name: name}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/gateway/settlement" {
			time.Sleep(300 * time.Millisecond)
			b, _ := io.ReadAll(r.Body)
			u.mu.Lock()
			u.reports = append(u.reports, string(b))
			u.mu.Unlock()
			w.WriteHeader(http.StatusNoContent)
			return
		}
		id := fmt.Sprintf("%s-%d", name, u.n.Add(1))
		if r.Header.Get(HeaderUpstreamSettlement) == "pending" {
			w.Header().Set(headerSettlementReport, "/v1/gateway/settlement")
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"verification_id": id, "paid_content": true})
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *slowReportUpstream) got() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return strings.Join(u.reports, " ")
}

// One gate serves two hosts, and host matchers after it choose each
// tenant's upstream. The outcomes the background pass resolves together
// are batched, and a batch goes through its leader's request: each tenant's
// upstream gets only its own verifications' outcomes. (Before: reports were
// batched by gate and path alone, and tenant B's outcomes went in tenant
// A's batch to A's upstream, while B's records stayed pending.)
func TestBatchedReportsGoOnlyWithReportsOfTheirHost(t *testing.T) {
	defer func(d time.Duration) { resolveInterval = d }(resolveInterval)
	resolveInterval = 300 * time.Millisecond
	_, _ = sharedDevnet(t)
	release := stallChain(t)
	a, b := newSlowReportUpstream(t, "tenantA"), newSlowReportUpstream(t, "tenantB")
	site := fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept devnet $0.02 %[1]s
			facilitator faulty_devnet lose_reply_stall
			store badger %[2]s
			public_base_url https://gateway.test
		}
		@a host a.test
		reverse_proxy @a %[3]s
		@b host b.test
		reverse_proxy @b %[4]s
	}
}
`, payTo.Hex(), filepath.Join(t.TempDir(), "gate"), strings.TrimPrefix(a.URL, "http://"), strings.TrimPrefix(b.URL, "http://"))
	url := startCaddy(t, site) + "/verify/schema"
	for _, host := range []string{"a.test", "b.test", "a.test", "b.test"} {
		sig := signFor(t, paymentRequired(t, post(t, url, "", map[string]string{"Host": host})), 9)
		resp := post(t, url, validRequest, map[string]string{"Host": host, x402.HeaderPaymentSignature: sig})
		if body := readAll(t, resp); resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("%s's paid call: %d %.300s; want 503 settlement_pending", host, resp.StatusCode, body)
		}
	}
	close(release)
	time.Sleep(8 * time.Second)
	t.Logf("tenant A's upstream got: %s", a.got())
	t.Logf("tenant B's upstream got: %s", b.got())
	if strings.Contains(a.got(), "tenantB-") || strings.Contains(b.got(), "tenantA-") {
		t.Error("a tenant's upstream was sent the other tenant's verification ids and outcomes; want each only its own")
	}
	for _, u := range []*slowReportUpstream{a, b} {
		for i := 1; i <= 2; i++ {
			if id := fmt.Sprintf(`"%s-%d"`, u.name, i); !strings.Contains(u.got(), id) {
				t.Errorf("%s's upstream got no report of %s; want each of its own", u.name, id)
			}
		}
	}
}
