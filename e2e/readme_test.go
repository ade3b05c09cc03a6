package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/interop"
	"github.com/aovhq/aov/receipt"
)

// The README's commands are run as written, so they cannot rot: every
// fenced block preceded by a marker line
//
//	<!-- readme-test: GROUP [prelude | background ready=URL] -->
//
// belongs to GROUP, and the blocks of a group run in document order in one
// scratch folder that looks like the repository's top (every top-level
// entry linked, bin/ holding the binaries `make build` makes). Unmarked
// blocks are documentation only and never run.
//
//   - a plain block runs in bash with `set -e`; a js block runs in Node;
//   - a prelude block is put in front of every later block of its group
//     (the variables a reader pastes into each terminal);
//   - a background block is a server a reader starts in another terminal:
//     it keeps running until the group ends, and the next block waits until
//     URL answers;
//   - a `# prints: TEXT` or `// prints: TEXT` comment says what the block's
//     output must contain, in that order.
//
// The stack stands in for `make run`: localhost:8080 and 127.0.0.1:8080 in
// a block are the stack's gateway.
const readmeMarker = "<!-- readme-test:"

type readmeBlock struct {
	group      string
	line       int // of the opening fence, 1-based
	lang       string
	code       string
	prelude    bool
	background bool
	ready      string
}

var (
	fenceOpen = regexp.MustCompile("^(\\s*)```([a-z]*)\\s*$")
	printsRe  = regexp.MustCompile(`(?m)(?:#|//) prints: (.+?)\s*$`)
)

// readmeBlocks parses the marked blocks of the README. A marker not
// followed by a fenced block is an error, so an edit cannot silently
// detach a test from its block.
func readmeBlocks(readme string) ([]readmeBlock, error) {
	lines := strings.Split(readme, "\n")
	var out []readmeBlock
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if !strings.HasPrefix(l, readmeMarker) {
			continue
		}
		spec, ok := strings.CutSuffix(strings.TrimPrefix(l, readmeMarker), "-->")
		fields := strings.Fields(spec)
		if !ok || len(fields) == 0 {
			return nil, fmt.Errorf("README line %d: a marker reads %s GROUP [prelude|background ready=URL] -->", i+1, readmeMarker)
		}
		b := readmeBlock{group: fields[0]}
		for _, f := range fields[1:] {
			switch {
			case f == "prelude":
				b.prelude = true
			case f == "background":
				b.background = true
			case strings.HasPrefix(f, "ready="):
				b.ready = strings.TrimPrefix(f, "ready=")
			default:
				return nil, fmt.Errorf("README line %d: unknown marker option %q", i+1, f)
			}
		}
		if b.background != (b.ready != "") {
			return nil, fmt.Errorf("README line %d: a background block needs ready=URL, and only it", i+1)
		}
		if i+1 >= len(lines) {
			return nil, fmt.Errorf("README line %d: the marker is not followed by a fenced block", i+1)
		}
		m := fenceOpen.FindStringSubmatch(lines[i+1])
		if m == nil {
			return nil, fmt.Errorf("README line %d: the marker is not followed by a fenced block", i+1)
		}
		indent, lang := m[1], m[2]
		switch lang {
		case "sh", "bash":
			lang = "sh"
		case "js":
		default:
			return nil, fmt.Errorf("README line %d: a marked block must be sh or js, not %q", i+2, lang)
		}
		b.line, b.lang = i+2, lang
		var code strings.Builder
		closed := false
		for i += 2; i < len(lines); i++ {
			if strings.TrimSpace(lines[i]) == "```" {
				closed = true
				break
			}
			code.WriteString(strings.TrimPrefix(lines[i], indent))
			code.WriteByte('\n')
		}
		if !closed {
			return nil, fmt.Errorf("README line %d: the block never closes", b.line)
		}
		b.code = code.String()
		out = append(out, b)
	}
	return out, nil
}

func TestReadmeBlocksParse(t *testing.T) {
	doc := strings.Join([]string{
		"text", "```sh", "not run", "```",
		"<!-- readme-test: g prelude -->", "```sh", ": ${A:=1}", "```",
		"1. step", "   <!-- readme-test: g -->", "   ```sh", "   cat <<'EOF'", "   x", "   EOF", "   ```",
		"<!-- readme-test: g background ready=http://$A/ -->", "```js", "run()", "```",
	}, "\n")
	bs, err := readmeBlocks(doc)
	if err != nil {
		t.Fatal(err)
	}
	if len(bs) != 3 || !bs[0].prelude || bs[1].code != "cat <<'EOF'\nx\nEOF\n" || !bs[2].background || bs[2].ready != "http://$A/" || bs[2].lang != "js" {
		t.Fatalf("parsed %+v", bs)
	}
	for _, bad := range []string{
		"<!-- readme-test: g -->\ntext\n```sh\nx\n```",
		"<!-- readme-test: g -->\n```python\nx\n```",
		"<!-- readme-test: g background -->\n```sh\nx\n```",
		"<!-- readme-test: g colour=red -->\n```sh\nx\n```",
		"<!-- readme-test: g -->\n```sh\nx",
	} {
		if _, err := readmeBlocks(bad); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
}

// readmeGroup is what a group needs besides its blocks: the files a
// reader already holds, extra environment, what must be installed, and
// checks of the whole output.
type readmeGroup struct {
	needsPeers bool // the npm peers of interop/ (the official x402 client)
	tools      []string
	setup      func(t *testing.T, s *stack, work string) []string // returns extra environment
	check      func(t *testing.T, work, output string)
}

func TestReadmeSnippetsRunAsWritten(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := readmeBlocks(string(raw))
	if err != nil {
		t.Fatal(err)
	}
	groups := map[string]readmeGroup{
		"quickstart": {tools: []string{"curl", "jq"}},
		"pay-js":     {needsPeers: true},
		"receipt-aov": {
			tools: []string{"curl"},
			setup: func(t *testing.T, s *stack, work string) []string {
				keptReceipt(t, s, work)
				return nil
			},
		},
		"receipt-by-hand": {
			tools: []string{"curl", "jq", "xxd", "openssl", "base64", "sha256sum", "node"},
			setup: func(t *testing.T, s *stack, work string) []string {
				keptReceipt(t, s, work)
				return nil
			},
			check: func(t *testing.T, work, output string) {
				var r struct {
					OutputHash string `json:"output_hash"`
					SchemaHash string `json:"schema_hash"`
					RulesHash  string `json:"rules_hash"`
				}
				b, _ := os.ReadFile(filepath.Join(work, "receipt.json"))
				if err := json.Unmarshal(b, &r); err != nil || r.OutputHash == "" {
					t.Fatalf("receipt.json: %v", err)
				}
				// Each hash twice: recomputed by the reader's pipeline (sha256sum)
				// and printed from the receipt.
				for _, h := range []string{r.OutputHash, r.SchemaHash, r.RulesHash} {
					if strings.Count(output, h) != 2 {
						t.Errorf("the recomputed hashes do not reproduce %s:\n%s", h, output)
					}
				}
			},
		},
		"seller": {
			needsPeers: true,
			tools:      []string{"curl", "jq", "base64", "go"},
			setup: func(t *testing.T, s *stack, work string) []string {
				if err := os.MkdirAll(filepath.Join(work, "data"), 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(work, "data", "gateway-token"), []byte(s.token+"\n"), 0o600); err != nil {
					t.Fatal(err)
				}
				_, port, _ := net.SplitHostPort(freeAddr(t))
				return []string{
					"AOV_URL=" + s.base(),
					"AOV_VERIFIERD_ADDR=" + s.verifierdAddr,
					"SELLER_AGENT_ADDR=" + freeAddr(t),
					"SELLER_PORT=" + port,
					"SELLER_ADMIN_ADDR=" + freeAddr(t),
				}
			},
		},
	}
	byGroup := map[string][]readmeBlock{}
	for _, b := range blocks {
		if _, ok := groups[b.group]; !ok {
			t.Errorf("README line %d: group %q is not one this test knows (add it to the groups here)", b.line, b.group)
		}
		byGroup[b.group] = append(byGroup[b.group], b)
	}
	for name := range groups {
		if len(byGroup[name]) == 0 {
			t.Errorf("no README block is marked %s", readmeMarker+" "+name+" -->")
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	s := newStack(t)
	for _, name := range []string{"quickstart", "pay-js", "receipt-aov", "receipt-by-hand", "seller"} {
		g := groups[name]
		t.Run(name, func(t *testing.T) {
			if g.needsPeers {
				interop.Dir(t, "@x402/fetch", "viem")
			}
			for _, tool := range g.tools {
				if _, err := exec.LookPath(tool); err != nil {
					interop.Missing(t, tool+" is not on PATH; the README's commands use it")
				}
			}
			runReadmeGroup(t, s, g, byGroup[name])
		})
	}
}

// keptReceipt writes what a reader of the receipt sections holds: the
// request they sent (request.json), the answer they kept (receipt.json) and
// the service's public key as a bare base64 file (k1.pub).
func keptReceipt(t *testing.T, s *stack, work string) {
	t.Helper()
	req := example(t, "invoice-fixed.json")
	r := post(t, s.url("/verify/schema"), req)
	if r.status != http.StatusOK {
		t.Fatalf("the fixed invoice: %d %s", r.status, r.body)
	}
	var card struct {
		Capabilities struct {
			Extensions []struct {
				Params struct {
					CurrentKeyVersion string `json:"currentKeyVersion"`
					PublicKeys        []struct {
						KeyVersion string `json:"keyVersion"`
						PublicKey  string `json:"publicKey"`
					} `json:"publicKeys"`
				} `json:"params"`
			} `json:"extensions"`
		} `json:"capabilities"`
	}
	if err := json.Unmarshal(get(t, s.cardURL()).body, &card); err != nil {
		t.Fatal(err)
	}
	pub := ""
	for _, e := range card.Capabilities.Extensions {
		for _, k := range e.Params.PublicKeys {
			if k.KeyVersion == e.Params.CurrentKeyVersion {
				pub = k.PublicKey
			}
		}
	}
	if pub == "" {
		t.Fatal("the card names no current public key")
	}
	for name, b := range map[string][]byte{"request.json": req, "receipt.json": r.body, "k1.pub": []byte(pub + "\n")} {
		if err := os.WriteFile(filepath.Join(work, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// readmeWorkdir makes a folder that looks like the repository's top to the
// commands: every top-level entry linked (the files the commands write
// land beside the links, not in the repository), bin/ with the built
// binaries, and node_modules for a script saved beside interop's.
func readmeWorkdir(t *testing.T) string {
	t.Helper()
	work := t.TempDir()
	entries, err := os.ReadDir(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		switch e.Name() {
		case ".git", "bin", "data":
			continue
		}
		if err := os.Symlink(filepath.Join(repoRoot, e.Name()), filepath.Join(work, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(bin.dir, filepath.Join(work, "bin")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(repoRoot, "interop", "node_modules"), filepath.Join(work, "node_modules")); err != nil {
		t.Fatal(err)
	}
	return work
}

// forStack points a block at the stack instead of make run's fixed port.
func forStack(code string, s *stack) string {
	return strings.NewReplacer("localhost:8080", s.caddyAddr, "127.0.0.1:8080", s.caddyAddr).Replace(code)
}

func runReadmeGroup(t *testing.T, s *stack, g readmeGroup, blocks []readmeBlock) {
	work := readmeWorkdir(t)
	env := append(os.Environ(), "PATH="+bin.dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	if g.setup != nil {
		env = append(env, g.setup(t, s, work)...)
	}
	lookup := func(name string) string {
		for i := len(env) - 1; i >= 0; i-- {
			if k, v, _ := strings.Cut(env[i], "="); k == name {
				return v
			}
		}
		return ""
	}
	command := func(name string, args ...string) *exec.Cmd {
		cmd := exec.Command(name, args...)
		cmd.Dir, cmd.Env = work, env
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		return cmd
	}
	var prelude, all strings.Builder
	// A reader types consecutive shell blocks into one terminal, so they
	// run as one shell (variables carry over); a background block is
	// another terminal and ends that run.
	var pending []readmeBlock
	flush := func() {
		if len(pending) == 0 {
			return
		}
		var script strings.Builder
		script.WriteString("set -e\n" + prelude.String())
		for i, b := range pending {
			fmt.Fprintf(&script, "printf '\\n%s%d\\n'\n%s", blockMark, i, forStack(b.code, s))
		}
		out := runReadmeBlocks(t, pending, command("bash", "-c", script.String()))
		for i, b := range pending {
			checkPrints(t, b, out[i], s)
			all.WriteString(out[i])
		}
		pending = nil
	}
	for i, b := range blocks {
		switch {
		case b.prelude:
			prelude.WriteString(forStack(b.code, s))
		case b.background:
			flush()
			startReadmeServer(t, b, command("bash", "-c", "set -e\n"+prelude.String()+forStack(b.code, s)), os.Expand(b.ready, lookup))
		case b.lang == "js":
			flush()
			script := filepath.Join(work, fmt.Sprintf("readme-%d.mjs", i))
			if err := os.WriteFile(script, []byte(forStack(b.code, s)), 0o600); err != nil {
				t.Fatal(err)
			}
			out := runReadmeBlocks(t, []readmeBlock{b}, command("node", script))
			checkPrints(t, b, out[0], s)
			all.WriteString(out[0])
		default:
			pending = append(pending, b)
		}
	}
	flush()
	if g.check != nil {
		g.check(t, work, all.String())
	}
}

// blockMark starts each block's output in a shell run of several blocks.
const blockMark = "@@readme-block "

// checkPrints fails t unless out shows every `prints:` text of b, in order.
func checkPrints(t *testing.T, b readmeBlock, out string, s *stack) {
	t.Helper()
	rest := out
	for _, m := range printsRe.FindAllStringSubmatch(b.code, -1) {
		want := forStack(m[1], s)
		i := strings.Index(rest, want)
		if i < 0 {
			t.Fatalf("README line %d: the output does not show %q (in this order):\n%s", b.line, want, out)
		}
		rest = rest[i+len(want):]
	}
}

// runReadmeBlocks runs blocks (one, or several as one shell script whose
// blocks print blockMark and their index first) to the end, within a
// deadline, and returns each block's output. A failure fails the test
// naming the block that was running.
func runReadmeBlocks(t *testing.T, blocks []readmeBlock, cmd *exec.Cmd) []string {
	t.Helper()
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(3 * time.Minute):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		err = errors.New("still running after 3 minutes")
	}
	out := make([]string, len(blocks))
	last := 0
	parts := strings.Split(buf.String(), "\n"+blockMark)
	if len(blocks) == 1 && len(parts) == 1 {
		out[0] = parts[0]
	}
	for _, p := range parts[1:] {
		idx, rest, _ := strings.Cut(p, "\n")
		if n, e := strconv.Atoi(idx); e == nil && n < len(blocks) {
			out[n], last = rest, n
		}
	}
	if err != nil {
		b := blocks[last]
		t.Fatalf("README line %d: %v\n--- block ---\n%s--- output ---\n%s", b.line, err, b.code, out[last])
	}
	return out
}

// startReadmeServer starts a background block, stops it (its whole process
// group: `go run` starts a child) when the test ends, and waits until ready
// answers with any HTTP status.
func startReadmeServer(t *testing.T, b readmeBlock, cmd *exec.Cmd, ready string) {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), "server.log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); f.Close(); close(done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		if t.Failed() {
			log, _ := os.ReadFile(logPath)
			t.Logf("---- README line %d server output ----\n%s", b.line, tailLines(string(log), 40))
		}
	})
	deadline := time.Now().Add(3 * time.Minute)
	for {
		select {
		case <-done:
			log, _ := os.ReadFile(logPath)
			t.Fatalf("README line %d: the server exited before %s answered:\n%s", b.line, ready, log)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, ready, nil)
		resp, err := http.DefaultClient.Do(req)
		cancel()
		if err == nil {
			resp.Body.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("README line %d: %s did not answer within 3 minutes: %v", b.line, ready, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func tailLines(s string, n int) string {
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// TestReadmeReceiptByHandRefusesWhatThePackageRefuses runs the README's
// by-hand receipt steps that read only receipt.json and card.json (every
// receipt-by-hand block but fetching the card and recomputing the hashes
// from request.json) on receipts and cards made to fool a reader, and
// wants each one refused exactly when package receipt refuses it: the
// README says those steps are what `aov receipt verify` does, so a receipt
// they verify and the package refuses is a forgery a careful reader takes.
func TestReadmeReceiptByHandRefusesWhatThePackageRefuses(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := readmeBlocks(string(raw))
	if err != nil {
		t.Fatal(err)
	}
	var script strings.Builder
	script.WriteString("set -e\n")
	steps := 0
	for _, b := range blocks {
		if b.group == "receipt-by-hand" && !strings.Contains(b.code, "curl ") && !strings.Contains(b.code, "request.json") {
			script.WriteString(b.code)
			steps++
		}
	}
	if steps < 3 {
		t.Fatalf("found %d by-hand steps that read only receipt.json and card.json", steps)
	}
	for _, tool := range []string{"jq", "xxd", "openssl", "base64", "node"} {
		if _, err := exec.LookPath(tool); err != nil {
			interop.Missing(t, tool+" is not on PATH; the README's by-hand steps use it")
		}
	}
	byHand := func(t *testing.T, receiptJSON, cardJSON []byte) (bool, string) {
		dir := t.TempDir()
		for name, b := range map[string][]byte{"receipt.json": receiptJSON, "card.json": cardJSON} {
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		cmd := exec.Command("bash", "-c", script.String())
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		return err == nil && bytes.Contains(out, []byte("Signature Verified Successfully")), string(out)
	}

	seed := func(b byte) ed25519.PrivateKey {
		return ed25519.NewKeyFromSeed(bytes.Repeat([]byte{b}, ed25519.SeedSize))
	}
	k1, k2 := seed(1), seed(2)
	const at = "2026-11-29T21:22:28.123456+00:00"
	// sign makes a receipt as verifierd does: the response, its attestation
	// spliced in last. The task_id carries a U+FFFD for the surrogate case.
	// signExtra puts extra members (`"score":0,`) in the response it signs.
	// signResponse signs resp (a response without attestation) under the
	// verify context with key version kv at at, whatever resp says.
	signResponse := func(t *testing.T, priv ed25519.PrivateKey, kv, at string, resp []byte) []byte {
		att, err := receipt.Sign(priv, receipt.ContextVerify, kv, at, resp)
		if err != nil {
			t.Fatal(err)
		}
		a, _ := json.Marshal(att)
		return append(append(append(resp[:len(resp)-1:len(resp)-1], `,"attestation":`...), a...), '}')
	}
	// response is verifierd's response; verifiedAt and verifyKV are what
	// its verified_at and verify.key_version say.
	response := func(verifiedAt, verifyKV, extra string) []byte {
		return []byte(`{"summary":{"result":"fail","blocking_checks":["consistency:sum_equals"]},"result":"fail",` + extra +
			`"task_id":"invoice-` + "\uFFFD" + `","output_hash":"` + strings.Repeat("ab", 32) + `","verified_at":"` + verifiedAt + `",` +
			`"verify":{"public_key_url":"https://verifier.example/.well-known/agent-card.json","key_version":"` + verifyKV + `"}}`)
	}
	// score is a trust score whose computed_at and verify.key_version say
	// computedAt and verifyKV; signScore signs one under the score context.
	score := func(computedAt, verifyKV string) []byte {
		return []byte(`{"agent_id":"a1","score":0.75,"inputs":{"window":{"to":"` + computedAt + `"}},"computed_at":"` + computedAt + `",` +
			`"verify":{"key_version":"` + verifyKV + `"}}`)
	}
	signScore := func(t *testing.T, priv ed25519.PrivateKey, kv, at string, resp []byte) []byte {
		att, err := receipt.Sign(priv, receipt.ContextScore, kv, at, resp)
		if err != nil {
			t.Fatal(err)
		}
		a, _ := json.Marshal(att)
		return append(append(append(resp[:len(resp)-1:len(resp)-1], `,"attestation":`...), a...), '}')
	}
	signExtra := func(t *testing.T, priv ed25519.PrivateKey, kv, at, extra string) []byte {
		return signResponse(t, priv, kv, at, response(at, kv, extra))
	}
	sign := func(t *testing.T, priv ed25519.PrivateKey, kv, at string) []byte {
		return signExtra(t, priv, kv, at, "")
	}
	type entry map[string]string
	key := func(kv string, priv ed25519.PrivateKey, status string, times ...string) entry {
		e := entry{"keyVersion": kv, "algorithm": "Ed25519", "publicKeyEncoding": "base64", "status": status,
			"publicKey": base64.StdEncoding.EncodeToString(priv.Public().(ed25519.PublicKey))}
		for i := 0; i+1 < len(times); i += 2 {
			e[times[i]] = times[i+1]
		}
		return e
	}
	card := func(t *testing.T, keys ...entry) []byte {
		b, err := json.Marshal(map[string]any{"name": "Agent Output Verifier", "capabilities": map[string]any{"extensions": []any{
			map[string]any{"uri": "urn:example:other", "params": map[string]any{}},
			map[string]any{"uri": receipt.ExtensionURI, "params": map[string]any{"publicKeys": keys, "currentKeyVersion": "k2"}},
		}}})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	retiredK1 := key("k1", k1, "retired", "createdAt", "2026-01-01T00:00:00Z", "retiredAt", "2026-11-28T21:22:28Z")
	currentK2 := key("k2", k2, "current", "createdAt", "2026-11-28T21:22:28Z")
	good := func(t *testing.T) []byte { return card(t, retiredK1, currentK2) }
	// twin puts members into k2's entry, after its status.
	twin := func(members string) func(t *testing.T) []byte {
		return func(t *testing.T) []byte {
			return bytes.Replace(good(t), []byte(`"status":"current"`), []byte(`"status":"current",`+members), 1)
		}
	}
	genuine := func(t *testing.T) []byte { return sign(t, k2, "k2", at) }
	// weakKey is the base64 of a key given in hex.
	weakKey := func(h string) string {
		b, err := hex.DecodeString(h)
		if err != nil || len(b) != ed25519.PublicKeySize {
			t.Fatalf("weak key %s: %v", h, err)
		}
		return base64.StdEncoding.EncodeToString(b)
	}
	with := func(e entry, member, value string) entry {
		c := maps.Clone(e)
		c[member] = value
		return c
	}

	for _, tc := range []struct {
		desc          string
		receipt, card func(t *testing.T) []byte
		verifies      bool
		refusal       string // what the by-hand steps say when they refuse
	}{
		{
			desc:     "a genuine receipt verifies",
			receipt:  func(t *testing.T) []byte { return sign(t, k2, "k2", at) },
			card:     func(t *testing.T) []byte { return card(t, retiredK1, currentK2) },
			verifies: true,
		},
		{
			desc: "a duplicated member put before the genuine one is refused",
			receipt: func(t *testing.T) []byte {
				return append([]byte(`{"result":"pass","summary":{"result":"pass","blocking_checks":[]},`), sign(t, k2, "k2", at)[1:]...)
			},
			card:    func(t *testing.T) []byte { return card(t, retiredK1, currentK2) },
			refusal: `receipt.json: refused: a member name twice in one object`,
		},
		{
			desc: "a lone surrogate escape in place of the signed U+FFFD is refused",
			receipt: func(t *testing.T) []byte {
				return bytes.Replace(sign(t, k2, "k2", at), []byte("\uFFFD"), []byte(`\ud800`), 1)
			},
			card:    func(t *testing.T) []byte { return card(t, retiredK1, currentK2) },
			refusal: `receipt.json: refused: a lone surrogate escape`,
		},
		{
			desc:    "a receipt of a retired key dated a day after its retirement (a leaked backup) is refused",
			receipt: func(t *testing.T) []byte { return sign(t, k1, "k1", at) },
			card:    func(t *testing.T) []byte { return card(t, retiredK1, currentK2) },
			refusal: `refused: the receipt is dated after its key was retired`,
		},
		{
			desc:     "a receipt of a retired key dated 5 minutes after its retirement verifies",
			receipt:  func(t *testing.T) []byte { return sign(t, k1, "k1", "2026-11-28T23:27:28+02:00") },
			card:     func(t *testing.T) []byte { return card(t, retiredK1, currentK2) },
			verifies: true,
		},
		{
			desc:    "a receipt of a retired key dated a nanosecond past those 5 minutes is refused",
			receipt: func(t *testing.T) []byte { return sign(t, k1, "k1", "2026-11-28T21:27:28.000000001Z") },
			card:    func(t *testing.T) []byte { return card(t, retiredK1, currentK2) },
			refusal: `refused: the receipt is dated after its key was retired`,
		},
		{
			desc:    "a receipt dated more than 5 minutes before its key was created is refused",
			receipt: func(t *testing.T) []byte { return sign(t, k2, "k2", "2026-11-28T21:17:27Z") },
			card:    func(t *testing.T) []byte { return card(t, retiredK1, currentK2) },
			refusal: `refused: the receipt is dated before its key was created`,
		},
		{
			desc:    "a receipt of a key marked compromised with no compromisedSince is refused",
			receipt: func(t *testing.T) []byte { return sign(t, k2, "k2", at) },
			card: func(t *testing.T) []byte {
				return card(t, retiredK1, key("k2", k2, "compromised", "createdAt", "2026-11-28T21:22:28Z"))
			},
			refusal: `refused: the key is marked compromised at the receipt's date`,
		},
		{
			desc:    "a receipt dated at its key's compromisedSince is refused",
			receipt: func(t *testing.T) []byte { return sign(t, k2, "k2", at) },
			card: func(t *testing.T) []byte {
				return card(t, retiredK1, key("k2", k2, "compromised", "createdAt", "2026-11-28T21:22:28Z", "compromisedSince", "2026-11-29T21:22:28.123456Z"))
			},
			refusal: `refused: the key is marked compromised at the receipt's date`,
		},
		{
			desc:    "a receipt dated before its key's compromisedSince verifies",
			receipt: func(t *testing.T) []byte { return sign(t, k2, "k2", at) },
			card: func(t *testing.T) []byte {
				return card(t, retiredK1, key("k2", k2, "compromised", "createdAt", "2026-11-28T21:22:28Z", "compromisedSince", "2026-11-29T21:22:28.123457Z"))
			},
			verifies: true,
		},
		{
			desc:    "a card listing the key twice, once compromised, is refused",
			receipt: func(t *testing.T) []byte { return sign(t, k2, "k2", at) },
			card: func(t *testing.T) []byte {
				return card(t, retiredK1, key("k2", k2, "compromised", "compromisedSince", "2026-01-02T00:00:00Z"), currentK2)
			},
			refusal: `refused: the card lists a key version twice`,
		},
		{
			desc:    "a card whose key entry says status twice is refused",
			receipt: func(t *testing.T) []byte { return sign(t, k2, "k2", at) },
			card: func(t *testing.T) []byte {
				return bytes.Replace(card(t, retiredK1, currentK2), []byte(`"status":"current"`), []byte(`"status":"compromised","status":"current"`), 1)
			},
			refusal: `card.json: refused: a member name twice in one object`,
		},
		// Member names are exact: encoding/json's struct matching took
		// "Status" (and "ſtatus", U+017F) for "status", the last one winning.
		{desc: "a card whose key entry adds Status compromised after status current verifies, as every exact reader says", receipt: genuine, card: twin(`"Status":"compromised"`), verifies: true},
		{desc: "a card whose key entry adds compromisedsince verifies", receipt: genuine, card: twin(`"compromisedsince":"2026-01-02T00:00:00Z"`), verifies: true},
		{desc: "a card whose key entry adds compromiſedSince (U+017F) verifies", receipt: genuine, card: twin(`"compromi` + "\u017f" + `edSince":"2026-01-02T00:00:00Z"`), verifies: true},
		{
			desc: "a card whose key entry says status compromised, then Status current, is refused", receipt: genuine,
			card: func(t *testing.T) []byte {
				return bytes.Replace(good(t), []byte(`"status":"current"`), []byte(`"status":"compromised","Status":"current"`), 1)
			},
			refusal: `refused: the key is marked compromised at the receipt's date`,
		},
		{
			desc: "a card whose key entry spells KeyVersion is refused", receipt: genuine,
			card: func(t *testing.T) []byte {
				return bytes.Replace(good(t), []byte(`"keyVersion":"k2"`), []byte(`"KeyVersion":"k2"`), 1)
			},
			refusal: `refused: a key of the card has no keyVersion`,
		},
		{desc: "a card whose key compromisedSince is not a string is refused", receipt: genuine, card: twin(`"compromisedSince":["2026-01-02T00:00:00Z"]`), refusal: `refused: a key's compromisedSince is not a string`},
		// Every Ed25519 entry is checked, not only the receipt's key.
		{
			desc: "a compromisedSince of 2026-11-31 (Date rolls it to December 1) is refused", receipt: genuine,
			card: func(t *testing.T) []byte {
				return card(t, retiredK1, with(currentK2, "compromisedSince", "2026-11-31T00:00:00Z"))
			},
			refusal: `refused: a time of the receipt or the card is not RFC 3339`,
		},
		{
			desc: "another key's retiredAt of 2026-02-30 is refused", receipt: genuine,
			card: func(t *testing.T) []byte {
				return card(t, with(retiredK1, "retiredAt", "2026-02-30T00:00:00Z"), currentK2)
			},
			refusal: `refused: a time of the receipt or the card is not RFC 3339`,
		},
		{
			desc: "a createdAt at T24:00:00Z is refused", receipt: genuine,
			card: func(t *testing.T) []byte {
				return card(t, retiredK1, with(currentK2, "createdAt", "2026-11-27T24:00:00Z"))
			},
			refusal: `refused: a time of the receipt or the card is not RFC 3339`,
		},
		{
			desc: "a createdAt with a comma before its fraction is refused", receipt: genuine,
			card: func(t *testing.T) []byte {
				return card(t, retiredK1, with(currentK2, "createdAt", "2026-11-28T21:22:28,5Z"))
			},
			refusal: `refused: a time of the receipt or the card is not RFC 3339`,
		},
		{
			desc: "another key's publicKey of 3 bytes is refused", receipt: genuine,
			card:    func(t *testing.T) []byte { return card(t, with(retiredK1, "publicKey", "AAAA"), currentK2) },
			refusal: `refused: a key of the card has no keyVersion or no base64 publicKey of 32 bytes`,
		},
		{
			desc: "a publicKeyEncoding hex is refused", receipt: genuine,
			card:    func(t *testing.T) []byte { return card(t, retiredK1, with(currentK2, "publicKeyEncoding", "hex")) },
			refusal: `refused: a key of the card has no keyVersion or no base64 publicKey of 32 bytes`,
		},
		// A key must be the canonical encoding of a point not of small
		// order, on every entry. (Before: key.mjs never looked at the point,
		// and OpenSSL verified the forgery below under the identity key.)
		{
			desc: "a receipt nobody signed, 01 00…00 ‖ 00…00, under a card key that is the identity point is refused",
			receipt: func(t *testing.T) []byte {
				sig := base64.StdEncoding.EncodeToString(append([]byte{1}, make([]byte, 63)...))
				resp := response(at, "k2", "")
				return append(resp[:len(resp)-1:len(resp)-1], `,"attestation":{"algorithm":"Ed25519","key_version":"k2","timestamp":"`+at+`","signature":"`+sig+`"}}`...)
			},
			card: func(t *testing.T) []byte {
				return card(t, retiredK1, with(currentK2, "publicKey", weakKey("01"+strings.Repeat("00", 31))))
			},
			refusal: `refused: a key of the card is of small order or not a canonical curve point`,
		},
		{
			desc: "another key's publicKey of order 8 is refused", receipt: genuine,
			card: func(t *testing.T) []byte {
				return card(t, with(retiredK1, "publicKey", weakKey("c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a")), currentK2)
			},
			refusal: `refused: a key of the card is of small order or not a canonical curve point`,
		},
		{
			desc: "another key's publicKey encoding y = p + 1 (the identity, not canonically) is refused", receipt: genuine,
			card: func(t *testing.T) []byte {
				return card(t, with(retiredK1, "publicKey", weakKey("ee"+strings.Repeat("ff", 30)+"7f")), currentK2)
			},
			refusal: `refused: a key of the card is of small order or not a canonical curve point`,
		},
		{
			desc: "another key's publicKey that is no curve point (y = 2) is refused", receipt: genuine,
			card: func(t *testing.T) []byte {
				return card(t, with(retiredK1, "publicKey", weakKey("02"+strings.Repeat("00", 31))), currentK2)
			},
			refusal: `refused: a key of the card is of small order or not a canonical curve point`,
		},
		{
			desc: "a card whose publicKeys is one object, not an array, is refused", receipt: genuine,
			card: func(t *testing.T) []byte {
				b, _ := json.Marshal(map[string]any{"capabilities": map[string]any{"extensions": []any{
					map[string]any{"uri": receipt.ExtensionURI, "params": map[string]any{"publicKeys": currentK2}}}}})
				return b
			},
			refusal: `refused: params.publicKeys is not an array`,
		},
		{
			desc: "a receipt whose attestation.algorithm is none is refused",
			receipt: func(t *testing.T) []byte {
				return bytes.Replace(genuine(t), []byte(`"algorithm":"Ed25519"`), []byte(`"algorithm":"none"`), 1)
			},
			card: good, refusal: `refused: attestation.algorithm is not Ed25519`,
		},
		{
			desc: "a signature re-encoded with nonzero pad bits is refused",
			receipt: func(t *testing.T) []byte {
				r := genuine(t)
				i := bytes.Index(r, []byte(`=="`)) - 1 // the last character of the 64 bytes: 4 pad bits
				const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
				r[i] = alphabet[strings.IndexByte(alphabet, r[i])|1]
				return r
			},
			card: good, refusal: `refused: attestation.signature is not standard base64 of 64 bytes`,
		},
		{
			desc: "a signature with a line break inside is refused",
			receipt: func(t *testing.T) []byte {
				return bytes.Replace(genuine(t), []byte(`=="`), []byte(`\n=="`), 1)
			},
			card: good, refusal: `refused: attestation.signature is not standard base64 of 64 bytes`,
		},
		{
			desc: "1e400 in place of the signed 1.7976931348623157e+308 is refused",
			receipt: func(t *testing.T) []byte {
				return bytes.Replace(signExtra(t, k2, "k2", at, `"score":1.7976931348623157e+308,`), []byte(`1.7976931348623157e+308`), []byte(`1e400`), 1)
			},
			card: good, refusal: `receipt.json: refused: a number beyond a double`,
		},
		{
			desc: "1e-400 in place of the signed 0 is refused",
			receipt: func(t *testing.T) []byte {
				return bytes.Replace(signExtra(t, k2, "k2", at, `"score":0,`), []byte(`"score":0,`), []byte(`"score":1e-400,`), 1)
			},
			card: good, refusal: `receipt.json: refused: a number beyond a double`,
		},
		{
			desc: "0e-400, which is 0, verifies where 0 was signed",
			receipt: func(t *testing.T) []byte {
				return bytes.Replace(signExtra(t, k2, "k2", at, `"score":0,`), []byte(`"score":0,`), []byte(`"score":0e-400,`), 1)
			},
			card:     good,
			verifies: true,
		},
		{
			desc:    "a receipt dated with 10 fraction digits verifies, cut to the nanosecond",
			receipt: func(t *testing.T) []byte { return sign(t, k2, "k2", "2026-11-29T21:22:28.1234567891Z") },
			card: func(t *testing.T) []byte {
				return card(t, retiredK1, with(currentK2, "compromisedSince", "2026-11-29T21:22:28.123456790Z"))
			},
			verifies: true,
		},
		{
			desc:    "a receipt dated with 10 fraction digits at its key's compromisedSince, to the nanosecond, is refused",
			receipt: func(t *testing.T) []byte { return sign(t, k2, "k2", "2026-11-29T21:22:28.1234567891Z") },
			card: func(t *testing.T) []byte {
				return card(t, retiredK1, with(currentK2, "compromisedSince", "2026-11-29T21:22:28.123456789Z"))
			},
			refusal: `refused: the key is marked compromised at the receipt's date`,
		},
		// The members Verify checks beyond the signature are signed too, so
		// a leaked retired key can sign any of them: a receipt dated inside
		// its service life must not say it was verified today, or under
		// another key.
		{
			desc: "a retired key's receipt dated in its service life whose verified_at says a year later is refused",
			receipt: func(t *testing.T) []byte {
				return signResponse(t, k1, "k1", "2026-11-28T21:00:00Z", response("2027-11-28T21:00:00Z", "k1", ""))
			},
			card: good, refusal: `refused: verified_at is not the instant of attestation.timestamp`,
		},
		{
			desc: "a receipt whose verified_at is the same instant as its timestamp in another offset verifies",
			receipt: func(t *testing.T) []byte {
				return signResponse(t, k2, "k2", "2026-11-30T03:07:28.123456+05:45", response("2026-11-29T21:22:28.123456Z", "k2", ""))
			},
			card: good, verifies: true,
		},
		{
			desc: "a receipt whose verified_at is null is refused",
			receipt: func(t *testing.T) []byte {
				return signResponse(t, k2, "k2", at, bytes.Replace(response(at, "k2", ""), []byte(`"`+at+`"`), []byte(`null`), 1))
			},
			card: good, refusal: `refused: verified_at is not the instant of attestation.timestamp`,
		},
		{
			desc: "a receipt whose verify.key_version names another key is refused",
			receipt: func(t *testing.T) []byte {
				return signResponse(t, k2, "k2", at, response(at, "k1", ""))
			},
			card: good, refusal: `refused: verify.key_version is not attestation.key_version`,
		},
		{
			desc: "a receipt whose verify is a string is refused",
			receipt: func(t *testing.T) []byte {
				return signResponse(t, k2, "k2", at, []byte(`{"result":"fail","output_hash":"`+strings.Repeat("ab", 32)+`","verified_at":"`+at+`","verify":"k2"}`))
			},
			card: good, refusal: `refused: verify is not an object`,
		},
		{
			desc: "a receipt with no output_hash (a score's shape) signed under the verify context is refused",
			receipt: func(t *testing.T) []byte {
				return signResponse(t, k2, "k2", at, []byte(`{"result":"pass","task_id":"t1","verified_at":"`+at+`","computed_at":"`+at+`","verify":{"key_version":"k2"}}`))
			},
			card: good, refusal: `Signature Verification Failure`,
		},
		{
			desc:    "a trust score receipt, signed under the score context, verifies",
			receipt: func(t *testing.T) []byte { return signScore(t, k2, "k2", at, score(at, "k2")) },
			card:    good, verifies: true,
		},
		{
			desc: "a trust score whose computed_at is the same instant in another offset verifies",
			receipt: func(t *testing.T) []byte {
				return signScore(t, k2, "k2", at, score("2026-11-30T03:07:28.123456+05:45", "k2"))
			},
			card: good, verifies: true,
		},
		// A score's own time is computed_at: a leaked retired key can date
		// its signature inside its service life and the score today.
		// (Before: only verified_at was tied to the timestamp, and this
		// verified.)
		{
			desc: "a retired key's trust score dated in its service life whose computed_at says a year later is refused",
			receipt: func(t *testing.T) []byte {
				return signScore(t, k1, "k1", "2026-11-28T21:00:00Z", score("2027-11-28T21:00:00Z", "k1"))
			},
			card: good, refusal: `refused: computed_at is not the instant of attestation.timestamp`,
		},
		{
			desc: "a retired key's trust score dated in its service life whose window ends a year later is refused",
			receipt: func(t *testing.T) []byte {
				resp := bytes.Replace(score("2026-11-28T21:00:00Z", "k1"), []byte(`"to":"2026-11-28T21:00:00Z"`), []byte(`"to":"2027-11-28T21:00:00Z"`), 1)
				return signScore(t, k1, "k1", "2026-11-28T21:00:00Z", resp)
			},
			card: good, refusal: `refused: inputs.window.to is not the instant of attestation.timestamp`,
		},
		// The key holder picks the context: a score signed as a
		// verification (an output_hash member makes that the inferred
		// context) is held to the same times. (Before: computed_at and
		// inputs.window.to were checked for scores only, and these
		// verified.)
		{
			desc: "a retired key's trust score signed as a verification whose computed_at says a year later is refused",
			receipt: func(t *testing.T) []byte {
				resp := append([]byte(`{"output_hash":"",`), score("2027-11-28T21:00:00Z", "k1")[1:]...)
				return signResponse(t, k1, "k1", "2026-11-28T21:00:00Z", resp)
			},
			card: good, refusal: `refused: computed_at is not the instant of attestation.timestamp`,
		},
		{
			desc: "a retired key's trust score signed as a verification whose window ends a year later is refused",
			receipt: func(t *testing.T) []byte {
				resp := bytes.Replace(score("2026-11-28T21:00:00Z", "k1"), []byte(`"to":"2026-11-28T21:00:00Z"`), []byte(`"to":"2027-11-28T21:00:00Z"`), 1)
				return signResponse(t, k1, "k1", "2026-11-28T21:00:00Z", append([]byte(`{"output_hash":"",`), resp[1:]...))
			},
			card: good, refusal: `refused: inputs.window.to is not the instant of attestation.timestamp`,
		},
		{
			desc: "a trust score signed as a verification at its computed_at verifies",
			receipt: func(t *testing.T) []byte {
				return signResponse(t, k2, "k2", at, append([]byte(`{"output_hash":"",`), score(at, "k2")[1:]...))
			},
			card: good, verifies: true,
		},
		// A score's evidence is never newer than the score. (Before: the
		// evidence dates were not read, and a leaked retired key dated a
		// score in its service life with evidence from a year later.)
		{
			desc: "a trust score with evidence dated up to its computed_at, or none, verifies",
			receipt: func(t *testing.T) []byte {
				resp := bytes.Replace(score(at, "k2"), []byte(`"to":"`), []byte(`"from":"2025-11-29T21:22:28Z","oldest_evidence_at":null,"newest_evidence_at":"2026-11-29T22:22:28.123456+01:00","to":"`), 1)
				return signScore(t, k2, "k2", at, resp)
			},
			card: good, verifies: true,
		},
		{
			desc: "a retired key's trust score dated in its service life whose newest evidence is a year later is refused",
			receipt: func(t *testing.T) []byte {
				resp := bytes.Replace(score("2026-11-28T21:00:00Z", "k1"), []byte(`"to":"`), []byte(`"newest_evidence_at":"2027-11-28T21:00:00Z","to":"`), 1)
				return signScore(t, k1, "k1", "2026-11-28T21:00:00Z", resp)
			},
			card: good, refusal: `refused: inputs.window.newest_evidence_at is more than 5 minutes after attestation.timestamp`,
		},
		// A score signed before the score method left out verifications
		// recorded while it was computed may date one seconds after it.
		// (Before: refused from the first nanosecond, so genuine receipts
		// issued earlier no longer verified.)
		{
			desc: "a trust score whose newest evidence is 2 s after it verifies",
			receipt: func(t *testing.T) []byte {
				resp := bytes.Replace(score(at, "k2"), []byte(`"to":"`), []byte(`"newest_evidence_at":"2026-11-29T21:22:30.123456+00:00","to":"`), 1)
				return signScore(t, k2, "k2", at, resp)
			},
			card: good, verifies: true,
		},
		{
			desc: "a trust score whose oldest evidence is 5 minutes and a nanosecond after it is refused",
			receipt: func(t *testing.T) []byte {
				resp := bytes.Replace(score(at, "k2"), []byte(`"to":"`), []byte(`"oldest_evidence_at":"2026-11-29T21:27:28.123456001Z","to":"`), 1)
				return signScore(t, k2, "k2", at, resp)
			},
			card: good, refusal: `refused: inputs.window.oldest_evidence_at is more than 5 minutes after attestation.timestamp`,
		},
		{
			desc: "a trust score whose window starts after it ends is refused",
			receipt: func(t *testing.T) []byte {
				resp := bytes.Replace(score(at, "k2"), []byte(`"to":"`), []byte(`"from":"2026-11-30T00:00:00Z","to":"`), 1)
				return signScore(t, k2, "k2", at, resp)
			},
			card: good, refusal: `refused: inputs.window.from is more than 5 minutes after attestation.timestamp`,
		},
		// The attestation is not signed: a member beyond its four is the
		// holder's. (Before: ignored, and these verified.)
		{
			desc: "a receipt whose attestation claims verified is refused",
			receipt: func(t *testing.T) []byte {
				g := genuine(t)
				return append(append(g[:len(g)-2:len(g)-2], `,"verified":true}`...), '}')
			},
			card: good, refusal: `refused: attestation has a member other than its four`,
		},
		{
			desc: "a receipt whose attestation names another card is refused",
			receipt: func(t *testing.T) []byte {
				g := genuine(t)
				return append(append(g[:len(g)-2:len(g)-2], `,"public_key_url":"https://evil.example/card.json"}`...), '}')
			},
			card: good, refusal: `refused: attestation has a member other than its four`,
		},
		{
			desc: "a trust score without computed_at is refused",
			receipt: func(t *testing.T) []byte {
				return signScore(t, k2, "k2", at, []byte(`{"agent_id":"a1","score":0.75,"verify":{"key_version":"k2"}}`))
			},
			card: good, refusal: `refused: computed_at is not the instant of attestation.timestamp`,
		},
		{
			desc: "numbers, escapes and member order JSON.parse and Go read alike verify",
			receipt: func(t *testing.T) []byte {
				return signExtra(t, k2, "k2", at, `"n":[1E2,-0,1.0e-7,9007199254740993,-0.0e5,1e21,5e-324,123456789012345678901234567890],`+
					`"s":"a\u2028b\u2029c\u007f\/\u00e9","o":{"b":1,"a":2,"10":3,"9":4,"\ud83d\ude00":6,"\uff61":7,"__proto__":8},`)
			},
			card: good, verifies: true,
		},
		{
			desc:    "a card with two attestation extensions, one per key, verifies",
			receipt: genuine,
			card: func(t *testing.T) []byte {
				b, _ := json.Marshal(map[string]any{"capabilities": map[string]any{"extensions": []any{
					map[string]any{"uri": receipt.ExtensionURI, "params": map[string]any{"publicKeys": []any{retiredK1}}},
					map[string]any{"uri": receipt.ExtensionURI, "params": map[string]any{"publicKeys": []any{currentK2}}, "foo": 1}}}})
				return b
			},
			verifies: true,
		},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			rec, c := tc.receipt(t), tc.card(t)
			keys, pkgErr := receipt.KeysFromCard(c)
			if pkgErr == nil {
				pkgErr = receipt.VerifyReceipt(rec, keys, "")
			}
			if (pkgErr == nil) != tc.verifies {
				t.Fatalf("package receipt: %v; the case wants verified=%v", pkgErr, tc.verifies)
			}
			ok, out := byHand(t, rec, c)
			if ok != tc.verifies {
				t.Fatalf("by hand verified=%v, package receipt says %v:\n%s", ok, pkgErr, out)
			}
			if !ok && !strings.Contains(out, tc.refusal) {
				t.Fatalf("refused, but not by the step that should say %q:\n%s", tc.refusal, out)
			}
		})
	}
}
