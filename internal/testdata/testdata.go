// Package testdata locates the shared conformance vectors (JSON-Schema-Test-
// Suite, RFC 8785, Ed25519, eddsa-jcs-2022) that live beside the repository
// in ../shared/testdata rather than inside it.
//
// Tests call Dir, which skips the test with a clear message when the folder
// is absent (a bare clone), so a missing folder never looks like a pass of
// the vectors it holds.
package testdata

import (
	"os"
	"path/filepath"
	"testing"
)

// EnvVar overrides where the vectors are looked for.
const EnvVar = "AOV_TESTDATA"

// Dir returns the shared testdata folder (or sub, below it), skipping t when
// it does not exist.
func Dir(t testing.TB, sub ...string) string {
	t.Helper()
	base := os.Getenv(EnvVar)
	if base == "" {
		root, err := repoRoot()
		if err != nil {
			t.Skipf("shared test vectors not found: %v (set %s)", err, EnvVar)
		}
		base = filepath.Join(root, "..", "shared", "testdata")
	}
	dir := filepath.Join(append([]string{base}, sub...)...)
	if _, err := os.Stat(dir); err != nil {
		t.Skipf("shared test vectors not found at %s: this checkout has no ../shared/testdata beside it (set %s to point at a copy)", dir, EnvVar)
	}
	return dir
}

// repoRoot walks up from the working directory to the folder with go.mod.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", os.ErrNotExist
		}
		dir = parent
	}
}
