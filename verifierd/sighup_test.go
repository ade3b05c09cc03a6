package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aovhq/aov/keystore"
	"github.com/aovhq/aov/receipt"
)

// process is a verifierd binary running, with the JSON lines of its log.
type process struct {
	cmd  *exec.Cmd
	api  string
	mu   sync.Mutex
	log  []map[string]any
	done chan error
}

// startProcess builds verifierd and runs it with args until the test ends.
func startProcess(t *testing.T, dir string, args ...string) *process {
	t.Helper()
	bin := filepath.Join(dir, "verifierd")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	p := &process{cmd: exec.Command(bin, args...), done: make(chan error, 1)}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var line map[string]any
			if json.Unmarshal(sc.Bytes(), &line) == nil {
				p.mu.Lock()
				p.log = append(p.log, line)
				p.mu.Unlock()
			}
		}
		p.done <- p.cmd.Wait()
	}()
	t.Cleanup(func() { p.cmd.Process.Kill(); <-p.done })
	line := p.waitLog(t, "verifierd listening")
	p.api, _ = line["addr"].(string)
	return p
}

// waitLog waits for the first log line whose msg is msg, failing the test
// if verifierd exits first.
func (p *process) waitLog(t *testing.T, msg string) map[string]any {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		p.mu.Lock()
		for _, line := range p.log {
			if line["msg"] == msg {
				p.mu.Unlock()
				return line
			}
		}
		p.mu.Unlock()
		select {
		case err := <-p.done:
			p.done <- err
			t.Fatalf("verifierd exited (%v) before logging %q", err, msg)
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("verifierd did not log %q", msg)
	return nil
}

// verification posts a passing verification to the verifierd at api and
// returns the receipt.
func verification(t *testing.T, api string) []byte {
	t.Helper()
	resp, err := http.Post("http://"+api+"/verify/schema", "application/json", strings.NewReader(passingRequest))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("verification: %d %s", resp.StatusCode, body)
	}
	return body
}

// SIGHUP never stops verifierd: with -signer-keys it reloads the key
// directory at once, as certd does (the keystore's advice after the clock
// went back behind a retirement names it), and logs the key in service;
// with certd as the signer there is nothing to reload, and it says so.
// Either way it goes on serving, and SIGTERM still stops it cleanly.
// (Before: SIGHUP killed verifierd at once, cutting requests in flight.)
func TestSIGHUPReloadsTheKeysAndNeverStopsVerifierd(t *testing.T) {
	dir := shortDir(t)
	keysDir, certd := keysWithOne(t, dir)
	common := []string{"-listen", "127.0.0.1:0", "-admin-listen", "", "-no-sync", "-public-base-url", "http://127.0.0.1:1"}

	for _, c := range []struct {
		desc, msg string
		args      []string
	}{
		{"in process", "keys reloaded on SIGHUP", []string{"-data", filepath.Join(dir, "data1"), "-signer-keys", keysDir, "-signer-socket", filepath.Join(dir, "nobody.sock")}},
		{"over certd's socket", "SIGHUP: nothing to reload, certd holds the keys", []string{"-data", filepath.Join(dir, "data2"), "-signer-socket", startCertd(t, shortDir(t))}},
	} {
		t.Run(c.desc, func(t *testing.T) {
			p := startProcess(t, dir, append(common, c.args...)...)
			if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
				t.Fatal(err)
			}
			line := p.waitLog(t, c.msg)
			if c.desc == "in process" && (line["current_key_version"] != "k1" || line["key_versions"] != 1.0) {
				t.Errorf("reload logged %v; want the current key k1 of 1 version", line)
			}
			body := verification(t, p.api)
			if c.desc == "in process" {
				k1, _ := certd.Lookup("k1")
				if _, err := receipt.Verify(body, receipt.SingleKey("k1", k1.Public), receipt.ContextVerify); err != nil {
					t.Fatalf("receipt after SIGHUP: %v", err)
				}
			}
			p.stop(t)
		})
	}

	// A key directory that no longer loads stops signing (503, retryable)
	// but not verifierd, as with certd.
	t.Run("a key directory that does not load", func(t *testing.T) {
		brokenDir := filepath.Join(dir, "keys2")
		ks, err := keystore.Open(brokenDir, keystore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ks.Generate(); err != nil {
			t.Fatal(err)
		}
		p := startProcess(t, dir, append(common, "-data", filepath.Join(dir, "data3"), "-signer-keys", brokenDir)...)
		if err := os.WriteFile(filepath.Join(brokenDir, keystore.IndexFile), []byte("{not json"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		line := p.waitLog(t, "reloading keys on SIGHUP failed; not signing until the key directory loads")
		if e, _ := line["error"].(string); !strings.Contains(e, "index") {
			t.Errorf("reload failure logged %v; want the index's error", line)
		}
		resp, err := http.Post("http://"+p.api+"/verify/schema", "application/json", strings.NewReader(passingRequest))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("verification with the key directory broken: %d, want 503", resp.StatusCode)
		}
		p.stop(t)
	})
}

// stop sends SIGTERM and expects a clean exit.
func (p *process) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		p.done <- err
		if err != nil {
			t.Fatalf("after SIGTERM verifierd exited with %v; want a clean stop", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("verifierd did not stop on SIGTERM")
	}
}
