package caddymodule

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Rounds count against the gate's rate_limit: each served nothing the
// buyer pays for, and each runs the tool. A free round keeps the event of
// the free budget it took, so past that budget the call is a demand for
// payment and the tool does not run.
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
	if status != http.StatusOK || !bytes.Contains(body, []byte(`free calls are used for now`)) {
		t.Fatalf("a third free round within the limit of two: HTTP %d %s, want a demand for payment", status, body)
	}
	if n := up.rounds.Load(); n != 2 {
		t.Fatalf("the tool ran %d times, want 2", n)
	}
}

// An honest free client (the official SDK) with several calls in flight,
// each needing one input from its user, gets every one answered, and each
// takes one unit: rounds are bounded per client by the gate's rate_limit
// (on by default, 120 a minute) and by the units the client holds in
// flight, not by a count of rounds per client that parallel calls, or
// clients behind one address, would share.
func TestMCPParallelFreeCallsNeedingInputAreAllAnswered(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newMRTRUpstream(t)
	const calls = 10
	base := startCaddy(t, faultSite(up.URL, fac, "free_allowance {\n\t\t\t\tpool verify\n\t\t\t\tper_day 10\n\t\t\t}"))
	var arrived atomic.Int64
	allAsked := make(chan struct{})
	c := mcp.NewClient(&mcp.Implementation{Name: "buyer", Version: "1"}, &mcp.ClientOptions{
		ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			if arrived.Add(1) == calls {
				close(allAsked)
			}
			select { // the user confirms once every prompt is on screen
			case <-allAsked:
			case <-time.After(10 * time.Second):
			}
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{}}, nil
		},
	})
	s, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: base + "/mcp"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var wg sync.WaitGroup
	errs := make(chan string, calls)
	for range calls {
		wg.Go(func() {
			res, err := s.CallTool(context.Background(), &mcp.CallToolParams{Name: "verify_schema", Arguments: map[string]any{}})
			switch {
			case err != nil:
				errs <- err.Error()
			case res.IsError:
				b, _ := json.Marshal(res.StructuredContent)
				errs <- string(b)
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Errorf("an honest call needing one input failed: %s", e)
	}
	if n := up.finals.Load(); n != calls || arrived.Load() != calls {
		t.Fatalf("the tool answered %d calls after %d inputs, want %d", n, arrived.Load(), calls)
	}
	// Each answer took one unit, and no round took one: the day's ten are
	// spent, and the next call is asked to pay.
	demandOf(t, callTool(t, s, "verify_schema", map[string]any{}, nil))
}
