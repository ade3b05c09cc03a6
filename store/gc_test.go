package store

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// valueLogBytes is the size of the value-log files in dir.
func valueLogBytes(t *testing.T, dir string) int64 {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "*.vlog"))
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, f := range m {
		if fi, err := os.Stat(f); err == nil {
			n += fi.Size()
		}
	}
	return n
}

// TestValueLogGCReclaimsSpace: saved answers of 1 MiB and more go to
// Badger's value log, whose space nothing gave back: every large paid
// answer stayed on disk after it expired, until the disk was full. The
// store's value-log GC rewrites files that hold mostly garbage and
// deletes them, on its own, while the store runs, and stops on Close.
func TestValueLogGCReclaimsSpace(t *testing.T) {
	ctx := context.Background()
	db, dir := openTemp(t, Options{NoSync: true, memTableSize: 8 << 20, valueLogFileSize: 4 << 20, gcInterval: 50 * time.Millisecond})
	answer := make([]byte, 3<<19) // 1.5 MiB: two a value-log file
	const answers = 40
	for i := range answers {
		if err := db.PaymentIDs().Save(ctx, fmt.Sprintf("id-%d", i), "fp", answer, time.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	written := valueLogBytes(t, dir)
	// Deleted, as Badger treats them once expired: Badger drops an
	// answer an hour after its expiry, which a test cannot wait for.
	if err := db.update(ctx, func(txn *tx) error {
		for i := range answers {
			if err := txn.Delete(paymentIDKey(fmt.Sprintf("id-%d", i))); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Other writes go on: Badger's compactions, which find the garbage,
	// run as its tables fill. The bound is a number of writes, not a
	// time, so a busy machine makes the test slower, never failed:
	// about 250,000 are enough on a quiet one.
	until := time.Now().Add(time.Hour)
	const otherWrites = 3_000_000
	var left int64
	for i := range otherWrites {
		if _, err := db.Claims().Claim(ctx, []string{fmt.Sprintf("payment-%07d-%0200d", i, i)}, until); err != nil {
			t.Fatal(err)
		}
		if i%1000 == 0 {
			if left = valueLogBytes(t, dir); left < written/4 {
				t.Logf("value logs: %d MiB written, %d MiB left after %d other writes", written>>20, left>>20, i)
				if err := db.Close(); err != nil {
					t.Fatal(err)
				}
				select {
				case <-db.life.gcDone:
				default:
					t.Fatal("the value-log GC runs on after Close")
				}
				return
			}
		}
	}
	t.Fatalf("value logs hold %d MiB of the %d MiB of answers deleted after %d other writes: never reclaimed", left>>20, written>>20, otherWrites)
}
