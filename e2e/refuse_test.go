package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/x402"
)

// A score that can never be served is refused before payment, through the
// shipped Caddyfile: a test- agent's score is 422 on REST and a tool error
// over MCP, never a demand, and so is a missing or invalid tool argument.
func TestScoreRefusalsBeforePaymentThroughCaddy(t *testing.T) {
	s := newStack(t)

	t.Run("a test- agent's score is 422 with no PAYMENT-REQUIRED", func(t *testing.T) {
		r := get(t, s.url("/score/test-seller-1"))
		mustStatus(t, r, http.StatusUnprocessableEntity)
		if h := r.header.Get(x402.HeaderPaymentRequired); h != "" {
			t.Fatalf("offered for sale: %.80s", h)
		}
		if e := decode[apierr.Error](t, r); e.Code != apierr.CodeInvalidRequest || e.Charged || len(e.Fields) != 1 || e.Fields[0].Field != "agent_id" {
			t.Fatalf("error %+v", e)
		}
	})
	t.Run("a real agent's score is 402", func(t *testing.T) {
		r := get(t, s.url("/score/seller-7"))
		mustStatus(t, r, http.StatusPaymentRequired)
		if r.header.Get(x402.HeaderPaymentRequired) == "" {
			t.Fatal("no PAYMENT-REQUIRED")
		}
	})

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil)
	sess, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: s.url("/mcp"), DisableStandaloneSSE: true}, nil)
	if err != nil {
		t.Fatalf("connecting to /mcp through Caddy: %v", err)
	}
	defer sess.Close()
	for _, tc := range []struct {
		desc string
		args any
	}{
		{"get_verification_record of a test- agent is a tool error", map[string]any{"agent_id": "test-seller-1"}},
		{"get_verification_record without agent_id is a tool error", map[string]any{}},
		{"get_verification_record with a number for agent_id is a tool error", map[string]any{"agent_id": 7}},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			res, err := sess.CallTool(ctx, &mcp.CallToolParams{Name: "get_verification_record", Arguments: tc.args})
			if err != nil {
				t.Fatal(err)
			}
			b, _ := json.Marshal(res.StructuredContent)
			var e apierr.Error
			if err := json.Unmarshal(b, &e); err != nil || !res.IsError || e.Code != apierr.CodeInvalidRequest || e.Status != 422 || e.Charged {
				t.Fatalf("result: isError %v, %s", res.IsError, b)
			}
		})
	}
	t.Run("get_verification_record of a real agent is payment-required", func(t *testing.T) {
		res, err := sess.CallTool(ctx, &mcp.CallToolParams{Name: "get_verification_record", Arguments: map[string]any{"agent_id": "seller-7"}})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(res.StructuredContent)
		var pr x402.PaymentRequired
		if err := json.Unmarshal(b, &pr); err != nil || !res.IsError || len(pr.Accepts) == 0 {
			t.Fatalf("result: isError %v, %s", res.IsError, b)
		}
	})
}
