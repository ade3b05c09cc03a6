package caddymodule

import (
	"bytes"
	"context"
	"encoding/json"
	"math/big"
	"net/http"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aovhq/aov/plugins/evmfacilitator"
)

// A round of a multi-round-trip call runs the tool and is handed over
// uncharged, so without a bound one payment (or one free client) would buy
// tool runs without end by sending the first call again and again. Past
// maxInputRounds rounds of one payment, or of one free client between two
// charged answers, the call is refused before the tool runs
// (too_many_input_rounds, nothing charged).
func TestMCPRoundsArePerPaymentBounded(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newMRTRUpstream(t)
	up.shed.Store(true)
	paid := faultRoute("/mcp", up.URL, fac, "rate_limit off")
	free := faultRoute("/free", up.URL, fac, "rate_limit off\n\t\t\tfree_allowance {\n\t\t\t\tpool verify\n\t\t\t\tper_day 1\n\t\t\t}")
	base := startCaddy(t, ":{port} {\n\t"+paid+"\n\t"+free+"\n}\n")
	const payer = 9
	payerAddr := evmfacilitator.DevAccounts()[payer].Address
	pr := demandOf(t, callTool(t, mcpSession(t, base+"/mcp"), "verify_schema", verifyArgs, nil))
	for _, url := range []string{base + "/mcp", base + "/free"} {
		var meta mcp.Meta
		if strings.HasSuffix(url, "/mcp") {
			meta = payMeta(t, pr, payer) // one payment, sent again and again
		}
		before, ran := balance(t, d, payerAddr), up.rounds.Load()
		for i := range maxInputRounds {
			status, body := postCallAs(t, url, meta, multiRoundTripVersion)
			if status != http.StatusOK || !bytes.Contains(body, []byte(`"inputRequests":{}`)) {
				t.Fatalf("%s: round %d: HTTP %d %s", url, i+1, status, body)
			}
		}
		status, body := postCallAs(t, url, meta, multiRoundTripVersion)
		var answer struct {
			Result struct {
				IsError           bool `json:"isError"`
				StructuredContent struct {
					Code    string `json:"code"`
					Charged *bool  `json:"charged"`
				} `json:"structuredContent"`
			} `json:"result"`
		}
		json.Unmarshal(body, &answer)
		if status != http.StatusOK || !answer.Result.IsError || answer.Result.StructuredContent.Code != codeTooManyInputRounds ||
			answer.Result.StructuredContent.Charged == nil || *answer.Result.StructuredContent.Charged {
			t.Fatalf("%s: round %d: HTTP %d %s: want the tool error %s", url, maxInputRounds+1, status, body, codeTooManyInputRounds)
		}
		if n := up.rounds.Load() - ran; n != maxInputRounds {
			t.Fatalf("%s: the tool ran %d times, want %d", url, n, maxInputRounds)
		}
		if charged := new(big.Int).Sub(before, balance(t, d, payerAddr)); charged.Sign() != 0 {
			t.Fatalf("%s: charged %v", url, charged)
		}
	}
	// A new payment starts a new call: its rounds are its own, and its
	// answer is charged once.
	up.shed.Store(false)
	s := mrtrSession(t, base+"/mcp")
	res, err := s.CallTool(context.Background(), &mcp.CallToolParams{Name: "verify_schema", Arguments: map[string]any{}, Meta: payMeta(t, pr, payer)})
	if err != nil || res.IsError {
		t.Fatalf("a new payment's call was refused: %v, %+v", err, res)
	}
}

// Rounds count against the gate's rate_limit as refusals do: each served
// nothing the buyer pays for, and each runs the tool.
func TestMCPRoundsCountAgainstTheRateLimit(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newMRTRUpstream(t)
	up.shed.Store(true)
	base := startCaddy(t, faultSite(up.URL, fac, "rate_limit 2 1m\n\t\t\tfree_allowance {\n\t\t\t\tpool verify\n\t\t\t\tper_day 5\n\t\t\t}"))
	for i := range 2 {
		if status, body := postCallAs(t, base+"/mcp", nil, multiRoundTripVersion); status != http.StatusOK || !bytes.Contains(body, []byte(`"inputRequests":{}`)) {
			t.Fatalf("round %d: HTTP %d %s", i+1, status, body)
		}
	}
	status, body := postCallAs(t, base+"/mcp", nil, multiRoundTripVersion)
	if status != http.StatusOK || !bytes.Contains(body, []byte(`"code":"rate_limited"`)) {
		t.Fatalf("a third round within the limit of two: HTTP %d %s", status, body)
	}
	if n := up.rounds.Load(); n != 2 {
		t.Fatalf("the tool ran %d times, want 2", n)
	}
}
