// Package callers runs a benchmark's calls from a number of concurrent
// callers, as a service's clients make them: each caller takes the next
// call until n are made. The benchmarks that set one kind of call against
// another in alternating rounds (the store's durable against its no-sync
// writes, verifierd's request against its verification core) share it.
package callers

import (
	"sync"
	"sync/atomic"
	"time"
)

// Run makes n calls of call from clients goroutines (each passing its own
// number, 0 to clients-1) and returns the wall time they took, or the
// first error a call returned (the callers stop at their next call).
func Run(clients, n int, call func(client int) error) (time.Duration, error) {
	var left atomic.Int64
	left.Store(int64(n))
	var wg sync.WaitGroup
	var failed atomic.Value
	start := time.Now()
	for client := range clients {
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				if err := call(client); err != nil {
					failed.CompareAndSwap(nil, err)
					left.Store(0)
					return
				}
			}
		})
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// maxRounds is how many rounds Rounds splits a benchmark into.
const maxRounds = 16

// Rounds splits n calls of each of kinds kinds of call into at most 16
// rounds, and in each round calls run(kind, calls) for every kind in turn.
// Kinds set against each other so share the machine as it changes while the
// benchmark runs (the other work of a shared machine, the state each kind
// builds up), instead of each running in a different moment of it.
func Rounds(n, kinds int, run func(kind, calls int)) {
	rounds := min(n, maxRounds)
	for round := range rounds {
		calls := n / rounds
		if round == rounds-1 {
			calls = n - calls*(rounds-1)
		}
		for kind := range kinds {
			run(kind, calls)
		}
	}
}
