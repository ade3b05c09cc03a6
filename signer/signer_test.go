package signer

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/keystore"
	"github.com/aovhq/aov/receipt"
)

// shortDir returns a temp directory with a short path: a unix socket path
// must fit in 108 bytes, which t.TempDir's long names can exceed.
func shortDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "sg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// fixture is a real certd signing endpoint on a real socket.
type fixture struct {
	keysDir string
	keys    *keystore.Store
	socket  string
	url     string
	now     time.Time
}

type fixtureOpts struct {
	tcp    bool
	secret string
	empty  bool
	now    func() time.Time
	skew   time.Duration
}

func start(t testing.TB, o fixtureOpts) *fixture {
	t.Helper()
	f := &fixture{keysDir: filepath.Join(shortDir(t), "keys")}
	var err error
	if f.keys, err = keystore.Open(f.keysDir, keystore.Options{}); err != nil {
		t.Fatal(err)
	}
	if !o.empty {
		if _, err := f.keys.Generate(); err != nil {
			t.Fatal(err)
		}
	}
	srv, err := NewServer(ServerConfig{Keys: f.keys, Secret: o.secret, Now: o.now, MaxSkew: o.skew, MaxBodyBytes: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	var ln net.Listener
	if o.tcp {
		ln, err = ListenTCP("127.0.0.1:0")
		f.url = "http://" + ln.Addr().String()
	} else {
		f.socket = filepath.Join(shortDir(t), "certd.sock")
		ln, err = ListenUnix(f.socket)
	}
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 5 * time.Second}
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })
	return f
}

func (f *fixture) client(secret string) *Client {
	return NewClient(ClientConfig{Socket: f.socket, URL: f.url, Secret: secret})
}

// rawClient talks HTTP to the fixture without the protocol client, to send
// what a correct client never would.
func (f *fixture) raw(t *testing.T, method, path, contentType, secret string, body []byte) (int, map[string]any) {
	t.Helper()
	c := f.client("")
	url := c.base + path
	req, _ := http.NewRequest(method, url, bytes.NewReader(body))
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if secret != "" {
		req.Header.Set("Authorization", "Bearer "+secret)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatalf("%s %s answered %d with non-JSON %q", method, path, resp.StatusCode, data)
	}
	return resp.StatusCode, m
}

// sampleResponse is a typical verification response without its attestation,
// padded to about size bytes. It carries a computed_at at its verified_at,
// as a trust score does, so that it verifies signed under either context.
func sampleResponse(kv string, at string, size int) []byte {
	doc := map[string]any{
		"summary":          map[string]any{"result": "pass", "blocking_checks": []any{}},
		"next_actions":     []any{map[string]any{"action": "attach_receipt", "for": "seller"}, map[string]any{"action": "proceed_to_payment", "for": "buyer"}},
		"result":           "pass",
		"verification_id":  "3f1c2b9e-6f0a-4a7e-9d7c-2f7c1f1e8a11",
		"task_id":          "invoice-42",
		"agent_id":         "seller-7",
		"output_hash":      strings.Repeat("ab", 32),
		"schema_hash":      strings.Repeat("cd", 32),
		"rules_hash":       strings.Repeat("ef", 32),
		"verified_at":      at,
		"computed_at":      at,
		"verifier_version": "aov/1.0.0",
		"enforce_rules":    true,
		"overall":          map[string]any{"ratio": 1.0, "passed": 23, "total": 23},
		"verify": map[string]any{"public_key_url": "http://localhost:8080/.well-known/agent-card.json", "key_version": kv,
			"canonicalization": receipt.Canonicalization, "hash_algorithm": receipt.HashAlgorithm, "service": "aov", "mcp": "http://localhost:8080/mcp"},
	}
	var flags []any
	for i := 0; ; i++ {
		b, _ := json.Marshal(doc)
		if len(b) >= size {
			return b
		}
		flags = append(flags, map[string]any{"check": "consistency:unique", "field": fmt.Sprintf("items[%d].id", i), "severity": "warning", "detail": "values repeat"})
		doc["flags"] = flags
	}
}

func nowString() string { return time.Now().UTC().Format("2006-01-02T15:04:05.000000+00:00") }

// checkSignature verifies att as a receipt holder would: the response with
// its attestation attached, checked by package receipt against the public
// key of the version att names.
func checkSignature(t *testing.T, keys *keystore.Store, signContext string, response []byte, att receipt.Attestation) {
	t.Helper()
	k, ok := keys.Lookup(att.KeyVersion)
	if !ok {
		t.Fatalf("attestation names unknown key %s", att.KeyVersion)
	}
	a, _ := json.Marshal(att)
	full := append(bytes.TrimSuffix(bytes.TrimSpace(append([]byte(nil), response...)), []byte("}")), []byte(`,"attestation":`+string(a)+`}`)...)
	if _, err := receipt.Verify(full, receipt.SingleKey(att.KeyVersion, k.Public), signContext); err != nil {
		t.Fatalf("the receipt does not verify: %v", err)
	}
}

func TestSignThenVerify(t *testing.T) {
	for _, tc := range []struct {
		desc string
		o    fixtureOpts
	}{
		{desc: "over the unix socket the signature verifies against the key version it names", o: fixtureOpts{}},
		{desc: "over loopback TCP with the bearer secret the signature verifies", o: fixtureOpts{tcp: true, secret: "0123456789abcdef0123"}},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			f := start(t, tc.o)
			c := f.client(tc.o.secret)
			ctx := context.Background()
			if err := c.Ping(ctx); err != nil {
				t.Fatalf("Ping: %v", err)
			}
			kv, err := c.CurrentKey(ctx)
			if err != nil || kv != "k1" {
				t.Fatalf("CurrentKey = %q, %v", kv, err)
			}
			for _, sc := range []string{receipt.ContextVerify, receipt.ContextScore} {
				at := nowString()
				resp := sampleResponse(kv, at, 2048)
				att, err := c.Sign(ctx, sc, kv, at, resp)
				if err != nil {
					t.Fatalf("Sign: %v", err)
				}
				if att.Algorithm != "Ed25519" || att.KeyVersion != "k1" || att.Timestamp != at {
					t.Fatalf("attestation = %+v", att)
				}
				checkSignature(t, f.keys, sc, resp, att)
				// The context is bound: the same signature does not verify
				// as the other kind of receipt.
				other := receipt.ContextScore
				if sc == other {
					other = receipt.ContextVerify
				}
				msg, _ := receipt.SigningInput(other, kv, at, resp)
				sig, _ := base64.StdEncoding.DecodeString(att.Signature)
				if ed25519.Verify(f.keys.List()[0].Public, msg, sig) {
					t.Fatal("a signature under one context verifies under the other")
				}
			}
		})
	}
}

func TestUnixSocketIsOwnerOnly(t *testing.T) {
	f := start(t, fixtureOpts{})
	fi, err := os.Stat(f.socket)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode = %v, want a socket with mode 0600", fi.Mode())
	}
}

func TestStaleKeyAfterRotation(t *testing.T) {
	f := start(t, fixtureOpts{})
	c := f.client("")
	ctx := context.Background()
	kv, err := c.CurrentKey(ctx)
	if err != nil || kv != "k1" {
		t.Fatalf("CurrentKey = %q, %v", kv, err)
	}
	// The operator rotates from another process (its own Store).
	operator, err := keystore.Open(f.keysDir, keystore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := operator.Rotate(); err != nil {
		t.Fatal(err)
	}
	// The client still believes k1 (cached) and builds its response with it.
	if kv, _ := c.CurrentKey(ctx); kv != "k1" {
		t.Fatalf("cached CurrentKey = %q, want k1 until refreshed", kv)
	}
	at := nowString()
	_, err = c.Sign(ctx, receipt.ContextVerify, "k1", at, sampleResponse("k1", at, 512))
	var stale *StaleKeyError
	if !errors.As(err, &stale) || stale.Current != "k2" {
		t.Fatalf("Sign with the retired key: err = %v, want StaleKeyError{k2}", err)
	}
	kv, err = c.CurrentKey(ctx)
	if err != nil || kv != "k2" {
		t.Fatalf("CurrentKey after stale = %q, %v; want k2 at once", kv, err)
	}
	resp := sampleResponse(kv, at, 512)
	att, err := c.Sign(ctx, receipt.ContextVerify, kv, at, resp)
	if err != nil {
		t.Fatal(err)
	}
	if att.KeyVersion != "k2" {
		t.Fatalf("signed with %s, want k2", att.KeyVersion)
	}
	checkSignature(t, f.keys, receipt.ContextVerify, resp, att)

	// The raw 409 carries the SPEC §6 shape and the current version.
	body, _ := receipt.SigningInput(receipt.ContextVerify, "k1", at, resp)
	status, m := f.raw(t, http.MethodPost, PathSign, "application/json", "", body)
	if status != http.StatusConflict || m["code"] != CodeStaleKeyVersion || m["current_key_version"] != "k2" || m["charged"] != false || m["status"] != float64(409) {
		t.Fatalf("stale answer = %d %v", status, m)
	}
}

func TestSignRefusals(t *testing.T) {
	fixed := time.Date(2026, 11, 29, 21, 0, 0, 0, time.UTC)
	f := start(t, fixtureOpts{now: func() time.Time { return fixed }})
	at := "2026-11-29T21:00:00.000000+00:00"
	resp := sampleResponse("k1", at, 256)
	// doc builds a signing input the way the client does; hand-written
	// bodies below cover what no correct client sends.
	doc := func(context, kv, at string, resp []byte) []byte {
		b, err := receipt.SigningInput(context, kv, at, resp)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	good := doc(receipt.ContextVerify, "k1", at, resp)
	canonResp, _ := receipt.Canonicalize(resp)
	hand := func(members string) []byte { return []byte("{" + members + "}") }
	const alg = `"algorithm":"Ed25519"`
	atM, ctxM, kvM := `"attested_at":"`+at+`"`, `"context":"`+receipt.ContextVerify+`"`, `"key_version":"k1"`
	respM := `"response":` + string(canonResp)
	for _, tc := range []struct {
		desc        string
		method      string
		path        string
		contentType string
		body        []byte
		wantStatus  int
		wantCode    string
		wantField   string
	}{
		{desc: "a verification document is signed", body: good, wantStatus: 200},
		{desc: "a trust-score document is signed", body: doc(receipt.ContextScore, "k1", at, resp), wantStatus: 200},
		{desc: "an attested_at 59 s behind certd's clock is signed", body: doc(receipt.ContextVerify, "k1", "2026-11-29T20:59:01Z", sampleResponse("k1", "2026-11-29T20:59:01Z", 256)), wantStatus: 200},
		{desc: "an attested_at 59 s ahead in another zone is signed", body: doc(receipt.ContextVerify, "k1", "2026-11-29T22:00:59+01:00", sampleResponse("k1", "2026-11-29T21:00:59Z", 256)), wantStatus: 200},
		// attested_at is pinned to certd's clock; the times a response
		// states of itself are held to it as verifiers hold them, under
		// either context, so that whoever reaches certd cannot have a
		// score "computed" years ahead signed today. (Before: only
		// attested_at was checked, and a score under the verify context
		// with computed_at 2029 was signed and verified.)
		{desc: "a response whose computed_at is years ahead is refused under the verify context", body: doc(receipt.ContextVerify, "k1", at, bytes.Replace(resp, []byte(`"computed_at":"`+at), []byte(`"computed_at":"2029-11-29T21:00:00Z`), 1)), wantStatus: 422, wantCode: "invalid_request", wantField: "response"},
		{desc: "a response whose computed_at is years ahead is refused under the score context", body: doc(receipt.ContextScore, "k1", at, bytes.Replace(resp, []byte(`"computed_at":"`+at), []byte(`"computed_at":"2029-11-29T21:00:00Z`), 1)), wantStatus: 422, wantCode: "invalid_request", wantField: "response"},
		{desc: "a response whose inputs.window.to is years ahead is refused", body: doc(receipt.ContextVerify, "k1", at, bytes.Replace(resp, []byte(`"computed_at"`), []byte(`"inputs":{"window":{"to":"2029-11-29T21:00:00Z"}},"computed_at"`), 1)), wantStatus: 422, wantCode: "invalid_request", wantField: "response"},
		{desc: "a response whose window ends at attested_at is signed", body: doc(receipt.ContextVerify, "k1", at, bytes.Replace(resp, []byte(`"computed_at"`), []byte(`"inputs":{"window":{"to":"2026-11-29T21:00:00Z"}},"computed_at"`), 1)), wantStatus: 200},
		{desc: "a response whose newest evidence is dated after attested_at is refused", body: doc(receipt.ContextScore, "k1", at, bytes.Replace(resp, []byte(`"computed_at"`), []byte(`"inputs":{"window":{"newest_evidence_at":"2029-11-29T21:00:00Z"}},"computed_at"`), 1)), wantStatus: 422, wantCode: "invalid_request", wantField: "response"},
		{desc: "a response whose evidence is dated at attested_at is signed", body: doc(receipt.ContextScore, "k1", at, bytes.Replace(resp, []byte(`"computed_at"`), []byte(`"inputs":{"window":{"newest_evidence_at":"2026-11-29T21:00:00Z","oldest_evidence_at":null}},"computed_at"`), 1)), wantStatus: 200},
		{desc: "a response whose verified_at is another instant is refused", body: doc(receipt.ContextVerify, "k1", at, bytes.Replace(resp, []byte(`"verified_at":"`+at), []byte(`"verified_at":"2026-11-29T20:59:00Z`), 1)), wantStatus: 422, wantCode: "invalid_request", wantField: "response"},
		{desc: "a trust score without computed_at is refused", body: hand(alg + "," + atM + `,"context":"` + receipt.ContextScore + `",` + kvM + `,"response":{"agent_id":"a1","score":0.5}`), wantStatus: 422, wantCode: "invalid_request", wantField: "response"},
		{desc: "an unknown context is refused", body: doc("json-schema-verifier/other/v1", "k1", at, resp), wantStatus: 422, wantCode: "invalid_request", wantField: "context"},
		{desc: "an empty context is refused", body: hand(alg + "," + atM + `,"context":"",` + kvM + "," + respM), wantStatus: 422, wantCode: "invalid_request", wantField: "context"},
		{desc: "an attested_at 61 s behind certd's clock is refused", body: doc(receipt.ContextVerify, "k1", "2026-11-29T20:58:59Z", resp), wantStatus: 422, wantCode: "invalid_request", wantField: "attested_at"},
		{desc: "an attested_at 61 s ahead of certd's clock is refused", body: doc(receipt.ContextVerify, "k1", "2026-11-29T21:01:01Z", resp), wantStatus: 422, wantCode: "invalid_request", wantField: "attested_at"},
		{desc: "an attested_at that is not RFC 3339 is refused", body: doc(receipt.ContextVerify, "k1", "29/11/2026 21:00", resp), wantStatus: 422, wantCode: "invalid_request", wantField: "attested_at"},
		// time.Parse takes these; verifiers (receipt.ParseTime, and by hand)
		// do not, so the receipt would be signed and never verify.
		{desc: "an attested_at with a comma before the fraction is refused", body: doc(receipt.ContextVerify, "k1", "2026-11-29T21:00:00,5Z", resp), wantStatus: 422, wantCode: "invalid_request", wantField: "attested_at"},
		{desc: "an attested_at with a one-digit hour is refused", body: doc(receipt.ContextVerify, "k1", "2026-11-30T0:00:00+03:00", resp), wantStatus: 422, wantCode: "invalid_request", wantField: "attested_at"},
		{desc: "a missing attested_at is refused", body: hand(alg + "," + ctxM + "," + kvM + "," + respM), wantStatus: 422, wantCode: "invalid_request", wantField: "attested_at"},
		{desc: "a missing key_version is refused", body: hand(alg + "," + atM + "," + ctxM + "," + respM), wantStatus: 422, wantCode: "invalid_request", wantField: "context"},
		{desc: "a missing algorithm is refused", body: hand(atM + "," + ctxM + "," + kvM + "," + respM), wantStatus: 422, wantCode: "invalid_request"},
		{desc: "another algorithm is refused", body: hand(`"algorithm":"ES256",` + atM + "," + ctxM + "," + kvM + "," + respM), wantStatus: 422, wantCode: "invalid_request"},
		{desc: "a response that is an array is refused", body: hand(alg + "," + atM + "," + ctxM + "," + kvM + `,"response":[1,2]`), wantStatus: 422, wantCode: "invalid_request", wantField: "response"},
		{desc: "a missing response is refused", body: hand(alg + "," + atM + "," + ctxM + "," + kvM), wantStatus: 422, wantCode: "invalid_request", wantField: "key_version"},
		{desc: "a response that already carries an attestation is refused", body: hand(alg + "," + atM + "," + ctxM + "," + kvM + `,"response":{"attestation":{},"result":"pass"}`), wantStatus: 422, wantCode: "invalid_request", wantField: "response"},
		{desc: "a response with duplicate keys is refused", body: hand(alg + "," + atM + "," + ctxM + "," + kvM + `,"response":{"a":1,"a":2}`), wantStatus: 422, wantCode: "invalid_request"},
		{desc: "a member after the response is refused", body: hand(alg + "," + atM + "," + ctxM + "," + kvM + "," + respM + `,"zzz":1`), wantStatus: 422, wantCode: "invalid_request", wantField: "response"},
		{desc: "a member between the five is refused", body: hand(alg + "," + atM + "," + ctxM + `,"extra":1,` + kvM + "," + respM), wantStatus: 422, wantCode: "invalid_request", wantField: "context"},
		{desc: "the old envelope framing is refused", body: []byte(`{"attested_at":"` + at + `","context":"` + receipt.ContextVerify + `","key_version":"k1","response":{"result":"pass"}}`), wantStatus: 422, wantCode: "invalid_request"},
		{desc: "whitespace outside strings is refused", body: bytes.Replace(good, []byte(`,"context"`), []byte(`, "context"`), 1), wantStatus: 422, wantCode: "invalid_request"},
		{desc: "a trailing newline is refused", body: append(bytes.Clone(good), '\n'), wantStatus: 422, wantCode: "invalid_request"},
		{desc: "members out of order are refused", body: hand(atM + "," + alg + "," + ctxM + "," + kvM + "," + respM), wantStatus: 422, wantCode: "invalid_request"},
		{desc: "response members out of order are refused", body: hand(alg + "," + atM + "," + ctxM + "," + kvM + `,"response":{"result":"pass","agent_id":null}`), wantStatus: 422, wantCode: "invalid_request"},
		{desc: "a non-canonical number is refused", body: hand(alg + "," + atM + "," + ctxM + "," + kvM + `,"response":{"ratio":1.0}`), wantStatus: 422, wantCode: "invalid_request"},
		{desc: "a needless escape is refused", body: hand(alg + "," + atM + "," + ctxM + "," + kvM + `,"response":{"result":"p\u0061ss"}`), wantStatus: 422, wantCode: "invalid_request"},
		{desc: "an escaped key version is refused", body: hand(alg + "," + atM + "," + ctxM + `,"key_version":"k\"1",` + respM), wantStatus: 422, wantCode: "invalid_request", wantField: "key_version"},
		{desc: "trailing data after the document is refused", body: append(bytes.Clone(good), []byte(`{}`)...), wantStatus: 422, wantCode: "invalid_request"},
		{desc: "a body that is not JSON is refused", body: []byte(`context=x`), wantStatus: 422, wantCode: "invalid_request"},
		{desc: "a body that is not declared JSON is refused", contentType: "text/plain", body: good, wantStatus: 415, wantCode: "unsupported_media_type"},
		{desc: "a body over the size cap is refused", body: doc(receipt.ContextVerify, "k1", at, sampleResponse("k1", at, 70<<10)), wantStatus: 413, wantCode: "payload_too_large"},
		{desc: "GET on the sign path is refused", method: http.MethodGet, wantStatus: 405, wantCode: "method_not_allowed"},
		{desc: "POST on the key path is refused", method: http.MethodPost, path: PathKey, wantStatus: 405, wantCode: "method_not_allowed"},
		{desc: "an unknown path is not found", method: http.MethodGet, path: "/v1/private-key", wantStatus: 404, wantCode: "not_found"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			method, path, ct := tc.method, tc.path, tc.contentType
			if method == "" {
				method = http.MethodPost
			}
			if path == "" {
				path = PathSign
			}
			if ct == "" {
				ct = "application/json"
			}
			status, m := f.raw(t, method, path, ct, "", tc.body)
			if status != tc.wantStatus {
				t.Fatalf("status = %d, want %d (%v)", status, tc.wantStatus, m)
			}
			if tc.wantStatus == 200 {
				if m["key_version"] != "k1" || m["algorithm"] != "Ed25519" {
					t.Fatalf("attestation = %v", m)
				}
				return
			}
			if m["code"] != tc.wantCode || m["charged"] != false || m["status"] != float64(tc.wantStatus) || m["message"] == "" {
				t.Fatalf("error = %v, want code %s in the SPEC §6 shape", m, tc.wantCode)
			}
			if tc.wantField != "" {
				fields, _ := m["fields"].([]any)
				found := false
				for _, fl := range fields {
					if fl.(map[string]any)["field"] == tc.wantField {
						found = true
					}
				}
				if !found {
					t.Fatalf("fields %v do not name %s", fields, tc.wantField)
				}
			}
			// Nothing of the request is echoed back.
			if raw, _ := json.Marshal(m); bytes.Contains(raw, []byte("invoice-42")) || bytes.Contains(raw, []byte("29/11/2026")) || bytes.Contains(raw, []byte("json-schema-verifier/other")) {
				t.Fatalf("the error echoes the request: %s", raw)
			}
		})
	}
}

func TestConfigurableClockSkew(t *testing.T) {
	fixed := time.Date(2026, 11, 29, 21, 0, 0, 0, time.UTC)
	f := start(t, fixtureOpts{now: func() time.Time { return fixed }, skew: 5 * time.Second})
	for _, tc := range []struct {
		desc string
		at   string
		want int
	}{
		{desc: "4 s inside a 5 s window is signed", at: "2026-11-29T21:00:04Z", want: 200},
		{desc: "6 s outside a 5 s window is refused", at: "2026-11-29T20:59:54Z", want: 422},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			body, _ := receipt.SigningInput(receipt.ContextVerify, "k1", tc.at, []byte(`{"result":"pass"}`))
			if status, m := f.raw(t, http.MethodPost, PathSign, "application/json", "", body); status != tc.want {
				t.Fatalf("status = %d, want %d (%v)", status, tc.want, m)
			}
		})
	}
}

func TestBearerSecretOverTCP(t *testing.T) {
	const secret = "s3cret-s3cret-s3cret"
	f := start(t, fixtureOpts{tcp: true, secret: secret})
	for _, tc := range []struct {
		desc   string
		secret string
		path   string
		want   int
	}{
		{desc: "the right secret reads the key", secret: secret, path: PathKey, want: 200},
		{desc: "no secret is refused", path: PathKey, want: 401},
		{desc: "a wrong secret is refused", secret: "s3cret-s3cret-s3creX", path: PathKey, want: 401},
		{desc: "a prefix of the secret is refused", secret: secret[:10], path: PathKey, want: 401},
		{desc: "a wrong secret cannot sign", secret: "nope", path: PathSign, want: 401},
		{desc: "health needs no secret and reveals only liveness", path: PathHealth, want: 200},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			method := http.MethodGet
			if tc.path == PathSign {
				method = http.MethodPost
			}
			status, m := f.raw(t, method, tc.path, "application/json", tc.secret, []byte(`{}`))
			if status != tc.want {
				t.Fatalf("status = %d, want %d (%v)", status, tc.want, m)
			}
			if tc.want == 401 && m["code"] != "unauthorized" {
				t.Fatalf("error = %v", m)
			}
		})
	}
	// The protocol client with a wrong secret reports a fault of ours, not
	// a retryable outage.
	_, err := f.client("wrong-wrong-wrong-wrong").CurrentKey(context.Background())
	var ae *apierr.Error
	if !errors.As(err, &ae) || ae.Code != apierr.CodeInternal || !strings.Contains(err.Error(), "401") {
		t.Fatalf("CurrentKey with a wrong secret: err = %v", err)
	}
}

func TestUnreachableSignerIsUnavailable(t *testing.T) {
	dir := shortDir(t)
	for _, tc := range []struct {
		desc string
		cfg  ClientConfig
	}{
		{desc: "a socket nobody listens on is 503 retryable", cfg: ClientConfig{Socket: filepath.Join(dir, "none.sock")}},
		{desc: "a closed TCP port is 503 retryable", cfg: ClientConfig{URL: "http://" + closedPort(t), Secret: "x"}},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			c := NewClient(tc.cfg)
			ctx := context.Background()
			for name, err := range map[string]error{
				"Ping": c.Ping(ctx),
				"CurrentKey": func() error {
					_, err := c.CurrentKey(ctx)
					return err
				}(),
				"Sign": func() error {
					_, err := c.Sign(ctx, receipt.ContextVerify, "k1", nowString(), []byte(`{}`))
					return err
				}(),
			} {
				var ae *apierr.Error
				if !errors.As(err, &ae) || ae.Code != apierr.CodeUpstreamUnavailable || !ae.Retryable || ae.Status != 503 || !strings.Contains(ae.Message, "signing service") {
					t.Errorf("%s: err = %v, want apierr upstream_unavailable", name, err)
				}
			}
		})
	}
}

func closedPort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func TestHealthWithoutKeys(t *testing.T) {
	f := start(t, fixtureOpts{empty: true})
	c := f.client("")
	var ae *apierr.Error
	if err := c.Ping(context.Background()); !errors.As(err, &ae) || ae.Code != apierr.CodeUpstreamUnavailable {
		t.Fatalf("Ping with no key: err = %v, want unavailable", err)
	}
	if _, err := f.keys.Generate(); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(context.Background()); err != nil {
		t.Fatalf("Ping once a key exists: %v", err)
	}
}

func TestListenUnix(t *testing.T) {
	t.Run("a stale socket file left by a dead certd is replaced", func(t *testing.T) {
		path := filepath.Join(shortDir(t), "s.sock")
		ln, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		ln.(*net.UnixListener).SetUnlinkOnClose(false)
		ln.Close()
		if _, err := os.Stat(path); err != nil {
			t.Fatalf("setup: stale socket missing: %v", err)
		}
		ln2, err := ListenUnix(path)
		if err != nil {
			t.Fatalf("ListenUnix over a stale socket: %v", err)
		}
		ln2.Close()
	})
	t.Run("a socket another process serves on is refused", func(t *testing.T) {
		path := filepath.Join(shortDir(t), "s.sock")
		ln, err := ListenUnix(path)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
		if ln2, err := ListenUnix(path); err == nil || !strings.Contains(err.Error(), "already serving") {
			if ln2 != nil {
				ln2.Close()
			}
			t.Fatalf("second ListenUnix: err = %v, want refusal", err)
		}
	})
	t.Run("a regular file at the socket path is refused and kept", func(t *testing.T) {
		path := filepath.Join(shortDir(t), "s.sock")
		os.WriteFile(path, []byte("data"), 0o600)
		if _, err := ListenUnix(path); err == nil || !strings.Contains(err.Error(), "not a socket") {
			t.Fatalf("err = %v", err)
		}
		if b, _ := os.ReadFile(path); string(b) != "data" {
			t.Fatal("the regular file was removed or changed")
		}
	})
	t.Run("a missing socket directory is created owner-only", func(t *testing.T) {
		dir := filepath.Join(shortDir(t), "run")
		ln, err := ListenUnix(filepath.Join(dir, "s.sock"))
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		fi, _ := os.Stat(dir)
		if fi.Mode().Perm() != 0o700 {
			t.Fatalf("directory mode %04o, want 0700", fi.Mode().Perm())
		}
	})
}

func TestCheckLoopback(t *testing.T) {
	for _, tc := range []struct {
		desc string
		addr string
		ok   bool
	}{
		{desc: "IPv4 loopback is accepted", addr: "127.0.0.1:8091", ok: true},
		{desc: "another 127/8 address is accepted", addr: "127.0.0.2:8091", ok: true},
		{desc: "IPv6 loopback is accepted", addr: "[::1]:8091", ok: true},
		{desc: "localhost is accepted", addr: "localhost:8091", ok: true},
		{desc: "every interface (empty host) is refused", addr: ":8091"},
		{desc: "every interface (0.0.0.0) is refused", addr: "0.0.0.0:8091"},
		{desc: "every interface (::) is refused", addr: "[::]:8091"},
		{desc: "a private network address is refused", addr: "10.0.0.5:8091"},
		{desc: "a host name other than localhost is refused", addr: "certd.internal:8091"},
		{desc: "an address without a port is refused", addr: "127.0.0.1"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			err := CheckLoopback(tc.addr)
			if (err == nil) != tc.ok {
				t.Fatalf("CheckLoopback(%q) = %v, want ok=%v", tc.addr, err, tc.ok)
			}
		})
	}
	if ln, err := ListenTCP("0.0.0.0:0"); err == nil {
		ln.Close()
		t.Fatal("ListenTCP listened on every interface")
	}
}

func TestReadSecretFile(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		desc    string
		content string
		mode    os.FileMode
		want    string
		wantErr string
	}{
		{desc: "an owner-only secret is read and trimmed", content: "  0123456789abcdef0123\n", mode: 0o600, want: "0123456789abcdef0123"},
		{desc: "a secret readable by others is refused with the fix", content: "0123456789abcdef0123", mode: 0o644, wantErr: "chmod 600"},
		{desc: "a short secret is refused", content: "short\n", mode: 0o600, wantErr: "at least 16"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			path := filepath.Join(dir, "secret"+strconv.Itoa(int(tc.mode))+strconv.Itoa(len(tc.content)))
			if err := os.WriteFile(path, []byte(tc.content), tc.mode); err != nil {
				t.Fatal(err)
			}
			os.Chmod(path, tc.mode)
			got, err := ReadSecretFile(path)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				if strings.Contains(err.Error(), strings.TrimSpace(tc.content)) {
					t.Fatal("the error echoes the secret")
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ReadSecretFile = %q, %v", got, err)
			}
		})
	}
}

// A secret file that is not a regular file is refused at once, and so is
// one larger than a secret can be: a named pipe at -sign-secret-file (or
// verifierd's secret or gateway-token file) opened for reading would wait
// for a writer, hanging the start forever, and a device such as /dev/zero
// never ends.
func TestReadSecretFileRefusesWhatIsNotASmallRegularFile(t *testing.T) {
	dir := t.TempDir()
	pipe := filepath.Join(dir, "pipe")
	if err := syscall.Mkfifo(pipe, 0o600); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(dir, "dir")
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, bytes.Repeat([]byte("s"), 5000), 0o600); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{pipe: pipe + " is not a regular file", sub: sub + " is not a regular file", big: "larger than 4096 bytes"} {
		done := make(chan error, 1)
		go func() { _, err := ReadSecretFile(path); done <- err }()
		var err error
		select {
		case err = <-done:
		case <-time.After(3 * time.Second):
			t.Errorf("ReadSecretFile(%s) still waiting after 3 s", path)
			if w, werr := os.OpenFile(path, os.O_WRONLY, 0); werr == nil {
				w.Close()
			}
			err = <-done
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ReadSecretFile(%s) = %v; want a refusal saying %q", path, err, want)
		}
	}
}
