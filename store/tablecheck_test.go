package store

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/servers"
	"github.com/dgraph-io/badger/v4/table"
)

// TestOpenRefusesATruncatedTable: a table file cut short (a disk error,
// an interrupted copy) made Badger panic in a goroutine of its own while
// opening the store (it reads a table's footer without checking it
// against the file's size), killing the process with a stack trace. Open
// refuses such a store with an error naming the directory and the
// restore; a table the manifest does not list (a compaction's output cut
// short by a crash, which Badger deletes) does not stop it.
func TestOpenRefusesATruncatedTable(t *testing.T) {
	if dir := os.Getenv("STORE_TABLECHECK_DIR"); dir != "" {
		db, err := Open(dir, Options{})
		if err == nil {
			db.Close()
			t.Fatal("Open succeeded on a store with a truncated table")
		}
		if !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "backup") {
			t.Fatalf("Open's error %q should name the directory and say how to restore", err)
		}
		return
	}
	prepare := func(t *testing.T) string {
		dir := filepath.Join(t.TempDir(), "db")
		db, err := Open(dir, Options{})
		if err != nil {
			t.Fatal(err)
		}
		until := time.Now().Add(time.Hour)
		for i := range 3000 {
			if _, err := db.Claims().Claim(context.Background(), []string{fmt.Sprintf("k-%d", i)}, until); err != nil {
				t.Fatal(err)
			}
		}
		if err := db.Close(); err != nil { // the memtable becomes a table
			t.Fatal(err)
		}
		return dir
	}
	t.Run("listed table truncated", func(t *testing.T) {
		dir := prepare(t)
		m, _ := filepath.Glob(filepath.Join(dir, "*.sst"))
		if len(m) == 0 {
			t.Fatal("no table written")
		}
		fi, err := os.Stat(m[0])
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(m[0], fi.Size()/2); err != nil {
			t.Fatal(err)
		}
		if out, err := servers.InChild(t, "TestOpenRefusesATruncatedTable", "STORE_TABLECHECK_DIR="+dir); err != nil {
			t.Fatalf("Open of a store with a truncated table (%v):\n%s", err, out)
		}
	})
	t.Run("unlisted table truncated", func(t *testing.T) {
		dir := prepare(t)
		if err := os.WriteFile(table.NewFilename(999, dir), []byte("cut short"), 0o600); err != nil {
			t.Fatal(err)
		}
		db, err := Open(dir, Options{})
		if err != nil {
			t.Fatalf("a table the manifest does not list stopped Open: %v", err)
		}
		db.Close()
	})
}
