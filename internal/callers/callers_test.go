package callers

import (
	"errors"
	"sync"
	"testing"
	"time"
)

// TestRun: exactly n calls, spread over the callers' own numbers.
func TestRun(t *testing.T) {
	var mu sync.Mutex
	seen := map[int]int{}
	total := 0
	if _, err := Run(4, 1000, func(client int) error {
		mu.Lock()
		defer mu.Unlock()
		seen[client]++
		total++
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if total != 1000 {
		t.Fatalf("%d calls, want 1000", total)
	}
	for client := range seen {
		if client < 0 || client >= 4 {
			t.Fatalf("caller number %d, want 0 to 3", client)
		}
	}
}

// TestRunStopsAtAnError: the first error is returned, and the other callers
// stop instead of making the calls left. The caller that got the error
// records it just after its call returns; calls after it take a
// millisecond each, so that on a busy machine the other caller cannot run
// through all the calls left in that moment (with instant calls it could,
// when the scheduler paused the erring caller right there).
func TestRunStopsAtAnError(t *testing.T) {
	boom := errors.New("boom")
	var mu sync.Mutex
	calls := 0
	_, err := Run(2, 1000, func(int) error {
		mu.Lock()
		calls++
		n := calls
		mu.Unlock()
		switch {
		case n == 10:
			return boom
		case n > 10:
			time.Sleep(time.Millisecond)
		}
		return nil
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err %v, want boom", err)
	}
	if calls >= 1000 {
		t.Fatalf("%d calls: the other caller went on with the calls left after the error at the 10th", calls)
	}
}

// TestRounds: every kind gets exactly n calls, the kinds alternating.
func TestRounds(t *testing.T) {
	for _, n := range []int{1, 5, 16, 17, 1000} {
		got := make([]int, 3)
		var order []int
		Rounds(n, 3, func(kind, calls int) {
			got[kind] += calls
			order = append(order, kind)
		})
		for kind, c := range got {
			if c != n {
				t.Fatalf("n=%d: kind %d got %d calls, want %d", n, kind, c, n)
			}
		}
		for i, kind := range order {
			if kind != i%3 {
				t.Fatalf("n=%d: the kinds run in order %v, want them alternating", n, order)
			}
		}
		if len(order) != 3*min(n, maxRounds) {
			t.Fatalf("n=%d: %d runs, want %d", n, len(order), 3*min(n, maxRounds))
		}
	}
}
