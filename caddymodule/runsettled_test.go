package caddymodule

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aovhq/aov/x402"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// stallingUpstream answers after stall, or gives up when its request's
// context ends (as reverse_proxy's upstream sees the gate give up), while
// stalling is set; otherwise it answers at once. served counts the answers
// it wrote.
func stallingUpstream(t *testing.T, stall time.Duration) (up *httptest.Server, stalling *atomic.Bool, served *atomic.Int32) {
	stalling, served = new(atomic.Bool), new(atomic.Int32)
	up = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) // read: only then does the server see the gate hang up
		if stalling.Load() {
			select {
			case <-r.Context().Done():
				return
			case <-time.After(stall):
			}
		}
		served.Add(1)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"paid_content":true}`)
	}))
	t.Cleanup(up.Close)
	return up, stalling, served
}

// settle before: an upstream that sends no headers within upstream_timeout
// is given up on at that deadline, and the buyer, charged already, gets the
// gate's 503 saying so (not retryable: the payment is spent), not a wait
// bounded only by the transport's own timeouts, if any.
func TestSettleBeforeUpstreamTimeoutBeforeHeadersSaysCharged(t *testing.T) {
	_, fac := sharedDevnet(t)
	up, stalling, _ := stallingUpstream(t, 2*time.Minute)
	stalling.Store(true)
	url := startCaddy(t, gateSite(up.URL, fac, 0, "settle before\n\t\t\tupstream_timeout 500ms")) + "/verify/schema"
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 8)
	start := time.Now()
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	took := time.Since(start)
	m := readJSON(t, resp)
	if resp.StatusCode != http.StatusServiceUnavailable || m["code"] != "upstream_unavailable" || m["charged"] != true || m["retryable"] != false {
		t.Fatalf("answer %d %v, want 503 upstream_unavailable, charged true, not retryable", resp.StatusCode, m)
	}
	// The upstream stalls for minutes: an answer within one was the
	// gate's deadline (a bound far above 500ms, so a busy machine
	// never fails it).
	if took > time.Minute {
		t.Fatalf("answered after %v, want about upstream_timeout (500ms) after the settlement", took)
	}
	t.Logf("answered %v after the request", took)
	if sr := settlementOf(t, resp); !sr.Success || sr.Transaction == "" {
		t.Fatalf("PAYMENT-RESPONSE %+v, want the settlement", sr)
	}
}

// settle before: upstream_timeout bounds the wait for the upstream's
// headers only. A stream (SSE) whose headers came in time runs past it and
// is delivered whole; the upstream was told the deadline for its headers
// (X-Aov-Answer-By).
func TestSettleBeforeStreamPastUpstreamTimeoutIsDeliveredWhole(t *testing.T) {
	_, fac := sharedDevnet(t)
	const events = 6
	var answerBy atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		by, _ := strconv.ParseInt(r.Header.Get(HeaderUpstreamAnswerBy), 10, 64)
		answerBy.Store(by)
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for i := range events {
			fmt.Fprintf(w, "data: %d\n\n", i)
			rc.Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(250 * time.Millisecond): // 1.5 s in all, past upstream_timeout
			}
		}
	}))
	t.Cleanup(up.Close)
	url := startCaddy(t, gateSite(up.URL, fac, 0, "settle before\n\t\t\tupstream_timeout 500ms")) + "/verify/schema"
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 8)
	sent := time.Now()
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK || strings.Count(string(b), "data: ") != events {
		t.Fatalf("stream %d %q (%v), want all %d events", resp.StatusCode, b, err, events)
	}
	by := time.UnixMilli(answerBy.Load())
	if by.Before(sent) || by.After(sent.Add(5*time.Second)) {
		t.Fatalf("X-Aov-Answer-By %v, want the headers' deadline, about 500ms after %v", by, sent)
	}
}

// settle before, the settle reply lost: the retry that finds the transfer
// runs the upstream again, which sends no headers within upstream_timeout.
// The run is given back at that deadline (charged, retryable), and the
// buyer's next retry runs it.
func TestRunAgainUpstreamTimeoutBeforeHeadersGivesTheRunBack(t *testing.T) {
	sharedDevnet(t)
	up, stalling, served := stallingUpstream(t, 2*time.Minute)
	url := startCaddy(t, pendingSite(up.URL, "lose_reply", gateDir(t), "settle before\n\t\t\tupstream_timeout 500ms")) + "/verify/schema"
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 8)
	hdr := map[string]string{x402.HeaderPaymentSignature: sig}
	if resp := post(t, url, validRequest, hdr); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("first try: %d", resp.StatusCode)
	}
	stalling.Store(true)
	start := time.Now()
	resp := post(t, url, validRequest, hdr)
	took := time.Since(start)
	m := readJSON(t, resp)
	if resp.StatusCode != http.StatusServiceUnavailable || m["code"] != "upstream_unavailable" || m["charged"] != true || m["retryable"] != true {
		t.Fatalf("retry while the upstream stalls: %d %v, want 503 upstream_unavailable, charged, retryable", resp.StatusCode, m)
	}
	if took > time.Minute { // the upstream stalls for minutes, see above
		t.Fatalf("answered after %v, want about upstream_timeout (500ms)", took)
	}
	t.Logf("answered %v after the request", took)
	stalling.Store(false)
	resp = post(t, url, validRequest, hdr)
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "paid_content") || served.Load() != 1 {
		t.Fatalf("retry once the upstream answers: %d %s (served %d)", resp.StatusCode, b, served.Load())
	}
}

// A run again counts as delivered at the upstream's first write, not when
// its stream ends: a retry while the first run still streams, after the
// run's span (the clock moved past it), is payment_already_used and does
// not run the upstream a second time for one payment.
func TestRunAgainStreamingPastItsSpanIsNotRunTwice(t *testing.T) {
	sharedDevnet(t)
	release := make(chan struct{})
	var calls atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: first\n\n")
		http.NewResponseController(w).Flush()
		select {
		case <-release: // the stream goes on while the test looks
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "data: last\n\n")
	}))
	t.Cleanup(up.Close)
	url := startCaddy(t, pendingSite(up.URL, "lose_reply", gateDir(t), "settle before")) + "/verify/schema"
	released := false
	t.Cleanup(func() {
		if !released {
			close(release)
		}
	})
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 8)
	hdr := map[string]string{x402.HeaderPaymentSignature: sig}
	if resp := post(t, url, validRequest, hdr); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("first try: %d", resp.StatusCode)
	}
	first := post(t, url, validRequest, hdr) // returns with the headers
	rd := bufio.NewReader(first.Body)
	if line, err := rd.ReadString('\n'); first.StatusCode != http.StatusOK || line != "data: first\n" {
		t.Fatalf("run again: %d %q (%v)", first.StatusCode, line, err)
	}
	later := time.Now().Add(10 * time.Minute) // past the run's span (3m43s)
	now = func() time.Time { return later }
	t.Cleanup(func() { now = time.Now })
	resp := post(t, url, validRequest, hdr)
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusPaymentRequired || !strings.Contains(string(b), x402.ReasonPaymentAlreadyUsed) || calls.Load() != 1 {
		t.Fatalf("retry while the run streams, past its span: %d %s (runs %d)", resp.StatusCode, b, calls.Load())
	}
	close(release)
	released = true
	rest, err := io.ReadAll(rd)
	if err != nil || !strings.Contains(string(rest), "data: last") {
		t.Fatalf("the first run's stream: %q (%v)", rest, err)
	}
}

// echoUpgradeUpstream switches protocols ("Upgrade: echo") and echoes
// lines back; tunnels counts the tunnels it opened, ended those whose
// connection the other side closed.
func echoUpgradeUpstream(t *testing.T) (up *httptest.Server, tunnels, ended *atomic.Int32) {
	return upgradeUpstream(t, "echo")
}

// upgradeUpstream is echoUpgradeUpstream switching to the first protocol
// of accept that the request's Upgrade names anywhere in its token list
// (as gorilla/websocket, or a Node server's 'upgrade' event, takes
// "foo, websocket"), and answering the 101 with that protocol alone.
func upgradeUpstream(t *testing.T, accept ...string) (up *httptest.Server, tunnels, ended *atomic.Int32) {
	tunnels, ended = new(atomic.Int32), new(atomic.Int32)
	up = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		proto := ""
		for _, a := range accept {
			if proto == "" && headerHasToken(r.Header, "Upgrade", a) {
				proto = a
			}
		}
		if proto == "" {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"paid_content":true}`)
			return
		}
		tunnels.Add(1)
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: " + proto + "\r\nConnection: Upgrade\r\n\r\n")
		brw.Flush()
		for {
			line, err := brw.ReadString('\n')
			if err != nil {
				ended.Add(1)
				return
			}
			brw.WriteString("echo " + line)
			brw.Flush()
		}
	}))
	t.Cleanup(up.Close)
	return up, tunnels, ended
}

// upgradePost is a paid POST that asks to switch to the echo protocol.
func upgradePost(t *testing.T, url, sig string) *http.Response {
	t.Helper()
	resp, err := sendUpgradePost(url, sig)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// sendUpgradePost sends upgradePost's request ("" sig: none), for a
// goroutine that cannot fail the test; the caller closes the body.
func sendUpgradePost(url, sig string) (*http.Response, error) {
	return sendUpgradePostAs(url, "echo", sig)
}

// sendUpgradePostAs is sendUpgradePost asking for upgrade.
func sendUpgradePostAs(url, upgrade, sig string) (*http.Response, error) {
	return sendUpgrade(http.MethodPost, url, validRequest, upgrade, sig)
}

// sendUpgrade sends a request that asks to switch to upgrade, with body
// ("": none) and sig ("": no payment); the caller closes the response's
// body.
func sendUpgrade(method, url, body, upgrade, sig string) (*http.Response, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", upgrade)
	if sig != "" {
		req.Header.Set(x402.HeaderPaymentSignature, sig)
	}
	// No client Timeout: it would wrap a 101's body, which is then no
	// connection. echo bounds each read instead.
	return http.DefaultClient.Do(req)
}

// echo sends line through a switched connection and reads its echo, or
// fails after 3 s.
func echo(t *testing.T, resp *http.Response, line string) string {
	t.Helper()
	rw, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		t.Fatalf("a %d answer's body is no connection", resp.StatusCode)
	}
	got := make(chan string, 1)
	go func() {
		io.WriteString(rw, line+"\n")
		l, _ := bufio.NewReader(rw).ReadString('\n')
		got <- l
	}()
	select {
	case l := <-got:
		return l
	case <-time.After(3 * time.Second):
		return "(no echo in 3s)"
	}
}

// settle before: a protocol switch (101) is the answer's start, as a
// header is: upstream_timeout no longer applies once it is out, and the
// tunnel of the charged buyer runs past it.
func TestSettleBeforeProtocolSwitchOutlivesUpstreamTimeout(t *testing.T) {
	_, fac := sharedDevnet(t)
	up, _, _ := echoUpgradeUpstream(t)
	url := startCaddy(t, gateSite(up.URL, fac, 0, "settle before\n\t\t\tupstream_timeout 500ms")) + "/verify/schema"
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 8)
	resp := upgradePost(t, url, sig)
	if resp.StatusCode != http.StatusSwitchingProtocols {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("upgrade: %d %s", resp.StatusCode, b)
	}
	settlementOf(t, resp)
	if l := echo(t, resp, "one"); l != "echo one\n" {
		t.Fatalf("first echo %q", l)
	}
	time.Sleep(1500 * time.Millisecond) // past upstream_timeout
	if l := echo(t, resp, "two"); l != "echo two\n" {
		t.Fatalf("the tunnel after upstream_timeout (500ms): %q, want \"echo two\"", l)
	}
}

// A run again through a protocol switch is delivered at the 101: the
// payment bought that one tunnel, and a retry with it is
// payment_already_used, not a second run.
func TestRunAgainThroughAProtocolSwitchIsRunOnce(t *testing.T) {
	sharedDevnet(t)
	up, tunnels, _ := echoUpgradeUpstream(t)
	url := startCaddy(t, pendingSite(up.URL, "lose_reply", gateDir(t), "settle before")) + "/verify/schema"
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 8)
	if resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("first try: %d", resp.StatusCode)
	}
	resp := upgradePost(t, url, sig)
	if resp.StatusCode != http.StatusSwitchingProtocols {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("run again: %d %s", resp.StatusCode, b)
	}
	if l := echo(t, resp, "hello"); l != "echo hello\n" {
		t.Fatalf("run again's tunnel: %q", l)
	}
	resp.Body.Close()
	retry := upgradePost(t, url, sig)
	if retry.StatusCode == http.StatusSwitchingProtocols {
		t.Fatalf("retry after the run's tunnel: a second tunnel (%d in all) for one payment", tunnels.Load())
	}
	b, _ := io.ReadAll(retry.Body)
	if retry.StatusCode != http.StatusPaymentRequired || !strings.Contains(string(b), x402.ReasonPaymentAlreadyUsed) || tunnels.Load() != 1 {
		t.Fatalf("retry after the run's tunnel: %d %s (tunnels %d), want payment_already_used and one tunnel", retry.StatusCode, b, tunnels.Load())
	}
}

// lateHeaderUpstream is a fake upstream handler, for a fault a real one
// causes only by a race a test cannot time: reverse_proxy copies the
// upstream's headers into the writer's map, then calls WriteHeader, and
// upstream_timeout may fall in between. This one sets its answer's
// headers, waits until the gate has given up on it (its context ends at the
// deadline) and only then writes its header and body; a body it cannot
// write aborts it, as it aborts reverse_proxy (http.ErrAbortHandler).
type lateHeaderUpstream struct{}

func (lateHeaderUpstream) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.test_late_header", New: func() caddy.Module { return lateHeaderUpstream{} }}
}

func (lateHeaderUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	io.Copy(io.Discard, r.Body)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Content-Encoding", "gzip")
	h.Set("Content-Length", "5")
	h.Set("Set-Cookie", "session=upstream")
	h.Set(x402.HeaderPaymentResponse, "upstream-own")
	<-r.Context().Done()
	w.WriteHeader(http.StatusOK)
	if _, err := w.Write([]byte("hello")); err != nil {
		panic(http.ErrAbortHandler)
	}
	return nil
}

func init() {
	caddy.RegisterModule(lateHeaderUpstream{})
	httpcaddyfile.RegisterHandlerDirective("test_late_header", func(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		h.Next()
		return lateHeaderUpstream{}, nil
	})
}

// settle before: an upstream whose headers were set but whose header came
// after upstream_timeout leaves none of them on the gate's 503: the buyer,
// charged, gets a whole JSON upstream_unavailable with the settlement's
// PAYMENT-RESPONSE, not the upstream's length, encoding and cookie.
func TestSettleBeforeHeaderAfterUpstreamTimeoutLeavesTheGate503Clean(t *testing.T) {
	_, fac := sharedDevnet(t)
	site := gateSite("127.0.0.1:1", fac, 0, "settle before\n\t\t\tupstream_timeout 300ms")
	site = strings.Replace(site, "reverse_proxy 127.0.0.1:1", "test_late_header", 1)
	url := startCaddy(t, site) + "/verify/schema"
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 8)
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(validRequest))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(x402.HeaderPaymentSignature, sig)
	cl := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableCompression: true}}
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503", resp.StatusCode)
	}
	for _, k := range []string{"Content-Encoding", "Set-Cookie"} {
		if v := resp.Header.Get(k); v != "" {
			t.Errorf("the gate's 503 carries the upstream's %s %q", k, v)
		}
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("Content-Type %q, want the gate's JSON", ct)
	}
	m := readJSON(t, resp)
	if m["code"] != "upstream_unavailable" || m["charged"] != true || m["retryable"] != false {
		t.Fatalf("answer %v, want upstream_unavailable, charged true, not retryable", m)
	}
	settlementOf(t, resp)
}

// settle before: an upstream's 1xx (103 Early Hints) reaches the buyer
// without the x402 headers only the gate sets.
func TestSettleBeforeEarlyHintsCarryNoUpstreamPaymentHeaders(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.Header().Set(x402.HeaderPaymentRequired, "upstream-own")
		w.Header().Set(x402.HeaderPaymentResponse, "upstream-own")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		w.Header().Del(x402.HeaderPaymentRequired)
		w.Header().Del(x402.HeaderPaymentResponse)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"paid_content":true}`)
	}))
	t.Cleanup(up.Close)
	url := startCaddy(t, gateSite(up.URL, fac, 0, "settle before")) + "/verify/schema"
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 8)
	var mu sync.Mutex
	var hints []textproto.MIMEHeader
	trace := &httptrace.ClientTrace{Got1xxResponse: func(_ int, h textproto.MIMEHeader) error {
		mu.Lock()
		defer mu.Unlock()
		hints = append(hints, h)
		return nil
	}}
	req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), http.MethodPost, url, strings.NewReader(validRequest))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(x402.HeaderPaymentSignature, sig)
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "paid_content") {
		t.Fatalf("answer %d %s", resp.StatusCode, b)
	}
	settlementOf(t, resp)
	mu.Lock()
	defer mu.Unlock()
	if len(hints) != 1 || hints[0].Get("Link") == "" {
		t.Fatalf("1xx answers %v, want the upstream's 103 with its Link", hints)
	}
	for _, k := range []string{x402.HeaderPaymentRequired, x402.HeaderPaymentResponse} {
		if v := hints[0].Values(k); len(v) != 0 {
			t.Errorf("the 103 carries %s %q", k, v)
		}
	}
}
