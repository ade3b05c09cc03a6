package caddymodule

import (
	"fmt"
	"io"
	"math/big"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// nestedGatesSite is a site-wide gate on /paid/* and a second gate inside
// route /paid/*, both offering $0.01 on the devnet: two REST gates on one
// request. inner is written into the inner gate's block.
func nestedGatesSite(up, fac, inner string) string {
	return fmt.Sprintf(`:{port} {
	x402 /paid/* {
		accept devnet $0.01 %[3]s
		facilitator http {
			url %[2]s
		}
		store badger {data}/gate
	}
	route /paid/* {
		x402 {
			accept devnet $0.01 %[3]s
			facilitator http {
				url %[2]s
			}
			store badger {data}/gate
			%[4]s
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up, "http://"), fac, payTo.Hex(), inner)
}

// Of two REST gates on one request, the first prices it and the second
// passes it on: a correctly paid call is served once, charged once, as a
// paid call. (Before: the inner gate, finding no payment (the outer had
// taken it), answered 402 to every paid call, after the outer gate had
// verified it; with a free_allowance it served the paid call as a free
// one, spending a free unit and telling the upstream "payment: free".)
func TestNestedRESTGatesFirstPricesTheCall(t *testing.T) {
	for i, tc := range []struct{ desc, inner string }{
		{"inner gate without allowance", ""},
		{"inner gate with free_allowance", "free_allowance {\n\t\t\t\tper_day 5\n\t\t\t}"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			d, fac := sharedDevnet(t)
			up := newUpstream(t)
			base := startCaddy(t, nestedGatesSite(up.URL, fac, tc.inner))
			resp := post(t, base+"/paid/x", `{"a":1}`, nil)
			resp.Body.Close()
			if resp.StatusCode != http.StatusPaymentRequired {
				t.Fatalf("unpaid call: %d, want 402 (the outer gate has no allowance)", resp.StatusCode)
			}
			if up.calls.Load() != 0 {
				t.Fatalf("the upstream ran %d times for an unpaid call", up.calls.Load())
			}
			pr := paymentRequired(t, resp)
			payerIdx := 2 + i
			payer := evmfacilitator.DevAccounts()[payerIdx].Address
			before := balance(t, d, payer)
			resp = post(t, base+"/paid/x", `{"a":1}`, map[string]string{x402.HeaderPaymentSignature: signFor(t, pr, payerIdx)})
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			spent := new(big.Int).Sub(before, balance(t, d, payer))
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("paid call: %d %.300s (upstream ran %d times, payer spent %v)", resp.StatusCode, b, up.calls.Load(), spent)
			}
			if spent.Cmp(big.NewInt(10000)) != 0 {
				t.Fatalf("payer spent %v, want 10000 ($0.01 once)", spent)
			}
			if up.calls.Load() != 1 {
				t.Fatalf("the upstream ran %d times, want once", up.calls.Load())
			}
			if !strings.Contains(string(b), `"payment":"paid"`) || resp.Header.Get(HeaderFreeRemaining) != "" {
				t.Fatalf("a paid call served as something else: Free-Allowance-Remaining %q, upstream saw %s", resp.Header.Get(HeaderFreeRemaining), b)
			}
			if resp.Header.Get(x402.HeaderPaymentResponse) == "" {
				t.Fatalf("paid call answered without PAYMENT-RESPONSE")
			}
		})
	}
}

// The later gate says once, naming its route, that it passes its requests
// on, so the operator learns its price and allowance are never used.
func TestShadowedRESTGateWarnsOnce(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	g := &Gate{Route: "POST /paid/x", logger: zap.New(core), shadowed: new(atomic.Bool)}
	g.warnShadowed()
	g.warnShadowed()
	if logs.Len() != 1 {
		t.Fatalf("%d warnings, want 1", logs.Len())
	}
	e := logs.All()[0]
	if !strings.Contains(e.Message, "route is priced by an earlier x402 gate") || e.ContextMap()["route"] != "POST /paid/x" {
		t.Fatalf("warning %q %v", e.Message, e.ContextMap())
	}
}

// A gate in handle_errors prices what it serves itself, after the route's
// gate has handled the request and failed: the route's gate is not gating
// it any more. (Before: the mark the route's gate set outlived it, and the
// handle_errors gate passed the request on, serving its content unpaid.)
// mcp_tool gates answer their calls' failures themselves, as tool results,
// so handle_errors never runs after one.
func TestHandleErrorsGatePricesItsOwnAnswer(t *testing.T) {
	_, fac := sharedDevnet(t)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	x402 /paid/* {
		accept devnet $0.01 %[2]s
		facilitator http {
			url %[1]s
		}
		store badger {data}/gate
		free_allowance {
			per_day 5
		}
	}
	route /paid/* {
		error "boom" 500
	}
	handle_errors {
		x402 {
			accept devnet $0.05 %[2]s
			facilitator http {
				url %[1]s
			}
			store badger {data}/gate2
		}
		respond "premium fallback content" 200
	}
}
`, fac, payTo.Hex()))
	resp := post(t, base+"/paid/x", `{"a":1}`, nil)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusPaymentRequired || strings.Contains(string(b), "premium") {
		t.Fatalf("unpaid call reaching handle_errors: %d %.200q; want the handle_errors gate's 402", resp.StatusCode, b)
	}
	if got := paymentRequired(t, resp).Accepts[0].Amount; got != "50000" {
		t.Errorf("the 402 asks for %s; want the handle_errors gate's 50000", got)
	}
}
