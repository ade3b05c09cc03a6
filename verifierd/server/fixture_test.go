package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aovhq/aov/agentcard"
	"github.com/aovhq/aov/internal/syncbuf"
	"github.com/aovhq/aov/keystore"
	"github.com/aovhq/aov/receipt"
	"github.com/aovhq/aov/score"
	"github.com/aovhq/aov/signer"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/verifierd/server"
	"github.com/aovhq/aov/verify"
)

const (
	baseURL      = "https://verify.example.test"
	gatewayToken = "gw-secret-0123456789abcdef"
)

// fixture is verifierd's handler wired to real parts: a real certd signing
// server on a real unix socket with keys on disk, and a real Badger store.
type fixture struct {
	keys    *keystore.Store
	socket  string
	signer  *http.Server
	db      *store.DB
	h       *server.Server
	reg     *prometheus.Registry
	logs    *syncbuf.Buffer
	dataDir string
}

type fixtureOpts struct {
	noSync bool
	// maxBody overrides the absolute body limit.
	maxBody int64
	// noGatewayToken configures no gateway token at all.
	noGatewayToken bool
	// ungated serves the paid routes without the gateway token.
	ungated bool
	// localSigner signs in process with the fixture's key directory
	// (verifierd -signer-keys) instead of over certd's socket.
	localSigner bool
	// history wraps the real store (a fault the real disk cannot be made
	// to show on cue).
	history func(*store.DB) server.History
	// score is the trust score method (nil: the default).
	score *score.Method
	// listCap overrides verify.Config.ListCap (verifierd -list-cap).
	listCap int
}

// shortDir is a temp dir with a short path: unix socket paths must fit in
// 108 bytes, which t.TempDir's long names can exceed.
func shortDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "vd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func newFixture(t testing.TB, o fixtureOpts) *fixture {
	t.Helper()
	dir := shortDir(t)
	f := &fixture{socket: filepath.Join(dir, "certd.sock"), logs: &syncbuf.Buffer{}, dataDir: filepath.Join(dir, "data")}
	var err error
	if f.keys, err = keystore.Open(filepath.Join(dir, "keys"), keystore.Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.keys.Generate(); err != nil {
		t.Fatal(err)
	}
	f.startSigner(t)

	if f.db, err = store.Open(f.dataDir, store.Options{NoSync: o.noSync}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.db.Close() })

	f.reg = prometheus.NewRegistry()
	m, err := server.NewMetrics(f.reg)
	if err != nil {
		t.Fatal(err)
	}
	token := gatewayToken
	if o.noGatewayToken {
		token = ""
	}
	var sig server.Signer = signer.NewClient(signer.ClientConfig{Socket: f.socket, Timeout: 2 * time.Second})
	if o.localSigner {
		l, err := signer.NewLocal(f.keys.Dir(), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		sig = l
	}
	var history server.History = f.db
	if o.history != nil {
		history = o.history(f.db)
	}
	f.h, err = server.New(server.Config{
		Verifier:          verify.New(verify.Config{MaxBodyBytes: o.maxBody, ListCap: o.listCap, VerifierVersion: "test"}),
		Signer:            sig,
		History:           history,
		PublicBaseURL:     baseURL + "/",
		GatewayToken:      token,
		UngatedPaidRoutes: o.ungated,
		Logger:            slog.New(slog.NewJSONHandler(logSink(t, f.logs), &slog.HandlerOptions{Level: slog.LevelDebug})),
		Metrics:           m,
		Score:             o.score,
	})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) startSigner(t testing.TB) {
	t.Helper()
	srv, err := signer.NewServer(signer.ServerConfig{Keys: f.keys})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := signer.ListenUnix(f.socket)
	if err != nil {
		t.Fatal(err)
	}
	f.signer = &http.Server{Handler: srv, ReadHeaderTimeout: 5 * time.Second}
	go f.signer.Serve(ln)
	t.Cleanup(func() { f.signer.Close() })
}

// stopSigner takes certd down: its socket stops answering.
func (f *fixture) stopSigner(t testing.TB) {
	t.Helper()
	if err := f.signer.Close(); err != nil {
		t.Fatal(err)
	}
	os.Remove(f.socket)
}

// keySet is what a receipt holder gets from the published agent card.
func (f *fixture) keySet(t testing.TB) receipt.KeySet {
	t.Helper()
	card, err := agentcard.Build(agentcard.Config{BaseURL: baseURL}, f.keys.List())
	if err != nil {
		t.Fatal(err)
	}
	raw, err := card.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	ks, err := receipt.KeysFromCard(raw)
	if err != nil {
		t.Fatal(err)
	}
	return ks
}

func (f *fixture) do(method, path string, body []byte, hdr map[string]string) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, newRequest(method, path, body, hdr))
	return w
}

// newRequest is a request to the handler: a body is JSON unless hdr says
// otherwise, and a header given as "" is removed.
func newRequest(method, path string, body []byte, hdr map[string]string) *http.Request {
	var r *http.Request
	if body == nil {
		r = httptest.NewRequest(method, path, nil)
	} else {
		r = httptest.NewRequest(method, path, bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		if v == "" {
			r.Header.Del(k)
		} else {
			r.Header.Set(k, v)
		}
	}
	return r
}

func (f *fixture) allRecords(t testing.TB) []store.Verification {
	t.Helper()
	vs, _, err := f.db.Verifications(context.Background(), "", "", store.MaxPageSize)
	if err != nil {
		t.Fatal(err)
	}
	return vs
}

// decode parses a JSON answer, failing the test on anything else.
func decode(t testing.TB, w *httptest.ResponseRecorder) map[string]any {
	t.Helper()
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q, want application/json", ct)
	}
	var m map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &m); err != nil {
		t.Fatalf("answer is not JSON: %v\n%s", err, w.Body.String())
	}
	return m
}

// invoice is the worked example of SPEC §10 with the given total.
func invoice(total string, extra string) []byte {
	return fmt.Appendf(nil, `{"task_id":"invoice-7731","agent_id":"seller-7",
"expected_schema":{"type":"object","required":["invoice_id","currency","line_items","total"],
 "properties":{"invoice_id":{"type":"string","pattern":"^INV-[0-9]{4}$"},
  "currency":{"enum":["USD","EUR"]},
  "line_items":{"type":"array","minItems":1,"items":{"type":"object","required":["sku","qty","line_total"],
   "properties":{"sku":{"type":"string"},"qty":{"type":"integer","minimum":1},"line_total":{"type":"number","minimum":0}}}},
  "total":{"type":"number"}}},
"submitted_output":{"invoice_id":"INV-7731","currency":"USD",
 "line_items":[{"sku":"A-100","qty":2,"line_total":87.0},{"sku":"B-200","qty":1,"line_total":42.5}],"total":%s},
"rules":[{"type":"sum_equals","field":"line_items[].line_total","equals_field":"total"}],
"enforce_rules":true%s}`, total, extra)
}

// logSink is where the fixture's logs go: the buffer tests read, but for a
// benchmark a sink that keeps nothing, as a daemon's stderr keeps nothing
// in its memory (an ever-growing buffer would charge its growth to the
// request). The JSON handler still formats every line.
func logSink(t testing.TB, logs io.Writer) io.Writer {
	if _, ok := t.(*testing.B); ok {
		return io.Discard
	}
	return logs
}
