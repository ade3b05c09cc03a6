package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/servers"
)

// TestDaemonOnFullDisk: the disk holding -data fills while verifierd
// serves. A verification that cannot be recorded is a 503 with
// Retry-After in the error shape, the process lives and serves reads,
// /health fails (gateways send the work elsewhere), and records are taken
// again once space is freed, without a restart. (Badger
// writes through memory maps: before the store kept a reserve free, the
// first write on a full disk was a SIGBUS that killed the process.)
func TestDaemonOnFullDisk(t *testing.T) {
	servers.InChildOnTmpfs(t, "256m", daemonOnFullDisk)
}

func daemonOnFullDisk(t *testing.T, root string) {
	sock := startCertd(t, shortDir(t))
	d := startDaemon(t, "-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0",
		"-data", filepath.Join(root, "data"), "-signer-socket", sock, "-public-base-url", "http://127.0.0.1:1")
	get := func(path string) (int, http.Header, []byte) {
		t.Helper()
		resp, err := http.Get("http://" + d.api + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, b
	}
	verify := func() (int, http.Header, []byte) {
		t.Helper()
		resp, err := http.Post("http://"+d.api+"/verify/schema", "application/json", strings.NewReader(passingRequest))
		if err != nil {
			t.Fatalf("verifierd stopped answering: %v", err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, b
	}
	if code, _, b := verify(); code != 200 {
		t.Fatalf("verification before the disk filled: %d %s", code, b)
	}
	filler := filepath.Join(root, "filler")
	servers.FillLeaving(t, filler, 2<<20)
	time.Sleep(200 * time.Millisecond) // the store reads the free space again
	code, h, b := verify()
	for i := 0; code == 200 && i < 5000; i++ {
		code, h, b = verify()
	}
	var e struct {
		Code      string `json:"code"`
		Retryable bool   `json:"retryable"`
	}
	if code != 503 || h.Get("Retry-After") == "" || json.Unmarshal(b, &e) != nil || !e.Retryable {
		t.Fatalf("verification on a full disk: %d Retry-After=%q %s; want 503, retryable, with Retry-After", code, h.Get("Retry-After"), b)
	}
	if strings.Contains(string(b), root) {
		t.Fatalf("the answer names the data directory: %s", b)
	}
	if code, _, b := get("/reputation/seller-7"); code != 200 {
		t.Fatalf("read while the disk is full: %d %s", code, b)
	}
	// A verifierd that cannot record is taken out of the gateways' rotation.
	if code, h, b := get("/health"); code != 503 || h.Get("Retry-After") == "" {
		t.Fatalf("/health while the disk is full: %d %s", code, b)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if code, _, b := get("/health"); code != 200 {
		t.Fatalf("/health once space was freed: %d %s", code, b)
	}
	if code, _, b := verify(); code != 200 {
		t.Fatalf("verification once space was freed: %d %s", code, b)
	}
}
