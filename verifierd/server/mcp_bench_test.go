package server_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/aovhq/aov/store"
)

// mcpCall is the JSON-RPC body of one tools/call, as a client sends it.
func mcpCall(tool string, args []byte) []byte {
	return fmt.Appendf(nil, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":%q,"arguments":%s}}`, tool, args)
}

// BenchmarkTransport is one verification of the SPEC §10 invoice in
// process, through REST (POST /verify/schema) and through MCP (tools/call
// verify_schema on /mcp): the same parse, check, sign (in process) and
// record, so the difference is what the MCP transport costs (JSON-RPC, a stateless
// session per request, the result wrapped twice).
func BenchmarkTransport(b *testing.B) {
	body := invoice("135.0", "")
	for _, c := range []struct {
		name, path string
		body       []byte
	}{
		{"rest", "/verify/schema", body},
		{"mcp", "/mcp", mcpCall("verify_schema", body)},
	} {
		b.Run(c.name, func(b *testing.B) {
			f := newFixture(b, fixtureOpts{noSync: true, localSigner: true})
			b.ReportAllocs()
			b.SetBytes(int64(len(c.body)))
			cpu := startCPU()
			defer cpu.report(b)
			for b.Loop() {
				r := httptest.NewRequest(http.MethodPost, c.path, bytes.NewReader(c.body))
				r.Header.Set("Content-Type", "application/json")
				r.Header.Set("Accept", "application/json, text/event-stream")
				w := httptest.NewRecorder()
				f.h.ServeHTTP(w, r)
				if w.Code != http.StatusOK || !bytes.Contains(w.Body.Bytes(), []byte(`"attestation"`)) || bytes.Contains(w.Body.Bytes(), []byte(`"isError":true`)) {
					b.Fatalf("status %d: %s", w.Code, w.Body)
				}
			}
		})
	}
}

// BenchmarkScore10k is GET /score/{agent_id} for an agent with 10,000
// recorded verifications (the method's record cap): 100 history pages
// read from Badger, the score computed and signed by a real certd.
// "unowned" counts all of them; "owned" is an owned agent whose 10,000
// newest records are others' labels above 100 of its owner's: the score
// reads only the owner's (the store's authenticated index), so the flood
// costs it nothing, against the unowned read in the same run.
func BenchmarkScore10k(b *testing.B) {
	f := newFixture(b, fixtureOpts{noSync: true})
	now := time.Now().UTC()
	record := func(agent string, i int, wallet string) {
		v := store.Verification{
			ID: fmt.Sprintf("%s-%05d", agent, i), VerifiedAt: now.Add(-time.Duration(i) * 20 * time.Minute),
			AgentID: agent, TaskID: "t", Result: []string{"pass", "pass", "pass", "fail"}[i%4],
			OutputHash: "o", SchemaHash: "s", RulesHash: "r", RequestHash: "q", Wallet: wallet, Authenticated: wallet != "",
		}
		if err := f.db.RecordVerification(context.Background(), v); err != nil {
			b.Fatal(err)
		}
	}
	for i := range 10000 {
		record("seller-7", i, "")
		record("owned-7", i, "")
	}
	for i := 10000; i < 10100; i++ {
		record("owned-7", i, wallet)
	}
	if _, err := f.db.BindAgent(context.Background(), "owned-7", wallet); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct{ name, agent, want string }{
		{"unowned", "seller-7", `"records":10000,"not_counted":0`},
		{"owned", "owned-7", `"records":100,"not_counted":10000`},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				w := f.do(http.MethodGet, "/score/"+c.agent, nil, viaGateway)
				if w.Code != http.StatusOK || !bytes.Contains(w.Body.Bytes(), []byte(c.want)) {
					b.Fatalf("status %d: %s", w.Code, w.Body)
				}
			}
		})
	}
}
