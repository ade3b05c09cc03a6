package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aovhq/aov/store"
)

// NewPaymentIDs returns a fresh, empty backend of payment identifiers. It
// is called once per subtest.
type NewPaymentIDs func(t *testing.T) store.PaymentIDs

// TestPaymentIDs runs the store.PaymentIDs contract against newP.
func TestPaymentIDs(t *testing.T, newP NewPaymentIDs) {
	ctx := context.Background()
	const id = "pay_7d5d747be160e280504c099d984bcfe0"

	t.Run("the first binder wins; the binding is reported to the others", func(t *testing.T) {
		p := newP(t)
		until := time.Now().Add(time.Hour)
		st, bound, err := p.Bind(ctx, id, "fp1", until)
		if err != nil || !bound || st.Fingerprint != "fp1" || st.Done || !near(st.Until, until) {
			t.Fatalf("first Bind = %+v, %v, %v", st, bound, err)
		}
		for _, fp := range []string{"fp1", "fp2"} {
			st, bound, err := p.Bind(ctx, id, fp, time.Now().Add(2*time.Hour))
			if err != nil || bound || st.Fingerprint != "fp1" || st.Done || !near(st.Until, until) {
				t.Fatalf("Bind %s over a live binding = %+v, %v, %v; want fp1's binding, unchanged", fp, st, bound, err)
			}
		}
		if st, err := p.Lookup(ctx, id); err != nil || st.Fingerprint != "fp1" {
			t.Fatalf("Lookup = %+v, %v", st, err)
		}
		if _, err := p.Lookup(ctx, "pay_another_identifier_0001"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("Lookup of an unbound id = %v, want ErrNotFound", err)
		}
	})

	t.Run("of many concurrent binders with different fingerprints exactly one wins", func(t *testing.T) {
		p := newP(t)
		var wins atomic.Int32
		var winner atomic.Value
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range 40 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				fp := "fp" + strings.Repeat("x", i+1)
				_, bound, err := p.Bind(ctx, id, fp, time.Now().Add(time.Hour))
				if err != nil {
					t.Error(err)
					return
				}
				if bound {
					wins.Add(1)
					winner.Store(fp)
				}
			}()
		}
		close(start)
		wg.Wait()
		if wins.Load() != 1 {
			t.Fatalf("%d binders won, want exactly 1", wins.Load())
		}
		if st, err := p.Lookup(ctx, id); err != nil || st.Fingerprint != winner.Load() {
			t.Fatalf("Lookup = %+v, %v; want the winner %v", st, err, winner.Load())
		}
	})

	t.Run("a saved answer is kept, first answer wins, another fingerprint cannot save", func(t *testing.T) {
		p := newP(t)
		if _, _, err := p.Bind(ctx, id, "fp1", time.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		if err := p.Save(ctx, id, "fp2", []byte("theirs"), time.Now().Add(time.Hour)); !errors.Is(err, store.ErrPaymentIDTaken) {
			t.Fatalf("Save by another fingerprint = %v, want ErrPaymentIDTaken", err)
		}
		answer := []byte("\x00status 200\xff binary body")
		keep := time.Now().Add(30 * time.Minute)
		if err := p.Save(ctx, id, "fp1", answer, keep); err != nil {
			t.Fatal(err)
		}
		if err := p.Save(ctx, id, "fp1", []byte("second"), time.Now().Add(time.Hour)); err != nil {
			t.Fatalf("a repeated Save = %v, want nil (and the first answer kept)", err)
		}
		st, err := p.Lookup(ctx, id)
		if err != nil || !st.Done || st.Fingerprint != "fp1" || !bytes.Equal(st.Answer, answer) || !near(st.Until, keep) {
			t.Fatalf("Lookup after Save = %+v, %v", st, err)
		}
		st, bound, err := p.Bind(ctx, id, "fp3", time.Now().Add(time.Hour))
		if err != nil || bound || !st.Done || !bytes.Equal(st.Answer, answer) {
			t.Fatalf("Bind over a done binding = %+v, %v, %v", st, bound, err)
		}
		if err := p.Unbind(ctx, id, "fp1"); err != nil {
			t.Fatal(err)
		}
		if st, err := p.Lookup(ctx, id); err != nil || !st.Done {
			t.Fatalf("Unbind dropped a done binding: %+v, %v", st, err)
		}
	})

	t.Run("save without a binding records the answer", func(t *testing.T) {
		p := newP(t)
		if err := p.Save(ctx, id, "fp1", []byte("a"), time.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		if st, err := p.Lookup(ctx, id); err != nil || !st.Done || string(st.Answer) != "a" {
			t.Fatalf("Lookup = %+v, %v", st, err)
		}
	})

	t.Run("unbind drops only its own unfinished binding", func(t *testing.T) {
		p := newP(t)
		if _, _, err := p.Bind(ctx, id, "fp1", time.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		if err := p.Unbind(ctx, id, "fp2"); err != nil {
			t.Fatal(err)
		}
		if st, err := p.Lookup(ctx, id); err != nil || st.Fingerprint != "fp1" {
			t.Fatalf("another fingerprint's Unbind changed the binding: %+v, %v", st, err)
		}
		if err := p.Unbind(ctx, id, "fp1"); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Lookup(ctx, id); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("after Unbind: %v, want ErrNotFound", err)
		}
		if err := p.Unbind(ctx, id, "fp1"); err != nil {
			t.Fatalf("a second Unbind = %v, want nil", err)
		}
		if _, bound, err := p.Bind(ctx, id, "fp2", time.Now().Add(time.Hour)); err != nil || !bound {
			t.Fatalf("Bind after Unbind = %v, %v; want bound", bound, err)
		}
	})

	t.Run("a binding and a saved answer expire at their until", func(t *testing.T) {
		p := newP(t)
		if _, _, err := p.Bind(ctx, id, "fp1", time.Now().Add(lifetime)); err != nil {
			t.Fatal(err)
		}
		if err := p.Save(ctx, "pay_saved_answer_expires_01", "fp1", []byte("a"), time.Now().Add(lifetime)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(lifetime + 50*time.Millisecond)
		for _, k := range []string{id, "pay_saved_answer_expires_01"} {
			if _, err := p.Lookup(ctx, k); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("Lookup %s after its until = %v, want ErrNotFound", k, err)
			}
		}
		if _, bound, err := p.Bind(ctx, id, "fp2", time.Now().Add(time.Hour)); err != nil || !bound {
			t.Fatalf("Bind after expiry = %v, %v; want bound", bound, err)
		}
	})

	t.Run("bad arguments are refused and write nothing", func(t *testing.T) {
		p := newP(t)
		long := strings.Repeat("a", store.MaxPaymentIDBytes+1)
		if _, _, err := p.Bind(ctx, "", "fp", time.Now().Add(time.Hour)); err == nil {
			t.Error("Bind accepted an empty id")
		}
		if _, _, err := p.Bind(ctx, long, "fp", time.Now().Add(time.Hour)); err == nil {
			t.Error("Bind accepted an over-long id")
		}
		if _, _, err := p.Bind(ctx, id, "", time.Now().Add(time.Hour)); err == nil {
			t.Error("Bind accepted an empty fingerprint")
		}
		if _, _, err := p.Bind(ctx, id, "fp", time.Now().Add(-time.Second)); err == nil {
			t.Error("Bind accepted an expiry in the past")
		}
		if err := p.Save(ctx, id, "fp", make([]byte, store.MaxPaymentIDAnswerBytes+1), time.Now().Add(time.Hour)); err == nil {
			t.Error("Save accepted an answer over the bound")
		}
		if _, err := p.Lookup(ctx, id); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("a refused call wrote: %v", err)
		}
	})
}

// BenchmarkPaymentIDs measures what a paid call with a payment identifier
// adds to the store's work: binding its id and saving a 2 KiB answer, a
// replay's lookup of the saved answer, and, as the baseline in the same
// run, the payment claim every paid call takes.
func BenchmarkPaymentIDs(b *testing.B, p store.PaymentIDs, cl store.Claims) {
	ctx := context.Background()
	run := fmt.Sprint(time.Now().UnixNano())
	answer := bytes.Repeat([]byte("a"), 2<<10)
	var seq atomic.Int64
	for _, c := range Concurrency {
		b.Run(fmt.Sprintf("claim(baseline)/c=%d", c), func(b *testing.B) {
			parallel(b, c, func(int) error {
				k := fmt.Sprintf("%s-%d", run, seq.Add(1))
				_, err := cl.Claim(ctx, []string{"payload:" + k, "nonce:" + k}, time.Now().Add(time.Minute))
				return err
			})
		})
		b.Run(fmt.Sprintf("bind+save/c=%d", c), func(b *testing.B) {
			parallel(b, c, func(int) error {
				id := fmt.Sprintf("pay_%s_%d", run, seq.Add(1))
				if _, _, err := p.Bind(ctx, id, "fp", time.Now().Add(time.Hour)); err != nil {
					return err
				}
				return p.Save(ctx, id, "fp", answer, time.Now().Add(time.Hour))
			})
		})
	}
	id := fmt.Sprintf("pay_%s_saved", run)
	if err := p.Save(ctx, id, "fp", answer, time.Now().Add(time.Hour)); err != nil {
		b.Fatal(err)
	}
	b.Run("lookup", func(b *testing.B) {
		parallel(b, 1, func(int) error {
			_, err := p.Lookup(ctx, id)
			return err
		})
	})
}
