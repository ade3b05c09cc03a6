package server_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/receipt"
	"github.com/aovhq/aov/score"
	"github.com/aovhq/aov/store"
)

// verifyAs records one verification of the SPEC §10 invoice for agent:
// total "129.5" passes, "135.0" fails.
func (f *fixture) verifyAs(t testing.TB, agent, total string, hdr map[string]string) {
	t.Helper()
	body := bytes.Replace(invoice(total, ""), []byte(`"seller-7"`), []byte(strconv.Quote(agent)), 1)
	if w := f.do(http.MethodPost, "/verify/schema", body, hdr); w.Code != http.StatusOK {
		t.Fatalf("setup verification for %s: %d %s", agent, w.Code, w.Body)
	}
}

const wallet = "0x2222222222222222222222222222222222222222"

// viaGateway are the headers of a request the gateway forwarded (for the
// paid score route, which verifierd serves only to the gateway).
var viaGateway = map[string]string{"X-Aov-Gateway-Token": gatewayToken, "X-Aov-Payment": "paid"}

// viaWallet are the gateway's headers for a caller who proved wallet.
var viaWallet = map[string]string{"X-Aov-Gateway-Token": gatewayToken, "X-Aov-Payment": "paid", "X-Aov-Wallet": wallet}

// evidenceOf reads an agent's whole history back as score evidence.
func (f *fixture) evidenceOf(t testing.TB, agent string) []score.Evidence {
	t.Helper()
	var ev []score.Evidence
	cursor := ""
	for {
		vs, next, err := f.db.Verifications(context.Background(), agent, cursor, store.MaxPageSize)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range vs {
			ev = append(ev, score.Evidence{At: v.VerifiedAt, Pass: v.Result == "pass", Authenticated: v.Authenticated})
		}
		if next == "" {
			return ev
		}
		cursor = next
	}
}

func TestScore(t *testing.T) {
	f := newFixture(t, fixtureOpts{noSync: true})
	keys := f.keySet(t)
	// The wallet's own agent: 4 authenticated passes, 1 authenticated
	// fail, and 2 passes and 1 fail sent under its address by callers who
	// proved nothing (recorded, but not evidence: the address owns its id).
	for _, total := range []string{"129.5", "129.5", "135.0", "129.5", "129.5"} {
		f.verifyAs(t, wallet, total, viaWallet)
	}
	for _, total := range []string{"129.5", "135.0", "129.5"} {
		f.verifyAs(t, wallet, total, nil)
	}
	for range 3 {
		f.verifyAs(t, "few-passes", "129.5", nil)
	}
	for range 30 {
		f.verifyAs(t, "many-passes", "129.5", nil)
	}
	f.verifyAs(t, "test-demo", "129.5", nil)

	get := func(t *testing.T, agent string) map[string]any {
		t.Helper()
		w := f.do(http.MethodGet, "/score/"+agent, nil, viaGateway)
		if w.Code != http.StatusOK {
			t.Fatalf("status %d: %s", w.Code, w.Body)
		}
		if cc := w.Header().Get("Cache-Control"); cc != "no-store" {
			t.Errorf("Cache-Control %q", cc)
		}
		if err := receipt.VerifyReceipt(w.Body.Bytes(), keys, ""); err != nil {
			t.Fatalf("score receipt does not verify under the inferred context: %v", err)
		}
		return decode(t, w)
	}

	t.Run("a score receipt verifies against the agent card under the trust-score context and no other", func(t *testing.T) {
		w := f.do(http.MethodGet, "/score/"+wallet, nil, viaGateway)
		v, err := receipt.Verify(w.Body.Bytes(), keys, "")
		if err != nil || v.Context != receipt.ContextScore {
			t.Fatalf("inferred context %q, %v; want %s", v.Context, err, receipt.ContextScore)
		}
		if err := receipt.VerifyReceipt(w.Body.Bytes(), keys, receipt.ContextVerify); !errors.Is(err, receipt.ErrSignature) {
			t.Fatalf("verifies under the verification context too: %v", err)
		}
		tampered := bytes.Replace(w.Body.Bytes(), []byte(`"score":`), []byte(`"score":1,"x":`), 1)
		if err := receipt.VerifyReceipt(tampered, keys, ""); err == nil {
			t.Fatal("a changed score still verifies")
		}
	})

	t.Run("the document carries the score, the method, its inputs, counts apart by authentication, and the verify block", func(t *testing.T) {
		doc := get(t, wallet)
		wantKeys := []string{"agent_id", "score", "method", "inputs", "counts", "computed_at", "verify", "attestation"}
		if got := keysOf(doc); !reflect.DeepEqual(got, sorted(wantKeys)) {
			t.Fatalf("keys %v, want %v", got, sorted(wantKeys))
		}
		if doc["agent_id"] != wallet {
			t.Errorf("agent_id %v", doc["agent_id"])
		}
		counts := doc["counts"].(map[string]any)
		wantCounts := map[string]any{
			"authenticated":   map[string]any{"pass": 4.0, "fail": 1.0},
			"unauthenticated": map[string]any{"pass": 2.0, "fail": 1.0},
			"total":           8.0,
		}
		if !reflect.DeepEqual(counts, wantCounts) {
			t.Errorf("counts %v, want %v", counts, wantCounts)
		}
		method := doc["method"].(map[string]any)
		if method["name"] != score.MethodName || method["version"] != score.MethodVersion {
			t.Errorf("method %v", method)
		}
		if p := method["params"].(map[string]any); p["half_life_days"] != 30.0 || p["unauthenticated_weight"] != 0.5 || p["z"] != 1.96 {
			t.Errorf("params %v", p)
		}
		// The score is the method's over the recorded history at computed_at.
		at, err := time.Parse(time.RFC3339Nano, doc["computed_at"].(string))
		if err != nil {
			t.Fatal(err)
		}
		want := score.Default().Score(at, true, f.evidenceOf(t, wallet))
		if doc["score"] != want.Score {
			t.Errorf("score %v, want %v", doc["score"], want.Score)
		}
		in := doc["inputs"].(map[string]any)
		if c := in["counts"].(map[string]any); c["authenticated_pass"] != 4.0 || c["authenticated_fail"] != 1.0 || c["unauthenticated_pass"] != 0.0 || c["unauthenticated_fail"] != 0.0 {
			t.Errorf("window counts %v, want the owner's 4 passes and 1 fail only", c)
		}
		if d := in["decayed"].(map[string]any); d["evidence"] != want.Decayed.Evidence || !(d["evidence"].(float64) > 4.9 && d["evidence"].(float64) <= 5) {
			t.Errorf("decayed %v, want evidence %v (5 authenticated)", d, want.Decayed.Evidence)
		}
		win := in["window"].(map[string]any)
		if in["owned"] != true || win["records"] != 5.0 || win["not_counted"] != 3.0 || win["truncated"] != false || win["to"] != doc["computed_at"] || win["newest_evidence_at"] == nil {
			t.Errorf("owned %v, window %v", in["owned"], win)
		}
		vb := doc["verify"].(map[string]any)
		cur, _ := f.keys.Current()
		if vb["public_key_url"] != baseURL+"/.well-known/agent-card.json" || vb["mcp"] != baseURL+"/mcp" ||
			vb["key_version"] != cur.Version || vb["canonicalization"] != "RFC 8785 (JCS)" || vb["hash_algorithm"] != "SHA-256" {
			t.Errorf("verify block %v", vb)
		}
		if att := doc["attestation"].(map[string]any); att["timestamp"] != doc["computed_at"] || att["key_version"] != cur.Version {
			t.Errorf("attestation %v", att)
		}
	})

	t.Run("3 passes out of 3 score below 30 out of 30, and both above an agent never seen", func(t *testing.T) {
		fewDoc := get(t, "few-passes")
		few, many, none := fewDoc["score"].(float64), get(t, "many-passes")["score"].(float64), get(t, "nobody")["score"].(float64)
		if !(none < few && few < many) {
			t.Fatalf("scores: nobody %v, 3/3 %v, 30/30 %v", none, few, many)
		}
		// Unowned: every label is evidence, at half weight.
		if in := fewDoc["inputs"].(map[string]any); few != 0.280815 || in["owned"] != false || in["window"].(map[string]any)["not_counted"] != 0.0 {
			t.Fatalf("3 labels of an unowned agent: score %v, inputs %v; want 0.280815 from all three", few, in)
		}
	})

	t.Run("an agent never seen gets a signed score of 0 with no evidence", func(t *testing.T) {
		doc := get(t, "nobody")
		win := doc["inputs"].(map[string]any)["window"].(map[string]any)
		if doc["score"] != 0.0 || doc["counts"].(map[string]any)["total"] != 0.0 || win["records"] != 0.0 || win["oldest_evidence_at"] != nil {
			t.Fatalf("document %v", doc)
		}
	})

	t.Run("an agent id with a slash and a space is URL-encoded in the path", func(t *testing.T) {
		f.verifyAs(t, "a/b c", "129.5", nil)
		if doc := get(t, "a%2Fb%20c"); doc["agent_id"] != "a/b c" || doc["counts"].(map[string]any)["total"] != 1.0 {
			t.Fatalf("document %v", doc)
		}
	})

	for _, c := range []struct {
		desc   string
		method string
		path   string
		status int
		code   string
		field  string
	}{
		{"a test- agent never gets a score: 422 naming agent_id", "GET", "/score/test-demo", 422, "invalid_request", "agent_id"},
		{"a test- agent never seen is refused the same way", "GET", "/score/test-nobody", 422, "invalid_request", "agent_id"},
		{"an empty agent id is refused", "GET", "/score/", 422, "invalid_request", "agent_id"},
		{"an agent id over 200 characters is refused", "GET", "/score/" + strings.Repeat("a", 201), 422, "invalid_request", "agent_id"},
		{"POST on a score path is 405", "POST", "/score/seller-7", 405, "method_not_allowed", ""},
	} {
		t.Run(c.desc, func(t *testing.T) {
			w := f.do(c.method, c.path, nil, viaGateway)
			if w.Code != c.status {
				t.Fatalf("status %d, want %d: %s", w.Code, c.status, w.Body)
			}
			doc := decode(t, w)
			if doc["code"] != c.code || doc["charged"] != false {
				t.Fatalf("answer %v", doc)
			}
			if c.field != "" {
				if fl := doc["fields"].([]any)[0].(map[string]any); fl["field"] != c.field {
					t.Fatalf("fields %v", doc["fields"])
				}
			}
			if strings.Contains(w.Body.String(), "test-demo") {
				t.Fatal("the refusal echoes the agent id")
			}
		})
	}

	t.Run("HEAD answers without a body", func(t *testing.T) {
		w := f.do(http.MethodHead, "/score/many-passes", nil, viaGateway)
		if w.Code != 200 || w.Body.Len() != 0 {
			t.Fatalf("%d, %d body bytes", w.Code, w.Body.Len())
		}
	})
}

func TestScoreFollowsKeyRotation(t *testing.T) {
	f := newFixture(t, fixtureOpts{noSync: true})
	f.verifyAs(t, "seller-7", "129.5", nil)
	newKey, err := f.keys.Rotate()
	if err != nil {
		t.Fatal(err)
	}
	w := f.do(http.MethodGet, "/score/seller-7", nil, viaGateway)
	if w.Code != http.StatusOK {
		t.Fatalf("after rotation: %d %s", w.Code, w.Body)
	}
	if kv := decode(t, w)["attestation"].(map[string]any)["key_version"]; kv != newKey.Version {
		t.Fatalf("signed with %v, want %s", kv, newKey.Version)
	}
	if err := receipt.VerifyReceipt(w.Body.Bytes(), f.keySet(t), receipt.ContextScore); err != nil {
		t.Fatal(err)
	}
}

func TestScoreSignerDown(t *testing.T) {
	f := newFixture(t, fixtureOpts{noSync: true})
	f.stopSigner(t)
	w := f.do(http.MethodGet, "/score/seller-7", nil, viaGateway)
	if w.Code != http.StatusServiceUnavailable || decode(t, w)["code"] != "upstream_unavailable" || w.Header().Get("Retry-After") == "" {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
}

func keysOf(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return sorted(out)
}

func sorted(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}
