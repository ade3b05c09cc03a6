package main

import (
	"bytes"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/receipt"
	"github.com/aovhq/aov/verify"
)

// derB64 is pub as base64 of its DER SubjectPublicKeyInfo (what OpenSSL
// prints), the form --public-key does not take.
func derB64(t *testing.T, pub ed25519.PublicKey) string {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(der)
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// invoiceRequest is the SPEC §10 worked example (the failing invoice).
const invoiceRequest = `{
  "task_id": "invoice-7731",
  "agent_id": "test-seller-1",
  "expected_schema": {
    "type": "object",
    "required": ["invoice_id", "currency", "line_items", "total"],
    "properties": {
      "invoice_id": {"type": "string", "pattern": "^INV-[0-9]{4}$"},
      "currency": {"enum": ["USD", "EUR"]},
      "line_items": {"type": "array", "minItems": 1, "items": {
        "type": "object", "required": ["sku", "qty", "line_total"],
        "properties": {"sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}, "line_total": {"type": "number", "minimum": 0}}}},
      "total": {"type": "number"}
    }
  },
  "submitted_output": {"invoice_id": "INV-7731", "currency": "USD",
    "line_items": [{"sku": "WIDGET-A", "qty": 3, "line_total": 87.0}, {"sku": "GADGET-B", "qty": 1, "line_total": 42.5}],
    "total": 135.0},
  "rules": [{"type": "sum_equals", "field": "line_items[].line_total", "equals_field": "total"}],
  "enforce_rules": true
}`

var at = time.Date(2026, 11, 29, 21, 22, 28, 123456000, time.UTC)

// signedReceipt runs the real verification pipeline (parse, check, sign)
// over body and returns the response as a client receives it.
func signedReceipt(t *testing.T, body string, priv ed25519.PrivateKey, kv string) []byte {
	t.Helper()
	return signedReceiptAt(t, body, priv, kv, at)
}

// signedReceiptAt is signedReceipt dated when.
func signedReceiptAt(t *testing.T, body string, priv ed25519.PrivateKey, kv string, when time.Time) []byte {
	t.Helper()
	v := verify.New(verify.Config{VerifierVersion: "test"})
	req, err := v.Parse([]byte(body))
	if err != nil {
		t.Fatalf("parsing request: %v", err)
	}
	res := v.Check(req, "5b1f4c9e-8d0a-4f8e-9b3c-2a7d6e1f0c44", when)
	res.Verify = receipt.VerifyBlock{
		PublicKeyURL: "https://verifier.example/.well-known/agent-card.json", KeyVersion: kv,
		Canonicalization: receipt.Canonicalization, HashAlgorithm: receipt.HashAlgorithm,
		Service: "aov", MCP: "https://verifier.example/mcp",
	}
	unsigned, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	att, err := receipt.Sign(priv, receipt.ContextVerify, kv, res.VerifiedAt, unsigned)
	if err != nil {
		t.Fatal(err)
	}
	res.Attestation = &att
	out, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(out, []byte(`"attestation"`)) {
		t.Fatal("the result does not carry its attestation")
	}
	return out
}

func key(b byte) (ed25519.PublicKey, ed25519.PrivateKey) {
	priv := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{b}, ed25519.SeedSize))
	return priv.Public().(ed25519.PublicKey), priv
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

// card builds an agent card listing the given keys (k1 retired, last current).
func card(keys map[string]ed25519.PublicKey, order ...string) []byte {
	var pks []receipt.PublicKey
	for i, v := range order {
		status := receipt.StatusRetired
		if i == len(order)-1 {
			status = receipt.StatusCurrent
		}
		pks = append(pks, receipt.PublicKey{KeyVersion: v, Algorithm: "Ed25519", PublicKey: b64(keys[v]), PublicKeyEncoding: "base64", Status: status, CreatedAt: "2026-01-01T00:00:00Z"})
	}
	c := map[string]any{
		"name": "Agent Output Verifier", "url": "https://verifier.example", "version": "1.0.0", "skills": []any{},
		"capabilities": map[string]any{"extensions": []any{map[string]any{
			"uri": receipt.ExtensionURI, "required": false,
			"params": map[string]any{"publicKeys": pks, "currentKeyVersion": order[len(order)-1]},
		}}},
	}
	b, _ := json.Marshal(c)
	return b
}

func writeFile(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// tamper decodes a receipt, changes it and encodes it again.
func tamper(t *testing.T, r []byte, f func(m map[string]any)) []byte {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(r))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		t.Fatal(err)
	}
	f(m)
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func obj(m map[string]any, k string) map[string]any { return m[k].(map[string]any) }

func TestReceiptVerify(t *testing.T) {
	pub1, priv1 := key(1)
	pub2, priv2 := key(2)
	pubX, _ := key(9)
	dir := t.TempDir()

	genuine := signedReceipt(t, invoiceRequest, priv2, "k2")
	old := signedReceipt(t, invoiceRequest, priv1, "k1")
	twoKeys := writeFile(t, dir, "card.json", card(map[string]ed25519.PublicKey{"k1": pub1, "k2": pub2}, "k1", "k2"))
	onlyK1 := writeFile(t, dir, "card-k1.json", card(map[string]ed25519.PublicKey{"k1": pub1}, "k1"))
	request := writeFile(t, dir, "request.json", []byte(invoiceRequest))
	otherRequest := writeFile(t, dir, "other.json", []byte(strings.Replace(invoiceRequest, `"total": 135.0}`, `"total": 129.5}`, 1)))
	otherHashes, err := verify.ComputeHashes([]byte(strings.Replace(invoiceRequest, `"total": 135.0}`, `"total": 129.5}`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	// A compact receipt has no request_hash: the request members it states
	// are compared one by one. The same output, schema and rules sent with
	// enforce_rules false gets the same three hashes.
	compactRequest := strings.Replace(invoiceRequest, "{", `{"detail": "compact",`, 1)
	compact := signedReceipt(t, strings.Replace(compactRequest, `"enforce_rules": true`, `"enforce_rules": false`, 1), priv2, "k2")
	compactSent := writeFile(t, dir, "compact-sent.json", []byte(strings.Replace(compactRequest, `"enforce_rules": true`, `"enforce_rules": false`, 1)))
	compactEnforced := writeFile(t, dir, "compact-enforced.json", []byte(compactRequest))
	compactOtherTask := writeFile(t, dir, "compact-task.json", []byte(strings.Replace(strings.Replace(compactRequest, `"enforce_rules": true`, `"enforce_rules": false`, 1), `"invoice-7731"`, `"invoice-9"`, 1)))

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/.well-known/agent-card.json":
			w.Header().Set("Content-Type", "application/json")
			w.Write(card(map[string]ed25519.PublicKey{"k1": pub1, "k2": pub2}, "k1", "k2"))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()

	tests := []struct {
		desc    string
		receipt []byte
		args    []string
		code    int
		stdout  string // exact stdout when set
		stderr  string // substring of stderr when set
	}{
		{desc: "a genuine receipt is valid with the bare public key", receipt: genuine, args: []string{"--public-key", b64(pub2)}, code: 0, stdout: "valid\n"},
		{desc: "a genuine receipt is valid against a saved card", receipt: genuine, args: []string{"--card", twoKeys}, code: 0, stdout: "valid\n"},
		{desc: "a genuine receipt is valid against a card served over HTTP", receipt: genuine, args: []string{"--card", srv.URL + "/.well-known/agent-card.json"}, code: 0, stdout: "valid\n"},
		{desc: "an old receipt stays valid after rotation: the card lists k1 and k2", receipt: old, args: []string{"--card", twoKeys}, code: 0, stdout: "valid\n"},
		{desc: "with --request every hash is recomputed and matches", receipt: genuine, args: []string{"--card", twoKeys, "--request", request}, code: 0, stdout: "valid\n"},
		{desc: "the context can be named", receipt: genuine, args: []string{"--card", twoKeys, "--context", "verify"}, code: 0, stdout: "valid\n"},
		{desc: "flags may follow the receipt file", receipt: genuine, args: []string{"RECEIPT", "--card", twoKeys}, code: 0, stdout: "valid\n"},
		{desc: "a changed result is invalid", receipt: tamper(t, genuine, func(m map[string]any) { m["result"] = "pass" }), args: []string{"--card", twoKeys}, code: 1, stdout: "invalid: signature does not match\n"},
		{desc: "a changed output_hash is invalid", receipt: tamper(t, genuine, func(m map[string]any) { m["output_hash"] = otherHashes.Output }), args: []string{"--card", twoKeys}, code: 1, stdout: "invalid: signature does not match\n"},
		{desc: "a changed verify.key_version is invalid", receipt: tamper(t, genuine, func(m map[string]any) { obj(m, "verify")["key_version"] = "k1" }), args: []string{"--card", twoKeys}, code: 1, stdout: "invalid: attestation.key_version k2 differs from verify.key_version k1\n"},
		{desc: "a changed attestation.timestamp is invalid", receipt: tamper(t, genuine, func(m map[string]any) { obj(m, "attestation")["timestamp"] = "2026-11-29T21:22:29.000000+00:00" }), args: []string{"--card", twoKeys}, code: 1, stdout: "invalid: attestation.timestamp 2026-11-29T21:22:29.000000+00:00 is not the instant of verified_at 2026-11-29T21:22:28.123456+00:00\n"},
		{desc: "changed signature bytes are invalid", receipt: tamper(t, genuine, func(m map[string]any) {
			a := obj(m, "attestation")
			sig, _ := base64.StdEncoding.DecodeString(a["signature"].(string))
			sig[63] ^= 0x01
			a["signature"] = b64(sig)
		}), args: []string{"--card", twoKeys}, code: 1, stdout: "invalid: signature does not match\n"},
		{desc: "the wrong public key is invalid", receipt: genuine, args: []string{"--public-key", b64(pubX)}, code: 1, stdout: "invalid: signature does not match\n"},
		{desc: "the wrong context is invalid", receipt: genuine, args: []string{"--card", twoKeys, "--context", "score"}, code: 1, stdout: "invalid: receipt has no computed_at, which every trust score carries\n"},
		{desc: "a key version the card does not list is invalid and named", receipt: genuine, args: []string{"--card", onlyK1}, code: 1, stdout: "invalid: no public key for key_version k2 (the keys given are k1)\n"},
		{desc: "a compact receipt with the request it answers is valid", receipt: compact, args: []string{"--card", twoKeys, "--request", compactSent}, code: 0, stdout: "valid\n"},
		{desc: "a compact receipt made without enforce_rules is invalid for a request that enforced them", receipt: compact, args: []string{"--card", twoKeys, "--request", compactEnforced}, code: 1, stdout: "invalid: enforce_rules differs: receipt has false, request gives true\n"},
		{desc: "a compact receipt of another task is invalid", receipt: compact, args: []string{"--card", twoKeys, "--request", compactOtherTask}, code: 1, stdout: "invalid: task_id differs: receipt has \"invoice-7731\", request gives \"invoice-9\"\n"},
		{desc: "another request's hashes are invalid and both hashes are shown", receipt: genuine, args: []string{"--card", twoKeys, "--request", otherRequest}, code: 1, stdout: "invalid: output_hash differs: receipt has "},
		{desc: "an error response is named as such, with its status, code and message", receipt: mustJSON(t, apierr.UnsupportedMediaType()), args: []string{"--card", twoKeys}, code: 2, stderr: "error: the input is an error response (HTTP 415 unsupported_media_type: " + apierr.UnsupportedMediaType().Message + "), not a receipt: nothing was verified or signed"},
		{desc: "a demand for payment is named as such", receipt: []byte(`{"x402Version":2,"error":"Payment required","resource":{"url":"http://x/score/a"},"accepts":[],"reason":"free_trial_exhausted"}`), args: []string{"--card", twoKeys}, code: 2, stderr: "error: the input is a demand for payment (HTTP 402, reason free_trial_exhausted), not a receipt: pay for the call, then check its answer"},
		{desc: "a receipt without attestation is invalid", receipt: tamper(t, genuine, func(m map[string]any) { delete(m, "attestation") }), args: []string{"--card", twoKeys}, code: 1, stdout: "invalid: receipt has no attestation\n"},
		{desc: "no key at all is a usage error that names the receipt's card", receipt: genuine, args: nil, code: 2, stderr: `need a public key: --card FILE_OR_URL (this receipt says its card is at "https://verifier.example/.well-known/agent-card.json")`},
		{desc: "both --card and --public-key is a usage error", receipt: genuine, args: []string{"--card", twoKeys, "--public-key", b64(pub2)}, code: 2, stderr: "not both"},
		{desc: "an unknown context is a usage error", receipt: genuine, args: []string{"--card", twoKeys, "--context", "payment"}, code: 2, stderr: "--context must be verify or score"},
		{desc: "a public key that is not base64 is a usage error", receipt: genuine, args: []string{"--public-key", "not-a-key!"}, code: 2, stderr: "--public-key: public key is not base64"},
		{desc: "a public key of small order, under which anyone forges receipts, is a usage error", receipt: genuine, args: []string{"--public-key", "AQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}, code: 2, stderr: "--public-key: public key is of small order"},
		{desc: "a card with a public key of small order cannot be checked", receipt: genuine, args: []string{"--card", writeFile(t, dir, "small-order-card.json", card(map[string]ed25519.PublicKey{"k2": make(ed25519.PublicKey, 32)}, "k2"))}, code: 2, stderr: "publicKeys[0]: public key is of small order"},
		{desc: "a DER public key is a usage error that says which form to give", receipt: genuine, args: []string{"--public-key", derB64(t, pub2)}, code: 2, stderr: "public key is 44 bytes, want 32 (this is a PEM or DER SubjectPublicKeyInfo; give base64 of the raw 32-byte key"},
		{desc: "an unknown flag is a usage error with help", receipt: genuine, args: []string{"--cardd", twoKeys}, code: 2, stderr: "Usage:"},
		{desc: "a card that cannot be fetched cannot be checked", receipt: genuine, args: []string{"--card", srv.URL + "/missing"}, code: 2, stderr: "answered HTTP 404\n"},
		{desc: "a card file that does not exist cannot be checked", receipt: genuine, args: []string{"--card", filepath.Join(dir, "nope.json")}, code: 2, stderr: "error: loading the agent card"},
		{desc: "a card without keys cannot be checked", receipt: genuine, args: []string{"--card", request}, code: 2, stderr: "no capabilities.extensions entry"},
		{desc: "a request that is not a verification request cannot be checked", receipt: genuine, args: []string{"--card", twoKeys, "--request", twoKeys}, code: 2, stderr: "recomputing hashes from the request"},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			rf := writeFile(t, t.TempDir(), "receipt.json", tc.receipt)
			args := []string{"receipt", "verify"}
			placed := false
			for _, a := range tc.args {
				if a == "RECEIPT" {
					a, placed = rf, true
				}
				args = append(args, a)
			}
			if !placed {
				args = append(args, rf)
			}
			var stdout, stderr bytes.Buffer
			code := run(args, strings.NewReader(""), &stdout, &stderr)
			if code != tc.code {
				t.Errorf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tc.code, stdout.String(), stderr.String())
			}
			if tc.stdout != "" && !strings.HasPrefix(stdout.String(), tc.stdout) {
				t.Errorf("stdout %q, want %q", stdout.String(), tc.stdout)
			}
			if strings.HasSuffix(tc.stdout, "\n") && stdout.String() != tc.stdout {
				t.Errorf("stdout %q, want exactly %q", stdout.String(), tc.stdout)
			}
			if tc.stderr != "" && !strings.Contains(stderr.String(), tc.stderr) {
				t.Errorf("stderr %q, want it to contain %q", stderr.String(), tc.stderr)
			}
		})
	}
}

func TestReceiptVerifyReadsStandardInput(t *testing.T) {
	pub, priv := key(3)
	r := signedReceipt(t, invoiceRequest, priv, "k1")
	var stdout, stderr bytes.Buffer
	code := run([]string{"receipt", "verify", "--public-key", b64(pub), "-"}, bytes.NewReader(r), &stdout, &stderr)
	if code != 0 || stdout.String() != "valid\n" {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
	}
	code = run([]string{"receipt", "verify", "--public-key", b64(pub), "--request", "-", "-"}, bytes.NewReader(r), &stdout, &stderr)
	if code != 2 || !strings.Contains(stderr.String(), "cannot both come from standard input") {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
}

// `--card -` reads the card from standard input, as "-" does for
// RECEIPT_FILE and --request; two inputs asking for it are a usage error.
// (Before: the command passed no standard input to the card reader and
// panicked.)
func TestReceiptVerifyReadsTheCardFromStandardInput(t *testing.T) {
	pub, priv := key(2)
	dir := t.TempDir()
	r := signedReceipt(t, invoiceRequest, priv, "k2")
	rcpt := writeFile(t, dir, "receipt.json", r)
	req := writeFile(t, dir, "request.json", []byte(invoiceRequest))
	cardJSON := card(map[string]ed25519.PublicKey{"k2": pub}, "k2")
	var stdout, stderr bytes.Buffer
	code := run([]string{"receipt", "verify", "--card", "-", "--request", req, rcpt}, bytes.NewReader(cardJSON), &stdout, &stderr)
	if code != 0 || stdout.String() != "valid\n" {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
	}
	for _, args := range [][]string{
		{"--card", "-", "-"},
		{"--card", "-", "--request", "-", rcpt},
		{"--card", "-", "--request", "-", "-"},
	} {
		stdout.Reset()
		stderr.Reset()
		code := run(append([]string{"receipt", "verify"}, args...), bytes.NewReader(cardJSON), &stdout, &stderr)
		if code != 2 || !strings.Contains(stderr.String(), "cannot both come from standard input") || stdout.Len() != 0 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, stdout.String(), stderr.String())
		}
	}
}

// `aov receipt verify -h` names every time it holds to the signature's
// timestamp. (Before: it named verified_at only, though the command also
// checks a score's computed_at, window and evidence dates.)
func TestReceiptVerifyHelpNamesEveryTimeItChecks(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"receipt", "verify", "-h"}, nil, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
	help := strings.Join(strings.Fields(stdout.String()), " ")
	for _, w := range []string{"verified_at", "computed_at", "inputs.window.to", "inputs.window.from", "oldest_evidence_at", "newest_evidence_at", "only its four members"} {
		if !strings.Contains(help, w) {
			t.Errorf("receipt verify -h does not mention %s:\n%s", w, stdout.String())
		}
	}
}

func TestHelp(t *testing.T) {
	tests := []struct {
		desc string
		args []string
		code int
		out  string // in stdout for code 0, in stderr otherwise
	}{
		{desc: "aov help explains the commands", args: []string{"help"}, code: 0, out: "aov receipt verify [flags] RECEIPT_FILE|-"},
		{desc: "aov -h is the same help", args: []string{"-h"}, code: 0, out: "aov keygen [--out DIR]"},
		{desc: "aov receipt verify -h explains every flag and exit status", args: []string{"receipt", "verify", "-h"}, code: 0, out: "invalid: REASON    (exit 1)"},
		{desc: "aov help receipt verify is the same", args: []string{"help", "receipt", "verify"}, code: 0, out: "--request FILE"},
		{desc: "aov keygen -h explains the files", args: []string{"keygen", "-h"}, code: 0, out: "file mode 0600"},
		{desc: "aov help keygen is the same", args: []string{"help", "keygen"}, code: 0, out: "never overwritten"},
		{desc: "no command at all is a usage error with help", args: nil, code: 2, out: "Usage:"},
		{desc: "an unknown command is a usage error", args: []string{"sign"}, code: 2, out: `unknown command "sign"`},
		{desc: "aov receipt alone names the subcommand", args: []string{"receipt"}, code: 2, out: "missing subcommand"},
		{desc: "an unknown receipt subcommand is a usage error", args: []string{"receipt", "check"}, code: 2, out: `unknown subcommand "check"`},
		{desc: "help on an unknown topic is a usage error", args: []string{"help", "fly"}, code: 2, out: `no help for "fly"`},
		{desc: "two receipt files is a usage error", args: []string{"receipt", "verify", "--public-key", "x", "a", "b"}, code: 2, out: "want exactly one RECEIPT_FILE"},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(tc.args, strings.NewReader(""), &stdout, &stderr)
			if code != tc.code {
				t.Fatalf("exit %d, want %d; stderr %q", code, tc.code, stderr.String())
			}
			got := stdout.String()
			if tc.code != 0 {
				got = stderr.String()
			}
			if !strings.Contains(got, tc.out) {
				t.Errorf("output %q does not contain %q", got, tc.out)
			}
		})
	}
}

func TestKeygen(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "keys")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"keygen", "--out", dir, "--version", "k7"}, nil, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	printed := strings.TrimSpace(stdout.String())
	pub, err := receipt.ParsePublicKey(printed)
	if err != nil {
		t.Fatalf("printed public key %q: %v", printed, err)
	}
	pubFile, err := os.ReadFile(filepath.Join(dir, "k7.pub"))
	if err != nil || strings.TrimSpace(string(pubFile)) != printed {
		t.Fatalf("k7.pub %q (%v), printed %q", pubFile, err, printed)
	}
	st, err := os.Stat(filepath.Join(dir, "k7.key"))
	if err != nil {
		t.Fatal(err)
	}
	if runtime.GOOS != "windows" && st.Mode().Perm() != 0o600 {
		t.Errorf("private key mode %v, want 0600", st.Mode().Perm())
	}
	pemBytes, _ := os.ReadFile(filepath.Join(dir, "k7.key"))
	block, _ := pem.Decode(pemBytes)
	if block == nil || block.Type != "PRIVATE KEY" {
		t.Fatalf("private key file is not PKCS#8 PEM: %q", pemBytes)
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	priv := k.(ed25519.PrivateKey)
	if !priv.Public().(ed25519.PublicKey).Equal(pub) {
		t.Fatal("the private key does not belong to the printed public key")
	}

	// A receipt signed with the new key verifies with the printed key.
	r := writeFile(t, t.TempDir(), "r.json", signedReceipt(t, invoiceRequest, priv, "k7"))
	stdout.Reset()
	if code := run([]string{"receipt", "verify", "--public-key", printed, r}, nil, &stdout, &stderr); code != 0 || stdout.String() != "valid\n" {
		t.Fatalf("exit %d, %q", code, stdout.String())
	}

	// Never overwritten: the same version again is refused and the key kept.
	stderr.Reset()
	if code := run([]string{"keygen", "--out", dir, "--version", "k7"}, nil, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), "refusing to overwrite") {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	again, _ := os.ReadFile(filepath.Join(dir, "k7.key"))
	if !bytes.Equal(again, pemBytes) {
		t.Fatal("the private key was overwritten")
	}
	// A stray public file alone also blocks, and no private key is written.
	writeFile(t, dir, "k8.pub", []byte("x"))
	if code := run([]string{"keygen", "--out", dir, "--version", "k8"}, nil, &stdout, &stderr); code != 2 {
		t.Fatalf("exit %d", code)
	}
	if _, err := os.Stat(filepath.Join(dir, "k8.key")); err == nil {
		t.Fatal("k8.key written beside an existing k8.pub")
	}
}

func TestKeygenRefusesBadLabels(t *testing.T) {
	for _, label := range []string{"", "../k1", "a/b", "..", strings.Repeat("k", 65), "k 1"} {
		t.Run(label, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			dir := t.TempDir()
			if code := run([]string{"keygen", "--out", dir, "--version", label}, nil, &stdout, &stderr); code != 2 {
				t.Fatalf("exit %d", code)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Fatalf("wrote %d files", len(entries))
			}
		})
	}
}

// TestBuiltBinary builds the command and runs it as a user would, to catch
// what an in-process run cannot: the exit status and streams of main.
func TestBuiltBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "aov")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	pub, priv := key(4)
	dir := t.TempDir()
	good := writeFile(t, dir, "good.json", signedReceipt(t, invoiceRequest, priv, "k1"))
	bad := writeFile(t, dir, "bad.json", tamper(t, signedReceipt(t, invoiceRequest, priv, "k1"), func(m map[string]any) { m["result"] = "pass" }))
	request := writeFile(t, dir, "request.json", []byte(invoiceRequest))

	tests := []struct {
		desc   string
		args   []string
		code   int
		stdout string
	}{
		{desc: "a genuine receipt with its request is valid, exit 0", args: []string{"receipt", "verify", "--public-key", b64(pub), "--request", request, good}, code: 0, stdout: "valid\n"},
		{desc: "a tampered receipt is invalid, exit 1", args: []string{"receipt", "verify", "--public-key", b64(pub), bad}, code: 1, stdout: "invalid: signature does not match\n"},
		{desc: "a usage error exits 2", args: []string{"receipt", "verify", good}, code: 2},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			cmd := exec.Command(bin, tc.args...)
			var stdout bytes.Buffer
			cmd.Stdout = &stdout
			err := cmd.Run()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tc.code || (tc.stdout != "" && stdout.String() != tc.stdout) {
				t.Errorf("exit %d stdout %q, want %d %q", code, stdout.String(), tc.code, tc.stdout)
			}
		})
	}
}

func TestOversizedInputsCannotBeChecked(t *testing.T) {
	pub, _ := key(5)
	dir := t.TempDir()
	big := writeFile(t, dir, "big.json", bytes.Repeat([]byte(" "), maxReceiptBytes+1))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write(bytes.Repeat([]byte(" "), maxCardBytes+1))
	}))
	defer srv.Close()
	small := writeFile(t, dir, "r.json", []byte(`{}`))
	tests := []struct {
		desc string
		args []string
		want string
	}{
		{desc: "a receipt over 8 MiB", args: []string{"--public-key", b64(pub), big}, want: "reading the receipt: larger than"},
		{desc: "a card over 1 MiB from a server", args: []string{"--card", srv.URL, small}, want: "sent more than"},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(append([]string{"receipt", "verify"}, tc.args...), nil, &stdout, &stderr)
			if code != 2 || !strings.Contains(stderr.String(), tc.want) {
				t.Fatalf("exit %d stderr %q", code, stderr.String())
			}
		})
	}
}

// FuzzNotAReceipt: whatever the input, the description of a non-receipt
// is one line of printable UTF-8, at most 300 runes per field it quotes.
func FuzzNotAReceipt(f *testing.F) {
	f.Add([]byte(`{"code":"unsupported_media_type","status":415,"message":"m"}`))
	f.Add([]byte(`{"x402Version":2,"accepts":[],"reason":"free_trial_exhausted"}`))
	f.Add([]byte(`{"code":"x","status":500,"message":"a\n\u001b[31mred\ufffd"}`))
	f.Add([]byte(`{"attestation":{},"code":"x","status":500}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		what := notAReceipt(in)
		if !utf8.ValidString(what) {
			t.Fatalf("invalid UTF-8: %q", what)
		}
		for _, r := range what {
			if !unicode.IsPrint(r) {
				t.Fatalf("unprintable %U in %q", r, what)
			}
		}
		if what != "" && bytes.Contains(in, []byte(`"attestation"`)) && json.Valid(in) {
			var m map[string]json.RawMessage
			if json.Unmarshal(in, &m) == nil && m["attestation"] != nil {
				t.Fatalf("a document with an attestation is described as %q", what)
			}
		}
	})
}

// A score "computed" months after its key's retirement, signed with the
// leaked retired key under the verify context (an output_hash member makes
// that the inferred context), is invalid. (Before: computed_at was checked
// under the score context only, and aov printed "valid".)
func TestReceiptVerifyRefusesALateScoreSignedAsAVerification(t *testing.T) {
	pub1, priv1 := key(1)
	dir := t.TempDir()
	cardJSON := []byte(`{"capabilities":{"extensions":[{"uri":"` + receipt.ExtensionURI + `","params":{"publicKeys":[` +
		`{"keyVersion":"k1","algorithm":"Ed25519","publicKey":"` + b64(pub1) + `","publicKeyEncoding":"base64","status":"retired","createdAt":"2026-01-01T00:00:00Z","retiredAt":"2026-06-01T00:00:00Z"}]}}]}}`)
	cardPath := writeFile(t, dir, "card.json", cardJSON)
	const inLife = "2026-05-01T00:00:00Z"
	doc := []byte(`{"output_hash":"","agent_id":"seller-7","score":0.99,"computed_at":"2027-01-15T00:00:00Z","inputs":{"window":{"from":"2026-01-15T00:00:00Z","to":"2027-01-15T00:00:00Z"}},` +
		`"verify":{"public_key_url":"https://verifier.example/.well-known/agent-card.json","key_version":"k1","canonicalization":"RFC 8785 (JCS)","hash_algorithm":"SHA-256","service":"aov","mcp":"https://verifier.example/mcp"}}`)
	att, err := receipt.Sign(priv1, receipt.ContextVerify, "k1", inLife, doc)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(att)
	rcpt := append(append(append([]byte(nil), doc[:len(doc)-1]...), `,"attestation":`...), append(a, '}')...)
	p := writeFile(t, dir, "receipt.json", rcpt)
	var stdout, stderr bytes.Buffer
	code := run([]string{"receipt", "verify", "--card", cardPath, p}, nil, &stdout, &stderr)
	if code != 1 || !strings.Contains(stdout.String(), "is not the instant of computed_at 2027-01-15T00:00:00Z") {
		t.Fatalf("exit %d, stdout %q, stderr %q: a score computed 2027-01-15 signed by k1 (retired 2026-06-01)", code, stdout.String(), stderr.String())
	}
}
