package pghistory

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/aovhq/aov/internal/servers"
)

// TestOwners: of concurrent first binders of one agent id on two instances
// exactly one wins and every binder learns the winner; an owner never
// changes; bad input is refused.
func TestOwners(t *testing.T) {
	srv := servers.StartPostgres(t)
	dsn := freshDB(t, srv)
	a, b := open(t, dsn), open(t, dsn)
	ctx := context.Background()
	if o, err := a.AgentOwner(ctx, "seller"); err != nil || o != "" {
		t.Fatalf("an unbound agent: %q, %v", o, err)
	}
	owners := make([]string, 20)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range owners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			h := a
			if i%2 == 1 {
				h = b
			}
			o, err := h.BindAgent(ctx, "seller", fmt.Sprintf("0xwallet%02d", i))
			if err != nil {
				t.Error(err)
			}
			owners[i] = o
		}()
	}
	close(start)
	wg.Wait()
	winner, _ := b.AgentOwner(ctx, "seller")
	if !strings.HasPrefix(winner, "0xwallet") {
		t.Fatalf("owner %q", winner)
	}
	for i, o := range owners {
		if o != winner {
			t.Errorf("binder %d was told %q, the owner is %q", i, o, winner)
		}
	}
	if o, _ := a.BindAgent(ctx, "seller", "0xlate"); o != winner {
		t.Fatalf("a later binder changed the owner to %q", o)
	}
	for _, c := range []struct{ agent, wallet string }{{"", "0x1"}, {"x", ""}, {"x", strings.Repeat("w", 129)}, {strings.Repeat("a", 70000), "0x1"}} {
		if _, err := a.BindAgent(ctx, c.agent, c.wallet); err == nil {
			t.Errorf("BindAgent(%.10q, %.10q) accepted", c.agent, c.wallet)
		}
	}
	if o, err := a.BindAgent(ctx, "nul\x00agent", "0xn"); err != nil || o != "0xn" {
		t.Fatalf("an agent id with NUL: %q, %v", o, err)
	}
}
