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
)

// Dir returns the interop folder, skipping (or, under CI, failing) t when
// node or the installed npm peers are missing.
func Dir(t testing.TB) string {
	t.Helper()
	dir, err := findDir()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@x402", "core")); err != nil {
		missing(t, "npm peers not installed: run `npm ci` in interop/ (make test does) to run the real-peer tests")
	}
	if _, err := exec.LookPath("node"); err != nil {
		missing(t, "node is not on PATH; the real-peer tests need Node 20")
	}
	return dir
}

func missing(t testing.TB, msg string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
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
// closing its stdin (the scripts exit on that) and then killing it.
func Start(t testing.TB, script string, env []string, ready any) {
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
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
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
			t.Fatalf("node %s printed %q: %v\n%s", script, b, err, stderr.String())
		}
	case <-time.After(time.Minute):
		t.Fatalf("node %s did not start\n%s", script, stderr.String())
	}
}
