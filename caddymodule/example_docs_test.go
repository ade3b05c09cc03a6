package caddymodule

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/aovhq/aov/x402"
)

// Caddyfile.example's documents state each MCP tool at the price its gate
// charges: the example's mcp_tool gates name the endpoint's route, which
// is how the documents find a tool's gate (a gate with no route is never
// listed). Without it the shipped example's llms.txt and openapi.json said
// its tools were not priced, while its gates charged for them.
func TestExampleDocumentsEachMCPToolAtItsGatesPrice(t *testing.T) {
	// No free calls: every priced call is answered with the gate's demand.
	base := startExampleCaddy(t, "../Caddyfile.example", "AOV_HTTP_PORT", "AOV_FREE_PER_DAY", "0")
	demand := func(tool, args string) string {
		t.Helper()
		body := fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":%q,"arguments":%s}}`, tool, args)
		req, _ := http.NewRequest(http.MethodPost, base+"/mcp", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var msg struct {
			Result struct {
				IsError           bool                 `json:"isError"`
				StructuredContent x402.PaymentRequired `json:"structuredContent"`
			} `json:"result"`
		}
		if err := json.Unmarshal(b, &msg); err != nil || !msg.Result.IsError || len(msg.Result.StructuredContent.Accepts) == 0 {
			t.Fatalf("unpaid call of %s: %d %.300s, want the gate's payment demand", tool, resp.StatusCode, b)
		}
		return msg.Result.StructuredContent.Accepts[0].Amount
	}
	args, err := json.Marshal(verifyArgs)
	if err != nil {
		t.Fatal(err)
	}
	charged := map[string]string{
		"verify_schema":           demand("verify_schema", string(args)),
		"get_verification_record": demand("get_verification_record", `{"agent_id":"some-agent"}`),
	}

	resp, err := http.Get(base + "/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	var api map[string]any
	err = json.NewDecoder(resp.Body).Decode(&api)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	tools, _ := docsPaymentInfo(t, api, "/mcp", "post")["tools"].(map[string]any)
	resp, err = http.Get(base + "/llms.txt")
	if err != nil {
		t.Fatal(err)
	}
	llms, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for tool, amount := range charged {
		doc, _ := tools[tool].(map[string]any)
		price, _ := doc["price"].(map[string]any)
		if doc["configured"] != true || price["amount"] != amount {
			t.Errorf("openapi.json documents %s as %v; its gate charges %s", tool, doc, amount)
		}
		if want := fmt.Sprintf("(`%s` atomic units", amount); !strings.Contains(string(llms), "`"+tool+"`") || !strings.Contains(string(llms), want) {
			t.Errorf("llms.txt does not state %s at %s", tool, want)
		}
		for _, line := range strings.Split(string(llms), "\n") {
			if strings.Contains(line, "`"+tool+"`") && strings.Contains(line, "not priced") {
				t.Errorf("llms.txt: %q, but its gate charges %s", line, amount)
			}
		}
	}
}
