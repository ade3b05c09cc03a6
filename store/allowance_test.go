package store

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

func TestAllowance(t *testing.T) {
	ctx := context.Background()
	day := time.Now()

	t.Run("committed units survive a restart", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "db")
		db, err := Open(dir, Options{})
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			r, err := db.Allowance().Reserve(ctx, "p", "c", day, 5)
			if err != nil {
				t.Fatal(err)
			}
			db.Allowance().Commit(ctx, r)
		}
		db.Close()
		db, err = Open(dir, Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if rem, _ := db.Allowance().Remaining(ctx, "p", "c", day, 5); rem != 2 {
			t.Fatalf("after restart %d remaining, want 2", rem)
		}
	})
}
