package caddymodule

import (
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files")

// caddyStorage is the storage folder of every Caddy the tests load.
var caddyStorage string

func TestMain(m *testing.M) {
	// Caddy keeps its data and config under XDG folders; keep tests out of
	// the user's.
	dir, err := os.MkdirTemp("", "caddymodule-test")
	if err != nil {
		panic(err)
	}
	os.Setenv("XDG_DATA_HOME", dir)
	os.Setenv("XDG_CONFIG_HOME", dir)
	caddyStorage = filepath.Join(dir, "storage")
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
