package receipt

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// keyMjsBatch runs README's key.mjs (the file given) once for every
// directory under the directory given, in one node process: it imports the
// script afresh in each, with process.exit made to throw, and prints
// "name<TAB>OK" or "name<TAB>REFUSED why".
const keyMjsBatch = `import { readdirSync } from "node:fs";
import { pathToFileURL } from "node:url";
const [dir, script] = process.argv.slice(2);
const write = process.stdout.write.bind(process.stdout);
process.stdout.write = () => true;
let why = "";
console.error = (s) => { why = String(s); };
process.exit = (code) => { throw new Error("exit " + code); };
const out = [];
for (const name of readdirSync(dir).sort()) {
  why = "";
  process.chdir(dir + "/" + name);
  try { await import(pathToFileURL(script).href + "?" + name); out.push(name + "\tOK"); }
  catch (e) { out.push(name + "\tREFUSED " + (why || e.message)); }
}
write(out.join("\n") + "\n");
`

// readmeKeyMjs returns the key.mjs of README's by-hand steps, as written.
func readmeKeyMjs(t *testing.T) string {
	t.Helper()
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(readme), "   cat > key.mjs <<'EOF'\n")
	script, _, ok2 := strings.Cut(rest, "\n   EOF\n")
	if !ok || !ok2 {
		t.Fatal("key.mjs not found in README")
	}
	lines := strings.Split(script, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(l, "   ")
	}
	return strings.Join(lines, "\n") + "\n"
}

// README's key.mjs refuses exactly the receipts Verify refuses for their
// times and attestation: receipts genuinely signed (so only those rules
// decide) with random verified_at, computed_at, output_hash, inputs and
// inputs.window shapes and evidence dates, in every JSON type, with
// offsets, fractions, leap seconds, years 0000 and 9999, and members added
// to the attestation.
func TestReadmeKeyMjsAgreesWithVerifyOnTimes(t *testing.T) {
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node not installed")
	}
	work := t.TempDir()
	script, batch := filepath.Join(work, "key.mjs"), filepath.Join(work, "batch.mjs")
	if err := os.WriteFile(script, []byte(readmeKeyMjs(t)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(batch, []byte(keyMjsBatch), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(work, "receipts")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	pub, priv := seededKey(1)
	card := cardWith("k1", cardKey{version: "k1", status: "current", createdAt: "0000-01-01T00:00:00Z", pub: pub})
	keys := mustKeys(t, card)
	tss := []string{"2026-11-29T21:00:00Z", "2026-11-29T22:00:00+01:00", "0000-01-01T00:00:00+00:00", "9999-12-31T23:59:59.999999999Z"}
	timeVals := func(ts string) []any {
		return []any{"<absent>", nil, ts, "2026-11-29T21:00:00.000+00:00", "2026-11-29T16:00:00-05:00", "2026-11-29T21:00:00.000000001Z",
			"2026-11-29T20:59:59.999999999Z", "2029-01-01T00:00:00Z", "1970-01-01T00:00:00Z", "2016-12-31T23:59:60Z", "0000-01-01T00:00:00Z",
			"0000-01-01T01:00:00+01:00", "9999-12-31T23:59:59.9999999999Z", "9999-12-31T23:59:59.999999999Z", json.Number("1"), "", "yesterday", true, map[string]any{}, []any{},
			"2026-11-29T21:00:00.0000000001Z", "2026-11-29T21:00:00.9999999999Z", "2026-11-29 21:00:00Z"}
	}
	rng := rand.New(rand.NewSource(7))
	pick := func(vs []any) any { return vs[rng.Intn(len(vs))] }
	set := func(m map[string]any, k string, v any) {
		if s, ok := v.(string); ok && s == "<absent>" {
			return
		}
		m[k] = v
	}
	// Evidence dates: none, before the score, a moment after it (scores
	// signed before late evidence was left out), at the 5 minutes allowed
	// and past them, or anything.
	near := []any{"<absent>", nil, "2026-11-29T20:00:00Z", "2026-11-29T21:00:02Z", "2026-11-29T21:05:00Z",
		"2026-11-29T22:05:00+01:00", "2026-11-29T21:05:00.000000001Z", "2026-11-29T21:05:01Z", "10000-01-01T00:00:00Z"}
	goVerdict := map[string]string{}
	const n = 1000
	for i := 0; i < n; i++ {
		ts := tss[rng.Intn(len(tss))]
		tv := timeVals(ts)
		doc := map[string]any{"agent_id": "a1", "score": json.Number("0.5"),
			"verify": map[string]any{"key_version": "k1", "public_key_url": "https://v.example/.well-known/agent-card.json"}}
		if rng.Intn(2) == 0 {
			doc["output_hash"] = ""
		}
		// Mostly the signing instant, so that the checks after the first are reached.
		bias := func() any {
			if rng.Intn(3) > 0 {
				return ts
			}
			return pick(tv)
		}
		evidence := func() any {
			if rng.Intn(3) > 0 {
				return pick(near)
			}
			return pick(tv)
		}
		set(doc, "verified_at", bias())
		set(doc, "computed_at", bias())
		switch rng.Intn(6) {
		case 0:
		case 1:
			doc["inputs"] = nil
		case 2:
			doc["inputs"] = "x"
		case 3:
			doc["inputs"] = map[string]any{"window": pick([]any{nil, []any{}, "w", json.Number("3")})}
		default:
			w := map[string]any{}
			set(w, "to", bias())
			for _, k := range []string{"from", "oldest_evidence_at", "newest_evidence_at"} {
				set(w, k, evidence())
			}
			doc["inputs"] = map[string]any{"window": w, "owned": true}
		}
		resp, err := json.Marshal(doc)
		if err != nil {
			t.Fatal(err)
		}
		ctx := ContextScore
		if _, ok := doc["output_hash"]; ok {
			ctx = ContextVerify
		}
		rec := attach(t, priv, ctx, "k1", ts, resp)
		if rng.Intn(8) == 0 {
			i := bytes.LastIndex(rec, []byte(`}}`))
			rec = append(append(append([]byte(nil), rec[:i]...), pick([]any{`,"verified":true`, `,"Signature":"x"`, `,"__proto__":{}`}).(string)...), rec[i:]...)
		}
		name := fmt.Sprintf("%03d", i)
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		for file, b := range map[string][]byte{"receipt.json": rec, "card.json": card} {
			if err := os.WriteFile(filepath.Join(dir, name, file), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := Verify(rec, keys, ""); err != nil {
			goVerdict[name] = "REFUSED " + err.Error()
		} else {
			goVerdict[name] = "OK"
		}
	}
	out, err := exec.Command("node", batch, dir, script).Output()
	if err != nil {
		t.Fatalf("node: %v", err)
	}
	var diffs []string
	accepted, answered := 0, 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		name, js, _ := strings.Cut(line, "\t")
		g, ok := goVerdict[name]
		if !ok {
			t.Fatalf("node answered for %q, not a receipt", line)
		}
		answered++
		if g == "OK" {
			accepted++
		}
		if (g == "OK") != (js == "OK") {
			b, _ := os.ReadFile(filepath.Join(dir, name, "receipt.json"))
			diffs = append(diffs, fmt.Sprintf("%s\n   Go: %s\n   key.mjs: %s\n   receipt: %s", name, g, js, b))
		}
	}
	if answered != n {
		t.Fatalf("node answered for %d of %d receipts", answered, n)
	}
	if accepted == 0 || accepted == n {
		t.Fatalf("%d of %d receipts accepted: the cases do not reach both outcomes", accepted, n)
	}
	sort.Strings(diffs)
	t.Logf("%d receipts, %d accepted by Go, %d disagreements", n, accepted, len(diffs))
	for _, d := range diffs {
		t.Error(d)
	}
}
