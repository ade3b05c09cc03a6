package server_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/aovhq/aov/receipt"
	"github.com/aovhq/aov/verify"
)

// The MCP path reads its body into, and holds its answer in, buffers of
// the same pool as REST. Concurrent tool calls interleaved with REST
// verifications and with refusals of both (a truncated JSON-RPC body, a
// truncated REST body) must each answer about their own request.
func TestReusedBuffersKeepMCPCallsApart(t *testing.T) {
	f := newFixture(t, fixtureOpts{noSync: true, localSigner: true})
	keys := f.keySet(t)
	mcpHdr := map[string]string{"Accept": "application/json, text/event-stream"}
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 6 {
				total, want := "135.0", "fail"
				if (g+i)%2 == 0 {
					total, want = "129.5", "pass"
				}
				agent := fmt.Sprintf(`"seller-%d-%d"`, g, i)
				body := bytes.Replace(invoice(total, ""), []byte(`"seller-7"`), []byte(agent), 1)
				call := mcpCall("verify_schema", body)
				if i%3 == 0 {
					if w := f.do(http.MethodPost, "/mcp", call[:len(call)/2], mcpHdr); w.Code != http.StatusBadRequest && w.Code != http.StatusUnprocessableEntity {
						t.Errorf("truncated JSON-RPC body: status %d: %s", w.Code, w.Body)
					}
				}
				if i%3 == 1 {
					if w := f.do(http.MethodPost, "/verify/schema", body, nil); w.Code != http.StatusOK {
						t.Errorf("REST in between: status %d", w.Code)
					}
				}
				w := f.do(http.MethodPost, "/mcp", call, mcpHdr)
				var resp struct {
					Result struct {
						IsError           bool            `json:"isError"`
						StructuredContent json.RawMessage `json:"structuredContent"`
					} `json:"result"`
				}
				if err := json.Unmarshal(w.Body.Bytes(), &resp); err != nil || w.Code != http.StatusOK || resp.Result.IsError {
					t.Errorf("status %d (%v): %s", w.Code, err, w.Body)
					return
				}
				doc := resp.Result.StructuredContent
				if err := receipt.VerifyReceipt(doc, keys, receipt.ContextVerify); err != nil {
					t.Errorf("receipt does not verify: %v", err)
				}
				hashes, err := verify.ComputeHashes(body)
				if err != nil {
					t.Error(err)
					return
				}
				if err := receipt.CheckHashes(doc, hashes); err != nil {
					t.Errorf("hashes: %v", err)
				}
				var got struct {
					Result  string `json:"result"`
					AgentID string `json:"agent_id"`
				}
				if err := json.Unmarshal(doc, &got); err != nil || got.Result != want || `"`+got.AgentID+`"` != agent {
					t.Errorf("answer is about %q/%q, want %s/%s (%v)", got.AgentID, got.Result, agent, want, err)
				}
			}
		}()
	}
	wg.Wait()
}
