package evmfacilitator

import (
	"errors"
	"fmt"
	"math/big"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"

	"github.com/aovhq/aov/x402"
)

// found is a search that finds a nonce's log, counting its runs.
func found(runs *atomic.Int64) func() (nonceUse, error) {
	return func() (nonceUse, error) {
		runs.Add(1)
		return nonceUse{log: &types.Log{Topics: []common.Hash{authorizationUsedEventID}}}, nil
	}
}

// TestUsedCacheStaysBoundedWhenNoncesRotate: a payer spending nonce after
// nonce, each then asked about, never grows the cache past usedCacheMax;
// the newest answers are the ones kept.
func TestUsedCacheStaysBoundedWhenNoncesRotate(t *testing.T) {
	var u usedCache
	var runs atomic.Int64
	at := time.Unix(1_700_000_000, 0)
	key := func(i int) usedKey {
		k := usedKey{token: common.HexToAddress("0x5FbDB2315678afecb367f032d93F642f64180aa3"), from: common.HexToAddress("0x90F79bf6EB2c4f870365E785982E1f101E93b906")}
		copy(k.nonce[:], fmt.Sprintf("%032d", i))
		return k
	}
	n := usedCacheMax + 500
	for i := 0; i < n; i++ {
		if _, err := u.lookup(key(i), at, found(&runs)); err != nil {
			t.Fatal(err)
		}
	}
	if l := len(u.m); l > usedCacheMax {
		t.Fatalf("%d nonces remembered after %d; want at most %d", l, n, usedCacheMax)
	}
	runs.Store(0)
	if _, err := u.lookup(key(n-1), at.Add(time.Second), found(&runs)); err != nil || runs.Load() != 0 {
		t.Fatalf("the newest nonce asked again: %d searches, %v; want it remembered", runs.Load(), err)
	}
}

// TestUsedCacheLookupSharesOneSearch: lookups of one nonce while its
// search runs wait for that search instead of starting their own; a
// finished "not found" is remembered (the zero nonceUse), a failed search
// is not.
func TestUsedCacheLookupSharesOneSearch(t *testing.T) {
	var u usedCache
	var runs atomic.Int64
	at := time.Unix(1_700_000_000, 0)
	k := usedKey{token: common.HexToAddress("0x01"), from: common.HexToAddress("0x02")}
	release := make(chan struct{})
	slow := func() (nonceUse, error) {
		runs.Add(1)
		<-release
		return nonceUse{}, fmt.Errorf("%w: not in blocks 1 to 2", errNoNonceLog)
	}
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if use, err := u.lookup(k, at, slow); err != nil || use.log != nil {
				t.Errorf("a lookup: %v, %v; want the shared not found", use.log, err)
			}
		}()
	}
	time.Sleep(200 * time.Millisecond) // the lookups reach the search in flight
	close(release)
	wg.Wait()
	if n := runs.Load(); n != 1 {
		t.Errorf("8 concurrent lookups ran %d searches; want 1", n)
	}
	if _, err := u.lookup(k, at.Add(time.Second), slow); err != nil || runs.Load() != 1 {
		t.Errorf("a later lookup: %d searches, %v; want the not found remembered", runs.Load(), err)
	}

	failing := func() (nonceUse, error) { runs.Add(1); return nonceUse{}, errors.New("provider down") }
	other := usedKey{token: k.token, from: common.HexToAddress("0x03")}
	runs.Store(0)
	for i := 0; i < 2; i++ {
		if _, err := u.lookup(other, at, failing); err == nil {
			t.Fatal("a failed search answered")
		}
	}
	if n := runs.Load(); n != 2 {
		t.Errorf("two lookups after a failed search ran %d searches; want 2 (a failure is not remembered)", n)
	}
}

// TestValidityCacheIsBoundedPerNonceAndInAll: what searches of validity
// windows learn is kept in one entry per nonce, whatever the number of
// windows its payer signs: at most maxSpans runs of blocks searched and
// maxCutWindows windows cut short, the most recent; nonces rotating never
// grow the cache past usedCacheMax; and a window within the blocks
// searched is answered without a search.
func TestValidityCacheIsBoundedPerNonceAndInAll(t *testing.T) {
	var c validityCache
	at := time.Unix(1_700_000_000, 0)
	k := usedKey{token: common.HexToAddress("0x5FbDB2315678afecb367f032d93F642f64180aa3"), from: common.HexToAddress("0x90F79bf6EB2c4f870365E785982E1f101E93b906")}
	window := func(after, before uint64) x402.AuthorizationValues {
		return x402.AuthorizationValues{ValidAfter: new(big.Int).SetUint64(after), ValidBefore: new(big.Int).SetUint64(before)}
	}
	var runs atomic.Int64
	// search is a search that covers a's window, blocks numbered as
	// their times, and does not find the nonce's log, or, cut, is cut short.
	search := func(a x402.AuthorizationValues, cut bool) func([]span) (nonceUse, []span, error) {
		return func([]span) (nonceUse, []span, error) {
			runs.Add(1)
			from, to := windowTimes(a)
			s := []span{{from: from, to: to, lo: from, hi: to - 1}}
			if cut {
				return nonceUse{}, s[:0], errSearchCut
			}
			return nonceUse{}, s, errNoNonceLog
		}
	}
	for i := range uint64(3 * maxSpans) {
		a := window(100*i, 100*i+50) // disjoint windows
		if use, err := c.lookup(k, a, at, search(a, false)); err != nil || use.log != nil {
			t.Fatalf("window %d: %v, %v; want not found", i, use.log, err)
		}
		a = window(100*i, 100*i+60+i)
		if _, err := c.lookup(k, a, at, search(a, true)); !errors.Is(err, errSearchCut) {
			t.Fatalf("cut window %d: %v", i, err)
		}
		at = at.Add(time.Millisecond)
	}
	e := c.m[k]
	if len(c.m) != 1 || len(e.searched) != maxSpans || len(e.cut) != maxCutWindows {
		t.Fatalf("%d entries, %d spans, %d cut windows; want 1, %d, %d", len(c.m), len(e.searched), len(e.cut), maxSpans, maxCutWindows)
	}
	last := uint64(3*maxSpans - 1)
	runs.Store(0)
	a := window(100*last+10, 100*last+40)
	if use, err := c.lookup(k, a, at, search(a, false)); err != nil || use.log != nil || runs.Load() != 0 {
		t.Errorf("a window within the last searched: %v, %v, %d searches; want not found, none", use.log, err, runs.Load())
	}
	a = window(100*last, 100*last+60+last)
	if _, err := c.lookup(k, a, at, search(a, true)); !errors.Is(err, errSearchCut) || runs.Load() != 0 {
		t.Errorf("the last window cut again: %v, %d searches; want the cut remembered, none", err, runs.Load())
	}
	for i := range usedCacheMax + 100 {
		k := k
		copy(k.nonce[:], fmt.Sprintf("%032d", i))
		a := window(0, 50)
		if _, err := c.lookup(k, a, at, search(a, false)); err != nil {
			t.Fatal(err)
		}
	}
	if len(c.m) > usedCacheMax {
		t.Errorf("%d nonces kept; want at most %d", len(c.m), usedCacheMax)
	}
}
