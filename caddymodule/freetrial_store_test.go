package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// With the shared store down, an answer that reports free_trial (here a
// 400 for an unusable payment) cannot read the caller's allowance: it
// leaves free_trial out, and never says the day's calls are used up.
// Before, the read's error was taken for zero calls left: the client,
// with 2 of its 3 free calls left, was told free_trial_exhausted, "pay
// with x402".
func TestFreeTrialLeftOutWhileStoreDown(t *testing.T) {
	up := newUpstream(t)
	srv := servers.StartRedis(t)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept base $0.02 0x1111111111111111111111111111111111111111
			facilitator http {
				url http://127.0.0.1:1
			}
			store redis %s {
				prefix trial
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
`, srv.Addr, strings.TrimPrefix(up.URL, "http://")))
	url := base + "/verify/schema"
	if resp := post(t, url, validRequest, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("free call with Redis up: %d", resp.StatusCode)
	}
	unusable := map[string]string{x402.HeaderPaymentSignature: "not-a-payment"}
	trialOf := func() (int, map[string]json.RawMessage) {
		resp := post(t, url, validRequest, unusable)
		var doc map[string]json.RawMessage
		if err := json.Unmarshal(readAll(t, resp), &doc); err != nil {
			t.Fatalf("%d: %v", resp.StatusCode, err)
		}
		return resp.StatusCode, doc
	}
	if status, doc := trialOf(); status != http.StatusBadRequest || !strings.Contains(string(doc["free_trial"]), `"remaining_calls_today":2`) {
		t.Fatalf("unusable payment with Redis up: %d, free_trial %s; want 400 and 2 calls left", status, doc["free_trial"])
	}
	srv.Stop()
	status, doc := trialOf()
	if status != http.StatusBadRequest {
		t.Fatalf("unusable payment with Redis down: %d; want 400", status)
	}
	if ft, ok := doc["free_trial"]; ok {
		t.Fatalf("with the store down the answer reports free_trial %s; want it left out", ft)
	}
}

// allowanceDeadline is a SPY, not a fault: the embedded store's allowance,
// recording the deadline of each Remaining read. A stalled Redis makes
// the read wait for its own timeouts; what bounds it is the deadline the
// gate gives, which is what this checks, without timing anything.
type allowanceDeadline struct {
	store.Allowance
	deadline time.Duration // left when the read began; 0: none
}

func (a *allowanceDeadline) Remaining(ctx context.Context, pool, client string, day time.Time, limit int) (int, error) {
	if d, ok := ctx.Deadline(); ok {
		a.deadline = time.Until(d)
	}
	return a.Allowance.Remaining(ctx, pool, client, day, limit)
}

type spiedStore struct {
	directStore
	a *allowanceDeadline
}

func (s spiedStore) Allowance() store.Allowance { return s.a }

// The read of free_trial waits at most trialReadTimeout, whatever the
// request's own deadline: an answer does not wait on a stalled store for
// a hint.
func TestFreeTrialReadIsBounded(t *testing.T) {
	g, _ := directGate(t, store.Options{NoSync: true}, func(g *Gate) { g.Free = &FreeAllowance{PerDay: 3} })
	spy := &allowanceDeadline{Allowance: g.state.Allowance()}
	g.state = spiedStore{g.state.(directStore), spy}
	r := httptest.NewRequest(http.MethodPost, "http://example.com/verify/schema", nil)
	ft := g.Free.trial(r, g)
	if ft == nil || ft.RemainingToday != 3 {
		t.Fatalf("free_trial %+v; want 3 calls left", ft)
	}
	if spy.deadline <= 0 || spy.deadline > trialReadTimeout {
		t.Fatalf("the allowance was read with %v left (0: no deadline); want at most %v", spy.deadline, trialReadTimeout)
	}
}
