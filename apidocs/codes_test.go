package apidocs

import (
	"encoding/json"
	"flag"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/aovhq/aov/internal/testdata"
)

var (
	codeValue = regexp.MustCompile(`^[a-z][a-z0-9_]*[a-z0-9]$`)
	codeConst = regexp.MustCompile(`^(Reason|reason|Code|code)[A-Z]`)
)

// sentCodes walks every non-test Go file of the module and collects the
// error and payment codes the code base can send: string constants named
// Reason…/Code… (x402's reasons, apierr's codes, the gateway's own), string
// literals given as Code, ErrorReason or InvalidReason of a composite
// literal, and string literals passed to a demand for payment. It returns
// each code with the place it was found.
func sentCodes(t *testing.T) map[string]string {
	t.Helper()
	root := testdata.Root(t)
	found := map[string]string{}
	add := func(fset *token.FileSet, lit ast.Expr) {
		bl, ok := lit.(*ast.BasicLit)
		if !ok || bl.Kind != token.STRING {
			return
		}
		v, err := strconv.Unquote(bl.Value)
		if err != nil || !codeValue.MatchString(v) {
			return
		}
		if _, seen := found[v]; !seen {
			p := fset.Position(bl.Pos())
			rel, _ := filepath.Rel(root, p.Filename)
			found[v] = rel + ":" + strconv.Itoa(p.Line)
		}
	}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case "testdata", "node_modules", ".git":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.ValueSpec:
				for i, name := range n.Names {
					if codeConst.MatchString(name.Name) && i < len(n.Values) {
						add(fset, n.Values[i])
					}
				}
			case *ast.KeyValueExpr:
				if k, ok := n.Key.(*ast.Ident); ok && (k.Name == "Code" || k.Name == "ErrorReason" || k.Name == "InvalidReason") {
					add(fset, n.Value)
				}
			case *ast.CallExpr:
				if sel, ok := n.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "demand" {
					for _, a := range n.Args {
						add(fset, a)
					}
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// internalCodes are sent only between the product's own daemons, never to
// a client, so the client documentation leaves them out.
var internalCodes = map[string]string{
	"stale_key_version": "certd's signing socket answers verifierd with it; verifierd rebuilds the receipt with the current key",
}

func documentedCodes() map[string]bool {
	out := map[string]bool{}
	for _, e := range ErrorCodes {
		out[e.Code] = true
	}
	for _, p := range PaymentCodes {
		out[p.Code] = true
	}
	return out
}

// TestEveryCodeTheServiceSendsIsDocumented fails when a code can be sent
// that the code tables (and so llms.txt, the OpenAPI description, the
// contract and the README) do not name.
func TestEveryCodeTheServiceSendsIsDocumented(t *testing.T) {
	sent := sentCodes(t)
	// The walk must see the codes of every source: apierr, x402 reasons,
	// the gateway's own constants and literals.
	for _, c := range []string{"invalid_request", "internal_error", "invalid_exact_evm_signature", "payment_in_flight", "no_matching_requirements", "upstream_response_too_large", "free_trial_exhausted", "response_unverifiable"} {
		if _, ok := sent[c]; !ok {
			t.Errorf("the source walk did not find %s", c)
		}
	}
	doc := documentedCodes()
	var missing []string
	for c := range internalCodes {
		if _, ok := sent[c]; !ok {
			t.Errorf("internal code %s is no longer sent: drop it from internalCodes", c)
		}
	}
	for c, at := range sent {
		if _, internal := internalCodes[c]; !doc[c] && !internal {
			missing = append(missing, c+" (sent at "+at+")")
		}
	}
	sort.Strings(missing)
	for _, m := range missing {
		t.Errorf("undocumented code %s: add it to ErrorCodes or PaymentCodes in apidocs/codes.go", m)
	}
	seen := map[string]bool{}
	for _, e := range ErrorCodes {
		if seen[e.Code] || e.Status < 400 || e.Meaning == "" {
			t.Errorf("%s: listed twice, or status %d, or no meaning", e.Code, e.Status)
		}
		seen[e.Code] = true
	}
	for _, p := range PaymentCodes {
		if seen[p.Code] || p.Meaning == "" {
			t.Errorf("%s: listed twice or no meaning", p.Code)
		}
		seen[p.Code] = true
	}
}

// TestEveryDocumentNamesEveryCode: llms.txt, the OpenAPI description, the
// contract (SPEC.md) and the README name every code of the tables.
func TestEveryDocumentNamesEveryCode(t *testing.T) {
	root := testdata.Root(t)
	openapi, err := OpenAPI(testService())
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(openapi, &doc); err != nil {
		t.Fatal(err)
	}
	errSchema := doc["components"].(map[string]any)["schemas"].(map[string]any)["Error"].(map[string]any)
	code := errSchema["properties"].(map[string]any)["code"].(map[string]any)
	enum := map[string]bool{}
	for _, c := range code["enum"].([]any) {
		enum[c.(string)] = true
	}
	llms := string(LLMsTxt(testService()))
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	spec, readme := read("SPEC.md"), read("README.md")
	for _, e := range ErrorCodes {
		if !enum[e.Code] {
			t.Errorf("the OpenAPI Error schema's code enum lacks %s", e.Code)
		}
	}
	for c := range documentedCodes() {
		row := "| `" + c + "` |"
		if !strings.Contains(llms, row) {
			t.Errorf("llms.txt has no row for %s", c)
		}
		if !strings.Contains(string(openapi), row) {
			t.Errorf("the OpenAPI description has no row for %s", c)
		}
		if !strings.Contains(spec, row) {
			t.Errorf("SPEC.md has no row for %s", c)
		}
		if !strings.Contains(readme, "`"+c+"`") {
			t.Errorf("README.md does not name %s", c)
		}
	}
	paymentErrors := llms[strings.Index(llms, "\n## Payment errors\n"):]
	for _, p := range PaymentCodes {
		if !strings.Contains(paymentErrors, "| `"+p.Code+"` | "+p.Meaning+" |") {
			t.Errorf("the Payment errors section of llms.txt lacks %s with what to do", p.Code)
		}
	}
}

var update = flag.Bool("update", false, "rewrite the generated code tables of SPEC.md and README.md")

// TestCodeTables: the code tables of SPEC.md and README.md are the ones
// generated from ErrorCodes and PaymentCodes, between their markers; with
// -update the test writes them.
func TestCodeTables(t *testing.T) {
	root := testdata.Root(t)
	tables := map[string]string{"error codes": errorCodeTable(), "payment reasons": paymentCodeTable()}
	for _, doc := range []string{"SPEC.md", "README.md"} {
		path := filepath.Join(root, doc)
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		for name, table := range tables {
			begin := "<!-- generated: " + name + " (go test ./apidocs -run TestCodeTables -update) -->\n"
			end := "<!-- end: " + name + " -->\n"
			i := strings.Index(text, begin)
			j := strings.Index(text, end)
			if i < 0 || j < i || strings.Count(text, begin) != 1 {
				t.Errorf("%s: no single %q … %q section", doc, strings.TrimSpace(begin), strings.TrimSpace(end))
				continue
			}
			if got := text[i+len(begin) : j]; got != table {
				if !*update {
					t.Errorf("%s: the %s table is not the generated one; run go test ./apidocs -run TestCodeTables -update", doc, name)
					continue
				}
				text = text[:i+len(begin)] + table + text[j:]
			}
		}
		if *update && text != string(b) {
			if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}
