package caddymodule

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// exampleGlobalLogEncoder is the encoder of Caddyfile.example's global log
// (Caddy's own log), adapted and provisioned as Caddy does, with its JSON.
func exampleGlobalLogEncoder(t *testing.T) (zapcore.Encoder, json.RawMessage) {
	t.Helper()
	raw, err := os.ReadFile("../Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	js, _, err := caddyconfig.GetAdapter("caddyfile").Adapt(raw, map[string]any{"filename": "Caddyfile.example"})
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Logging struct {
			Logs map[string]struct {
				Encoder json.RawMessage `json:"encoder"`
			} `json:"logs"`
		} `json:"logging"`
	}
	if err := json.Unmarshal(js, &cfg); err != nil {
		t.Fatal(err)
	}
	enc := cfg.Logging.Logs["default"].Encoder
	if enc == nil {
		t.Fatalf("Caddyfile.example has no global log encoder: %s", js)
	}
	return loadLogEncoder(t, enc), enc
}

// loadLogEncoder provisions the encoder module raw names (its "format").
func loadLogEncoder(t *testing.T, raw json.RawMessage) zapcore.Encoder {
	t.Helper()
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	var format string
	json.Unmarshal(cfg["format"], &format)
	delete(cfg, "format") // the module's name, not its configuration
	raw, _ = json.Marshal(cfg)
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	mod, err := ctx.LoadModuleByID("caddy.logging.encoders."+format, raw)
	if err != nil {
		t.Fatal(err)
	}
	return mod.(zapcore.Encoder)
}

// countingObject is a log object that counts how often it is encoded.
type countingObject struct {
	n *int
	zapcore.ObjectMarshaler
}

func (c countingObject) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	*c.n++
	return c.ObjectMarshaler.MarshalLogObject(enc)
}

// Caddy gives each request's copy to its access logger with With, and
// reverse_proxy its upstream request to its logger with With on every
// call; zap hands those fields to every core of the logger, so Caddy's own
// log (the global `log`, which writes neither: access lines are excluded
// from it, reverse_proxy's lines are DEBUG) received them too, and its
// filter encoded each request at once, about 40 allocations per free call
// for lines never written. Caddyfile.example's global log keeps them
// unencoded until a line is written; a written line still holds the
// request without any of its headers. (Before: the request was encoded on
// every With.)
func TestExampleGlobalLogEncodesAFieldOnlyWhenALineIsWritten(t *testing.T) {
	enc, _ := exampleGlobalLogEncoder(t)
	var out bytes.Buffer
	logger := zap.New(zapcore.NewCore(enc, zapcore.AddSync(&out), zapcore.InfoLevel))

	r := httptest.NewRequest(http.MethodPost, "http://gw.example/verify/schema", nil)
	r.Header.Set("Payment-Signature", "PAYSIG-MARK")
	r.Header.Set("X-Aov-Gateway-Token", "TOKEN-MARK")
	var n int
	req := zap.Object("request", countingObject{&n, caddyhttp.LoggableHTTPRequest{Request: r}})

	withReq := logger.With(req, zap.String("upstream", "127.0.0.1:8081"))
	withReq.Debug("upstream roundtrip") // below the log's level: never written
	if n != 0 || out.Len() != 0 {
		t.Fatalf("a line not written encoded the request %d times (%q)", n, out.String())
	}
	withReq.Info("handled request", zap.Int("status", 200))
	if n != 1 {
		t.Fatalf("a written line encoded the request %d times, want 1", n)
	}
	line := out.String()
	for _, want := range []string{`/verify/schema"`, `"method": "POST"`, `"upstream": "127.0.0.1:8081"`, `"status": 200`} {
		if !strings.Contains(line, want) {
			t.Errorf("the line has no %s: %s", want, line)
		}
	}
	for _, mark := range []string{"PAYSIG-MARK", "TOKEN-MARK", "headers"} {
		if strings.Contains(line, mark) {
			t.Errorf("the line holds %s: %s", mark, line)
		}
	}
}

// aov_filter writes every line as Caddy's filter writes it, the fields
// given to With (nested loggers, namespaces, every field type) in the same
// places as those given with the line; only the moment they are encoded
// differs.
func TestLogFilterWritesWhatCaddysFilterWrites(t *testing.T) {
	const fields = `"fields":{"request>headers":{"filter":"delete"},"secret":{"filter":"replace","value":"REDACTED"}}`
	for _, wrap := range []string{"console", "json"} {
		encode := func(format string) string {
			enc := loadLogEncoder(t, json.RawMessage(`{"format":"`+format+`","wrap":{"format":"`+wrap+`"},`+fields+`}`))
			var out bytes.Buffer
			logger := zap.New(zapcore.NewCore(enc, zapcore.AddSync(&out), zapcore.DebugLevel), zap.WithClock(fixedClock{})).Named("http.handlers.reverse_proxy")
			r := httptest.NewRequest(http.MethodGet, "http://gw.example/score/a?x=1", nil)
			r.Header.Set("X-Wallet-Auth", "WALLETPROOF-MARK")
			at := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
			l := logger.With(
				zap.Object("request", caddyhttp.LoggableHTTPRequest{Request: r}),
				zap.String("secret", "s3cret"),
				zap.Strings("list", []string{"a", "b"}),
				zap.Binary("bin", []byte{1, 2}), zap.ByteString("bs", []byte("x")),
				zap.Bool("b", true), zap.Complex128("c128", 1+2i), zap.Complex64("c64", 3+4i),
				zap.Duration("d", time.Second), zap.Float64("f64", 1.5), zap.Float32("f32", 2.5),
				zap.Int("i", -1), zap.Int64("i64", -2), zap.Int32("i32", -3), zap.Int16("i16", -4), zap.Int8("i8", -5),
				zap.Time("t", at), zap.Uint("u", 1), zap.Uint64("u64", 2), zap.Uint32("u32", 3), zap.Uint16("u16", 4),
				zap.Uint8("u8", 5), zap.Uintptr("up", 6), zap.Reflect("r", map[string]int{"k": 1}),
				zap.Error(http.ErrBodyNotAllowed), zap.Stringer("st", r.URL),
			).With(zap.Namespace("ns"), zap.String("inner", "v"))
			l.Info("one", zap.Int("status", 200), zap.String("secret", "again"))
			l.Warn("two")
			logger.Info("three")
			return out.String()
		}
		want, got := encode("filter"), encode("aov_filter")
		if got != want || !strings.Contains(got, "inner") {
			t.Errorf("wrap %s: aov_filter wrote\n%s\nCaddy's filter\n%s", wrap, got, want)
		}
		if strings.Contains(got, "WALLETPROOF-MARK") || strings.Contains(got, "s3cret") {
			t.Errorf("wrap %s: a filtered field was written: %s", wrap, got)
		}
	}
}

// fixedClock is a log clock that always reads the same time.
type fixedClock struct{}

func (fixedClock) Now() time.Time { return time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) }

func (fixedClock) NewTicker(d time.Duration) *time.Ticker { return time.NewTicker(d) }

// One logger's encoder is shared by every request: loggers derived from
// it at once, each with its own fields, write only their own (run with
// -race for the sharing itself).
func TestLogFilterKeepsEachLoggersFieldsApart(t *testing.T) {
	enc := loadLogEncoder(t, json.RawMessage(`{"format":"aov_filter","wrap":{"format":"json"},"fields":{"request>headers":{"filter":"delete"}}}`))
	var mu sync.Mutex
	var out bytes.Buffer
	logger := zap.New(zapcore.NewCore(enc, zapcore.AddSync(lockedWriter{&mu, &out}), zapcore.InfoLevel)).With(zap.String("server", "srv0"))
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := logger.With(zap.Int("n", i))
			for j := range 20 {
				l.With(zap.Int("j", j)).Info("line")
			}
		}()
	}
	wg.Wait()
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 16*20 {
		t.Fatalf("%d lines, want %d", len(lines), 16*20)
	}
	seen := map[[2]float64]bool{}
	for _, l := range lines {
		var v map[string]any
		if err := json.Unmarshal([]byte(l), &v); err != nil {
			t.Fatalf("%v: %s", err, l)
		}
		n, _ := v["n"].(float64)
		j, _ := v["j"].(float64)
		if len(v) != 6 || v["server"] != "srv0" || seen[[2]float64{n, j}] {
			t.Fatalf("a line not of its own logger's fields alone: %s", l)
		}
		seen[[2]float64{n, j}] = true
	}
}

// lockedWriter serializes writes to a buffer shared by goroutines.
type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// aov_filter refuses an unknown field, as Caddy refuses one in any
// module's JSON and its own filter does: a misspelt "fields" would load
// and delete nothing. (Before: it loaded, and the line kept the request's
// headers.)
func TestLogFilterRefusesAnUnknownField(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	typo := json.RawMessage(`{"wrap":{"format":"json"},"feilds":{"request>headers":{"filter":"delete"}}}`)
	for _, id := range []string{"filter", "aov_filter"} {
		if _, err := ctx.LoadModuleByID("caddy.logging.encoders."+id, typo); err == nil || !strings.Contains(err.Error(), "feilds") {
			t.Errorf("%s loaded a config with the unknown field feilds: %v; want refused", id, err)
		}
	}
}

// Caddy's admin API logs each request it receives at INFO with its
// headers under the top-level field "headers": Caddyfile.example's global
// log deletes them as it deletes request>headers, so no request header
// reaches Caddy's own log. (Before: the admin request's headers were
// written.)
func TestExampleGlobalLogHoldsNoAdminRequestHeader(t *testing.T) {
	_, encoder := exampleGlobalLogEncoder(t)
	logFile := t.TempDir() + "/caddy.log"
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	cfg := fmt.Sprintf(`{"admin":{"listen":%q},"logging":{"logs":{"default":{"writer":{"output":"file","filename":%q},"encoder":%s,"level":"INFO"}}}}`, addr, logFile, encoder)
	if err := caddy.Load([]byte(cfg), true); err != nil {
		t.Fatal(err)
	}
	defer caddy.Stop()
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/config/", nil)
	req.Header.Set("X-Wallet-Auth", "WALLETPROOF-MARK")
	req.Header.Set("Payment-Signature", "PAYSIG-MARK")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var log []byte
	waitFor(t, "the admin API's line for the request", func() bool {
		log, _ = os.ReadFile(logFile)
		return bytes.Contains(log, []byte(`"uri":"/config/"`)) || bytes.Contains(log, []byte("/config/"))
	})
	if bytes.Contains(log, []byte("WALLETPROOF-MARK")) || bytes.Contains(log, []byte("PAYSIG-MARK")) {
		t.Errorf("Caddy's own log wrote a request header of an admin request:\n%s", log)
	}
}
