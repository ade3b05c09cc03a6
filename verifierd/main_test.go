package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/keystore"
	"github.com/aovhq/aov/receipt"
	"github.com/aovhq/aov/signer"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/verify"
)

const passingRequest = `{"task_id":"t1","agent_id":"seller-7","expected_schema":{"type":"object","required":["ok"],"properties":{"ok":{"type":"boolean"}}},"submitted_output":{"ok":true}}`

// startCertd runs a real signing server on a unix socket in dir.
func startCertd(t *testing.T, dir string) string {
	t.Helper()
	keys, err := keystore.Open(filepath.Join(dir, "keys"), keystore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := keys.Generate(); err != nil {
		t.Fatal(err)
	}
	srv, err := signer.NewServer(signer.ServerConfig{Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "certd.sock")
	ln, err := signer.ListenUnix(sock)
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 5 * time.Second}
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })
	return sock
}

func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "vdm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

type daemon struct {
	api, admin string
	done       chan error
	cancel     context.CancelFunc
}

func startDaemon(t *testing.T, args ...string) *daemon {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d := &daemon{done: make(chan error, 1), cancel: cancel}
	readyc := make(chan struct{})
	go func() {
		d.done <- run(ctx, args, io.Discard, func(api, admin string) {
			d.api, d.admin = api, admin
			close(readyc)
		})
	}()
	select {
	case <-readyc:
	case err := <-d.done:
		t.Fatalf("verifierd exited before serving: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("verifierd did not start")
	}
	t.Cleanup(func() {
		cancel()
		<-d.done
	})
	return d
}

func TestDaemonServesAndShutsDownGracefully(t *testing.T) {
	dir := shortDir(t)
	sock := startCertd(t, dir)
	data := filepath.Join(dir, "data")
	d := startDaemon(t, "-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0",
		"-data", data, "-signer-socket", sock, "-public-base-url", "http://127.0.0.1:1")

	resp, err := http.Post("http://"+d.api+"/verify/schema", "application/json", strings.NewReader(passingRequest))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Contains(body, []byte(`"attestation"`)) {
		t.Fatalf("verification over TCP: %d %s", resp.StatusCode, body)
	}

	t.Run("metrics are on the admin listener only", func(t *testing.T) {
		resp, err := http.Get("http://" + d.admin + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		m, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !bytes.Contains(m, []byte(`aov_verifierd_verifications_total{payment="unknown",result="pass"} 1`)) {
			t.Fatalf("admin /metrics lacks the verification counter:\n%s", m)
		}
		resp, err = http.Get("http://" + d.api + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("public /metrics = %d, want 404", resp.StatusCode)
		}
	})

	t.Run("an in-flight request finishes after shutdown begins", func(t *testing.T) {
		pr, pw := io.Pipe()
		req, _ := http.NewRequest(http.MethodPost, "http://"+d.api+"/verify/schema", pr)
		req.Header.Set("Content-Type", "application/json")
		req.ContentLength = int64(len(passingRequest))
		got := make(chan *http.Response, 1)
		errc := make(chan error, 1)
		go func() {
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				errc <- err
				return
			}
			got <- resp
		}()
		half := len(passingRequest) / 2
		pw.Write([]byte(passingRequest[:half]))
		time.Sleep(100 * time.Millisecond) // the request is now being read by the server
		d.cancel()                         // SIGTERM
		// New connections are refused once shutdown began (it begins when
		// the signal is handled: waited for, as a loaded machine may take
		// a while)...
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			c, err := net.DialTimeout("tcp", d.api, time.Second)
			if err != nil {
				break
			}
			c.Close()
			if time.Now().After(deadline) {
				t.Errorf("new connections were still accepted 10 s after shutdown began")
				break
			}
		}
		// ...but the request in flight completes.
		pw.Write([]byte(passingRequest[half:]))
		pw.Close()
		select {
		case resp := <-got:
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("in-flight request: %d %s", resp.StatusCode, b)
			}
			var doc map[string]any
			if err := json.Unmarshal(b, &doc); err != nil || doc["attestation"] == nil {
				t.Fatalf("in-flight request answer: %s", b)
			}
		case err := <-errc:
			t.Fatalf("in-flight request failed: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatal("in-flight request never answered")
		}
		select {
		case err := <-d.done:
			d.done <- err // for the cleanup
			if err != nil {
				t.Fatalf("run returned %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("verifierd did not exit")
		}
	})

	t.Run("the store was closed and holds both verifications", func(t *testing.T) {
		db, err := store.Open(data, store.Options{})
		if err != nil {
			t.Fatalf("store still locked after exit: %v", err)
		}
		defer db.Close()
		c, err := db.AgentCounts(context.Background(), "seller-7")
		if err != nil || c.Pass != 2 {
			t.Fatalf("counts %+v, %v; want 2 passes", c, err)
		}
	})
}

func TestConfiguration(t *testing.T) {
	t.Run("environment fills flags the command line did not set", func(t *testing.T) {
		t.Setenv("VERIFIERD_PUBLIC_BASE_URL", "https://env.example")
		t.Setenv("VERIFIERD_LIST_CAP", "7")
		t.Setenv("VERIFIERD_LISTEN", "127.0.0.1:1")
		c, err := parseFlags([]string{"-listen", "127.0.0.1:2"}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if c.publicBaseURL != "https://env.example" || c.listCap != 7 || c.listen != "127.0.0.1:2" {
			t.Fatalf("got base %q cap %d listen %q", c.publicBaseURL, c.listCap, c.listen)
		}
	})

	t.Run("verification budgets have documented defaults and flags", func(t *testing.T) {
		c, err := parseFlags(nil, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		got := verify.New(verifyConfig(c)).Config()
		want := verify.New(verify.Config{}).Config()
		if got.Timeout != want.Timeout || got.MaxRegexWork != want.MaxRegexWork || got.MaxPatternSize != want.MaxPatternSize ||
			got.MaxSchemaSteps != want.MaxSchemaSteps || got.MaxSchemas != want.MaxSchemas || got.SchemaCacheBytes != want.SchemaCacheBytes ||
			got.MaxIntegrityWork != want.MaxIntegrityWork {
			t.Errorf("flag defaults %+v differ from the verifier's defaults %+v", got, want)
		}
		t.Setenv("VERIFIERD_MAX_REGEX_WORK", "1000")
		c, err = parseFlags([]string{"-verify-timeout", "2s", "-max-pattern-size", "50", "-max-schemas", "9",
			"-max-schema-steps", "77", "-schema-cache-bytes", "4096", "-max-concurrent-verifications", "3", "-max-integrity-work", "555"}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		vc := verifyConfig(c)
		if vc.Timeout != 2*time.Second || vc.MaxRegexWork != 1000 || vc.MaxPatternSize != 50 || vc.MaxSchemas != 9 ||
			vc.MaxSchemaSteps != 77 || vc.SchemaCacheBytes != 4096 || vc.MaxConcurrent != 3 || vc.MaxIntegrityWork != 555 {
			t.Errorf("budgets from flags and environment = %+v", vc)
		}
	})

	t.Run("a malformed environment value is an error naming the variable", func(t *testing.T) {
		t.Setenv("VERIFIERD_LIST_CAP", "many")
		if _, err := parseFlags(nil, io.Discard); err == nil || !strings.Contains(err.Error(), "VERIFIERD_LIST_CAP") {
			t.Fatalf("err = %v", err)
		}
	})

	for _, c := range []struct {
		desc    string
		content string
		mode    os.FileMode
		env     string
		want    string
		wantErr bool
	}{
		{"a gateway token file readable by others is refused", "tok-0123456789abcdef", 0o644, "", "", true},
		{"a short gateway token is refused", "short", 0o600, "", "", true},
		{"a private gateway token file is read and trimmed", "tok-0123456789abcdef\n", 0o600, "", "tok-0123456789abcdef", false},
		{"without a file the token comes from AOV_GATEWAY_TOKEN", "", 0, "env-token-0123456789", "env-token-0123456789", false},
		{"a short AOV_GATEWAY_TOKEN is refused", "", 0, "short", "", true},
	} {
		t.Run(c.desc, func(t *testing.T) {
			t.Setenv("AOV_GATEWAY_TOKEN", c.env)
			file := ""
			if c.content != "" {
				file = filepath.Join(t.TempDir(), "token")
				if err := os.WriteFile(file, []byte(c.content), c.mode); err != nil {
					t.Fatal(err)
				}
				os.Chmod(file, c.mode)
			}
			got, err := gatewayToken(file)
			if (err != nil) != c.wantErr || got != c.want {
				t.Fatalf("gatewayToken = %q, %v", got, err)
			}
		})
	}

	for _, c := range []struct {
		desc string
		flag []string
	}{
		{"a trust score weight above 1 is refused at start", []string{"-score-unauthenticated-weight", "2"}},
		{"a trust score weight of 0 is refused at start", []string{"-score-unauthenticated-weight", "0"}},
		{"a zero half-life is refused at start", []string{"-score-half-life", "0s"}},
	} {
		t.Run(c.desc, func(t *testing.T) {
			dir := shortDir(t)
			args := append([]string{"-data", filepath.Join(dir, "data"), "-signer-socket", filepath.Join(dir, "s.sock"), "-admin-listen", ""}, c.flag...)
			err := run(context.Background(), args, io.Discard, nil)
			if err == nil || !strings.Contains(err.Error(), "weight") {
				t.Fatalf("err = %v", err)
			}
		})
	}

	t.Run("a signer URL that is not loopback is refused", func(t *testing.T) {
		err := run(context.Background(), []string{"-signer-url", "http://192.0.2.1:8091", "-signer-secret-file", "x", "-admin-listen", ""}, io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), "loopback") {
			t.Fatalf("err = %v", err)
		}
	})
}

// TestDaemonServesScoreAndMCP runs the daemon on TCP and calls the score
// route and a tools/call on /mcp with the Host a gateway forwards.
func TestDaemonServesScoreAndMCP(t *testing.T) {
	dir := shortDir(t)
	sock := startCertd(t, dir)
	d := startDaemon(t, "-listen", "127.0.0.1:0", "-admin-listen", "", "-no-sync",
		"-data", filepath.Join(dir, "data"), "-signer-socket", sock, "-public-base-url", "https://verify.example.test",
		"-score-half-life", "240h", "-dev-ungated-paid-routes")

	req, _ := http.NewRequest(http.MethodPost, "http://"+d.api+"/mcp", strings.NewReader(
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"verify_schema","arguments":`+passingRequest+`}}`))
	req.Host = "verify.example.test"
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Contains(body, []byte(`"structuredContent":{"summary":{"result":"pass"`)) {
		t.Fatalf("tools/call over TCP: %d %s", resp.StatusCode, body)
	}

	resp, err = http.Get("http://" + d.api + "/score/seller-7")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Score  float64 `json:"score"`
		Method struct {
			Params struct {
				HalfLifeDays float64 `json:"half_life_days"`
			} `json:"params"`
		} `json:"method"`
		Counts struct {
			Total int `json:"total"`
		} `json:"counts"`
	}
	err = json.NewDecoder(resp.Body).Decode(&doc)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || doc.Counts.Total != 1 || !(doc.Score > 0) || doc.Method.Params.HalfLifeDays != 10 {
		t.Fatalf("score over TCP: %d %+v %v", resp.StatusCode, doc, err)
	}
}

// keysWithOne is a key directory in dir ("keys") with one key generated
// in it, for -signer-keys, and the keystore on it, for reading its keys or
// rotating them as another process would.
func keysWithOne(t *testing.T, dir string) (string, *keystore.Store) {
	t.Helper()
	keysDir := filepath.Join(dir, "keys")
	ks, err := keystore.Open(keysDir, keystore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ks.Generate(); err != nil {
		t.Fatal(err)
	}
	return keysDir, ks
}

// TestDaemonSignsInProcess runs the daemon with -signer-keys and no certd
// listening: receipts are signed with the directory's current key, and a
// rotation made there by another process (as `certd rotate` is) signs the
// next verification.
func TestDaemonSignsInProcess(t *testing.T) {
	dir := shortDir(t)
	keysDir, certd := keysWithOne(t, dir)
	d := startDaemon(t, "-listen", "127.0.0.1:0", "-admin-listen", "", "-no-sync",
		"-data", filepath.Join(dir, "data"), "-signer-keys", keysDir, "-signer-socket", filepath.Join(dir, "nobody.sock"),
		"-public-base-url", "http://127.0.0.1:1")
	verifyWith := func(want string) {
		t.Helper()
		body := verification(t, d.api)
		k, _ := certd.Lookup(want)
		v, err := receipt.Verify(body, receipt.SingleKey(want, k.Public), receipt.ContextVerify)
		if err != nil || v.KeyVersion != want {
			t.Fatalf("receipt: %+v, %v; want one signed by %s", v, err, want)
		}
	}
	verifyWith("k1")
	if _, err := certd.Rotate(); err != nil {
		t.Fatal(err)
	}
	verifyWith("k2")

	for _, c := range []struct {
		desc string
		args []string
		want string
	}{
		{"-signer-keys with -signer-url is refused", []string{"-signer-keys", keysDir, "-signer-url", "http://127.0.0.1:8091"}, "choose one"},
		{"a missing key directory is refused", []string{"-signer-keys", filepath.Join(dir, "nope")}, "key directory"},
	} {
		t.Run(c.desc, func(t *testing.T) {
			args := append([]string{"-data", filepath.Join(dir, "data2"), "-admin-listen", ""}, c.args...)
			if err := run(context.Background(), args, io.Discard, nil); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want one saying %q", err, c.want)
			}
		})
	}
}

// A zero or negative duration is refused with the flag's (or the
// variable's) name: net/http reads a non-positive server timeout as no
// deadline at all (a slow client holds its connection forever), a negative
// -shutdown-timeout cuts every request in flight at SIGTERM, and a
// negative -signer-timeout or -verify-timeout silently meant the default.
func TestNonPositiveDurationsAreRefused(t *testing.T) {
	for _, f := range []string{"read-header-timeout", "read-timeout", "idle-timeout", "shutdown-timeout", "signer-timeout", "verify-timeout"} {
		for _, v := range []string{"-1s", "0s"} {
			_, err := parseFlags([]string{"-" + f, v}, io.Discard)
			if err == nil || !strings.Contains(err.Error(), "-"+f) || !strings.Contains(err.Error(), "must be positive") {
				t.Errorf("-%s %s: %v; want an error naming the flag", f, v, err)
			}
		}
		env := "VERIFIERD_" + strings.ToUpper(strings.ReplaceAll(f, "-", "_"))
		t.Run(env, func(t *testing.T) {
			t.Setenv(env, "-1s")
			if _, err := parseFlags(nil, io.Discard); err == nil || !strings.Contains(err.Error(), env) {
				t.Errorf("%s=-1s: %v; want an error naming the variable", env, err)
			}
		})
		if _, err := parseFlags([]string{"-" + f, "1ms"}, io.Discard); err != nil {
			t.Errorf("-%s 1ms: %v", f, err)
		}
	}
}
