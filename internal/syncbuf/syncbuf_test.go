package syncbuf

import (
	"strings"
	"sync"
	"testing"
)

// TestConcurrentWritesAndReadsKeepEveryByte runs writers and a reader at
// once (go test -race checks the locking) and finds every write whole.
func TestConcurrentWritesAndReadsKeepEveryByte(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				if n, err := b.Write([]byte("ab")); n != 2 || err != nil {
					t.Errorf("Write = %d, %v", n, err)
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 50 {
			if s := b.String(); len(s)%2 != 0 {
				t.Errorf("read a torn write: %d bytes", len(s))
			}
		}
	}()
	wg.Wait()
	<-done
	if got := b.String(); got != strings.Repeat("ab", 800) {
		t.Fatalf("got %d bytes, want 1600 of \"ab\" repeated", len(got))
	}
}
