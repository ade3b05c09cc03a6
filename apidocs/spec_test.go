package apidocs

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/aovhq/aov/internal/testdata"
	"github.com/aovhq/aov/verify"
)

// specKeys reads the key list of the SPEC.md paragraph that starts with
// lead: the backticked names in order (`errors[]` is errors, a backticked
// `{…}` shape or any other text is not a key).
func specKeys(t *testing.T, spec, lead string) []string {
	t.Helper()
	i := strings.Index(spec, lead)
	if i < 0 {
		t.Fatalf("SPEC.md has no paragraph starting %q", lead)
	}
	para := spec[i+len(lead):]
	if j := strings.Index(para, "\n\n"); j >= 0 {
		para = para[:j]
	}
	key := regexp.MustCompile(`^([a-z_]+)(\[\])?( \{[^}]*\})?$`)
	var keys []string
	for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(para, -1) {
		if k := key.FindStringSubmatch(m[1]); k != nil {
			keys = append(keys, k[1])
		}
	}
	return keys
}

// topLevelKeys is the member names of a JSON object in the order sent.
func topLevelKeys(t *testing.T, doc []byte) []string {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(doc))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("not an object: %v", err)
	}
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, tok.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

// TestSpecKeyOrderIsTheResultsKeyOrder: the result's key order that the
// contract document states (SPEC §4) is the order the verifier sends, for
// full and compact detail, so the document cannot drift from the product.
func TestSpecKeyOrderIsTheResultsKeyOrder(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(testdata.Root(t), "SPEC.md"))
	if err != nil {
		t.Fatal(err)
	}
	spec := string(b)
	full := specKeys(t, spec, "### The full response (`detail: \"full\"`), in this key order\n\n")
	compact := specKeys(t, spec, "`detail: \"compact\"` keeps only")
	if len(full) < 30 || len(compact) < 10 {
		t.Fatalf("read %d full and %d compact keys from SPEC.md: %v / %v", len(full), len(compact), full, compact)
	}
	body := mustJSON(t, invoiceRequest(135.0))
	for _, tc := range []struct {
		detail string
		want   []string
	}{{verify.DetailFull, full}, {verify.DetailCompact, compact}} {
		got := topLevelKeys(t, signedResult(t, body, tc.detail))
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s result keys\n got %v\nSPEC %v", tc.detail, got, tc.want)
		}
	}
}

// TestSpecWorkedExampleCountsAreTheVerifiers: the counts SPEC §4 and §10
// state for the worked invoice are the verifier's.
func TestSpecWorkedExampleCountsAreTheVerifiers(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(testdata.Root(t), "SPEC.md"))
	if err != nil {
		t.Fatal(err)
	}
	spec := string(b)
	type block struct{ Passed, Total int }
	for _, tc := range []struct {
		total float64
		text  string // as SPEC.md states it
		want  [3]block
	}{
		{135.0, "schema 22/22, integrity 0/1, overall 22/23", [3]block{{22, 22}, {0, 1}, {22, 23}}},
		{129.5, "passes: 22/22, 1/1, 23/23", [3]block{{22, 22}, {1, 1}, {23, 23}}},
	} {
		if !strings.Contains(spec, tc.text) {
			t.Errorf("SPEC.md no longer says %q", tc.text)
		}
		var r struct {
			Schema    block `json:"schema_compliance"`
			Integrity block `json:"integrity_checks"`
			Overall   block `json:"overall"`
		}
		if err := json.Unmarshal(signedResult(t, mustJSON(t, invoiceRequest(tc.total)), verify.DetailFull), &r); err != nil {
			t.Fatal(err)
		}
		if got := [3]block{r.Schema, r.Integrity, r.Overall}; got != tc.want {
			t.Errorf("total %v: the verifier counts %v, SPEC.md says %q", tc.total, got, tc.text)
		}
	}
}

// TestSpecNextActionsAreTheVerifiers: the next_actions SPEC §4 gives for a
// pass and a fail are the ones the verifier sends, byte for byte.
func TestSpecNextActionsAreTheVerifiers(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(testdata.Root(t), "SPEC.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, total := range []float64{129.5, 135.0} {
		var r struct {
			Result      string          `json:"result"`
			NextActions json.RawMessage `json:"next_actions"`
		}
		if err := json.Unmarshal(signedResult(t, mustJSON(t, invoiceRequest(total)), verify.DetailFull), &r); err != nil {
			t.Fatal(err)
		}
		if want := "`" + string(r.NextActions) + "`"; !strings.Contains(string(b), want) {
			t.Errorf("SPEC.md does not give the %s result's next_actions %s", r.Result, want)
		}
	}
}
