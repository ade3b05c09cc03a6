package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	neturl "net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/redis/go-redis/v9"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/store"
)

func init() { caddy.RegisterModule(blindStore{}) }

// blindStore is a named fake for two store faults the real stores cannot
// be made to show on demand: it is the Badger store, but its claims keep
// no held records (as a store without store.HeldClaims), or, with
// "lookup_fails", they keep them but cannot be read back (a store that
// blips right after the settlement).
type blindStore struct {
	BadgerStore
	LookupFails bool `json:"lookup_fails,omitempty"`
}

func (blindStore) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "x402.stores.blind_badger", New: func() caddy.Module { return new(blindStore) }}
}

func (s *blindStore) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	if !d.NextArg() {
		return d.ArgErr()
	}
	s.Path = d.Val()
	if d.NextArg() {
		s.LookupFails = d.Val() == "lookup_fails"
	}
	return nil
}

func (s *blindStore) Claims() store.Claims {
	if s.LookupFails {
		return failingLookup{s.BadgerStore.Claims().(heldClaims)}
	}
	return struct{ store.Claims }{s.BadgerStore.Claims()}
}

type heldClaims interface {
	store.Claims
	store.HeldClaims
}

type failingLookup struct{ heldClaims }

func (failingLookup) Lookup(context.Context, string) (store.ClaimState, error) {
	return store.ClaimState{}, errors.New("blind_badger: the store is unreachable")
}

// A paid call whose settlement outcome is unknown is never reported
// unpaid when the gate cannot tell the outcome: not when its store keeps
// no held record of it, nor when the claim cannot be read back. unpaid is
// final, and the transfer did happen here (lose_reply): the verification
// stays pending, which counts for nothing, instead of being recorded as
// never paid.
func TestUnknownOutcomeNotToldIsNeverReportedUnpaid(t *testing.T) {
	sharedDevnet(t)
	for _, fault := range []string{"", "lookup_fails"} {
		t.Run("store "+fault, func(t *testing.T) {
			vf := startVerifier(t)
			site := strings.Replace(mcpHistorySite(vf, "lose_reply", "{dir}"), "store badger {dir}", "store blind_badger {dir} "+fault, 2)
			site = strings.ReplaceAll(site, "{dir}", gateDir(t))
			url := startCaddy(t, site) + "/mcp"
			agent := "seller-unknown-" + fault
			args := map[string]any{"task_id": "t-mcp", "agent_id": agent,
				"expected_schema": map[string]any{"type": "object"}, "submitted_output": map[string]any{"ok": true}}
			postMCP(t, url, toolCall(t, "verify_schema", map[string]any{"task_id": "t-free", "expected_schema": map[string]any{}, "submitted_output": 1}, nil)) // the free call of the day
			_, body := postMCP(t, url, toolCall(t, "verify_schema", args, nil))
			p := payDemand(t, body, 3)
			if _, body = postMCP(t, url, toolCall(t, "verify_schema", args, &p)); !strings.Contains(string(body), "settlement_pending") {
				t.Fatalf("paid call: %s", body)
			}
			// A report is made before the answer (settle, then
			// reportOutcome): what verifierd holds now is final.
			recs, _, err := vf.db.Verifications(context.Background(), agent, "", 10)
			if err != nil || len(recs) != 1 {
				t.Fatalf("records %+v, %v", recs, err)
			}
			if recs[0].Payment != store.PaymentPending {
				t.Fatalf("recorded %s, want %s: %s", recs[0].Payment, store.PaymentPending, fmt.Sprint(recs[0]))
			}
		})
	}
}

// The store loses a paid call's claim while its settlement's outcome is
// unknown: Redis comes back empty (FLUSHALL here, what a restart without
// its data leaves) while the upstream runs, and the facilitator's reply
// is then lost after the transfer (lose_reply). The claim's absence says
// nothing of the outcome: the gate asks the chain, where the transfer is,
// and the verification is reported paid. Before, the missing claim was
// taken for a released one and the verification reported unpaid, which
// verifierd keeps as final: a paid call recorded as never paid.
func TestUnknownOutcomeWithClaimLostIsNotReportedUnpaid(t *testing.T) {
	claimLostUnderCall(t, "lose_reply", "lost", 8, func(call func() []byte) {
		if body := call(); !strings.Contains(string(body), "settlement_pending") {
			t.Fatalf("paid call: %s", body)
		}
	})
}

// The chain read that reports such a call's outcome (reportFromChain, up
// to resolveTimeout) is made in the background: the buyer's answer,
// settlement_pending, is already decided and does not wait for it. The
// chain here stalls until the answer has come (lose_reply_stall, a fake
// for a slow RPC); before, the handler waited for the chain's answer, or
// its deadline, before it returned. The outcome is still reported paid
// once the chain answers.
func TestUnknownOutcomeReportFromChainDoesNotHoldTheAnswer(t *testing.T) {
	defer func(d time.Duration) { resolveTimeout = d }(resolveTimeout)
	resolveTimeout = 3 * time.Second // before the fix, the handler waited this long
	release := make(chan struct{})
	chainStall.Lock()
	chainStall.release, chainStall.events = release, nil
	chainStall.Unlock()
	defer func() {
		chainStall.Lock()
		chainStall.release, chainStall.events = nil, nil
		chainStall.Unlock()
	}()
	claimLostUnderCall(t, "lose_reply_stall", "stall", 9, func(call func() []byte) {
		if body := call(); !strings.Contains(string(body), "settlement_pending") {
			t.Fatalf("paid call: %s", body)
		}
		chainStallEvent("answer")
		chainStall.Lock()
		events := slices.Clone(chainStall.events)
		chainStall.Unlock()
		if len(events) == 0 || events[0] != "answer" {
			t.Fatalf("events %v: the answer waited for the chain", events)
		}
		close(release)
	})
}

// claimLostUnderCall makes a paid MCP call (facilitator mode, payer) whose
// claim Redis loses while the upstream runs; paid makes the call (call)
// and checks its answer. Then the verification must be reported paid: at
// once, or in the background, as the chain tells it.
func claimLostUnderCall(t *testing.T, mode, prefix string, payer int, paid func(call func() []byte)) {
	sharedDevnet(t)
	vf := startVerifier(t)
	srv := servers.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { rdb.Close() })
	var wipe atomic.Bool
	target, _ := neturl.Parse(vf.srv.URL)
	proxy := httputil.NewSingleHostReverseProxy(target)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if wipe.CompareAndSwap(true, false) {
			if err := rdb.FlushAll(r.Context()).Err(); err != nil {
				t.Errorf("FLUSHALL: %v", err)
			}
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	site := strings.ReplaceAll(mcpHistorySite(vf, mode, "{dir}"), "store badger {dir}", "store redis "+srv.Addr+" {\n\t\t\t\tprefix "+prefix+"\n\t\t\t}")
	site = strings.Replace(site, strings.TrimPrefix(vf.srv.URL, "http://"), strings.TrimPrefix(front.URL, "http://"), 1)
	url := startCaddy(t, site) + "/mcp"
	agent := "seller-claim-lost-" + prefix
	args := map[string]any{"task_id": "t-mcp", "agent_id": agent,
		"expected_schema": map[string]any{"type": "object"}, "submitted_output": map[string]any{"ok": true}}
	postMCP(t, url, toolCall(t, "verify_schema", map[string]any{"task_id": "t-free", "expected_schema": map[string]any{}, "submitted_output": 1}, nil)) // the free call of the day
	_, body := postMCP(t, url, toolCall(t, "verify_schema", args, nil))
	p := payDemand(t, body, payer)
	wipe.Store(true)
	paid(func() []byte {
		_, body := postMCP(t, url, toolCall(t, "verify_schema", args, &p))
		return body
	})
	if wipe.Load() {
		t.Fatal("the store was never wiped under the call")
	}
	// Reported by a background chain read: wait for it (bounded).
	var recs []store.Verification
	for range 200 {
		var err error
		recs, _, err = vf.db.Verifications(context.Background(), agent, "", 10)
		if err != nil || len(recs) != 1 {
			t.Fatalf("records %+v, %v", recs, err)
		}
		if recs[0].Payment != store.PaymentPending {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if recs[0].Payment != store.PaymentPaid {
		t.Fatalf("recorded %s, want %s (the transfer is on chain): %s", recs[0].Payment, store.PaymentPaid, fmt.Sprint(recs[0]))
	}
}
