// Package testdata locates the conformance vectors (JSON-Schema-Test-Suite,
// RFC 8785, Ed25519, eddsa-jcs-2022) kept in the repository's top-level
// testdata/ folder, and the contract document (SPEC.md) whose test vectors
// the tests read.
//
// A missing data set fails the test that needs it: a skipped conformance
// test would let `go test` report ok for vectors that never ran.
package testdata

import (
	"os"
	"path/filepath"
	"testing"
)

// Dir returns the repository's testdata folder (or sub, below it), failing
// t when it does not exist.
func Dir(t testing.TB, sub ...string) string {
	t.Helper()
	dir := filepath.Join(append([]string{Root(t), "testdata"}, sub...)...)
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("conformance data missing: %v (testdata/README.md lists each data set and its source)", err)
	}
	return dir
}

// Root returns the repository's root folder (the one holding go.mod),
// failing t when there is none above the working directory.
func Root(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the working directory: not inside the repository")
		}
		dir = parent
	}
}
