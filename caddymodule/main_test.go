package caddymodule

import (
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files")

var (
	// testDir holds everything the test binary writes outside a test's own
	// t.TempDir: Caddy's XDG folders and the commands built once. It is
	// removed when the tests end, so runs leave nothing behind.
	testDir string
	// caddyStorage is the storage folder of every Caddy the tests load.
	caddyStorage string
	// trustedCert and trustedKey are the files of a certificate for
	// 127.0.0.1 that every TLS client of the test binary verifying with
	// the system's roots trusts (SSL_CERT_FILE names it): a gate's remote
	// facilitator reached over HTTPS, with its default transport.
	trustedCert, trustedKey string
)

func TestMain(m *testing.M) {
	// Caddy keeps its data and config under XDG folders; keep tests out of
	// the user's.
	var err error
	testDir, err = os.MkdirTemp("", "caddymodule-test")
	if err != nil {
		panic(err)
	}
	os.Setenv("XDG_DATA_HOME", testDir)
	os.Setenv("XDG_CONFIG_HOME", testDir)
	caddyStorage = filepath.Join(testDir, "storage")
	// Set before any TLS client reads the system's roots: they are read
	// once per process.
	if trustedCert, trustedKey, err = writeLoopbackCert(testDir); err != nil {
		panic(err)
	}
	os.Setenv("SSL_CERT_FILE", trustedCert)
	code := m.Run()
	os.RemoveAll(testDir)
	os.Exit(code)
}
