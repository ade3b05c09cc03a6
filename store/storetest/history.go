package storetest

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aovhq/aov/store"
)

// History is a verification history backend.
type History interface {
	RecordVerification(ctx context.Context, v store.Verification) error
	Verification(ctx context.Context, id string) (store.Verification, error)
	Verifications(ctx context.Context, agentID, cursor string, limit int) ([]store.Verification, string, error)
	AgentCounts(ctx context.Context, agentID string) (store.Counts, error)
	SetPayment(ctx context.Context, id, payment string) error
	SetPayments(ctx context.Context, outs []store.PaymentOutcome) ([]error, error)
	Ping(ctx context.Context) error
}

// NewHistory returns two handles on one fresh, empty history: for a
// shared backend two instances' connections, for the embedded one the
// same database twice. It is called once per subtest.
type NewHistory func(t *testing.T) (a, b History)

// unfiredDeadline is a context whose deadline has passed but whose timer
// has not fired: what a process resumed after a stall sees until its timer
// goroutine runs.
type unfiredDeadline struct {
	context.Context
	at time.Time
}

func (c unfiredDeadline) Deadline() (time.Time, bool) { return c.at, true }

// Sample is a valid verification for tests.
func Sample(id, agent string, at time.Time, result string) store.Verification {
	return store.Verification{
		ID: id, VerifiedAt: at, AgentID: agent, TaskID: "task-" + id, Result: result,
		OutputHash: strings.Repeat("a", 64), SchemaHash: strings.Repeat("b", 64),
		RulesHash: strings.Repeat("c", 64), RequestHash: strings.Repeat("d", 64),
		Payment: store.PaymentFree,
	}
}

// TestHistory runs the history contract against newH.
func TestHistory(t *testing.T, newH NewHistory) {
	ctx := context.Background()
	base := time.Date(2026, 11, 29, 21, 0, 0, 123456789, time.UTC)

	t.Run("a record whose deadline has passed is not made, even before the context's timer fired", func(t *testing.T) {
		h, other := newH(t)
		past := time.Now().Add(-time.Millisecond)
		err := h.RecordVerification(unfiredDeadline{ctx, past}, Sample("id-late", "seller-7", base, "pass"))
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want the deadline", err)
		}
		if _, err := other.Verification(ctx, "id-late"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("the record was made: %v", err)
		}
		if c, err := other.AgentCounts(ctx, "seller-7"); err != nil || c.Total() != 0 {
			t.Fatalf("counted %+v, %v", c, err)
		}
	})

	t.Run("a record is readable by id with every field, to the nanosecond", func(t *testing.T) {
		h, other := newH(t)
		v := Sample("id-1", "seller-7", base, "fail")
		v.Payment, v.Payer, v.Network, v.Wallet, v.Authenticated = store.PaymentPaid, "0xabc", "eip155:8453", "0xdef", true
		v.KeyVersion = "k2"
		if err := h.RecordVerification(ctx, v); err != nil {
			t.Fatal(err)
		}
		got, err := other.Verification(ctx, "id-1")
		if err != nil {
			t.Fatal(err)
		}
		if got != v {
			t.Fatalf("got %+v\nwant %+v", got, v)
		}
		if _, err := h.Verification(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("unknown id: %v, want ErrNotFound", err)
		}
		if err := h.Ping(ctx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("an agent id of MaxAgentIDBytes is recorded and bound, one byte more refused", func(t *testing.T) {
		h, other := newH(t)
		// Random base64: nothing for a backend to compress, so a limit
		// of its own below the contract's (PostgreSQL's btree entries,
		// about 2.7 kB) shows.
		raw := make([]byte, store.MaxAgentIDBytes)
		rand.Read(raw)
		agent := base64.RawURLEncoding.EncodeToString(raw)[:store.MaxAgentIDBytes]
		v := Sample("id-long-agent", agent, base, "pass")
		if err := h.RecordVerification(ctx, v); err != nil {
			t.Fatalf("RecordVerification with a %d-byte agent id: %v", len(agent), err)
		}
		got, err := other.Verification(ctx, v.ID)
		if err != nil || got.AgentID != agent {
			t.Fatalf("read back: agent id of %d bytes (%v), want %d", len(got.AgentID), err, len(agent))
		}
		if vs, _, err := other.Verifications(ctx, agent, "", 10); err != nil || len(vs) != 1 {
			t.Fatalf("the agent's page: %d records (%v), want 1", len(vs), err)
		}
		if c, err := other.AgentCounts(ctx, agent); err != nil || c.Pass != 1 {
			t.Fatalf("the agent's counts: %+v (%v), want one pass", c, err)
		}
		owners, ok := h.(store.Owners)
		if ok {
			if owner, err := owners.BindAgent(ctx, agent, "0x1111111111111111111111111111111111111111"); err != nil || owner == "" {
				t.Fatalf("BindAgent with a %d-byte agent id: %q, %v", len(agent), owner, err)
			}
		}
		longer := agent + "x"
		if err := h.RecordVerification(ctx, Sample("id-longer-agent", longer, base, "pass")); err == nil {
			t.Errorf("RecordVerification took a %d-byte agent id", len(longer))
		}
		if _, err := other.Verification(ctx, "id-longer-agent"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("the refused record was made: %v", err)
		}
		if ok {
			if _, err := owners.BindAgent(ctx, longer, "0x1111111111111111111111111111111111111111"); err == nil {
				t.Errorf("BindAgent took a %d-byte agent id", len(longer))
			}
		}
	})

	t.Run("agents starting with test- are flagged by the store, whatever the caller says", func(t *testing.T) {
		h, _ := newH(t)
		for _, c := range []struct {
			desc, agent string
			test        bool
		}{
			{"a test- agent is flagged", "test-agent", true},
			{"an ordinary agent is not flagged even if the caller claims so", "seller", false},
			{"a prefix in the middle does not count", "my-test-agent", false},
		} {
			v := Sample("id-"+c.agent, c.agent, base, "pass")
			v.Test = !c.test
			if err := h.RecordVerification(ctx, v); err != nil {
				t.Fatal(err)
			}
			got, err := h.Verification(ctx, v.ID)
			if err != nil || got.Test != c.test {
				t.Errorf("%s: Test = %v (%v), want %v", c.desc, got.Test, err, c.test)
			}
		}
	})

	t.Run("a duplicate id is refused once across instances and the counts do not change", func(t *testing.T) {
		a, b := newH(t)
		var ok, dup atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				h := a
				if i%2 == 1 {
					h = b
				}
				v := Sample("dup", "agent", base, "pass")
				if i > 0 {
					v.Result = "fail"
				}
				switch err := h.RecordVerification(ctx, v); {
				case err == nil:
					ok.Add(1)
				case errors.Is(err, store.ErrDuplicate):
					dup.Add(1)
				default:
					t.Error(err)
				}
			}()
		}
		close(start)
		wg.Wait()
		if ok.Load() != 1 || dup.Load() != 19 {
			t.Fatalf("%d recorded, %d refused; want 1 and 19", ok.Load(), dup.Load())
		}
		c, err := b.AgentCounts(ctx, "agent")
		if err != nil || c.Total() != 1 {
			t.Fatalf("counts %+v (%v) after refused duplicates, want one record", c, err)
		}
	})

	t.Run("invalid records are refused", func(t *testing.T) {
		h, _ := newH(t)
		for _, c := range []struct {
			desc string
			edit func(*store.Verification)
		}{
			{"an empty id", func(v *store.Verification) { v.ID = "" }},
			{"an id over 200 bytes", func(v *store.Verification) { v.ID = strings.Repeat("x", 201) }},
			{"a result other than pass or fail", func(v *store.Verification) { v.Result = "maybe" }},
			{"a zero time", func(v *store.Verification) { v.VerifiedAt = time.Time{} }},
			{"an unknown payment kind", func(v *store.Verification) { v.Payment = "credit" }},
			{"an agent id longer than a key component", func(v *store.Verification) { v.AgentID = strings.Repeat("a", 70000) }},
		} {
			v := Sample("x", "agent", base, "pass")
			c.edit(&v)
			if err := h.RecordVerification(ctx, v); err == nil {
				t.Errorf("%s: accepted", c.desc)
			}
		}
		if c, _ := h.AgentCounts(ctx, "agent"); c.Total() != 0 {
			t.Fatalf("refused records were counted: %+v", c)
		}
	})

	t.Run("ids and agent ids may hold NUL and any byte", func(t *testing.T) {
		h, _ := newH(t)
		v := Sample("a\x00b", "ag\x00ent", base, "pass")
		v.TaskID = "t\x00"
		if err := h.RecordVerification(ctx, v); err != nil {
			t.Fatal(err)
		}
		if got, err := h.Verification(ctx, "a\x00b"); err != nil || got != v {
			t.Fatalf("%+v, %v", got, err)
		}
		if c, _ := h.AgentCounts(ctx, "ag\x00ent"); c.Pass != 1 {
			t.Fatalf("counts %+v", c)
		}
		if c, _ := h.AgentCounts(ctx, "ag"); c.Total() != 0 {
			t.Fatalf("a prefix of the agent id has counts %+v", c)
		}
		if vs, _, err := h.Verifications(ctx, "ag", "", 10); err != nil || len(vs) != 0 {
			t.Fatalf("a prefix of the agent id lists %d records, %v", len(vs), err)
		}
	})

	t.Run("counts stay exact under concurrency across instances", func(t *testing.T) {
		a, b := newH(t)
		now := time.Now()
		const n = 60
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				result := "pass"
				if i%3 == 0 {
					result = "fail"
				}
				v := Sample(fmt.Sprintf("c-%d", i), "busy-agent", now.Add(time.Duration(i)*time.Millisecond), result)
				v.Authenticated = i%2 == 0
				if i%4 == 0 {
					v.Payment = store.PaymentPaid
				}
				h := a
				if i%2 == 1 {
					h = b
				}
				if err := h.RecordVerification(ctx, v); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		c, err := a.AgentCounts(ctx, "busy-agent")
		if err != nil {
			t.Fatal(err)
		}
		want := store.Counts{Pass: 40, Fail: 20, AuthenticatedPass: 20, AuthenticatedFail: 10, Paid: 15,
			First: now.UTC(), Last: now.Add((n - 1) * time.Millisecond).UTC()}
		c.First, c.Last = c.First.Round(0), c.Last.Round(0)
		want.First, want.Last = want.First.Round(0), want.Last.Round(0)
		if c != want {
			t.Fatalf("counts %+v, want %+v", c, want)
		}
		if u, _ := a.AgentCounts(ctx, "never-seen"); u != (store.Counts{}) {
			t.Fatalf("an unknown agent has counts %+v", u)
		}
	})

	t.Run("paging is newest first, ties by id, and stable while records arrive", func(t *testing.T) {
		h, other := newH(t)
		order := []int{3, 0, 7, 1, 9, 4, 2, 8, 6, 5}
		for _, i := range order {
			at := base.Add(time.Duration(i) * time.Second)
			if i == 8 {
				at = base.Add(9 * time.Second)
			}
			if err := h.RecordVerification(ctx, Sample(fmt.Sprintf("a%02d", i), "alpha", at, "pass")); err != nil {
				t.Fatal(err)
			}
			if err := other.RecordVerification(ctx, Sample(fmt.Sprintf("b%02d", i), "alphabet", at, "fail")); err != nil {
				t.Fatal(err)
			}
		}
		if err := h.RecordVerification(ctx, Sample("anon", "", base.Add(time.Hour), "pass")); err != nil {
			t.Fatal(err)
		}
		wantAlpha := []string{"a08", "a09", "a07", "a06", "a05", "a04", "a03", "a02", "a01", "a00"}
		pageAll := func(agent string, limit int) ([]string, int) {
			t.Helper()
			var ids []string
			cursor, pages := "", 0
			for {
				// Alternate instances: a cursor from one serves on the other.
				src := h
				if pages%2 == 1 {
					src = other
				}
				vs, next, err := src.Verifications(ctx, agent, cursor, limit)
				if err != nil {
					t.Fatal(err)
				}
				pages++
				for _, v := range vs {
					ids = append(ids, v.ID)
				}
				if next == "" {
					return ids, pages
				}
				if len(vs) != limit {
					t.Fatalf("a page of %d with a next cursor, want full pages of %d", len(vs), limit)
				}
				cursor = next
			}
		}
		for _, c := range []struct {
			desc      string
			agent     string
			limit     int
			want      []string
			wantPages int
		}{
			{"one agent's records, not mixed with an agent whose id extends it", "alpha", 3, wantAlpha, 4},
			{"a limit that divides the total ends without an empty page", "alpha", 5, wantAlpha, 2},
			{"a limit above the total is one page", "alpha", 50, wantAlpha, 1},
			{"an unknown agent has no records", "nobody", 10, nil, 1},
		} {
			got, pages := pageAll(c.agent, c.limit)
			if strings.Join(got, ",") != strings.Join(c.want, ",") || pages != c.wantPages {
				t.Errorf("%s:\n got %v in %d pages\nwant %v in %d", c.desc, got, pages, c.want, c.wantPages)
			}
		}
		if got, _ := pageAll("", 7); len(got) != 21 || got[0] != "anon" {
			t.Errorf("global listing %v, want 21 records starting with anon", got)
		}

		first, next, err := h.Verifications(ctx, "alpha", "", 4)
		if err != nil || len(first) != 4 {
			t.Fatal(err)
		}
		if err := other.RecordVerification(ctx, Sample("a-new", "alpha", base.Add(time.Minute), "pass")); err != nil {
			t.Fatal(err)
		}
		if err := other.RecordVerification(ctx, Sample("a-old", "alpha", base.Add(-time.Minute), "pass")); err != nil {
			t.Fatal(err)
		}
		rest, _, err := other.Verifications(ctx, "alpha", next, 50)
		if err != nil {
			t.Fatal(err)
		}
		if len(rest) != 7 || rest[0].ID != "a05" || rest[6].ID != "a-old" {
			t.Fatalf("after the cursor: %d records, want a05..a00 then a-old", len(rest))
		}

		for i := range store.MaxPageSize + 5 {
			h.RecordVerification(ctx, Sample(fmt.Sprintf("m%03d", i), "many", base.Add(time.Duration(i)), "pass"))
		}
		for _, c := range []struct {
			desc  string
			limit int
			want  int
		}{
			{"zero means the default page size", 0, store.DefaultPageSize},
			{"negative means the default page size", -3, store.DefaultPageSize},
			{"over the maximum means the maximum", 1000, store.MaxPageSize},
		} {
			if vs, _, err := h.Verifications(ctx, "many", "", c.limit); err != nil || len(vs) != c.want {
				t.Errorf("%s: %d records (%v), want %d", c.desc, len(vs), err, c.want)
			}
		}
		for _, cur := range []string{"!!!", "AAAA", "not base64 at all"} {
			if _, _, err := h.Verifications(ctx, "alpha", cur, 5); !errors.Is(err, store.ErrBadCursor) {
				t.Errorf("cursor %q: %v, want ErrBadCursor", cur, err)
			}
		}
	})
	t.Run("a pending paid call counts only once reported paid, an unpaid one never, and the outcome is set once across instances", func(t *testing.T) {
		h, other := newH(t)
		rec := func(id, payment string) {
			t.Helper()
			v := Sample(id, "agent-p", base, "pass")
			v.Payment = payment
			if err := h.RecordVerification(ctx, v); err != nil {
				t.Fatal(err)
			}
		}
		counts := func() store.Counts {
			t.Helper()
			c, err := other.AgentCounts(ctx, "agent-p")
			if err != nil {
				t.Fatal(err)
			}
			return c
		}
		rec("free-1", store.PaymentFree)
		rec("paid-1", store.PaymentPending)
		rec("paid-2", store.PaymentPending)
		if c := counts(); c.Pass != 1 || c.Paid != 0 {
			t.Fatalf("pending records counted: %+v", c)
		}
		// Two instances report the same outcome at once: it counts once.
		var wg sync.WaitGroup
		var ok atomic.Int32
		for _, db := range []History{h, other} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := db.SetPayment(ctx, "paid-1", store.PaymentPaid); err == nil {
					ok.Add(1)
				} else if !errors.Is(err, store.ErrPaymentFinal) {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		if ok.Load() != 1 {
			t.Fatalf("%d reports took effect, want 1", ok.Load())
		}
		if err := other.SetPayment(ctx, "paid-2", store.PaymentUnpaid); err != nil {
			t.Fatal(err)
		}
		if c := counts(); c.Pass != 2 || c.Paid != 1 {
			t.Fatalf("after the outcomes: %+v, want 2 passes, 1 paid", c)
		}
		for _, tc := range []struct {
			id, payment string
			want        error
		}{
			{"paid-1", store.PaymentUnpaid, store.ErrPaymentFinal},
			{"paid-2", store.PaymentPaid, store.ErrPaymentFinal},
			{"free-1", store.PaymentPaid, store.ErrPaymentFinal},
			{"nope", store.PaymentPaid, store.ErrNotFound},
		} {
			if err := h.SetPayment(ctx, tc.id, tc.payment); !errors.Is(err, tc.want) {
				t.Errorf("SetPayment(%s, %s) = %v, want %v", tc.id, tc.payment, err, tc.want)
			}
		}
		if err := h.SetPayment(ctx, "paid-1", store.PaymentFree); err == nil {
			t.Error("an outcome other than paid or unpaid was accepted")
		}
		if c := counts(); c.Pass != 2 || c.Paid != 1 {
			t.Fatalf("refused reports changed the counts: %+v", c)
		}
		recs, _, err := other.Verifications(ctx, "agent-p", "", store.MaxPageSize)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, v := range recs {
			got[v.ID] = v.Payment
		}
		if got["paid-1"] != store.PaymentPaid || got["paid-2"] != store.PaymentUnpaid || got["free-1"] != store.PaymentFree {
			t.Fatalf("history %v", got)
		}
	})
	t.Run("first and last are the times of counted records only: pending and unpaid ones do not move them, a pending one reported paid does", func(t *testing.T) {
		h, other := newH(t)
		at := func(hours int) time.Time { return base.Add(time.Duration(hours) * time.Hour) }
		rec := func(id string, hours int, payment string) {
			t.Helper()
			v := Sample(id, "agent-fl", at(hours), "pass")
			v.Payment = payment
			if err := h.RecordVerification(ctx, v); err != nil {
				t.Fatal(err)
			}
		}
		check := func(stage string, first, last time.Time) {
			t.Helper()
			c, err := other.AgentCounts(ctx, "agent-fl")
			if err != nil {
				t.Fatal(err)
			}
			if !c.First.Equal(first) || !c.Last.Equal(last) {
				t.Fatalf("%s: first %v, last %v; want %v, %v", stage, c.First, c.Last, first, last)
			}
		}
		// Only uncounted records: the agent has no first or last yet.
		rec("early-pending", 0, store.PaymentPending)
		rec("late-pending", 4, store.PaymentPending)
		check("pending records only", time.Time{}, time.Time{})
		rec("free", 2, store.PaymentFree)
		check("one free record", at(2), at(2))
		// Settled unpaid: they never count, so they never move first/last.
		if _, err := other.SetPayments(ctx, []store.PaymentOutcome{{ID: "early-pending", Payment: store.PaymentUnpaid}, {ID: "late-pending", Payment: store.PaymentUnpaid}}); err != nil {
			t.Fatal(err)
		}
		check("pending records reported unpaid", at(2), at(2))
		// Pending records reported paid count from then on, at their own time.
		rec("earliest-pending", -1, store.PaymentPending)
		rec("latest-pending", 5, store.PaymentPending)
		check("new pending records", at(2), at(2))
		if err := other.SetPayment(ctx, "latest-pending", store.PaymentPaid); err != nil {
			t.Fatal(err)
		}
		check("a later pending record reported paid", at(2), at(5))
		if err := h.SetPayment(ctx, "earliest-pending", store.PaymentPaid); err != nil {
			t.Fatal(err)
		}
		check("an earlier pending record reported paid", at(-1), at(5))
	})
	t.Run("an agent whose only record is reported paid gets its counts", func(t *testing.T) {
		h, other := newH(t)
		v := Sample("only", "agent-one", base, "fail")
		v.Payment = store.PaymentPending
		if err := h.RecordVerification(ctx, v); err != nil {
			t.Fatal(err)
		}
		if c, err := other.AgentCounts(ctx, "agent-one"); err != nil || c != (store.Counts{}) {
			t.Fatalf("a pending record counted: %+v, %v", c, err)
		}
		if err := other.SetPayment(ctx, "only", store.PaymentPaid); err != nil {
			t.Fatal(err)
		}
		want := store.Counts{Fail: 1, Paid: 1, First: base, Last: base}
		if c, err := h.AgentCounts(ctx, "agent-one"); err != nil || !c.First.Equal(want.First) || !c.Last.Equal(want.Last) || c.Fail != 1 || c.Paid != 1 || c.Pass != 0 {
			t.Fatalf("counts %+v, %v; want %+v", c, err, want)
		}
	})
	t.Run("a batch of outcomes is recorded as one by one, each refusal its own, and two instances' batches in opposite orders count each outcome once", func(t *testing.T) {
		h, other := newH(t)
		for i, id := range []string{"b-1", "b-2", "b-3", "b-4", "b-5", "b-6"} {
			v := Sample(id, []string{"agent-x", "agent-y"}[i%2], base.Add(time.Duration(i)), "pass")
			v.Payment = store.PaymentPending
			if err := h.RecordVerification(ctx, v); err != nil {
				t.Fatal(err)
			}
		}
		free := Sample("b-free", "agent-x", base, "fail")
		if err := h.RecordVerification(ctx, free); err != nil {
			t.Fatal(err)
		}
		errs, err := other.SetPayments(ctx, []store.PaymentOutcome{
			{ID: "b-2", Payment: store.PaymentPaid},
			{ID: "nope", Payment: store.PaymentPaid},
			{ID: "b-1", Payment: store.PaymentUnpaid},
			{ID: "b-free", Payment: store.PaymentPaid},
			{ID: "b-2", Payment: store.PaymentUnpaid}, // the same id again: final by now
			{ID: "b-3", Payment: store.PaymentFree},
			{ID: "b-4", Payment: store.PaymentPaid},
		})
		if err != nil {
			t.Fatal(err)
		}
		for i, want := range []error{nil, store.ErrNotFound, nil, store.ErrPaymentFinal, store.ErrPaymentFinal, store.ErrBadOutcome, nil} {
			if !errors.Is(errs[i], want) {
				t.Errorf("outcome %d: %v, want %v", i, errs[i], want)
			}
		}
		payments := func() map[string]string {
			t.Helper()
			got := map[string]string{}
			for _, agent := range []string{"agent-x", "agent-y"} {
				recs, _, err := h.Verifications(ctx, agent, "", store.MaxPageSize)
				if err != nil {
					t.Fatal(err)
				}
				for _, v := range recs {
					got[v.ID] = v.Payment
				}
			}
			return got
		}
		want := map[string]string{"b-1": store.PaymentUnpaid, "b-2": store.PaymentPaid, "b-3": store.PaymentPending,
			"b-4": store.PaymentPaid, "b-5": store.PaymentPending, "b-6": store.PaymentPending, "b-free": store.PaymentFree}
		if got := payments(); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("after the batch: %v, want %v", got, want)
		}
		// Two instances report overlapping batches at once, in opposite
		// orders and across both agents: every outcome counts once, and
		// neither batch fails for the other.
		var wg sync.WaitGroup
		var took atomic.Int32
		for _, c := range []struct {
			db  History
			ids []string
		}{{h, []string{"b-3", "b-5", "b-6"}}, {other, []string{"b-6", "b-5", "b-3"}}} {
			wg.Go(func() {
				outs := make([]store.PaymentOutcome, len(c.ids))
				for i, id := range c.ids {
					outs[i] = store.PaymentOutcome{ID: id, Payment: store.PaymentPaid}
				}
				errs, err := c.db.SetPayments(ctx, outs)
				if err != nil {
					t.Error(err)
					return
				}
				for _, err := range errs {
					if err == nil {
						took.Add(1)
					} else if !errors.Is(err, store.ErrPaymentFinal) {
						t.Error(err)
					}
				}
			})
		}
		wg.Wait()
		if took.Load() != 3 {
			t.Fatalf("%d outcomes took effect, want 3", took.Load())
		}
		cx, err := other.AgentCounts(ctx, "agent-x")
		if err != nil {
			t.Fatal(err)
		}
		cy, err := other.AgentCounts(ctx, "agent-y")
		if err != nil {
			t.Fatal(err)
		}
		// agent-x: b-1 unpaid, b-3 and b-5 paid, b-free free (a fail);
		// agent-y: b-2, b-4 and b-6 paid.
		if cx.Pass != 2 || cx.Fail != 1 || cx.Paid != 2 || cy.Pass != 3 || cy.Paid != 3 {
			t.Fatalf("counts x %+v, y %+v; want x 2 passes, 1 fail, 2 paid; y 3 passes, 3 paid", cx, cy)
		}
	})
}
