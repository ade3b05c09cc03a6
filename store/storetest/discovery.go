package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aovhq/aov/store"
)

// NewDiscovery returns a fresh, empty discovery list bounded by l. It is
// called once per subtest.
type NewDiscovery func(t *testing.T, l store.DiscoveryLimits) store.Discovery

// accept is a way to pay for the discovery tests.
func discAccept(network, payTo, amount string) store.DiscoveryAccept {
	raw := fmt.Sprintf(`{"scheme":"exact","network":%q,"amount":%q,"asset":"0xA","payTo":%q}`, network, amount, payTo)
	return store.DiscoveryAccept{Scheme: "exact", Network: network, Asset: "0xA", PayTo: payTo, Raw: json.RawMessage(raw)}
}

func discEntry(resource, typ, item string, accepts ...store.DiscoveryAccept) store.DiscoveryEntry {
	if len(accepts) == 0 {
		accepts = []store.DiscoveryAccept{discAccept("eip155:1337", "0xpay", "10000")}
	}
	return store.DiscoveryEntry{Resource: resource, Type: typ, Extensions: []string{"bazaar"}, Item: json.RawMessage(item), Accepts: accepts}
}

func discResources(p store.DiscoveryPage) string {
	var names []string
	for _, e := range p.Entries {
		names = append(names, e.Resource)
	}
	return strings.Join(names, ",")
}

// TestDiscovery runs the store.Discovery contract against newD.
func TestDiscovery(t *testing.T, newD NewDiscovery) {
	ctx := context.Background()
	all := store.DiscoveryQuery{Limit: 100}
	// Records a few milliseconds apart have distinct last-seen times on
	// every backend (Redis keeps milliseconds).
	tick := func() { time.Sleep(3 * time.Millisecond) }

	t.Run("an entry comes back as recorded", func(t *testing.T) {
		d := newD(t, store.DiscoveryLimits{})
		before := time.Now()
		e := discEntry("https://a.example/score/:agent_id", "http", `{"description":"Trust score","extensions":{"bazaar":{"x":[]}}}`)
		if err := d.Record(ctx, e); err != nil {
			t.Fatal(err)
		}
		p, err := d.List(ctx, all)
		if err != nil || p.Total != 1 || len(p.Entries) != 1 {
			t.Fatalf("List = %+v, %v; want the one entry", p, err)
		}
		got := p.Entries[0]
		if got.Resource != e.Resource || got.Type != "http" || strings.Join(got.Extensions, ",") != "bazaar" ||
			string(got.Item) != string(e.Item) || len(got.Accepts) != 1 || string(got.Accepts[0].Raw) != string(e.Accepts[0].Raw) ||
			got.Accepts[0].Network != "eip155:1337" || got.Accepts[0].PayTo != "0xpay" {
			t.Fatalf("entry = %+v, want %+v", got, e)
		}
		if got.LastSeen.Before(before.Add(-time.Millisecond)) || got.LastSeen.After(time.Now().Add(time.Millisecond)) {
			t.Fatalf("LastSeen %v is not the time of the record (after %v)", got.LastSeen, before)
		}
	})

	t.Run("one entry per resource: the item is replaced, ways to pay merged, last seen moves", func(t *testing.T) {
		d := newD(t, store.DiscoveryLimits{})
		r := "https://a.example/verify/schema"
		discMust(t, d.Record(ctx, discEntry(r, "http", `{"v":1}`, discAccept("eip155:1337", "0xpay", "10000"))))
		tick()
		discMust(t, d.Record(ctx, discEntry("https://b.example/x", "http", `{}`)))
		first, _ := d.List(ctx, all)
		tick()
		discMust(t, d.Record(ctx, discEntry(r, "http", `{"v":2}`, discAccept("eip155:1337", "0xpay", "20000"), discAccept("solana:dev", "So1", "5"))))
		p, err := d.List(ctx, all)
		if err != nil || p.Total != 2 || discResources(p) != r+",https://b.example/x" {
			t.Fatalf("List = %q (total %d), %v; want %s first (seen last), then b", discResources(p), p.Total, err, r)
		}
		got := p.Entries[0]
		if string(got.Item) != `{"v":2}` || len(got.Accepts) != 2 || !strings.Contains(string(got.Accepts[0].Raw), `"20000"`) ||
			got.Accepts[1].Network != "solana:dev" {
			t.Fatalf("merged entry = item %s, accepts %+v; want the new item, the updated EVM way and the Solana one", got.Item, got.Accepts)
		}
		if !got.LastSeen.After(first.Entries[1].LastSeen) {
			t.Fatalf("LastSeen did not move: %v, was %v", got.LastSeen, first.Entries[1].LastSeen)
		}
	})

	t.Run("an entry keeps at most MaxDiscoveryAccepts ways to pay", func(t *testing.T) {
		d := newD(t, store.DiscoveryLimits{})
		for i := range store.MaxDiscoveryAccepts + 3 {
			discMust(t, d.Record(ctx, discEntry("https://a.example/x", "http", `{}`, discAccept("eip155:1337", fmt.Sprintf("0x%d", i), "1"))))
		}
		p, _ := d.List(ctx, all)
		if p.Total != 1 || len(p.Entries[0].Accepts) != store.MaxDiscoveryAccepts || p.Entries[0].Accepts[0].PayTo != "0x0" {
			t.Fatalf("accepts = %+v; want the first %d", p.Entries[0].Accepts, store.MaxDiscoveryAccepts)
		}
	})

	t.Run("paging is deterministic: most recently seen first, then by resource", func(t *testing.T) {
		d := newD(t, store.DiscoveryLimits{})
		for _, r := range []string{"r1", "r2", "r3", "r4", "r5"} {
			discMust(t, d.Record(ctx, discEntry("https://a.example/"+r, "http", `{}`)))
			tick()
		}
		var pages []string
		for off := 0; off < 6; off += 2 {
			p, err := d.List(ctx, store.DiscoveryQuery{Offset: off, Limit: 2})
			if err != nil || p.Total != 5 {
				t.Fatalf("page at %d: total %d, %v", off, p.Total, err)
			}
			pages = append(pages, strings.ReplaceAll(discResources(p), "https://a.example/", ""))
		}
		if got := strings.Join(pages, "|"); got != "r5,r4|r3,r2|r1" {
			t.Fatalf("pages = %s, want r5,r4|r3,r2|r1", got)
		}
		if p, _ := d.List(ctx, store.DiscoveryQuery{Offset: 9, Limit: 2}); p.Total != 5 || len(p.Entries) != 0 {
			t.Fatalf("past the end: %d entries, total %d; want none of 5", len(p.Entries), p.Total)
		}
	})

	t.Run("filters: type, extension, and scheme, network and payTo on one way to pay", func(t *testing.T) {
		d := newD(t, store.DiscoveryLimits{})
		discMust(t, d.Record(ctx, discEntry("https://a.example/h", "http", `{}`, discAccept("eip155:1337", "0xpay", "1"), discAccept("solana:dev", "So1", "1"))))
		tick()
		mcp := discEntry("https://a.example/mcp verify_schema", "mcp", `{}`, discAccept("eip155:1337", "0xother", "1"))
		mcp.Extensions = nil
		discMust(t, d.Record(ctx, mcp))
		for _, c := range []struct {
			q    store.DiscoveryQuery
			want string
		}{
			{store.DiscoveryQuery{Type: "http"}, "https://a.example/h"},
			{store.DiscoveryQuery{Type: "mcp"}, mcp.Resource},
			{store.DiscoveryQuery{Extension: "bazaar"}, "https://a.example/h"},
			{store.DiscoveryQuery{Network: "eip155:1337"}, mcp.Resource + ",https://a.example/h"},
			{store.DiscoveryQuery{PayTo: "0xother"}, mcp.Resource},
			{store.DiscoveryQuery{Network: "solana:dev", PayTo: "So1", Scheme: "exact"}, "https://a.example/h"},
			{store.DiscoveryQuery{Network: "solana:dev", PayTo: "0xpay"}, ""},
			{store.DiscoveryQuery{Scheme: "upto"}, ""},
		} {
			c.q.Limit = 10
			p, err := d.List(ctx, c.q)
			if err != nil || discResources(p) != c.want || p.Total != len(p.Entries) {
				t.Errorf("List(%+v) = %q (total %d), %v; want %q", c.q, discResources(p), p.Total, err, c.want)
			}
		}
	})

	t.Run("a full list evicts the entry seen longest ago", func(t *testing.T) {
		d := newD(t, store.DiscoveryLimits{MaxEntries: 3})
		for _, r := range []string{"r1", "r2", "r3"} {
			discMust(t, d.Record(ctx, discEntry(r, "http", `{}`)))
			tick()
		}
		discMust(t, d.Record(ctx, discEntry("r1", "http", `{}`))) // seen again: r2 is now the oldest
		tick()
		discMust(t, d.Record(ctx, discEntry("r4", "http", `{}`)))
		if p, _ := d.List(ctx, all); discResources(p) != "r4,r1,r3" || p.Total != 3 {
			t.Fatalf("List = %q (total %d), want r4,r1,r3", discResources(p), p.Total)
		}
	})

	t.Run("an entry out of bounds is refused and changes nothing", func(t *testing.T) {
		d := newD(t, store.DiscoveryLimits{MaxItemBytes: 64})
		discMust(t, d.Record(ctx, discEntry("r", "http", `{"v":1}`)))
		tooMany := discEntry("r", "http", `{}`)
		for i := range store.MaxDiscoveryAccepts + 1 {
			tooMany.Accepts = append(tooMany.Accepts, discAccept("n", fmt.Sprint(i), "1"))
		}
		for name, e := range map[string]store.DiscoveryEntry{
			"item over MaxItemBytes": discEntry("r", "http", `{"v":"`+strings.Repeat("x", 64)+`"}`),
			"item not JSON":          discEntry("r", "http", `{"v":`),
			"no resource":            discEntry("", "http", `{}`),
			"control character":      discEntry("r\n", "http", `{}`),
			"resource too long":      discEntry(strings.Repeat("r", store.MaxDiscoveryResourceBytes+1), "http", `{}`),
			"no way to pay":          {Resource: "r", Type: "http", Item: json.RawMessage(`{}`)},
			"too many ways to pay":   tooMany,
			"way to pay too large": discEntry("r", "http", `{}`, store.DiscoveryAccept{Scheme: "exact", Network: "n",
				Raw: json.RawMessage(`"` + strings.Repeat("x", store.MaxDiscoveryAcceptBytes) + `"`)}),
		} {
			if err := d.Record(ctx, e); !errors.Is(err, store.ErrDiscoveryEntry) {
				t.Errorf("%s: Record = %v, want ErrDiscoveryEntry", name, err)
			}
		}
		if p, _ := d.List(ctx, all); p.Total != 1 || string(p.Entries[0].Item) != `{"v":1}` {
			t.Fatalf("after refused records: %+v, want the first entry unchanged", p)
		}
	})

	t.Run("an entry not seen for MaxAge is gone", func(t *testing.T) {
		d := newD(t, store.DiscoveryLimits{MaxAge: lifetime})
		discMust(t, d.Record(ctx, discEntry("old", "http", `{}`)))
		time.Sleep(lifetime + 50*time.Millisecond)
		discMust(t, d.Record(ctx, discEntry("new", "http", `{}`)))
		if p, _ := d.List(ctx, all); discResources(p) != "new" || p.Total != 1 {
			t.Fatalf("List = %q (total %d), want only new", discResources(p), p.Total)
		}
	})

	t.Run("concurrent records never exceed MaxEntries nor lose a way to pay", func(t *testing.T) {
		d, shared := newD(t, store.DiscoveryLimits{MaxEntries: 10}), newD(t, store.DiscoveryLimits{})
		var wg sync.WaitGroup
		for i := range 40 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := d.Record(ctx, discEntry(fmt.Sprintf("r%d", i), "http", `{}`)); err != nil {
					t.Error(err)
				}
				if i < store.MaxDiscoveryAccepts {
					if err := shared.Record(ctx, discEntry("shared", "http", `{}`, discAccept("n", fmt.Sprint(i), "1"))); err != nil {
						t.Error(err)
					}
				}
			}()
		}
		wg.Wait()
		p, err := d.List(ctx, all)
		if err != nil || p.Total != 10 || len(p.Entries) != 10 {
			t.Fatalf("List: %d entries, total %d, %v; want exactly 10", len(p.Entries), p.Total, err)
		}
		p, _ = shared.List(ctx, all)
		if p.Total != 1 || len(p.Entries[0].Accepts) != store.MaxDiscoveryAccepts {
			t.Fatalf("shared entry has %d ways to pay, want %d (one per concurrent record)", len(p.Entries[0].Accepts), store.MaxDiscoveryAccepts)
		}
	})
}

// TestDiscoveryTrust runs the parts of the store.Discovery contract that
// keep the list trustworthy: one settled payment lists one resource, a
// lower Rank never replaces what a higher one wrote, and a page is bounded
// by bytes.
func TestDiscoveryTrust(t *testing.T, newD NewDiscovery) {
	ctx := context.Background()
	all := store.DiscoveryQuery{Limit: 100}

	t.Run("one payment lists one resource, even when recorded concurrently", func(t *testing.T) {
		d := newD(t, store.DiscoveryLimits{})
		const n = 24
		errs := make(chan error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				e := discEntry(fmt.Sprintf("https://a.example/spam-%d", i), "http", `{}`)
				e.Payment = "eip155:1337 0xfeed"
				errs <- d.Record(ctx, e)
			}()
		}
		wg.Wait()
		close(errs)
		var listed int
		for err := range errs {
			switch {
			case err == nil:
				listed++
			case !errors.Is(err, store.ErrDiscoveryPaymentUsed):
				t.Errorf("Record = %v, want nil or ErrDiscoveryPaymentUsed", err)
			}
		}
		p, err := d.List(ctx, all)
		if err != nil || listed != 1 || p.Total != 1 {
			t.Fatalf("%d records succeeded and %d entries are listed (%v); want one payment, one entry", listed, p.Total, err)
		}
		again := discEntry(p.Entries[0].Resource, "http", `{"again":true}`)
		again.Payment = "eip155:1337 0xfeed"
		discMust(t, d.Record(ctx, again)) // the same payment for its own resource: a retry
		other := discEntry("https://a.example/other", "http", `{}`)
		other.Payment = "eip155:1337 0xbeef"
		discMust(t, d.Record(ctx, other))
		if p, _ := d.List(ctx, all); p.Total != 2 {
			t.Fatalf("after a retry and another payment: %q, want two entries", discResources(p))
		}
	})

	t.Run("a lower rank never replaces what a higher one wrote", func(t *testing.T) {
		d := newD(t, store.DiscoveryLimits{})
		r := "https://a.example/score/:agent_id"
		op := discEntry(r, "http", `{"description":"Trust score"}`, discAccept("eip155:1337", "0xpay", "20000"))
		op.Rank = 3
		discMust(t, d.Record(ctx, op))
		stranger := discEntry(r, "http", `{"description":"MOVED"}`, discAccept("eip155:1337", "0xpay", "10000"))
		stranger.Rank = 1
		if err := d.Record(ctx, stranger); !errors.Is(err, store.ErrDiscoveryOutranked) {
			t.Fatalf("a lower rank's record = %v, want ErrDiscoveryOutranked", err)
		}
		p, _ := d.List(ctx, all)
		if p.Total != 1 || string(p.Entries[0].Item) != `{"description":"Trust score"}` || !strings.Contains(string(p.Entries[0].Accepts[0].Raw), `"20000"`) {
			t.Fatalf("after a lower rank's record: %s %s; want the operator's entry unchanged", p.Entries[0].Item, p.Entries[0].Accepts[0].Raw)
		}
		op.Item = json.RawMessage(`{"description":"Trust score v2"}`)
		discMust(t, d.Record(ctx, op))
		stranger.Resource = "https://a.example/elsewhere"
		discMust(t, d.Record(ctx, stranger))
		stranger.Rank = 2
		discMust(t, d.Record(ctx, stranger)) // a higher rank replaces a lower one
		if p, _ := d.List(ctx, all); p.Total != 2 || string(p.Entries[1].Item) != `{"description":"Trust score v2"}` {
			t.Fatalf("List = %+v; want the operator's update and the other resource", p)
		}
	})

	t.Run("a complete record or a higher rank replaces the ways to pay", func(t *testing.T) {
		d := newD(t, store.DiscoveryLimits{})
		r := "https://a.example/score/:agent_id"
		payTos := func() string {
			p, _ := d.List(ctx, all)
			var s []string
			for _, a := range p.Entries[0].Accepts {
				s = append(s, a.PayTo+"="+string(a.Raw))
			}
			return strings.Join(s, " ")
		}
		// A stranger's way to pay, then the operator's, which names them all.
		stranger := discEntry(r, "http", `{}`, discAccept("eip155:1337", "0xevil", "1"))
		stranger.Rank = 1
		discMust(t, d.Record(ctx, stranger))
		op := discEntry(r, "http", `{}`, discAccept("eip155:1337", "0xold", "20000"), discAccept("eip155:8453", "0xold", "20000"))
		op.Rank, op.ReplaceAccepts = 3, true
		discMust(t, d.Record(ctx, op))
		if got, want := payTos(), "0xold="+string(op.Accepts[0].Raw)+" 0xold="+string(op.Accepts[1].Raw); got != want {
			t.Fatalf("after the operator's record over a stranger's: %s; want %s", got, want)
		}
		// The operator rotates pay_to and drops a network.
		op.Accepts = []store.DiscoveryAccept{discAccept("eip155:1337", "0xnew", "20000")}
		discMust(t, d.Record(ctx, op))
		if got, want := payTos(), "0xnew="+string(op.Accepts[0].Raw); got != want {
			t.Fatalf("after the operator's rotation: %s; want only %s", got, want)
		}
		// Among callers of one rank the ways to pay still merge; a higher
		// rank drops a lower one's.
		r2 := "https://a.example/elsewhere"
		a := discEntry(r2, "http", `{}`, discAccept("eip155:1337", "0xa", "1"))
		a.Rank = 1
		b := discEntry(r2, "http", `{}`, discAccept("eip155:1337", "0xb", "1"))
		b.Rank = 1
		discMust(t, d.Record(ctx, a))
		discMust(t, d.Record(ctx, b))
		if p, _ := d.List(ctx, store.DiscoveryQuery{Limit: 1}); len(p.Entries[0].Accepts) != 2 {
			t.Fatalf("two callers of one rank: %+v; want both ways to pay", p.Entries[0].Accepts)
		}
		trusted := discEntry(r2, "http", `{}`, discAccept("eip155:1337", "0xc", "1"))
		trusted.Rank = 2
		discMust(t, d.Record(ctx, trusted))
		if p, _ := d.List(ctx, store.DiscoveryQuery{Limit: 1}); len(p.Entries[0].Accepts) != 1 || p.Entries[0].Accepts[0].PayTo != "0xc" {
			t.Fatalf("after a higher rank's record: %+v; want only its way to pay", p.Entries[0].Accepts)
		}
	})

	t.Run("a page holds at most MaxBytes of entries, at least one", func(t *testing.T) {
		d := newD(t, store.DiscoveryLimits{})
		item := `{"pad":"` + strings.Repeat("x", 1000) + `"}`
		for i := range 10 {
			discMust(t, d.Record(ctx, discEntry(fmt.Sprintf("r%d", i), "http", item)))
		}
		size := len(item) + len(discAccept("eip155:1337", "0xpay", "10000").Raw)
		for _, q := range []store.DiscoveryQuery{{Limit: 100}, {Limit: 100, Type: "http"}} {
			q.MaxBytes = 3*size + 1
			p, err := d.List(ctx, q)
			if err != nil || p.Total != 10 || len(p.Entries) != 3 {
				t.Fatalf("List(%+v) = %d entries of %d, %v; want 3 of 10", q, len(p.Entries), p.Total, err)
			}
			q.MaxBytes = 1
			if p, _ := d.List(ctx, q); len(p.Entries) != 1 {
				t.Fatalf("a budget smaller than one entry: %d entries, want 1", len(p.Entries))
			}
		}
	})
}

func discMust(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
