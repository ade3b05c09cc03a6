package caddymodule

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	dto "github.com/prometheus/client_model/go"

	"github.com/aovhq/aov/agentcard"
	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/internal/interop"
	"github.com/aovhq/aov/keystore"
	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/receipt"
	"github.com/aovhq/aov/signer"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/verifierd/server"
	"github.com/aovhq/aov/verify"
	"github.com/aovhq/aov/x402"
)

// The seller-mode tests run everything for real: Caddy in process, a
// verifierd handler signing through a real certd signing server (unix
// socket, keys on disk) and recording in Badger, the agent card served
// beside it, the example seller agent as its own process, the devnet
// facilitator for payments, the aov command and the official @x402/fetch
// client.

const verifierToken = "seller-gateway-token-0123456789"

// verifierFixture is a running verification service: verifierd's handler
// and the agent card on one HTTP server, certd's signing server on a unix
// socket.
type verifierFixture struct {
	srv      *httptest.Server
	signer   *http.Server
	db       *store.DB
	cardURL  string
	keyStore *keystore.Store // certd's, behind the signer and the card
	// tokens counts calls that carried the configured gateway token.
	tokens atomic.Int64
	calls  atomic.Int64
	// cards counts fetches of the agent card.
	cards atomic.Int64
	// answerBy is the X-Aov-Answer-By of the last call (Unix ms, 0: none).
	answerBy atomic.Int64
}

func startVerifier(t testing.TB) *verifierFixture {
	t.Helper()
	// Unix socket paths must fit in 108 bytes: a short folder.
	dir, err := os.MkdirTemp("", "vr")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	keys, err := keystore.Open(filepath.Join(dir, "keys"), keystore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := keys.Generate(); err != nil {
		t.Fatal(err)
	}
	f := &verifierFixture{keyStore: keys}
	socket := filepath.Join(dir, "certd.sock")
	ss, err := signer.NewServer(signer.ServerConfig{Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := signer.ListenUnix(socket)
	if err != nil {
		t.Fatal(err)
	}
	f.signer = &http.Server{Handler: ss, ReadHeaderTimeout: 5 * time.Second}
	go f.signer.Serve(ln)
	t.Cleanup(func() { f.signer.Close() })

	if f.db, err = store.Open(filepath.Join(dir, "data"), store.Options{NoSync: true}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.db.Close() })

	mux := http.NewServeMux()
	f.srv = httptest.NewUnstartedServer(mux)
	base := "http://" + f.srv.Listener.Addr().String()
	vs, err := server.New(server.Config{
		Verifier:      verify.New(verify.Config{VerifierVersion: "test"}),
		Signer:        signer.NewClient(signer.ClientConfig{Socket: socket, Timeout: 2 * time.Second}),
		History:       f.db,
		PublicBaseURL: base,
		GatewayToken:  verifierToken,
	})
	if err != nil {
		t.Fatal(err)
	}
	card, err := agentcard.NewHandler(agentcard.Config{BaseURL: base}, keys, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	mux.Handle("/.well-known/agent-card.json", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.cards.Add(1)
		card.ServeHTTP(w, r)
	}))
	mux.Handle("/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.calls.Add(1)
		if r.Header.Get(server.HeaderGatewayToken) == verifierToken {
			f.tokens.Add(1)
		}
		ms, _ := strconv.ParseInt(r.Header.Get(server.HeaderAnswerBy), 10, 64)
		f.answerBy.Store(ms)
		vs.ServeHTTP(w, r)
	}))
	f.srv.Start()
	t.Cleanup(f.srv.Close)
	f.cardURL = base + "/.well-known/agent-card.json"
	return f
}

// keys fetches the served agent card, as a receipt holder would.
func (f *verifierFixture) keys(t testing.TB) receipt.KeySet {
	t.Helper()
	resp, err := testClient.Get(f.cardURL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	card, _ := io.ReadAll(resp.Body)
	ks, err := receipt.KeysFromCard(card)
	if err != nil {
		t.Fatalf("agent card: %v", err)
	}
	return ks
}

// binaries builds the example seller agent and the aov command once per
// test binary.
var binaries struct {
	once              sync.Once
	dir, agent, aov   string
	err               error
	buildOutput       []byte
	schemaPath, rules string
}

// buildBinaries builds them, under testDir.
func buildBinaries(t testing.TB) {
	t.Helper()
	binaries.once.Do(func() {
		root, err := filepath.Abs("..")
		if err != nil {
			binaries.err = err
			return
		}
		binaries.schemaPath = filepath.Join(root, "examples", "seller-agent", "invoice.schema.json")
		binaries.rules = filepath.Join(root, "examples", "seller-agent", "invoice.rules.json")
		binaries.dir, binaries.err = os.MkdirTemp(testDir, "bin")
		if binaries.err != nil {
			return
		}
		cmd := exec.Command("go", "build", "-o", binaries.dir+string(filepath.Separator), "./examples/seller-agent", "./cmd/aov")
		cmd.Dir = root
		binaries.buildOutput, binaries.err = cmd.CombinedOutput()
		binaries.agent = filepath.Join(binaries.dir, "seller-agent")
		binaries.aov = filepath.Join(binaries.dir, "aov")
	})
	if binaries.err != nil {
		t.Fatalf("building the seller agent and aov: %v\n%s", binaries.err, binaries.buildOutput)
	}
}

// aovCommand is the path of the aov command, built once.
func aovCommand(t testing.TB) string {
	t.Helper()
	buildBinaries(t)
	return binaries.aov
}

// startAgent runs the example seller agent as a process on a free port and
// returns its base URL.
func startAgent(t testing.TB) string {
	t.Helper()
	buildBinaries(t)
	cmd := exec.Command(binaries.agent, "-addr", "127.0.0.1:0")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("seller agent did not start: %v", err)
	}
	_, url, ok := strings.Cut(strings.TrimSpace(line), " on ")
	if !ok {
		t.Fatalf("seller agent printed %q", line)
	}
	return url
}

// sellerRoute is one route of the seller test sites: a path prefix handed
// to the agent stripped, with verify_response options added to the
// defaults.
func sellerRoute(prefix, upstream string, f *verifierFixture, options string) string {
	return fmt.Sprintf(`
	handle_path %s/* {
		verify_response {
			schema %s
			rules %s
			enforce_rules
			agent_id seller-7
			task_id "invoice-{http.request.uuid}"
			verifier_url %s
			verifier_token %s
			%s
		}
		reverse_proxy %s
	}
`, prefix, binaries.schemaPath, binaries.rules, f.srv.URL, verifierToken, options, strings.TrimPrefix(upstream, "http://"))
}

func getBody(t testing.TB, url string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

// headerReceipt decodes the Verification-Receipt header.
func headerReceipt(t testing.TB, resp *http.Response, name string) []byte {
	t.Helper()
	h := resp.Header.Get(name)
	if h == "" {
		t.Fatalf("status %d without %s", resp.StatusCode, name)
	}
	raw, err := base64.StdEncoding.Strict().DecodeString(h)
	if err != nil {
		t.Fatalf("%s is not standard base64: %v", name, err)
	}
	return raw
}

// checkReceipt verifies a receipt's signature against the served card and
// that its output_hash is the hash of output, the bytes delivered; it
// returns the receipt decoded.
func checkReceipt(t testing.TB, keys receipt.KeySet, rcpt, output []byte) map[string]any {
	t.Helper()
	if err := receipt.VerifyReceipt(rcpt, keys, receipt.ContextVerify); err != nil {
		t.Fatalf("receipt does not verify: %v\n%s", err, rcpt)
	}
	canon, err := receipt.Canonicalize(output)
	if err != nil {
		t.Fatalf("delivered output is not JSON: %v", err)
	}
	var doc map[string]any
	if err := json.Unmarshal(rcpt, &doc); err != nil {
		t.Fatal(err)
	}
	if doc["output_hash"] != receipt.Hash(canon) {
		t.Fatalf("receipt output_hash %v does not match the delivered bytes (%s)", doc["output_hash"], receipt.Hash(canon))
	}
	return doc
}

func TestVerifyResponseAttachesReceipts(t *testing.T) {
	buildBinaries(t)
	vf := startVerifier(t)
	agent := startAgent(t)
	base := startCaddy(t, ":{port} {"+
		sellerRoute("/plain", agent, vf, "")+
		sellerRoute("/envelope", agent, vf, "envelope")+
		sellerRoute("/block", agent, vf, "on_fail block")+
		sellerRoute("/named", agent, vf, "receipt_header X-Invoice-Receipt")+
		`
	handle_path /gzip/* {
		encode gzip
		verify_response {
			schema `+binaries.schemaPath+`
			rules `+binaries.rules+`
			enforce_rules
			verifier_url `+vf.srv.URL+`
			verifier_token `+verifierToken+`
		}
		reverse_proxy `+strings.TrimPrefix(agent, "http://")+`
	}
}`)
	keys := vf.keys(t)

	// What the agent itself answers, uncompressed.
	direct := func(path string) []byte {
		_, b := getBody(t, agent+path, map[string]string{"Accept-Encoding": "identity"})
		return b
	}

	cases := []struct {
		desc   string
		path   string
		hdr    map[string]string
		status int
		check  func(t *testing.T, resp *http.Response, body []byte)
	}{
		{"a passing output is released byte for byte with its pass receipt", "/plain/invoices/INV-7731", nil, 200, func(t *testing.T, resp *http.Response, body []byte) {
			if !bytes.Equal(body, direct("/invoices/INV-7731")) {
				t.Errorf("body changed:\n%s", body)
			}
			doc := checkReceipt(t, keys, headerReceipt(t, resp, HeaderVerificationReceipt), body)
			if doc["result"] != "pass" || resp.Header.Get(HeaderVerificationStatus) != "pass" {
				t.Errorf("result %v, status header %q", doc["result"], resp.Header.Get(HeaderVerificationStatus))
			}
			if doc["agent_id"] != "seller-7" || !strings.HasPrefix(doc["task_id"].(string), "invoice-") {
				t.Errorf("agent_id %v task_id %v", doc["agent_id"], doc["task_id"])
			}
			if _, full := doc["hints"]; full {
				t.Error("the header receipt is not compact")
			}
		}},
		{"a failing output passes with its fail receipt under on_fail pass", "/plain/invoices/INV-7732", nil, 200, func(t *testing.T, resp *http.Response, body []byte) {
			if !bytes.Equal(body, direct("/invoices/INV-7732")) {
				t.Errorf("body changed:\n%s", body)
			}
			doc := checkReceipt(t, keys, headerReceipt(t, resp, HeaderVerificationReceipt), body)
			if doc["result"] != "fail" || resp.Header.Get(HeaderVerificationStatus) != "fail" {
				t.Errorf("result %v", doc["result"])
			}
			if fmt.Sprint(doc["summary"].(map[string]any)["blocking_checks"]) != "[consistency:sum_equals]" {
				t.Errorf("summary %v", doc["summary"])
			}
		}},
		{"the envelope carries the original output and the same signed receipt", "/envelope/invoices/INV-7731", nil, 200, func(t *testing.T, resp *http.Response, body []byte) {
			var env map[string]json.RawMessage
			if err := json.Unmarshal(body, &env); err != nil || len(env) != 2 {
				t.Fatalf("envelope %s (%v)", body, err)
			}
			if !bytes.Equal(env["output"], bytes.TrimSpace(direct("/invoices/INV-7731"))) {
				t.Errorf("envelope output is not the agent's bytes: %s", env["output"])
			}
			checkReceipt(t, keys, env["verification"], env["output"])
			if !bytes.Equal(env["verification"], headerReceipt(t, resp, HeaderVerificationReceipt)) {
				t.Error("envelope and header carry different receipts")
			}
			if resp.Header.Get("Content-Length") != fmt.Sprint(len(body)) {
				t.Errorf("Content-Length %q for %d bytes", resp.Header.Get("Content-Length"), len(body))
			}
		}},
		{"on_fail block withholds a failing output and answers 502 with the hints", "/block/invoices/INV-7732", nil, 502, func(t *testing.T, resp *http.Response, body []byte) {
			if bytes.Contains(body, []byte("Acme Robotics")) || bytes.Contains(body, []byte("Sensor calibration")) {
				t.Fatalf("the withheld output leaked: %s", body)
			}
			if resp.Header.Get(HeaderVerificationReceipt) != "" {
				t.Error("a receipt header on an answer that is not the output")
			}
			var ans struct {
				Code           string           `json:"code"`
				Status         int              `json:"status"`
				Charged        *bool            `json:"charged"`
				NextActions    []map[string]any `json:"next_actions"`
				BlockingChecks []string         `json:"blocking_checks"`
				Hints          []map[string]any `json:"hints"`
				Verification   json.RawMessage  `json:"verification"`
			}
			if err := json.Unmarshal(body, &ans); err != nil {
				t.Fatal(err)
			}
			if ans.Code != "output_failed_verification" || ans.Status != 502 || ans.Charged == nil || *ans.Charged || len(ans.NextActions) != 1 || ans.NextActions[0]["action"] != "repair_and_reverify" {
				t.Errorf("answer %s", body)
			}
			if fmt.Sprint(ans.BlockingChecks) != "[consistency:sum_equals]" || len(ans.Hints) == 0 || ans.Hints[0]["check"] != "consistency:sum_equals" {
				t.Errorf("blocking %v hints %v", ans.BlockingChecks, ans.Hints)
			}
			if err := receipt.VerifyReceipt(ans.Verification, keys, ""); err != nil {
				t.Errorf("fail receipt: %v", err)
			}
		}},
		{"on_fail block releases a passing output with a full receipt", "/block/invoices/INV-7731", nil, 200, func(t *testing.T, resp *http.Response, body []byte) {
			doc := checkReceipt(t, keys, headerReceipt(t, resp, HeaderVerificationReceipt), body)
			if _, full := doc["hints"]; !full || doc["result"] != "pass" {
				t.Errorf("receipt %v", doc)
			}
		}},
		{"the receipt header name is configurable", "/named/invoices/INV-7731", nil, 200, func(t *testing.T, resp *http.Response, body []byte) {
			checkReceipt(t, keys, headerReceipt(t, resp, "X-Invoice-Receipt"), body)
			if !strings.Contains(strings.Join(resp.Header.Values("Access-Control-Expose-Headers"), ","), "X-Invoice-Receipt") {
				t.Errorf("browsers cannot read the receipt: %q", resp.Header.Values("Access-Control-Expose-Headers"))
			}
			if resp.Header.Get(HeaderVerificationReceipt) != "" {
				t.Error("default header also set")
			}
		}},
		{"a client that accepts gzip gets a compressed answer whose plain bytes match the receipt", "/gzip/invoices/INV-7731?lines=40", map[string]string{"Accept-Encoding": "gzip"}, 200, func(t *testing.T, resp *http.Response, body []byte) {
			if resp.Header.Get("Content-Encoding") != "gzip" {
				t.Fatalf("Content-Encoding %q", resp.Header.Get("Content-Encoding"))
			}
			zr, err := gzip.NewReader(bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			plain, err := io.ReadAll(zr)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(plain, direct("/invoices/INV-7731?lines=40")) {
				t.Error("decompressed body is not the agent's answer")
			}
			checkReceipt(t, keys, headerReceipt(t, resp, HeaderVerificationReceipt), plain)
		}},
		{"an answer it does not check passes untouched and without a receipt", "/plain/invoices/nope", nil, 404, func(t *testing.T, resp *http.Response, body []byte) {
			if resp.Header.Get(HeaderVerificationReceipt) != "" || resp.Header.Get(HeaderVerificationStatus) != "" {
				t.Errorf("headers %v", resp.Header)
			}
			if !bytes.Equal(body, direct("/invoices/nope")) {
				t.Errorf("body %s", body)
			}
		}},
		{"a HEAD request is not checked", "/plain/invoices/INV-7731", map[string]string{"X-Method": "HEAD"}, 200, func(t *testing.T, resp *http.Response, body []byte) {
			if len(body) != 0 || resp.Header.Get(HeaderVerificationReceipt) != "" {
				t.Errorf("HEAD answer %d bytes, receipt %q", len(body), resp.Header.Get(HeaderVerificationReceipt))
			}
		}},
	}
	counts := func() map[string]float64 {
		m := map[string]float64{}
		for _, o := range []string{"pass", "fail", "blocked", "unchecked"} {
			var mv dto.Metric
			if err := verifyMetrics.WithLabelValues(o).Write(&mv); err != nil {
				t.Fatal(err)
			}
			m[o] = mv.GetCounter().GetValue()
		}
		return m
	}
	before := counts()
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			method := http.MethodGet
			if tc.hdr["X-Method"] != "" {
				method = tc.hdr["X-Method"]
			}
			req, _ := http.NewRequest(method, base+tc.path, nil)
			for k, v := range tc.hdr {
				req.Header.Set(k, v)
			}
			resp, err := testClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %.400s", resp.StatusCode, tc.status, body)
			}
			tc.check(t, resp, body)
		})
	}

	// Each outcome is counted for the operator's metrics.
	after := counts()
	for o, want := range map[string]float64{"pass": 5, "fail": 1, "blocked": 1, "unchecked": 2} {
		if got := after[o] - before[o]; got != want {
			t.Errorf("aov_verify_response_outcomes_total{outcome=%q} grew by %v, want %v", o, got, want)
		}
	}

	// Every call to the verification service carried the gateway token, and
	// each verification is in the service's history under the agent.
	if vf.calls.Load() == 0 || vf.tokens.Load() != vf.calls.Load() {
		t.Errorf("%d verification calls, %d with the gateway token", vf.calls.Load(), vf.tokens.Load())
	}
	recs, _, err := vf.db.Verifications(context.Background(), "seller-7", "", 50)
	if err != nil || len(recs) < 4 {
		t.Fatalf("history for seller-7: %d records (%v)", len(recs), err)
	}
}

func TestAovCommandVerifiesAGatewayReceipt(t *testing.T) {
	buildBinaries(t)
	vf := startVerifier(t)
	agent := startAgent(t)
	base := startCaddy(t, ":{port} {"+sellerRoute("/s", agent, vf, "")+"}")
	resp, body := getBody(t, base+"/s/invoices/INV-7731", nil)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	rcpt := headerReceipt(t, resp, HeaderVerificationReceipt)
	dir := t.TempDir()
	good := filepath.Join(dir, "receipt.json")
	os.WriteFile(good, rcpt, 0o600)
	// The same receipt claiming another result must not verify.
	bad := filepath.Join(dir, "tampered.json")
	os.WriteFile(bad, bytes.Replace(rcpt, []byte(`"result":"pass"`), []byte(`"result":"fail"`), 1), 0o600)

	for _, tc := range []struct {
		desc, file string
		exit       int
		out        string
	}{
		{"aov receipt verify accepts the receipt the gateway attached", good, 0, "valid"},
		{"aov receipt verify rejects it once altered", bad, 1, "invalid"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			cmd := exec.Command(binaries.aov, "receipt", "verify", "--card", vf.cardURL, tc.file)
			out, _ := cmd.CombinedOutput()
			if cmd.ProcessState.ExitCode() != tc.exit || !strings.HasPrefix(string(out), tc.out) {
				t.Fatalf("exit %d, output %q", cmd.ProcessState.ExitCode(), out)
			}
		})
	}
	// The delivered body is what the receipt's output_hash names.
	checkReceipt(t, vf.keys(t), rcpt, body)
}

// misbehaving is an upstream that gives the answers a gateway must not
// attach a receipt to.
func misbehaving(t testing.TB) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/notjson":
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, "<html>SECRET-OUTPUT</html>")
		case "/big":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"pad":"%s"}`, strings.Repeat("x", 64<<10))
		case "/forged":
			w.Header().Set("Content-Type", "text/plain")
			w.Header().Set(HeaderVerificationReceipt, base64.StdEncoding.EncodeToString([]byte(`{"result":"pass"}`)))
			w.Header().Set(HeaderVerificationStatus, "pass")
			io.WriteString(w, "plain text")
		case "/gzipped":
			// Compressed although the gateway asked for identity.
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Encoding", "gzip")
			zw := gzip.NewWriter(w)
			io.WriteString(zw, goodInvoice)
			zw.Close()
		case "/abort":
			// Dies in the middle of its answer.
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", "1000")
			io.WriteString(w, `{"invoice_id":"INV-7731",`)
			w.(http.Flusher).Flush()
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
		case "/good":
			w.Header().Set("Content-Type", "application/json; charset=utf-8")
			io.WriteString(w, goodInvoice)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// goodInvoice passes the example schema and rules (SPEC §10 with total 129.5).
const goodInvoice = `{"invoice_id":"INV-7731","currency":"USD","line_items":[{"sku":"A-100","qty":2,"line_total":87.0},{"sku":"B-200","qty":1,"line_total":42.5}],"total":129.5}`

func TestVerifyResponseErrorPolicies(t *testing.T) {
	buildBinaries(t)
	vf := startVerifier(t)
	up := misbehaving(t)
	// A verification service that signs a receipt about other bytes (here
	// a fault-injecting proxy, a fake because a real verifierd never does
	// it, rewrites the output before the real verifierd sees it): the
	// gateway attaches no receipt that does not match what it releases.
	liar := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		body = bytes.Replace(body, []byte(`"total":129.5`), []byte(`"total":129.50`+"1"), 1)
		req, _ := http.NewRequest(r.Method, vf.srv.URL+r.URL.Path, bytes.NewReader(body))
		req.Header = r.Header.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		defer resp.Body.Close()
		copyHeader(w.Header(), resp.Header)
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, resp.Body)
	}))
	defer liar.Close()
	base := startCaddy(t, ":{port} {"+
		sellerRoute("/closed", up.URL, vf, "max_response 16KiB")+
		sellerRoute("/open", up.URL, vf, "max_response 16KiB\n\t\t\ton_error fail_open")+
		fmt.Sprintf(`
	handle_path /lying/* {
		verify_response {
			schema %s
			verifier_url %s
		}
		reverse_proxy %s
	}
`, binaries.schemaPath, liar.URL, strings.TrimPrefix(up.URL, "http://"))+
		"}")
	keys := vf.keys(t)

	closed := func(code string) func(t *testing.T, resp *http.Response, body []byte) {
		return func(t *testing.T, resp *http.Response, body []byte) {
			var e map[string]any
			if err := json.Unmarshal(body, &e); err != nil {
				t.Fatalf("body %s", body)
			}
			if e["code"] != code || e["retryable"] != true || e["charged"] != false || resp.Header.Get("Retry-After") == "" {
				t.Errorf("error %s", body)
			}
			if bytes.Contains(body, []byte("SECRET-OUTPUT")) || bytes.Contains(body, []byte("xxxx")) || bytes.Contains(body, []byte("INV-7731")) {
				t.Error("the withheld output leaked into the error")
			}
			if resp.Header.Get(HeaderVerificationReceipt) != "" {
				t.Error("an error carries a receipt")
			}
		}
	}
	open := func(wantLen int) func(t *testing.T, resp *http.Response, body []byte) {
		return func(t *testing.T, resp *http.Response, body []byte) {
			if resp.Header.Get(HeaderVerificationStatus) != "unverified" || resp.Header.Get(HeaderVerificationReceipt) != "" {
				t.Errorf("headers %v", resp.Header)
			}
			if len(body) != wantLen {
				t.Errorf("released %d bytes, want %d", len(body), wantLen)
			}
		}
	}
	type tcase struct {
		desc   string
		path   string
		status int
		check  func(t *testing.T, resp *http.Response, body []byte)
	}
	run := func(t *testing.T, cases []tcase) {
		for _, tc := range cases {
			t.Run(tc.desc, func(t *testing.T) {
				resp, body := getBody(t, base+tc.path, nil)
				if resp.StatusCode != tc.status {
					t.Fatalf("status %d, want %d: %.300s", resp.StatusCode, tc.status, body)
				}
				tc.check(t, resp, body)
			})
		}
	}
	bigLen := len(`{"pad":""}`) + 64<<10
	run(t, []tcase{
		{"a non-JSON answer is withheld with 503 under fail_closed", "/closed/notjson", 503, closed("response_unverifiable")},
		{"a non-JSON answer passes marked unverified under fail_open", "/open/notjson", 200, open(len("<html>SECRET-OUTPUT</html>"))},
		{"an answer over max_response is withheld with 503 under fail_closed", "/closed/big", 503, closed("response_unverifiable")},
		{"an answer over max_response passes whole and unverified under fail_open", "/open/big", 200, open(bigLen)},
		{"receipt headers from the upstream are dropped", "/closed/forged", 200, func(t *testing.T, resp *http.Response, body []byte) {
			if resp.Header.Get(HeaderVerificationReceipt) != "" || resp.Header.Get(HeaderVerificationStatus) != "" {
				t.Errorf("forged headers released: %v", resp.Header)
			}
		}},
		{"a JSON answer with a charset parameter is verified", "/closed/good", 200, func(t *testing.T, resp *http.Response, body []byte) {
			checkReceipt(t, keys, headerReceipt(t, resp, HeaderVerificationReceipt), body)
		}},
		{"a receipt about other bytes is never attached", "/lying/good", 503, closed("upstream_unavailable")},
		{"an answer compressed despite the request for identity is withheld", "/closed/gzipped", 503, closed("response_unverifiable")},
		{"an upstream that dies mid-answer is a 502 and nothing is released", "/closed/abort", 502, func(t *testing.T, resp *http.Response, body []byte) {
			if bytes.Contains(body, []byte("INV-7731")) || resp.Header.Get(HeaderVerificationReceipt) != "" {
				t.Errorf("partial answer released: %s", body)
			}
		}},
	})

	// certd stops: verifierd answers 503, which is an outage of the
	// verification service.
	vf.signer.Close()
	run(t, []tcase{
		{"verifierd failing (5xx) withholds the answer with 503 under fail_closed", "/closed/good", 503, closed("upstream_unavailable")},
		{"verifierd failing (5xx) passes the answer unverified under fail_open", "/open/good", 200, open(len(goodInvoice))},
	})

	// verifierd stops.
	vf.srv.Close()
	run(t, []tcase{
		{"verifierd unreachable withholds the answer with 503 under fail_closed", "/closed/good", 503, closed("upstream_unavailable")},
		{"verifierd unreachable passes the answer unverified under fail_open", "/open/good", 200, open(len(goodInvoice))},
	})
}

// sellerPaidSite is a seller's route behind the x402 gate: the default
// settle_on (pass, since verify_response is in the route) on /invoices/*,
// and settle_on any when the query has settle=any.
func sellerPaidSite(agent, fac string, vf *verifierFixture) string {
	vr := fmt.Sprintf(`verify_response {
			schema %s
			rules %s
			enforce_rules
			agent_id seller-7
			verifier_url %s
		}`, binaries.schemaPath, binaries.rules, vf.srv.URL)
	return fmt.Sprintf(`:{port} {
	@any query settle=any
	handle @any {
		x402 {
			accept devnet $0.05 %[3]s
			facilitator http %[2]s
			store badger {data}/gate
			settle_on any
		}
		%[4]s
		reverse_proxy %[1]s
	}
	handle /invoices/* {
		x402 {
			accept devnet $0.05 %[3]s
			description "An invoice, verified before you pay"
			facilitator http %[2]s
			store badger {data}/gate
		}
		%[4]s
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(agent, "http://"), fac, payTo.Hex(), vr)
}

func TestSettleOnPassChargesOnlyVerifiedOutputs(t *testing.T) {
	d, fac := sharedDevnet(t)
	buildBinaries(t)
	vf := startVerifier(t)
	agent := startAgent(t)
	base := startCaddy(t, sellerPaidSite(agent, fac, vf))
	keys := vf.keys(t)
	price := big.NewInt(50000)
	payerIdx := 6
	payer := evmfacilitator.DevAccounts()[payerIdx].Address

	pay := func(t *testing.T, path string) (string, *http.Response, []byte) {
		resp, _ := getBody(t, base+path, nil)
		if resp.StatusCode != http.StatusPaymentRequired {
			t.Fatalf("unpaid call: status %d, want 402", resp.StatusCode)
		}
		sig := signFor(t, paymentRequired(t, resp), payerIdx)
		resp, body := getBody(t, base+path, map[string]string{x402.HeaderPaymentSignature: sig})
		return sig, resp, body
	}

	t.Run("a failing output is not charged, and the buyer gets it with its fail receipt", func(t *testing.T) {
		before := balance(t, d, payer)
		sig, resp, body := pay(t, "/invoices/INV-7732")
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		if resp.Header.Get(x402.HeaderPaymentResponse) != "" {
			t.Error("PAYMENT-RESPONSE on an answer that was not charged")
		}
		if doc := checkReceipt(t, keys, headerReceipt(t, resp, HeaderVerificationReceipt), body); doc["result"] != "fail" {
			t.Fatalf("result %v", doc["result"])
		}
		if balance(t, d, payer).Cmp(before) != 0 {
			t.Fatal("a failing output was charged")
		}
		// The payment was released: the buyer can spend the same
		// authorization on a passing output, and is charged once.
		resp, body = getBody(t, base+"/invoices/INV-7731", map[string]string{x402.HeaderPaymentSignature: sig})
		if resp.StatusCode != 200 || resp.Header.Get(x402.HeaderPaymentResponse) == "" {
			t.Fatalf("the released payment on a passing output: status %d: %s", resp.StatusCode, body)
		}
		if got := new(big.Int).Sub(before, balance(t, d, payer)); got.Cmp(price) != 0 {
			t.Fatalf("charged %v, want %v", got, price)
		}
	})

	t.Run("a passing output is charged and carries PAYMENT-RESPONSE and its pass receipt", func(t *testing.T) {
		before := balance(t, d, payer)
		_, resp, body := pay(t, "/invoices/INV-7731")
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		var sr x402.SettleResponse
		if err := x402.DecodeHeader(resp.Header.Get(x402.HeaderPaymentResponse), &sr); err != nil || !sr.Success || sr.Transaction == "" {
			t.Fatalf("PAYMENT-RESPONSE %+v (%v)", sr, err)
		}
		if doc := checkReceipt(t, keys, headerReceipt(t, resp, HeaderVerificationReceipt), body); doc["result"] != "pass" {
			t.Fatalf("result %v", doc["result"])
		}
		if got := new(big.Int).Sub(before, balance(t, d, payer)); got.Cmp(price) != 0 {
			t.Fatalf("charged %v, want %v", got, price)
		}
		if !strings.Contains(resp.Header.Get("Access-Control-Expose-Headers"), HeaderVerificationReceipt) {
			t.Errorf("browsers cannot read the receipt: %q", resp.Header.Get("Access-Control-Expose-Headers"))
		}
	})

	t.Run("settle_on any charges a failing output too", func(t *testing.T) {
		before := balance(t, d, payer)
		_, resp, body := pay(t, "/invoices/INV-7732?settle=any")
		if resp.StatusCode != 200 || resp.Header.Get(x402.HeaderPaymentResponse) == "" {
			t.Fatalf("status %d, PAYMENT-RESPONSE %q", resp.StatusCode, resp.Header.Get(x402.HeaderPaymentResponse))
		}
		checkReceipt(t, keys, headerReceipt(t, resp, HeaderVerificationReceipt), body)
		if got := new(big.Int).Sub(before, balance(t, d, payer)); got.Cmp(price) != 0 {
			t.Fatalf("charged %v, want %v", got, price)
		}
	})

	t.Run("an output that cannot be verified is neither released nor charged", func(t *testing.T) {
		before := balance(t, d, payer)
		vf.srv.Close()
		_, resp, body := pay(t, "/invoices/INV-7731")
		if resp.StatusCode != 503 || resp.Header.Get(x402.HeaderPaymentResponse) != "" || bytes.Contains(body, []byte("INV-7731")) {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		if balance(t, d, payer).Cmp(before) != 0 {
			t.Fatal("charged for an unverified output")
		}
	})
}

func TestOfficialFetchClientBuysAReceiptedOutput(t *testing.T) {
	interop.Dir(t) // skips (or fails under CI) without the npm peers
	d, fac := sharedDevnet(t)
	buildBinaries(t)
	vf := startVerifier(t)
	agent := startAgent(t)
	base := startCaddy(t, sellerPaidSite(agent, fac, vf))
	payer := evmfacilitator.DevAccounts()[7]
	before := balance(t, d, payer.Address)

	var res fetchResult
	var raw struct {
		Headers map[string]string `json:"headers"`
	}
	var out json.RawMessage
	interop.Run(t, "x402-fetch-pay.mjs", nil, map[string]any{
		"privateKey": payer.PrivateKeyHex,
		"url":        base + "/invoices/INV-7731",
		"method":     "GET",
	}, &out)
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatal(err)
	}
	json.Unmarshal(out, &raw)
	if res.Status != 200 || res.PaymentResponse == nil || !res.PaymentResponse.Success {
		t.Fatalf("status %d, PAYMENT-RESPONSE %+v: %s", res.Status, res.PaymentResponse, res.Body)
	}
	rcpt, err := base64.StdEncoding.DecodeString(raw.Headers["verification-receipt"])
	if err != nil || len(rcpt) == 0 {
		t.Fatalf("the client did not receive a receipt: %v %v", raw.Headers, err)
	}
	if doc := checkReceipt(t, vf.keys(t), rcpt, []byte(res.Body)); doc["result"] != "pass" {
		t.Fatalf("result %v", doc["result"])
	}
	if got := new(big.Int).Sub(before, balance(t, d, payer.Address)); got.Cmp(big.NewInt(50000)) != 0 {
		t.Fatalf("charged %v, want 50000", got)
	}
}

// loadError adapts and loads a site, returning Caddy's error (and stopping
// Caddy if it did start).
func loadError(t *testing.T, site string) error {
	t.Helper()
	cfg := fmt.Sprintf("{\n\tadmin off\n\tauto_https off\n\tpersist_config off\n\thttp_port %d\n}\n", freePort(t)) + site
	js, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		return err
	}
	if err := caddy.Load(js, true); err != nil {
		return err
	}
	caddy.Stop()
	return nil
}

func TestVerifyResponseConfiguration(t *testing.T) {
	buildBinaries(t)
	cases := []struct {
		desc, body, want string
	}{
		{"an unknown option is named", "colour red", "unrecognized verify_response option 'colour'"},
		{"status codes must be numbers", "status ok", "is not a number"},
		{"inline JSON must parse", "schema `{\"type\":`", "inline JSON does not parse"},
		{"a flag takes on or off", "envelope maybe", "want on or off"},
		{"a schema is required", "verifier_url http://127.0.0.1:1", "schema is required"},
		{"a verifier_url is required", "schema `{}`", "verifier_url is required"},
		{"a verifier_url must be http or https", "schema `{}`\n\t\tverifier_url ftp://x", "must be an http:// or https:// URL"},
		{"a verifier_url's user and password are not echoed", "schema `{}`\n\t\tverifier_url ftp://gateway:s3cret-pw@x", `verifier_url "ftp://xxxxx@x" must be`},
		{"an unparsable verifier_url's password is not echoed", "schema `{}`\n\t\tverifier_url \"http://gateway:s3cret-pw@x:port/\"", "verifier_url does not parse: invalid port"},
		{"a schema that does not compile fails at load", "schema `{\"type\":\"objekt\"}`\n\t\tverifier_url http://127.0.0.1:1", "would be refused: schema"},
		{"a rule that is not a rule fails at load", "schema `{}`\n\t\trules `[{\"type\":\"sum\"}]`\n\t\tverifier_url http://127.0.0.1:1", "rules[0].type"},
		{"a missing schema file fails at load", "schema /nonexistent/schema.json\n\t\tverifier_url http://127.0.0.1:1", "schema file"},
		{"on_fail is pass or block", "schema `{}`\n\t\tverifier_url http://127.0.0.1:1\n\t\ton_fail maybe", "on_fail must be pass or block"},
		{"on_error is fail_closed or fail_open", "schema `{}`\n\t\tverifier_url http://127.0.0.1:1\n\t\ton_error shrug", "on_error must be fail_closed or fail_open"},
		{"a negative verifier_timeout fails every check at once", "schema `{}`\n\t\tverifier_url http://127.0.0.1:1\n\t\tverifier_timeout -1s", "verifier_timeout -1s must be positive"},
		{"verifier_timeout 0 is the default", "schema `{}`\n\t\tverifier_url http://127.0.0.1:1\n\t\tverifier_timeout 0s", ""},
		{"a card_url must be http or https, its password not echoed", "schema `{}`\n\t\tverifier_url http://127.0.0.1:1\n\t\tcard_url ftp://gateway:s3cret-pw@x/card", "card_url must be an http:// or https:// URL"},
		{"a card_url is a URL", "schema `{}`\n\t\tverifier_url http://127.0.0.1:1\n\t\tcard_url https://127.0.0.1:1/.well-known/agent-card.json", ""},
		{"a receipt header must be a header name", "schema `{}`\n\t\tverifier_url http://127.0.0.1:1\n\t\treceipt_header \"Bad Name\"", "not a valid header name"},
		// (Before: each loaded. Under Verification-Status the status overwrote
		// the receipt; under Content-Type the upstream's type was dropped as
		// the receipt's own, so no JSON answer was checked; under
		// Payment-Response a settle after gate removed the receipt and sent
		// its settlement in its place.)
		{"the status header is not a receipt header", "schema `{}`\n\t\tverifier_url http://127.0.0.1:1\n\t\treceipt_header verification-status", `receipt_header "verification-status" names a header the gateway sets`},
		{"a header describing the body is not a receipt header", "schema `{}`\n\t\tverifier_url http://127.0.0.1:1\n\t\treceipt_header Content-Type", `receipt_header "Content-Type" names a header the gateway sets`},
		{"the gate's headers are not receipt headers", "schema `{}`\n\t\tverifier_url http://127.0.0.1:1\n\t\treceipt_header PAYMENT-RESPONSE", `receipt_header "PAYMENT-RESPONSE" names a header the gateway sets`},
		{"the allowance headers are not receipt headers", "schema `{}`\n\t\tverifier_url http://127.0.0.1:1\n\t\treceipt_header Free-Allowance-Remaining", "names a header the gateway sets"},
		{"CORS headers are not receipt headers", "schema `{}`\n\t\tverifier_url http://127.0.0.1:1\n\t\treceipt_header Vary", "names a header the gateway sets"},
		{"a hop-by-hop header is not a receipt header", "schema `{}`\n\t\tverifier_url http://127.0.0.1:1\n\t\treceipt_header Trailer", "names a header the gateway sets"},
		{"a name of one's own is a receipt header", "schema `{}`\n\t\tverifier_url http://127.0.0.1:1\n\t\treceipt_header X-Invoice-Receipt", ""},
		{"the example schema and rules load", "schema " + binaries.schemaPath + "\n\t\trules " + binaries.rules + "\n\t\tverifier_url http://127.0.0.1:1", ""},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			err := loadError(t, ":0 {\n\tverify_response {\n\t\t"+tc.body+"\n\t}\n\trespond ok\n}\n")
			wantErr(t, err, tc.want)
			if err != nil && (strings.Contains(err.Error(), "s3cret-pw") || strings.Contains(err.Error(), "gateway:")) {
				t.Fatalf("the error echoes the verifier_url's credentials: %v", err)
			}
		})
	}
}

func TestSettleOnConfiguration(t *testing.T) {
	sharedDevnet(t) // registers the devnet USDC
	cases := []struct {
		desc, opts, want string
	}{
		{"settle_on is pass or any", "settle_on always", "settle_on must be pass or any"},
		{"settle_on pass cannot settle before the upstream runs", "settle before\n\t\tsettle_on pass", "settle_on pass needs settle after"},
		{"settle_on any with settle before loads", "settle before\n\t\tsettle_on any", ""},
		{"settle_on pass cannot price an MCP tool", "mcp_tool verify_schema\n\t\tsettle_on pass", "settle_on pass cannot price an MCP tool (mcp_tool)"},
		{"settle_on any with mcp_tool loads", "mcp_tool verify_schema\n\t\tsettle_on any", ""},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			err := loadError(t, fmt.Sprintf(":0 {\n\tx402 {\n\t\taccept devnet $0.01 %s\n\t\tfacilitator http http://127.0.0.1:1\n\t\tstore badger %s\n\t\t%s\n\t}\n\trespond ok\n}\n", payTo.Hex(), t.TempDir(), tc.opts))
			wantErr(t, err, tc.want)
		})
	}
}

// identityGet GETs url asking for an uncompressed answer, reads the answer
// and fails b unless it is a 200.
func identityGet(b testing.TB, url string) {
	b.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := testClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		b.Fatalf("status %d", resp.StatusCode)
	}
}

// FuzzVerifierAnswer feeds the verification service's answer (untrusted
// input to the gateway) to its reader: it never panics, and whatever it
// accepts is a JSON object with a pass or fail result and a signature.
func FuzzVerifierAnswer(f *testing.F) {
	f.Add(200, "application/json", []byte(`{"result":"pass","output_hash":"a","schema_hash":"b","rules_hash":"c","attestation":{"signature":"c2ln"}}`))
	f.Add(200, "application/json", []byte(`{"result":"maybe","attestation":{"signature":"x"}}`))
	f.Add(200, "application/json; charset=utf-8", []byte(`[1,2]`))
	f.Add(200, "text/html", []byte(`<html>`))
	f.Add(422, "application/json", []byte(`{"code":"invalid_request","fields":[{"field":"submitted_output"}]}`))
	f.Add(503, "application/json", []byte(`{"code":"upstream_unavailable"}`))
	f.Add(200, "application/json", []byte(`{"result":"fail","hints":{},"summary":{"blocking_checks":[1]},"attestation":{"signature":"x"}}`))
	v := &VerifyResponse{}
	f.Fuzz(func(t *testing.T, status int, ctype string, raw []byte) {
		rc, err := v.readAnswer(status, ctype, raw)
		if err != nil {
			if rc != nil {
				t.Fatal("receipt and error")
			}
			return
		}
		if status != 200 || !json.Valid(rc.raw) || rc.raw[0] != '{' {
			t.Fatalf("accepted status %d answer %q", status, raw)
		}
		if (rc.view.Result != "pass" && rc.view.Result != "fail") || rc.view.Attestation == nil || rc.view.Attestation.Signature == "" {
			t.Fatalf("accepted %q", raw)
		}
	})
}

// BenchmarkVerifyResponse measures, in one run, a typical 2 KB JSON answer
// through Caddy's reverse_proxy alone and through the same route with
// verify_response (verification service local: verifierd signing through
// certd over a unix socket, recording in Badger without fsync). The
// difference is what verifying and receipting an answer adds; the
// interleaved run reports it directly.
func BenchmarkVerifyResponse(b *testing.B) {
	buildBinaries(b)
	vf := startVerifier(b)
	agent := startAgent(b)
	base := startCaddy(b, fmt.Sprintf(`:{port} {
	handle_path /plain/* {
		reverse_proxy %[1]s
	}
	handle_path /verified/* {
		verify_response {
			schema %[2]s
			rules %[3]s
			enforce_rules
			verifier_url %[4]s
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(agent, "http://"), binaries.schemaPath, binaries.rules, vf.srv.URL))
	// ?lines=20 makes a 2 KB invoice. The client asks for it uncompressed
	// on both routes (the agent would otherwise gzip it on the plain route
	// only, since verify_response asks for identity).
	const path = "/invoices/INV-7731?lines=20"
	for _, route := range []string{"plain", "verified"} {
		url := base + "/" + route + path
		resp, body := getBody(b, url, nil)
		if resp.StatusCode != 200 || (route == "verified" && resp.Header.Get(HeaderVerificationStatus) != "pass") {
			b.Fatalf("%s: status %d %q", route, resp.StatusCode, resp.Header.Get(HeaderVerificationStatus))
		}
		b.Run(route, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				identityGet(b, url)
			}
		})
	}
	// The two routes alternately, each request timed: a machine whose load
	// drifts during the run affects both alike.
	b.Run("interleaved", func(b *testing.B) {
		var plain, verified time.Duration
		call := func(url string) time.Duration {
			start := time.Now()
			identityGet(b, url)
			return time.Since(start)
		}
		for b.Loop() {
			plain += call(base + "/plain" + path)
			verified += call(base + "/verified" + path)
		}
		n := float64(b.N)
		b.ReportMetric(float64(plain.Nanoseconds())/n, "plain-ns/req")
		b.ReportMetric(float64(verified.Nanoseconds())/n, "verified-ns/req")
		b.ReportMetric(float64((verified-plain).Nanoseconds())/n, "added-ns/req")
		b.ReportMetric(float64(verified)/float64(plain), "ratio")
	})
}

func TestSellerExampleCaddyfileAdapts(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "examples", "seller-agent", "Caddyfile"))
	if err != nil {
		t.Fatal(err)
	}
	js, _, err := caddyconfig.GetAdapter("caddyfile").Adapt(raw, map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatalf("the example Caddyfile does not adapt: %v", err)
	}
	// The route's handlers run gate, then verification, then the agent.
	var cfg struct {
		Apps struct {
			HTTP struct {
				Servers map[string]struct {
					Routes []struct {
						Handle []struct {
							Routes []struct {
								Handle []struct {
									Handler  string `json:"handler"`
									SettleOn string `json:"settle_on"`
								} `json:"handle"`
							} `json:"routes"`
						} `json:"handle"`
					} `json:"routes"`
				} `json:"servers"`
			} `json:"http"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(js, &cfg); err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, srv := range cfg.Apps.HTTP.Servers {
		for _, rt := range srv.Routes {
			for _, h := range rt.Handle {
				for _, sub := range h.Routes {
					for _, hh := range sub.Handle {
						order = append(order, hh.Handler)
					}
				}
			}
		}
	}
	if got := strings.Join(order, " "); !strings.Contains(got, "x402 verify_response reverse_proxy") {
		t.Fatalf("handler order %q", got)
	}
}

// Under settle_on pass, a 2xx answer with content that no verify_response
// saw (none in the route, or one whose matcher did not match: here a
// header the client sends, so the client chooses) is neither charged nor
// handed over free: it is withheld with response_unverifiable, the payment
// released, an error logged. (It used to be handed over uncharged: the
// buyer got the work free.) The released payment buys the verified answer.
func TestSettleOnPassWithoutVerificationNeverCharges(t *testing.T) {
	d, fac := sharedDevnet(t)
	buildBinaries(t)
	vf := startVerifier(t)
	up := newUpstream(t)
	gate := fmt.Sprintf(`x402 {
			accept devnet $0.05 %s
			facilitator http %s
			store badger {data}/gate
			settle_on pass
		}`, payTo.Hex(), fac)
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	base := startCaddyServers(t, "", logFile, fmt.Sprintf(`:{port} {
	route /none/* {
		%[1]s
		reverse_proxy %[2]s
	}
	route /matched/* {
		%[1]s
		@checked header X-Check yes
		verify_response @checked {
			schema `+"`{\"type\":\"object\"}`"+`
			verifier_url %[3]s
		}
		reverse_proxy %[2]s
	}
}`, gate, strings.TrimPrefix(up.URL, "http://"), vf.srv.URL))
	payer := evmfacilitator.DevAccounts()[8].Address
	before := balance(t, d, payer)
	resp, _ := getBody(t, base+"/matched/thing", nil)
	sig := signFor(t, paymentRequired(t, resp), 8)
	for _, tc := range []struct{ desc, url string }{
		{"no verify_response in the route", base + "/none/thing"},
		{"verify_response's matcher did not match", base + "/matched/thing"},
	} {
		resp, body := getBody(t, tc.url, map[string]string{x402.HeaderPaymentSignature: sig})
		var e apierr.Error
		if resp.StatusCode != http.StatusServiceUnavailable || json.Unmarshal(body, &e) != nil || e.Code != "response_unverifiable" || e.Charged {
			t.Fatalf("%s: status %d: %s", tc.desc, resp.StatusCode, body)
		}
		if strings.Contains(string(body), "paid_content") || resp.Header.Get(x402.HeaderPaymentResponse) != "" {
			t.Fatalf("%s: the unverified answer, or a receipt of payment, reached the buyer: %s", tc.desc, body)
		}
		if balance(t, d, payer).Cmp(before) != 0 {
			t.Fatalf("%s: settle_on pass charged an answer nothing verified", tc.desc)
		}
	}
	// Without content there is nothing to withhold: handed over, uncharged.
	resp, body := getBody(t, base+"/none/thing", map[string]string{x402.HeaderPaymentSignature: sig, "X-Test-Status": "204"})
	if resp.StatusCode != http.StatusNoContent || resp.Header.Get(x402.HeaderPaymentResponse) != "" {
		t.Fatalf("204: status %d: %s", resp.StatusCode, body)
	}
	// The payment was released each time: it buys the verified answer.
	resp, body = getBody(t, base+"/matched/thing", map[string]string{x402.HeaderPaymentSignature: sig, "X-Check": "yes"})
	if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderVerificationStatus) != "pass" || resp.Header.Get(x402.HeaderPaymentResponse) == "" {
		t.Fatalf("verified: status %d: %s", resp.StatusCode, body)
	}
	if got := new(big.Int).Sub(before, balance(t, d, payer)); got.Cmp(big.NewInt(50000)) != 0 {
		t.Fatalf("charged %v, want 50000", got)
	}
	wantLogged(t, logFile, "no verify_response handled this request")
}

// Under settle_on pass, an answer verify_response lets through unchecked
// (a content type it does not check) can be neither charged nor handed
// over free: a buyer who steers the agent to another type (here an Accept
// asking for CSV) would get the work for nothing. It is withheld with
// response_unverifiable and the payment released; an answer without
// content (204) is still handed over, uncharged.
func TestSettleOnPassWithholdsUncheckedContent(t *testing.T) {
	d, fac := sharedDevnet(t)
	buildBinaries(t)
	vf := startVerifier(t)
	agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/invoices/none":
			w.WriteHeader(http.StatusNoContent)
		case strings.Contains(r.Header.Get("Accept"), "text/csv"):
			w.Header().Set("Content-Type", "text/csv")
			io.WriteString(w, "sku,qty,line_total\nA-100,2,87.0\n")
		default:
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"invoice_id":"INV-7731"}`)
		}
	}))
	t.Cleanup(agent.Close)
	base := startCaddy(t, sellerPaidSite(agent.URL, fac, vf))
	payerIdx := 7
	payer := evmfacilitator.DevAccounts()[payerIdx].Address
	before := balance(t, d, payer)

	resp, _ := getBody(t, base+"/invoices/INV-7731", map[string]string{"Accept": "text/csv"})
	if resp.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("unpaid: status %d, want 402", resp.StatusCode)
	}
	sig := signFor(t, paymentRequired(t, resp), payerIdx)
	resp, body := getBody(t, base+"/invoices/INV-7731", map[string]string{"Accept": "text/csv", x402.HeaderPaymentSignature: sig})
	var e apierr.Error
	if resp.StatusCode != http.StatusServiceUnavailable || json.Unmarshal(body, &e) != nil || e.Code != "response_unverifiable" || e.Charged {
		t.Fatalf("paid CSV: status %d: %s", resp.StatusCode, body)
	}
	if strings.Contains(string(body), "A-100") || resp.Header.Get(x402.HeaderPaymentResponse) != "" {
		t.Fatalf("the unchecked answer, or a receipt of payment, reached the buyer: %s", body)
	}
	if !strings.Contains(e.Message, "content type text/csv") {
		t.Errorf("message %q does not name the content type", e.Message)
	}
	// The payment was released: the same signature buys a 204 (handed
	// over, uncharged, nothing to withhold).
	resp, body = getBody(t, base+"/invoices/none", map[string]string{x402.HeaderPaymentSignature: sig})
	if resp.StatusCode != http.StatusNoContent || resp.Header.Get(x402.HeaderPaymentResponse) != "" {
		t.Fatalf("204: status %d, PAYMENT-RESPONSE %q: %s", resp.StatusCode, resp.Header.Get(x402.HeaderPaymentResponse), body)
	}
	if balance(t, d, payer).Cmp(before) != 0 {
		t.Fatal("charged for answers nothing verified")
	}
}

// headerGames is an upstream that says one thing in headers verify_response
// reads and another in headers a browser reads: two values where readers
// take different ones, and headers sent as trailers after the body.
func headerGames(t *testing.T) *httptest.Server {
	forged := base64.StdEncoding.EncodeToString([]byte(`{"result":"pass","forged":true}`))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/good":
			io.WriteString(w, goodInvoice)
		case "/twoct":
			// Header.Get reads the first, a browser the last valid one
			// (Fetch, "extract a MIME type").
			h["Content-Type"] = []string{"application/json", "text/html"}
			io.WriteString(w, `{"invoice_id":"<img src=x onerror=alert(document.domain)>"}`)
		case "/twoce":
			h["Content-Encoding"] = []string{"identity", "gzip"}
			io.WriteString(w, goodInvoice)
		case "/celist":
			h.Set("Content-Encoding", "identity, gzip")
			io.WriteString(w, goodInvoice)
		case "/trailer":
			// Not JSON (unverifiable), with a receipt and a second
			// Content-Type as trailers, after the hold dropped the receipt
			// headers.
			h.Set("Trailer", HeaderVerificationReceipt+", "+HeaderVerificationStatus+", Content-Type")
			io.WriteString(w, "not json")
			h.Set(HeaderVerificationReceipt, forged)
			h.Set(HeaderVerificationStatus, "pass")
			h.Set("Content-Type", "text/html")
		case "/trailer-unannounced":
			// The same, as trailers not announced before the body (sent
			// chunked: net/http sends trailers only then).
			io.WriteString(w, "not json")
			w.(http.Flusher).Flush()
			h.Set(http.TrailerPrefix+HeaderVerificationReceipt, forged)
			h.Set(http.TrailerPrefix+"Content-Type", "text/html")
		case "/trailer-good":
			h.Set("Trailer", "Content-Type, X-Late")
			io.WriteString(w, goodInvoice)
			h.Set("Content-Type", "text/html")
			h.Set("X-Late", "1")
		case "/plain":
			// Not a response verify_response checks: passed through,
			// with its own trailer and forged ones of the gateway's.
			h.Set("Content-Type", "text/plain")
			h.Set("Trailer", HeaderVerificationStatus+", "+HeaderVerificationReceipt+", X-Late")
			io.WriteString(w, "plain text")
			h.Set(HeaderVerificationStatus, "pass")
			h.Set(HeaderVerificationReceipt, forged)
			h.Set("X-Late", "1")
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestVerifyResponseReleasesOnlyWhatItChecked: an answer with two
// Content-Type or Content-Encoding values (or a list of encodings) is
// unverifiable, and on_error decides (fail_closed withholds it, fail_open
// releases it without a receipt): otherwise JSON would be verified and
// receipted, then rendered as HTML by a browser on the gateway's origin, or
// plain bytes checked and released labelled gzip. Nothing the upstream sends
// after the body (trailers) is released with an answer verify_response
// held, on any path, so it cannot plant a receipt, a status or a second
// Content-Type. An answer it does not check passes with its trailers, but
// never a receipt or status trailer. Every answer verify_response releases
// carries X-Content-Type-Options: nosniff.
func TestVerifyResponseReleasesOnlyWhatItChecked(t *testing.T) {
	buildBinaries(t)
	vf := startVerifier(t)
	up := headerGames(t)
	base := startCaddy(t, ":{port} {"+
		sellerRoute("/closed", up.URL, vf, "")+
		sellerRoute("/open", up.URL, vf, "on_error fail_open")+
		"}\n")
	noTrailers := func(t *testing.T, path string, resp *http.Response) {
		t.Helper()
		if len(resp.Trailer) != 0 || resp.Header.Get("Trailer") != "" {
			t.Errorf("%s: trailers released: %v (Trailer %q)", path, resp.Trailer, resp.Header.Get("Trailer"))
		}
	}

	resp, body := getBody(t, base+"/closed/good", nil)
	if resp.StatusCode != 200 || resp.Header.Get(HeaderVerificationReceipt) == "" || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
		t.Fatalf("a verified answer: %d receipt %t nosniff %q: %s", resp.StatusCode, resp.Header.Get(HeaderVerificationReceipt) != "", resp.Header.Get("X-Content-Type-Options"), body)
	}
	for _, path := range []string{"/twoct", "/twoce", "/celist"} {
		resp, body := getBody(t, base+"/closed"+path, nil)
		var e map[string]any
		json.Unmarshal(body, &e)
		if resp.StatusCode != http.StatusServiceUnavailable || e["code"] != codeResponseUnverifiable || e["charged"] != false ||
			resp.Header.Get(HeaderVerificationReceipt) != "" || bytes.Contains(body, []byte("onerror")) || bytes.Contains(body, []byte("INV-7731")) {
			t.Errorf("fail_closed %s: %d %s; want 503 %s without the output", path, resp.StatusCode, body, codeResponseUnverifiable)
		}
		resp, body = getBody(t, base+"/open"+path, nil)
		if resp.StatusCode != 200 || resp.Header.Get(HeaderVerificationStatus) != outcomeUnverified || resp.Header.Get(HeaderVerificationReceipt) != "" ||
			resp.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("fail_open %s: %d status %q receipt %t nosniff %q; want it released unverified, without a receipt", path, resp.StatusCode,
				resp.Header.Get(HeaderVerificationStatus), resp.Header.Get(HeaderVerificationReceipt) != "", resp.Header.Get("X-Content-Type-Options"))
		}
		noTrailers(t, path, resp)
	}

	for _, path := range []string{"/open/trailer", "/open/trailer-unannounced"} {
		resp, body = getBody(t, base+path, nil)
		if resp.StatusCode != 200 || string(body) != "not json" || resp.Header.Get(HeaderVerificationStatus) != outcomeUnverified ||
			resp.Header.Get(HeaderVerificationReceipt) != "" || resp.Trailer.Get(HeaderVerificationReceipt) != "" ||
			!slices.Equal(resp.Header.Values("Content-Type"), []string{"application/json"}) {
			t.Errorf("%s, fail_open with a receipt as a trailer: %d status %q receipt %q trailer %v Content-Type %q", path,
				resp.StatusCode, resp.Header.Get(HeaderVerificationStatus), resp.Header.Get(HeaderVerificationReceipt), resp.Trailer, resp.Header.Values("Content-Type"))
		}
		for k := range resp.Header {
			if strings.HasPrefix(k, http.TrailerPrefix) {
				t.Errorf("%s: a trailer released as header %q", path, k)
			}
		}
		noTrailers(t, path, resp)
	}

	resp, body = getBody(t, base+"/closed/trailer-good", nil)
	if resp.StatusCode != 200 || resp.Header.Get(HeaderVerificationStatus) != "pass" || resp.Header.Get(HeaderVerificationReceipt) == "" ||
		!slices.Equal(resp.Header.Values("Content-Type"), []string{"application/json"}) || resp.Header.Get("X-Late") != "" {
		t.Errorf("a verified answer with a Content-Type trailer: %d status %q Content-Type %q X-Late %q: %s", resp.StatusCode,
			resp.Header.Get(HeaderVerificationStatus), resp.Header.Values("Content-Type"), resp.Header.Get("X-Late"), body)
	}
	noTrailers(t, "/closed/trailer-good", resp)

	resp, _ = getBody(t, base+"/closed/plain", nil)
	if resp.Header.Get(HeaderVerificationStatus) != "" || resp.Trailer.Get(HeaderVerificationStatus) != "" || resp.Trailer.Get(HeaderVerificationReceipt) != "" {
		t.Errorf("an unchecked answer carries the upstream's status or receipt: header %q, trailers %v", resp.Header.Get(HeaderVerificationStatus), resp.Trailer)
	}
	// Its own trailer arrives, so the trailers above were dropped by name,
	// not lost with every other.
	if got := resp.Trailer.Get("X-Late"); got != "1" {
		t.Errorf("an unchecked answer lost the upstream's X-Late trailer: trailers %v", resp.Trailer)
	}
}
