package store

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"
)

func TestClaims(t *testing.T) {
	ctx := context.Background()

	t.Run("claims survive a restart", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "db")
		db, err := Open(dir, Options{})
		if err != nil {
			t.Fatal(err)
		}
		db.Claims().Claim(ctx, []string{"persist"}, time.Now().Add(time.Hour))
		db.Close()
		db, err = Open(dir, Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if _, err := db.Claims().Claim(ctx, []string{"persist"}, time.Now().Add(time.Hour)); !errors.Is(err, ErrClaimed) {
			t.Fatalf("after restart: %v, want ErrClaimed", err)
		}
	})
}
