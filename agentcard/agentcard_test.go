package agentcard

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/testdata"
	"github.com/aovhq/aov/keystore"
	"github.com/aovhq/aov/receipt"
)

type clock struct{ t time.Time }

func (c *clock) Now() time.Time { return c.t }

// history makes a key directory with k1 (compromised), k2 (retired) and k3
// (current).
func history(t *testing.T) (*keystore.Store, *clock) {
	t.Helper()
	c := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	ks, err := keystore.Open(t.TempDir(), keystore.Options{Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ks.Generate(); err != nil {
		t.Fatal(err)
	}
	c.t = c.t.Add(24 * time.Hour)
	if _, err := ks.Rotate(); err != nil {
		t.Fatal(err)
	}
	c.t = c.t.Add(24 * time.Hour)
	if _, err := ks.Rotate(); err != nil {
		t.Fatal(err)
	}
	c.t = c.t.Add(time.Hour)
	if _, err := ks.MarkCompromised("k1", time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)); err != nil {
		t.Fatal(err)
	}
	return ks, c
}

var cfg = Config{Name: "aov-test", BaseURL: "https://verify.example.com/", Version: "1.2.3", Provider: &Provider{Organization: "Example Org", URL: "https://example.com"}}

func buildJSON(t *testing.T, ks *keystore.Store) ([]byte, map[string]any) {
	t.Helper()
	c, err := Build(cfg, ks.List())
	if err != nil {
		t.Fatal(err)
	}
	body, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatal(err)
	}
	return body, m
}

func extensionParams(t *testing.T, m map[string]any) map[string]any {
	t.Helper()
	exts := m["capabilities"].(map[string]any)["extensions"].([]any)
	for _, e := range exts {
		e := e.(map[string]any)
		if e["uri"] == "urn:json-schema-verifier:extension:attestation:v1" {
			return e["params"].(map[string]any)
		}
	}
	t.Fatal("no attestation extension in the card")
	return nil
}

func TestCardListsEveryKeyVersionEverUsed(t *testing.T) {
	ks, _ := history(t)
	body, m := buildJSON(t, ks)

	set, err := receipt.KeysFromCard(body)
	if err != nil {
		t.Fatalf("receipt.KeysFromCard: %v", err)
	}
	if got := set.Versions(); !slices.Equal(got, []string{"k1", "k2", "k3"}) {
		t.Fatalf("KeysFromCard found %v, want k1 k2 k3", got)
	}
	if set.Current() != "k3" {
		t.Fatalf("current = %q, want k3", set.Current())
	}

	params := extensionParams(t, m)
	pubs := params["publicKeys"].([]any)
	want := []struct{ version, status, created, retired, compromised string }{
		{"k1", "compromised", "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z", "2026-01-01T12:00:00Z"},
		{"k2", "retired", "2026-01-02T00:00:00Z", "2026-01-03T00:00:00Z", ""},
		{"k3", "current", "2026-01-03T00:00:00Z", "", ""},
	}
	if len(pubs) != len(want) {
		t.Fatalf("publicKeys has %d entries, want %d", len(pubs), len(want))
	}
	for i, w := range want {
		p := pubs[i].(map[string]any)
		k, _ := ks.Lookup(w.version)
		raw, err := base64.StdEncoding.DecodeString(p["publicKey"].(string))
		if err != nil || len(raw) != 32 || !k.Public.Equal(ed25519.PublicKey(raw)) {
			t.Errorf("%s: publicKey is not the base64 of the raw 32-byte key", w.version)
		}
		str := func(k string) string { s, _ := p[k].(string); return s }
		if str("keyVersion") != w.version || str("algorithm") != "Ed25519" || str("publicKeyEncoding") != "base64" || str("status") != w.status ||
			str("createdAt") != w.created || str("retiredAt") != w.retired || str("compromisedSince") != w.compromised {
			t.Errorf("entry %d = %v, want %+v", i, p, w)
		}
		if _, has := p["retiredAt"]; has != (w.retired != "") {
			t.Errorf("%s: retiredAt present=%v, want it only on retired keys", w.version, has)
		}
	}
	if params["currentKeyVersion"] != "k3" {
		t.Errorf("currentKeyVersion = %v", params["currentKeyVersion"])
	}
}

func TestCardShape(t *testing.T) {
	ks, _ := history(t)
	_, m := buildJSON(t, ks)
	for _, tc := range []struct {
		desc string
		got  any
		want any
	}{
		{desc: "name is the configured service name", got: m["name"], want: "aov-test"},
		{desc: "url is the public base URL without a trailing slash", got: m["url"], want: "https://verify.example.com"},
		{desc: "version is the configured version", got: m["version"], want: "1.2.3"},
		{desc: "provider names the organisation", got: m["provider"].(map[string]any)["organization"], want: "Example Org"},
		{desc: "the service takes JSON", got: m["defaultInputModes"].([]any)[0], want: "application/json"},
		{desc: "the service answers JSON", got: m["defaultOutputModes"].([]any)[0], want: "application/json"},
		{desc: "the first skill is verify_schema", got: m["skills"].([]any)[0].(map[string]any)["id"], want: "verify_schema"},
		{desc: "the second skill is get_verification_record", got: m["skills"].([]any)[1].(map[string]any)["id"], want: "get_verification_record"},
		{desc: "the extension names RFC 8785", got: extensionParams(t, m)["canonicalization"], want: "RFC 8785 (JCS)"},
		{desc: "the extension names SHA-256", got: extensionParams(t, m)["hashAlgorithm"], want: "SHA-256"},
		{desc: "the verify context is the verify-schema attestation", got: extensionParams(t, m)["contexts"].(map[string]any)["verify"], want: "json-schema-verifier/verify-schema-attestation/v1"},
		{desc: "the score context is the trust-score attestation", got: extensionParams(t, m)["contexts"].(map[string]any)["score"], want: "json-schema-verifier/trust-score-attestation/v1"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			if tc.got != tc.want {
				t.Fatalf("got %v, want %v", tc.got, tc.want)
			}
		})
	}
	for _, s := range m["skills"].([]any) {
		s := s.(map[string]any)
		for _, k := range []string{"name", "description"} {
			if v, _ := s[k].(string); v == "" {
				t.Errorf("skill %v has no %s", s["id"], k)
			}
		}
		for _, k := range []string{"tags", "examples"} {
			if v, _ := s[k].([]any); len(v) == 0 {
				t.Errorf("skill %v has no %s", s["id"], k)
			}
		}
	}
	if sd, _ := extensionParams(t, m)["signedDocument"].(string); !strings.Contains(sd, "{context, algorithm, key_version, attested_at, response}") {
		t.Errorf("signedDocument = %q", sd)
	}
}

// The SPEC §5 vectors, copied here as expectations.
var specVectors = []struct{ request, canonical, hash string }{
	{
		`{"task_id":"tv-1","expected_schema":{"type":"object","required":["ok"],"properties":{"ok":{"type":"boolean"}}},"submitted_output":{"ok":true}}`,
		`{"agent_id":null,"bounds":null,"enforce_rules":false,"expected_schema":{"properties":{"ok":{"type":"boolean"}},"required":["ok"],"type":"object"},"rules":null,"strict_content_check":false,"submitted_output":{"ok":true},"task_id":"tv-1"}`,
		"5366542000b4226c5efb411c15ec8f0aac3c63844343997aa1bcc3c585086f97",
	},
	{
		`{"task_id":"tv-2","agent_id":"seller-7","expected_schema":{"type":"object","required":["items","total"],"properties":{"items":{"type":"array","items":{"type":"object","required":["id","price"],"properties":{"id":{"type":"string"},"price":{"type":"number"}}}},"total":{"type":"number"}}},"submitted_output":{"total":30.5,"items":[{"id":"a","price":10.0},{"id":"b","price":20.5}]},"bounds":{"items[].price":{"min":0,"max":100}},"rules":[{"type":"sum_equals","field":"items[].price","equals_field":"total","tolerance":0.01},{"type":"unique","field":"items[].id"}],"enforce_rules":true}`,
		`{"agent_id":"seller-7","bounds":{"items[].price":{"if_present":false,"max":100,"min":0}},"enforce_rules":true,"expected_schema":{"properties":{"items":{"items":{"properties":{"id":{"type":"string"},"price":{"type":"number"}},"required":["id","price"],"type":"object"},"type":"array"},"total":{"type":"number"}},"required":["items","total"],"type":"object"},"rules":[{"equals":null,"equals_field":"total","field":"items[].price","if_present":false,"in_field":null,"other_field":null,"tolerance":0.01,"type":"sum_equals","value":null,"values":null},{"equals":null,"equals_field":null,"field":"items[].id","if_present":false,"in_field":null,"other_field":null,"tolerance":1e-9,"type":"unique","value":null,"values":null}],"strict_content_check":false,"submitted_output":{"items":[{"id":"a","price":10},{"id":"b","price":20.5}],"total":30.5},"task_id":"tv-2"}`,
		"1aa064d21a2c1487d5d319ded6efec48c18dfee45b93f741266b1f491c2e099f",
	},
	{
		`{"task_id":"tv-3","expected_schema":{"type":"object","properties":{"name":{"type":"string"},"n":{"type":"number"}}},"submitted_output":{"n":1.0,"name":"café ✓","z":[1e+21,1e-06]},"strict_content_check":true,"rules":[{"type":"gte","field":"n","value":0,"if_present":true}]}`,
		`{"agent_id":null,"bounds":null,"enforce_rules":false,"expected_schema":{"properties":{"n":{"type":"number"},"name":{"type":"string"}},"type":"object"},"rules":[{"equals":null,"equals_field":null,"field":"n","if_present":true,"in_field":null,"other_field":null,"tolerance":1e-9,"type":"gte","value":0,"values":null}],"strict_content_check":true,"submitted_output":{"n":1,"name":"café ✓","z":[1e+21,0.000001]},"task_id":"tv-3"}`,
		"037abd3fe4643c14e68d9fd57ca93b460c177c5372f058aa2920a2ef120c0432",
	},
}

func TestRequestHashTestVectorsReproduceTheSpec(t *testing.T) {
	ks, _ := history(t)
	body, _ := buildJSON(t, ks)
	var card struct {
		Capabilities struct {
			Extensions []struct {
				Params struct {
					RequestHashTestVectors []TestVector `json:"requestHashTestVectors"`
				} `json:"params"`
			} `json:"extensions"`
		} `json:"capabilities"`
	}
	if err := json.Unmarshal(body, &card); err != nil {
		t.Fatal(err)
	}
	got := card.Capabilities.Extensions[0].Params.RequestHashTestVectors
	if len(got) != len(specVectors) {
		t.Fatalf("card has %d vectors, want %d", len(got), len(specVectors))
	}
	for i, w := range specVectors {
		t.Run(w.hash[:8], func(t *testing.T) {
			g := got[i]
			if string(g.Request) != w.request {
				t.Errorf("request differs from the SPEC:\n got %s\nwant %s", g.Request, w.request)
			}
			if g.Canonical != w.canonical {
				t.Errorf("canonical differs from the SPEC:\n got %s\nwant %s", g.Canonical, w.canonical)
			}
			if g.RequestHash != w.hash {
				t.Errorf("request_hash = %s, want %s", g.RequestHash, w.hash)
			}
		})
	}
}

// TestRequestHashTestVectorsMatchTheSpecDocument reads the vectors out of
// the repository's SPEC.md itself, so a change to the contract cannot leave
// the card behind.
func TestRequestHashTestVectorsMatchTheSpecDocument(t *testing.T) {
	spec, err := os.ReadFile(filepath.Join(testdata.Root(t), "SPEC.md"))
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile("(?s)\\d\\. Request `([^`]+)`\\s+canonical `([^`]+)`\\s+request_hash `([0-9a-f]{64})`")
	found := re.FindAllStringSubmatch(string(spec), -1)
	if len(found) != 3 {
		t.Fatalf("found %d vectors in SPEC.md, want 3", len(found))
	}
	vectors, err := TestVectors()
	if err != nil {
		t.Fatal(err)
	}
	for i, f := range found {
		if string(vectors[i].Request) != f[1] || vectors[i].Canonical != f[2] || vectors[i].RequestHash != f[3] {
			t.Errorf("vector %d differs from SPEC.md", i+1)
		}
	}
}

func TestBuildRefusals(t *testing.T) {
	ks, _ := history(t)
	for _, tc := range []struct {
		desc    string
		cfg     Config
		keys    []keystore.Key
		wantErr string
	}{
		{desc: "a card without a public base URL is refused", cfg: Config{}, keys: ks.List(), wantErr: "base URL"},
		{desc: "a card with no key at all is refused", cfg: cfg, wantErr: "no signing key"},
		{desc: "a key of small order, under which anyone forges receipts, is never published", cfg: cfg, keys: smallOrderKey(ks.List()), wantErr: "key k1: public key is of small order"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			if _, err := Build(tc.cfg, tc.keys); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

// A compromise of the current key whose replacement was refused leaves no
// key current: the card still publishes the history, the mark included,
// with no current version, so verifiers distrust the key at once.
func TestCardWithoutACurrentKeyPublishesTheHistory(t *testing.T) {
	c, err := Build(cfg, mustHistory(t)[:2]) // k1 compromised, k2 retired
	if err != nil {
		t.Fatalf("Build without a current key: %v", err)
	}
	body, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	set, err := receipt.KeysFromCard(body)
	if err != nil || set.Current() != "" || !slices.Equal(set.Versions(), []string{"k1", "k2"}) {
		t.Fatalf("card: current %q, versions %v, %v", set.Current(), set.Versions(), err)
	}
	if !bytes.Contains(body, []byte(`"status":"compromised"`)) {
		t.Errorf("the card does not publish the compromise: %s", body)
	}
}

// smallOrderKey is keys with k1's public key replaced by the identity
// point (01 00…00), as a tampered key index would give it.
func smallOrderKey(keys []keystore.Key) []keystore.Key {
	keys = slices.Clone(keys)
	keys[0].Public = make([]byte, 32)
	keys[0].Public[0] = 1
	return keys
}

func mustHistory(t *testing.T) []keystore.Key {
	ks, _ := history(t)
	return ks.List()
}

// A receipt signed by a retired key still verifies against the card; one
// signed by the compromised key after its compromise does not.
func TestReceiptsVerifyAgainstTheCard(t *testing.T) {
	ks, _ := history(t)
	body, _ := buildJSON(t, ks)
	set, err := receipt.KeysFromCard(body)
	if err != nil {
		t.Fatal(err)
	}
	sign := func(version, at string) []byte {
		k, _ := ks.Lookup(version)
		resp := `{"result":"pass","verified_at":"` + at + `","output_hash":"00","verify":{"key_version":"` + version + `"}}`
		att, err := receipt.Sign(k.Private, receipt.ContextVerify, version, at, []byte(resp))
		if err != nil {
			t.Fatal(err)
		}
		a, _ := json.Marshal(att)
		return []byte(resp[:len(resp)-1] + `,"attestation":` + string(a) + `}`)
	}
	for _, tc := range []struct {
		desc    string
		version string
		at      string
		ok      bool
	}{
		{desc: "a receipt of the current key verifies", version: "k3", at: "2026-01-03T10:00:00.000000+00:00", ok: true},
		{desc: "a receipt of a retired key verifies", version: "k2", at: "2026-01-02T10:00:00.000000+00:00", ok: true},
		{desc: "a receipt of the compromised key from before the compromise verifies", version: "k1", at: "2026-01-01T11:00:00.000000+00:00", ok: true},
		{desc: "a receipt of the compromised key from after the compromise is rejected", version: "k1", at: "2026-01-01T13:00:00.000000+00:00"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			err := receipt.VerifyReceipt(sign(tc.version, tc.at), set, receipt.ContextVerify)
			if tc.ok && err != nil {
				t.Fatalf("VerifyReceipt: %v", err)
			}
			var ce *receipt.CompromisedKeyError
			if !tc.ok && !errors.As(err, &ce) {
				t.Fatalf("VerifyReceipt = %v, want a compromised-key error", err)
			}
		})
	}
}

func TestHandler(t *testing.T) {
	ks, c := history(t)
	h, err := NewHandler(cfg, ks, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	get := func(method string, hdr map[string]string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, "/.well-known/agent-card.json", nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	first := get(http.MethodGet, nil)
	etag := first.Header().Get("ETag")
	for _, tc := range []struct {
		desc string
		ok   bool
	}{
		{desc: "GET answers 200", ok: first.Code == 200},
		{desc: "the card is JSON", ok: first.Header().Get("Content-Type") == "application/json"},
		{desc: "clients may cache it for a minute", ok: first.Header().Get("Cache-Control") == "public, max-age=60"},
		{desc: "it carries a quoted ETag", ok: strings.HasPrefix(etag, `"`) && len(etag) > 10},
		{desc: "the body is the card", ok: json.Valid(first.Body.Bytes()) && strings.Contains(first.Body.String(), `"currentKeyVersion":"k3"`)},
		{desc: "If-None-Match with the ETag answers 304", ok: get(http.MethodGet, map[string]string{"If-None-Match": etag}).Code == 304},
		{desc: "HEAD answers 200 without a body", ok: func() bool { r := get(http.MethodHead, nil); return r.Code == 200 && r.Body.Len() == 0 }()},
		{desc: "POST is not allowed", ok: get(http.MethodPost, nil).Code == 405},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			if !tc.ok {
				t.Fatal("does not hold")
			}
		})
	}

	t.Run("a rotation by another process shows without a restart", func(t *testing.T) {
		operator, err := keystore.Open(ks.Dir(), keystore.Options{Now: c.Now})
		if err != nil {
			t.Fatal(err)
		}
		c.t = c.t.Add(time.Hour)
		if _, err := operator.Rotate(); err != nil {
			t.Fatal(err)
		}
		r := get(http.MethodGet, map[string]string{"If-None-Match": etag})
		if r.Code != 200 || r.Header().Get("ETag") == etag {
			t.Fatalf("after rotation: status %d, ETag %s (was %s)", r.Code, r.Header().Get("ETag"), etag)
		}
		set, err := receipt.KeysFromCard(r.Body.Bytes())
		if err != nil || set.Current() != "k4" || set.Len() != 4 {
			t.Fatalf("after rotation the card has current %q and %d keys (%v)", set.Current(), set.Len(), err)
		}
	})
}

func TestNewHandlerRefusesAStoreWithoutKeys(t *testing.T) {
	ks, err := keystore.Open(t.TempDir(), keystore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewHandler(cfg, ks, 0, nil); err == nil {
		t.Fatal("NewHandler accepted a key directory without keys")
	}
}

// certd's store (CurrentOnly, as certd opens it) after `certd compromise`
// marked the current key and wrote a new key file certd cannot load: the
// card must not go on publishing the compromised key as current. It
// publishes the index as it is on disk (the compromise and the new key,
// public halves only), with no current key while signing stops until the
// file loads: the new key is pending.
func TestCardPublishesACompromiseWhoseNewKeyCannotLoad(t *testing.T) {
	c := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	dir := t.TempDir()
	ks, err := keystore.Open(dir, keystore.Options{Now: c.Now, CurrentOnly: true, Watch: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ks.Close()
	if _, err := ks.Generate(); err != nil {
		t.Fatal(err)
	}
	h, err := NewHandler(cfg, ks, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	operator, err := keystore.Open(dir, keystore.Options{Now: c.Now, PublicOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	c.t = c.t.Add(time.Hour)
	if _, err := operator.MarkCompromised("k1", c.t.Add(-time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "k2.key"), 0o644); err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/.well-known/agent-card.json", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("card: status %d %s", rec.Code, rec.Body)
	}
	set, err := receipt.KeysFromCard(rec.Body.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if set.Current() != "" || !strings.Contains(rec.Body.String(), `"status":"pending"`) {
		t.Errorf("the card publishes %q as current; the index marks k1 compromised and certd cannot sign with k2, so none is and k2 is pending: %s", set.Current(), rec.Body)
	}
	if !strings.Contains(rec.Body.String(), `"status":"compromised"`) {
		t.Errorf("the card does not publish k1's compromise: %s", rec.Body)
	}
	if _, err := ks.Current(); err == nil {
		t.Error("the store offers a key to sign with although k2.key cannot be loaded")
	}
}
