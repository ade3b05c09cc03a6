package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/keystore"
	"github.com/aovhq/aov/receipt"
	"github.com/aovhq/aov/signer"
)

// certdBin is the certd binary built once for the end-to-end tests.
var (
	buildOnce sync.Once
	certdBin  string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if certdBin != "" {
		os.RemoveAll(filepath.Dir(certdBin))
	}
	os.Exit(code)
}

func binary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end: builds and runs the certd binary")
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "certd-bin")
		if err != nil {
			buildErr = err
			return
		}
		certdBin = filepath.Join(dir, "certd")
		out, err := exec.Command("go", "build", "-o", certdBin, ".").CombinedOutput()
		if err != nil {
			buildErr = errors.New(string(out))
		}
	})
	if buildErr != nil {
		t.Fatalf("building certd: %v", buildErr)
	}
	return certdBin
}

// shortDir is a temp dir with a path short enough for a unix socket.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "cd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// daemon is a running `certd serve`.
type daemon struct {
	cmd        *exec.Cmd
	publicAddr string
	signAddr   string
	done       chan error

	mu   sync.Mutex
	logs []map[string]any
}

func (d *daemon) sawLog(msg string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, l := range d.logs {
		if l["msg"] == msg {
			return true
		}
	}
	return false
}

// startServe runs certd serve and waits for its ready line.
func startServe(t *testing.T, args ...string) *daemon {
	t.Helper()
	cmd := exec.Command(binary(t), append([]string{"serve"}, args...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &daemon{cmd: cmd, done: make(chan error, 1)}
	ready := make(chan map[string]any, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) != nil {
				t.Logf("certd (not JSON): %s", sc.Text())
				continue
			}
			d.mu.Lock()
			d.logs = append(d.logs, m)
			d.mu.Unlock()
			if m["msg"] == "certd ready" {
				ready <- m
			}
		}
		d.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
		}
	})
	select {
	case m := <-ready:
		d.publicAddr, _ = m["public_addr"].(string)
		d.signAddr, _ = m["sign_addr"].(string)
		if m["level"] != "INFO" || m["time"] == nil {
			t.Fatalf("ready line is not a structured slog record: %v", m)
		}
	case err := <-d.done:
		t.Fatalf("certd serve exited before ready: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("certd serve did not become ready in 30 s")
	}
	return d
}

// stop sends sig and waits for a clean exit.
func (d *daemon) stop(t *testing.T, sig os.Signal) {
	t.Helper()
	if err := d.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-d.done:
		if err != nil {
			t.Fatalf("certd exited with %v after %v", err, sig)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("certd did not stop within 15 s of %v", sig)
	}
}

// certd runs a one-shot subcommand and returns its stdout, stderr and code.
func certd(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(binary(t), args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

func fetchCard(t *testing.T, addr string) ([]byte, http.Header) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/.well-known/agent-card.json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("agent card: %d %s", resp.StatusCode, body)
	}
	return body, resp.Header
}

// signedResponse builds a verification-shaped response naming kv, has certd
// sign it over c, and returns the full response with its attestation.
func signedResponse(t *testing.T, c *signer.Client, kv string) ([]byte, error) {
	t.Helper()
	at := time.Now().UTC().Format("2006-01-02T15:04:05.000000+00:00")
	doc := map[string]any{
		"result": "pass", "verification_id": "0b7f6c1e-3d1a-4f43-9a55-0d3b0c8f1a22", "task_id": "e2e",
		"agent_id": "test-e2e", "output_hash": strings.Repeat("0", 64), "schema_hash": strings.Repeat("1", 64),
		"rules_hash": strings.Repeat("2", 64), "verified_at": at,
		"verify": map[string]any{"public_key_url": "http://localhost:9999/.well-known/agent-card.json", "key_version": kv,
			"canonicalization": receipt.Canonicalization, "hash_algorithm": receipt.HashAlgorithm, "service": "aov-e2e", "mcp": "http://localhost:9999/mcp"},
	}
	body, _ := json.Marshal(doc)
	att, err := c.Sign(context.Background(), receipt.ContextVerify, kv, at, body)
	if err != nil {
		return nil, err
	}
	doc["attestation"] = att
	full, _ := json.Marshal(doc)
	return full, nil
}

func TestEndToEndSignRotateCompromise(t *testing.T) {
	keys := filepath.Join(shortDir(t), "keys")
	sock := filepath.Join(shortDir(t), "certd.sock")
	d := startServe(t, "-dev", "-keys", keys, "-sign-socket", sock, "-public-listen", "127.0.0.1:0",
		"-public-base-url", "http://localhost:9999/", "-service-name", "aov-e2e")
	if !d.sawLog("generated a development signing key; for production create keys with `certd rotate` and keep the key directory private") {
		t.Error("dev mode did not log that it generated a key")
	}
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("signing socket: %v, mode %v; want 0600", err, fi.Mode())
	}

	// The card: k1 current; health answers.
	card1, hdr1 := fetchCard(t, d.publicAddr)
	if !strings.HasPrefix(hdr1.Get("Cache-Control"), "public, max-age=") || hdr1.Get("ETag") == "" {
		t.Errorf("card headers: Cache-Control %q, ETag %q", hdr1.Get("Cache-Control"), hdr1.Get("ETag"))
	}
	set1, err := receipt.KeysFromCard(card1)
	if err != nil || set1.Current() != "k1" {
		t.Fatalf("card 1: current %q, %v", set1.Current(), err)
	}
	var cardDoc map[string]any
	json.Unmarshal(card1, &cardDoc)
	if cardDoc["name"] != "aov-e2e" || cardDoc["url"] != "http://localhost:9999" {
		t.Errorf("card name/url = %v / %v", cardDoc["name"], cardDoc["url"])
	}
	if resp, err := http.Get("http://" + d.publicAddr + "/health"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("public /health: %v %v", resp, err)
	}
	// The public endpoint never exposes signing.
	if resp, err := http.Post("http://"+d.publicAddr+"/v1/sign", "application/json", strings.NewReader(`{}`)); err != nil || resp.StatusCode != 404 {
		t.Fatalf("public /v1/sign: %v %v; want 404", resp, err)
	}

	// Sign over the socket; the receipt verifies against the card.
	c := signer.NewClient(signer.ClientConfig{Socket: sock})
	kv, err := c.CurrentKey(context.Background())
	if err != nil || kv != "k1" {
		t.Fatalf("CurrentKey = %q, %v", kv, err)
	}
	old, err := signedResponse(t, c, kv)
	if err != nil {
		t.Fatal(err)
	}
	if err := receipt.VerifyReceipt(old, set1, ""); err != nil {
		t.Fatalf("receipt of k1 against card 1: %v", err)
	}
	time.Sleep(5 * time.Millisecond)
	afterOld := time.Now().UTC()

	// Rotate while serving.
	out, errOut, code := certd(t, "rotate", "-keys", keys)
	if code != 0 || !strings.Contains(out, "k2 is now the current signing key") {
		t.Fatalf("certd rotate: %d %q %q", code, out, errOut)
	}
	card2, hdr2 := fetchCard(t, d.publicAddr)
	if hdr2.Get("ETag") == hdr1.Get("ETag") {
		t.Error("the card's ETag did not change with the rotation")
	}
	set2, err := receipt.KeysFromCard(card2)
	if err != nil || set2.Current() != "k2" || !slices.Equal(set2.Versions(), []string{"k1", "k2"}) {
		t.Fatalf("card 2: current %q, versions %v, %v", set2.Current(), set2.Versions(), err)
	}
	if err := receipt.VerifyReceipt(old, set2, ""); err != nil {
		t.Fatalf("the k1 receipt no longer verifies after rotation: %v", err)
	}
	// The client's cached k1 is stale: it learns k2 and signs with it.
	_, err = signedResponse(t, c, "k1")
	var stale *signer.StaleKeyError
	if !errors.As(err, &stale) || stale.Current != "k2" {
		t.Fatalf("signing with k1 after rotation: %v, want stale with k2", err)
	}
	kv, _ = c.CurrentKey(context.Background())
	fresh, err := signedResponse(t, c, kv)
	if err != nil {
		t.Fatal(err)
	}
	var freshDoc struct {
		Attestation receipt.Attestation `json:"attestation"`
	}
	json.Unmarshal(fresh, &freshDoc)
	if freshDoc.Attestation.KeyVersion != "k2" {
		t.Fatalf("new signature carries %q, want k2", freshDoc.Attestation.KeyVersion)
	}
	if err := receipt.VerifyReceipt(fresh, set2, ""); err != nil {
		t.Fatalf("k2 receipt against card 2: %v", err)
	}
	if err := receipt.VerifyReceipt(fresh, set1, ""); err == nil {
		t.Fatal("a k2 receipt verified against a card that predates k2")
	}

	// Mark k1 compromised from after the old receipt: the card says so and
	// the old receipt, signed before, still holds.
	out, errOut, code = certd(t, "compromise", "-keys", keys, "-version", "k1", "-since", afterOld.Format(time.RFC3339Nano))
	if code != 0 || !strings.Contains(out, "k1 is marked compromised") {
		t.Fatalf("certd compromise: %d %q %q", code, out, errOut)
	}
	card3, _ := fetchCard(t, d.publicAddr)
	if !bytes.Contains(card3, []byte(`"keyVersion":"k1","algorithm":"Ed25519"`)) || !bytes.Contains(card3, []byte(`"status":"compromised"`)) {
		t.Fatal("card 3 does not show k1 as compromised")
	}
	set3, err := receipt.KeysFromCard(card3)
	if err != nil {
		t.Fatal(err)
	}
	if err := receipt.VerifyReceipt(old, set3, ""); err != nil {
		t.Fatalf("the k1 receipt from before the compromise: %v", err)
	}

	// keys lists both versions.
	out, _, code = certd(t, "keys", "-keys", keys, "-json")
	var rows []keyRow
	if code != 0 || json.Unmarshal([]byte(out), &rows) != nil || len(rows) != 2 || rows[0].Status != "compromised" || rows[1].Status != "current" {
		t.Fatalf("certd keys -json: %d %s", code, out)
	}

	// SIGHUP reloads without stopping; SIGTERM stops cleanly and removes
	// the socket.
	if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !d.sawLog("keys reloaded on SIGHUP") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if !d.sawLog("keys reloaded on SIGHUP") {
		t.Error("SIGHUP did not reload the keys")
	}
	if err := c.Ping(context.Background()); err != nil {
		t.Fatalf("Ping after SIGHUP: %v", err)
	}
	d.stop(t, syscall.SIGTERM)
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("the socket is still there after shutdown: %v", err)
	}
	if !d.sawLog("stopped") {
		t.Error("no log line for the clean stop")
	}
}

// TestCompromiseIsRecordedWhenItsNewKeyIsRefused: `certd compromise` of
// the current key while a key file the index does not name is in the way
// still marks and retires the key (the card says so at once) and a running
// certd stops signing with it; the command fails saying the mark is
// recorded and how to make the new key, and `certd rotate`, once the file
// is moved out, does.
func TestCompromiseIsRecordedWhenItsNewKeyIsRefused(t *testing.T) {
	keys := filepath.Join(shortDir(t), "keys")
	if out, errOut, code := certd(t, "rotate", "-keys", keys); code != 0 {
		t.Fatalf("rotate: %s %s", out, errOut)
	}
	sock := filepath.Join(shortDir(t), "certd.sock")
	d := startServe(t, "-keys", keys, "-sign-socket", sock, "-public-listen", "127.0.0.1:0")
	c := signer.NewClient(signer.ClientConfig{Socket: sock})
	if kv, err := c.CurrentKey(context.Background()); err != nil || kv != "k1" {
		t.Fatalf("CurrentKey = %q, %v", kv, err)
	}
	stray := filepath.Join(keys, "k2.key")
	if err := os.WriteFile(stray, []byte("a key of a k2 the index does not name"), 0o600); err != nil {
		t.Fatal(err)
	}

	out, errOut, code := certd(t, "compromise", "-keys", keys, "-version", "k1", "-since", time.Now().Add(-time.Minute).UTC().Format(time.RFC3339))
	if code != 1 {
		t.Fatalf("certd compromise with its new key refused: exit %d, stdout %q, stderr %q; want exit 1", code, out, errOut)
	}
	for _, want := range []string{"k1 IS marked compromised", "k2.key", "`certd rotate`"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr %q does not mention %q", errOut, want)
		}
	}
	out, _, code = certd(t, "keys", "-keys", keys, "-json")
	var rows []keyRow
	if code != 0 || json.Unmarshal([]byte(out), &rows) != nil || len(rows) != 1 || rows[0].Status != "compromised" || rows[0].RetiredAt == "" {
		t.Fatalf("certd keys -json after the compromise: %d %s", code, out)
	}
	if card, _ := fetchCard(t, d.publicAddr); !bytes.Contains(card, []byte(`"status":"compromised"`)) {
		t.Errorf("the card does not show k1 as compromised: %s", card)
	}
	if _, err := signedResponse(t, c, "k1"); err == nil {
		t.Fatal("certd still signs with the compromised k1")
	}
	if err := c.Ping(context.Background()); err == nil {
		t.Fatal("certd reports a signing key while none is current")
	}

	if err := os.Remove(stray); err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := certd(t, "rotate", "-keys", keys); code != 0 || !strings.Contains(out, "k2 is now the current signing key") {
		t.Fatalf("rotate once the file is moved out: %d %q %q", code, out, errOut)
	}
	if _, err := signedResponse(t, c, "k2"); err != nil {
		t.Fatalf("signing with k2 after the rotation: %v", err)
	}
	card, _ := fetchCard(t, d.publicAddr)
	if set, err := receipt.KeysFromCard(card); err != nil || set.Current() != "k2" {
		t.Fatalf("card after the rotation: current %q, %v", set.Current(), err)
	}
}

// A restart while a compromise has no replacement key (the stray file that
// refused it moved out as the error says, `certd rotate` not run yet)
// starts and serves the card with the compromise mark, which verifiers
// need most of all then; signing and /health answer 503 until `certd
// rotate` makes a key, which a running certd picks up.
func TestARestartWithNoKeyInServiceServesTheCard(t *testing.T) {
	keys := filepath.Join(shortDir(t), "keys")
	if out, errOut, code := certd(t, "rotate", "-keys", keys); code != 0 {
		t.Fatalf("rotate: %s %s", out, errOut)
	}
	stray := filepath.Join(keys, "k2.key")
	if err := os.WriteFile(stray, []byte("leftover"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := certd(t, "compromise", "-keys", keys, "-version", "k1", "-since", time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)); code != 1 {
		t.Fatalf("compromise: %d %s %s", code, out, errOut)
	}
	if err := os.Rename(stray, filepath.Join(shortDir(t), "k2.key")); err != nil {
		t.Fatal(err)
	}

	sock := filepath.Join(shortDir(t), "certd.sock")
	d := startServe(t, "-keys", keys, "-sign-socket", sock, "-public-listen", "127.0.0.1:0")
	card, _ := fetchCard(t, d.publicAddr)
	if _, err := receipt.KeysFromCard(card); err != nil || !bytes.Contains(card, []byte(`"status":"compromised"`)) {
		t.Fatalf("card after the restart: %v %s", err, card)
	}
	if !d.sawLog("not signing until a key is in service; the agent card is served") {
		t.Error("the start does not say that nothing is signed")
	}
	c := signer.NewClient(signer.ClientConfig{Socket: sock})
	if _, err := signedResponse(t, c, "k1"); apierr.From(err).Status != http.StatusServiceUnavailable {
		t.Fatalf("signing with no key in service: %v; want 503", err)
	}
	resp, err := http.Get("http://" + d.publicAddr + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("/health with no key in service: %d; want 503", resp.StatusCode)
	}

	if out, errOut, code := certd(t, "rotate", "-keys", keys); code != 0 {
		t.Fatalf("rotate: %s %s", out, errOut)
	}
	if _, err := signedResponse(t, c, "k2"); err != nil {
		t.Fatalf("signing with k2 after the rotation: %v", err)
	}
	d.stop(t, os.Interrupt)
}

// README's `sudo certd compromise` case: the compromise is recorded but
// the new key's file has a mode certd refuses. A certd restarted then
// starts as with no key in service: it serves the card with the mark and
// no current key (the new one pending, as `certd keys` says too), signs
// nothing (503) and logs at start the file and the fix; fixing the mode
// makes it sign with the new key, current again, no restart needed.
func TestARestartAfterACompromiseWhoseNewKeyDoesNotLoadServesTheCard(t *testing.T) {
	keys := filepath.Join(shortDir(t), "keys")
	if out, errOut, code := certd(t, "rotate", "-keys", keys); code != 0 {
		t.Fatalf("rotate: %s %s", out, errOut)
	}
	if out, errOut, code := certd(t, "compromise", "-keys", keys, "-version", "k1", "-since", time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)); code != 0 {
		t.Fatalf("compromise: %d %s %s", code, out, errOut)
	}
	k2 := filepath.Join(keys, "k2.key")
	if err := os.Chmod(k2, 0o644); err != nil { // as with root's umask
		t.Fatal(err)
	}

	sock := filepath.Join(shortDir(t), "certd.sock")
	d := startServe(t, "-keys", keys, "-sign-socket", sock, "-public-listen", "127.0.0.1:0")
	card, _ := fetchCard(t, d.publicAddr)
	if ks, err := receipt.KeysFromCard(card); err != nil || !bytes.Contains(card, []byte(`"status":"compromised"`)) || ks.Current() != "" || !bytes.Contains(card, []byte(`"status":"pending"`)) {
		t.Fatalf("card after the restart: %v %s; want k1 compromised, k2 pending and no currentKeyVersion", err, card)
	}
	if got := keyStatuses(t, keys); got != "k1:compromised,k2:pending" {
		t.Errorf("certd keys while k2.key does not load: %s; want k1:compromised,k2:pending", got)
	}
	said := false
	d.mu.Lock()
	for _, l := range d.logs {
		e, _ := l["error"].(string)
		said = said || l["msg"] == "not signing until a key is in service; the agent card is served" && strings.Contains(e, "chmod 600 "+k2)
	}
	d.mu.Unlock()
	if !said {
		t.Error("the start does not say that nothing is signed and how to fix the key file")
	}
	c := signer.NewClient(signer.ClientConfig{Socket: sock})
	if _, err := signedResponse(t, c, "k2"); apierr.From(err).Status != http.StatusServiceUnavailable {
		t.Fatalf("signing with the new key's file unloadable: %v; want 503", err)
	}
	if err := os.Chmod(k2, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := signedResponse(t, c, "k2"); err != nil {
		t.Fatalf("signing with k2 once its file loads: %v", err)
	}
	card, _ = fetchCard(t, d.publicAddr)
	if ks, err := receipt.KeysFromCard(card); err != nil || ks.Current() != "k2" {
		t.Errorf("card once k2 signs: current %q, %v", ks.Current(), err)
	}
	if got := keyStatuses(t, keys); got != "k1:compromised,k2:current" {
		t.Errorf("certd keys once k2.key loads: %s", got)
	}
	d.stop(t, os.Interrupt)
}

// keyStatuses is what `certd keys` says of each key, as "k1:retired,...".
func keyStatuses(t *testing.T, keys string) string {
	t.Helper()
	out, errOut, code := certd(t, "keys", "-keys", keys, "-json")
	var rows []keyRow
	if err := json.Unmarshal([]byte(out), &rows); code != 0 || err != nil {
		t.Fatalf("certd keys: %d %v %s", code, err, errOut)
	}
	var st []string
	for _, r := range rows {
		st = append(st, r.KeyVersion+":"+r.Status)
	}
	return strings.Join(st, ",")
}

func TestEndToEndLoopbackTCPWithSecret(t *testing.T) {
	dir := shortDir(t)
	secretFile := filepath.Join(dir, "secret")
	secret := "e2e-secret-0123456789abcdef"
	if err := os.WriteFile(secretFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startServe(t, "-dev", "-keys", filepath.Join(dir, "keys"), "-sign-listen", "127.0.0.1:0",
		"-sign-secret-file", secretFile, "-public-listen", "127.0.0.1:0")
	ok := signer.NewClient(signer.ClientConfig{URL: "http://" + d.signAddr, Secret: secret})
	resp, err := signedResponse(t, ok, "k1")
	if err != nil {
		t.Fatalf("sign over TCP with the secret: %v", err)
	}
	card, _ := fetchCard(t, d.publicAddr)
	set, _ := receipt.KeysFromCard(card)
	if err := receipt.VerifyReceipt(resp, set, ""); err != nil {
		t.Fatal(err)
	}
	bad := signer.NewClient(signer.ClientConfig{URL: "http://" + d.signAddr, Secret: "wrong-secret-0123456789"})
	if _, err := signedResponse(t, bad, "k1"); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("sign with a wrong secret: %v", err)
	}
	d.stop(t, syscall.SIGINT)
}

func TestServeRefusals(t *testing.T) {
	dir := shortDir(t)
	secretFile := filepath.Join(dir, "secret")
	os.WriteFile(secretFile, []byte("e2e-secret-0123456789abcdef"), 0o600)
	loose := filepath.Join(dir, "loose")
	os.WriteFile(loose, []byte("e2e-secret-0123456789abcdef"), 0o644)
	os.Chmod(loose, 0o644)
	leaky := filepath.Join(dir, "leaky")
	if out, errOut, code := certd(t, "rotate", "-keys", leaky); code != 0 {
		t.Fatalf("rotate: %s %s", out, errOut)
	}
	os.Chmod(filepath.Join(leaky, "k1.key"), 0o644)
	sock := filepath.Join(dir, "s.sock")
	for _, tc := range []struct {
		desc     string
		args     []string
		wantCode int
		wantErr  string
	}{
		{desc: "an empty key directory without -dev is refused with the way to make a key", args: []string{"serve", "-keys", filepath.Join(dir, "empty"), "-sign-socket", sock, "-public-listen", "127.0.0.1:0"}, wantCode: 1, wantErr: "certd rotate -keys"},
		{desc: "a signing address on every interface is refused", args: []string{"serve", "-dev", "-keys", filepath.Join(dir, "k2"), "-sign-listen", "0.0.0.0:0", "-sign-secret-file", secretFile, "-public-listen", "127.0.0.1:0"}, wantCode: 1, wantErr: "not a loopback address"},
		{desc: "a signing address on the network is refused", args: []string{"serve", "-dev", "-keys", filepath.Join(dir, "k2"), "-sign-listen", "192.0.2.1:8091", "-sign-secret-file", secretFile, "-public-listen", "127.0.0.1:0"}, wantCode: 1, wantErr: "not a loopback address"},
		{desc: "TCP signing without a secret file is a usage error", args: []string{"serve", "-dev", "-keys", filepath.Join(dir, "k2"), "-sign-listen", "127.0.0.1:0"}, wantCode: 2, wantErr: "-sign-secret-file"},
		{desc: "a secret file readable by others is refused", args: []string{"serve", "-dev", "-keys", filepath.Join(dir, "k2"), "-sign-listen", "127.0.0.1:0", "-sign-secret-file", loose, "-public-listen", "127.0.0.1:0"}, wantCode: 1, wantErr: "chmod 600"},
		{desc: "a clock skew beyond what receipt verifiers allow is refused", args: []string{"serve", "-dev", "-keys", filepath.Join(dir, "k2"), "-sign-socket", sock, "-public-listen", "127.0.0.1:0", "-max-skew", "6m"}, wantCode: 1, wantErr: "max skew 6m0s is above 5m0s"},
		{desc: "compromise without -since is a usage error", args: []string{"compromise", "-keys", leaky, "-version", "k1"}, wantCode: 2, wantErr: "-since"},
		{desc: "compromise with a bad time is a usage error", args: []string{"compromise", "-keys", leaky, "-version", "k1", "-since", "yesterday"}, wantCode: 2, wantErr: "RFC 3339"},
		{desc: "listing a key directory that does not exist is refused, not created", args: []string{"keys", "-keys", filepath.Join(dir, "typo")}, wantCode: 1, wantErr: "no such file"},
		{desc: "compromise of an unknown version is refused", args: []string{"compromise", "-keys", leaky, "-version", "k7", "-since", "2026-01-01T00:00:00Z"}, wantCode: 1, wantErr: "no key version"},
		{desc: "a key whose file mode certd refuses can still be marked compromised", args: []string{"compromise", "-keys", leaky, "-version", "k1", "-since", "2026-01-01T00:00:00Z"}, wantCode: 0},
		{desc: "an unknown command is a usage error", args: []string{"sign"}, wantCode: 2, wantErr: "unknown command"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			_, errOut, code := certd(t, tc.args...)
			if code != tc.wantCode || (tc.wantErr != "" && !strings.Contains(errOut, tc.wantErr)) || (tc.wantErr == "" && errOut != "") {
				t.Fatalf("exit %d, stderr %q; want exit %d mentioning %q", code, errOut, tc.wantCode, tc.wantErr)
			}
		})
	}
}

// TestServeNeverReadsARetiredKey: certd signs with the current key only, so
// it loads no retired private key (whoever takes the process over cannot
// sign with one), and the operator may even delete retired key files: the
// card still publishes their public keys from the index.
func TestServeNeverReadsARetiredKey(t *testing.T) {
	keys := filepath.Join(shortDir(t), "keys")
	for range 2 {
		if out, errOut, code := certd(t, "rotate", "-keys", keys); code != 0 {
			t.Fatalf("rotate: %s %s", out, errOut)
		}
	}
	if err := os.Remove(filepath.Join(keys, "k1.key")); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(shortDir(t), "certd.sock")
	d := startServe(t, "-keys", keys, "-sign-socket", sock, "-public-listen", "127.0.0.1:0")
	card, _ := fetchCard(t, d.publicAddr)
	set, err := receipt.KeysFromCard(card)
	if err != nil || set.Current() != "k2" || !slices.Equal(set.Versions(), []string{"k1", "k2"}) {
		t.Fatalf("card: current %q, versions %v, %v; want k2 of k1, k2", set.Current(), set.Versions(), err)
	}
	signed, err := signedResponse(t, signer.NewClient(signer.ClientConfig{Socket: sock}), "k2")
	if err != nil {
		t.Fatal(err)
	}
	if err := receipt.VerifyReceipt(signed, set, ""); err != nil {
		t.Fatalf("a k2 receipt against the card: %v", err)
	}
}

// TestServeOnAnIndexOlderThanItsKeysSignsNothing: certd started where a
// key file is newer than the index (here the index restored from a backup
// older than the last rotation) says so at start naming the file, serves
// the card with no current key and answers 503 to signing; moving the file
// out resumes signing, k1 current again, without a restart.
func TestServeOnAnIndexOlderThanItsKeysSignsNothing(t *testing.T) {
	keys := filepath.Join(shortDir(t), "keys")
	if out, errOut, code := certd(t, "rotate", "-keys", keys); code != 0 {
		t.Fatalf("rotate: %s %s", out, errOut)
	}
	backup, err := os.ReadFile(filepath.Join(keys, keystore.IndexFile))
	if err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := certd(t, "rotate", "-keys", keys); code != 0 {
		t.Fatalf("rotate: %s %s", out, errOut)
	}
	if err := os.WriteFile(filepath.Join(keys, keystore.IndexFile), backup, 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(shortDir(t), "certd.sock")
	d := startServe(t, "-keys", keys, "-sign-socket", sock, "-public-listen", "127.0.0.1:0")
	d.mu.Lock()
	var said string
	for _, l := range d.logs {
		if l["msg"] == "not signing until a key is in service; the agent card is served" && l["level"] == "ERROR" {
			said, _ = l["error"].(string)
		}
	}
	d.mu.Unlock()
	for _, want := range []string{"k2.key", "restore the newest one", "move the file out of the directory"} {
		if !strings.Contains(said, want) {
			t.Errorf("the start's error log %q does not say %q", said, want)
		}
	}
	card, _ := fetchCard(t, d.publicAddr)
	if set, err := receipt.KeysFromCard(card); err != nil || set.Current() != "" || !bytes.Contains(card, []byte(`"status":"pending"`)) {
		t.Fatalf("card: current %q, %v; want none, the index's k1 pending while nothing signs", set.Current(), err)
	}
	if got := keyStatuses(t, keys); got != "k1:pending" {
		t.Errorf("certd keys while k2.key is newer than the index: %s; want k1:pending, as the card", got)
	}
	c := signer.NewClient(signer.ClientConfig{Socket: sock})
	if _, err := signedResponse(t, c, "k1"); err == nil {
		t.Fatal("certd signed with k1 while k2.key is newer than the index")
	}
	resp, err := http.Get("http://" + d.publicAddr + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("/health while k2.key is newer than the index: %d; want 503", resp.StatusCode)
	}

	if err := os.Rename(filepath.Join(keys, "k2.key"), filepath.Join(shortDir(t), "k2.key")); err != nil {
		t.Fatal(err)
	}
	if _, err := signedResponse(t, c, "k1"); err != nil {
		t.Fatalf("signing once the file is moved out: %v", err)
	}
	card, _ = fetchCard(t, d.publicAddr)
	if set, err := receipt.KeysFromCard(card); err != nil || set.Current() != "k1" {
		t.Fatalf("card once k1 signs: current %q, %v; want k1", set.Current(), err)
	}
	if got := keyStatuses(t, keys); got != "k1:current" {
		t.Errorf("certd keys once the file is moved out: %s; want k1:current", got)
	}
}

// TestCertdKeysSaysPendingWhileAPendingKeyFileStopsSigning: a rotation
// dated ahead of this clock (k2 pending) whose key file certd refuses
// (mode 0644). certd loads the private key of every key that may still
// sign, so it signs nothing, k1 included, and its card calls k1 pending;
// `certd keys` makes the same start checks and says the same, not k1
// current because k1's own file loads.
func TestCertdKeysSaysPendingWhileAPendingKeyFileStopsSigning(t *testing.T) {
	keys := filepath.Join(shortDir(t), "keys")
	for range 2 {
		if out, errOut, code := certd(t, "rotate", "-keys", keys); code != 0 {
			t.Fatalf("rotate: %s %s", out, errOut)
		}
	}
	// Date the rotation ahead, as a rotation run on a host whose clock
	// is ten minutes ahead does.
	path := filepath.Join(keys, keystore.IndexFile)
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var idx map[string]any
	if err := json.Unmarshal(raw, &idx); err != nil {
		t.Fatal(err)
	}
	ahead := time.Now().Add(10 * time.Minute).UTC().Format(time.RFC3339Nano)
	entries := idx["keys"].([]any)
	entries[0].(map[string]any)["retired_at"] = ahead
	entries[1].(map[string]any)["created_at"] = ahead
	if raw, err = json.Marshal(idx); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(keys, "k2.key"), 0o644); err != nil {
		t.Fatal(err)
	}

	sock := filepath.Join(shortDir(t), "certd.sock")
	d := startServe(t, "-keys", keys, "-sign-socket", sock, "-public-listen", "127.0.0.1:0")
	defer d.stop(t, os.Interrupt)
	c := signer.NewClient(signer.ClientConfig{Socket: sock})
	if _, err := signedResponse(t, c, "k1"); apierr.From(err).Status != http.StatusServiceUnavailable {
		t.Fatalf("signing with k2.key unloadable: %v; want 503", err)
	}
	card, _ := fetchCard(t, d.publicAddr)
	if set, err := receipt.KeysFromCard(card); err != nil || set.Current() != "" {
		t.Fatalf("card: current %q, %v; want none", set.Current(), err)
	}
	if got := keyStatuses(t, keys); got != "k1:pending,k2:pending" {
		t.Errorf("certd keys while certd signs nothing: %s; want k1:pending,k2:pending, as the card", got)
	}
}

// TestCompromiseMarkOnlyMovesEarlier: `certd compromise` of a key already
// marked keeps the earlier instant and says so when -since is later (a later
// mark would trust again the receipts dated in between); an earlier -since
// moves the mark.
func TestCompromiseMarkOnlyMovesEarlier(t *testing.T) {
	keys := filepath.Join(shortDir(t), "keys")
	for range 2 {
		if out, errOut, code := certd(t, "rotate", "-keys", keys); code != 0 {
			t.Fatalf("rotate: %s %s", out, errOut)
		}
	}
	mark := func(since, wantOut string) {
		t.Helper()
		out, errOut, code := certd(t, "compromise", "-keys", keys, "-version", "k1", "-since", since)
		if code != 0 || errOut != "" || !strings.Contains(out, wantOut) {
			t.Fatalf("compromise -since %s: exit %d, stdout %q, stderr %q; want exit 0 saying %q", since, code, out, errOut, wantOut)
		}
		out, _, _ = certd(t, "keys", "-keys", keys, "-json")
		var rows []keyRow
		if json.Unmarshal([]byte(out), &rows) != nil || len(rows) != 2 || rows[0].Status != "compromised" {
			t.Fatalf("certd keys -json: %s", out)
		}
	}
	since := func() string {
		out, _, _ := certd(t, "keys", "-keys", keys, "-json")
		var rows []keyRow
		json.Unmarshal([]byte(out), &rows)
		return rows[0].CompromisedSince
	}
	// The zero time, "compromised from the start", was stored and read
	// back as no mark at all; it is refused, changing nothing.
	out, errOut, code := certd(t, "compromise", "-keys", keys, "-version", "k1", "-since", "0001-01-01T00:00:00Z")
	if code == 0 || !strings.Contains(errOut, "is before 1970, and no key existed then; to distrust every receipt the key signed, give ") {
		t.Fatalf("compromise -since 0001-01-01T00:00:00Z: exit %d, stdout %q, stderr %q; want it refused", code, out, errOut)
	}
	if out, _, _ := certd(t, "keys", "-keys", keys, "-json"); strings.Contains(out, "compromised") {
		t.Fatalf("a refused mark changed the keys: %s", out)
	}
	mark("2026-01-02T00:00:00Z", "k1 is marked compromised since 2026-01-02T00:00:00Z")
	mark("2026-01-03T00:00:00Z", "k1 was already marked compromised since 2026-01-02T00:00:00Z, earlier than -since 2026-01-03T00:00:00Z: the mark stays")
	if got := since(); got != "2026-01-02T00:00:00Z" {
		t.Fatalf("a later -since moved the mark to %s", got)
	}
	mark("2026-01-01T00:00:00Z", "k1 is marked compromised since 2026-01-01T00:00:00Z")
	if got := since(); got != "2026-01-01T00:00:00Z" {
		t.Fatalf("an earlier -since left the mark at %s", got)
	}
}

// A -max-skew of zero or less, or a CERTD_MAX_SKEW certd cannot read (a
// number without a unit, a misspelt unit, a negative skew), is a usage
// error naming the flag or the variable, as verifierd refuses its
// VERIFIERD_* variables, instead of silently meaning 60 s.
func TestServeRefusesAMaxSkewItCannotUse(t *testing.T) {
	for _, v := range []string{"-1h", "0s"} {
		_, err := parseServe([]string{"-sign-socket", "/tmp/x.sock", "-max-skew", v}, io.Discard)
		if err == nil || !errors.As(err, new(usageError)) || !strings.Contains(err.Error(), "-max-skew") || !strings.Contains(err.Error(), "must be positive") {
			t.Errorf("-max-skew %s: %v; want a usage error naming the flag", v, err)
		}
	}
	for _, v := range []string{"90", "2 m", "30sec", "-5s", "0"} {
		t.Run(v, func(t *testing.T) {
			t.Setenv("CERTD_MAX_SKEW", v)
			_, err := parseServe([]string{"-sign-socket", "/tmp/x.sock"}, io.Discard)
			if err == nil || !errors.As(err, new(usageError)) || !strings.Contains(err.Error(), "CERTD_MAX_SKEW") {
				t.Errorf("CERTD_MAX_SKEW=%q: %v; want a usage error naming the variable", v, err)
			}
		})
	}
	t.Setenv("CERTD_MAX_SKEW", "90s")
	c, err := parseServe([]string{"-sign-socket", "/tmp/x.sock"}, io.Discard)
	if err != nil || c.maxSkew != 90*time.Second {
		t.Fatalf("CERTD_MAX_SKEW=90s: %v, %v", c.maxSkew, err)
	}
	c, err = parseServe([]string{"-sign-socket", "/tmp/x.sock", "-max-skew", "2m"}, io.Discard)
	if err != nil || c.maxSkew != 2*time.Minute {
		t.Fatalf("-max-skew 2m over CERTD_MAX_SKEW=90s: %v, %v", c.maxSkew, err)
	}
}
