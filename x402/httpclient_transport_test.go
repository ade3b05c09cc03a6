package x402

import (
	"context"
	"crypto/tls"
	"encoding/pem"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"weak"
)

// callersTransports are transports an operator may give the facilitator
// client, each with the protocol net/http speaks over it to an HTTPS
// server that offers HTTP/2 and HTTP/1.1.
var callersTransports = []struct {
	name  string
	proto string
	new   func() *http.Transport
}{
	{"the zero transport", "HTTP/2.0", func() *http.Transport { return &http.Transport{} }},
	{"pool sizes and a proxy", "HTTP/2.0", func() *http.Transport {
		return &http.Transport{Proxy: http.ProxyFromEnvironment, MaxIdleConnsPerHost: 8, IdleConnTimeout: time.Minute}
	}},
	{"HTTP/2 turned off", "HTTP/1.1", func() *http.Transport {
		return &http.Transport{TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{}}
	}},
	{"a dialer of its own", "HTTP/1.1", func() *http.Transport {
		return &http.Transport{DialContext: (&net.Dialer{}).DialContext}
	}},
	{"a dialer of its own, HTTP/2 forced", "HTTP/2.0", func() *http.Transport {
		return &http.Transport{DialContext: (&net.Dialer{}).DialContext, ForceAttemptHTTP2: true}
	}},
	{"Protocols HTTP/1", "HTTP/1.1", func() *http.Transport {
		p := new(http.Protocols)
		p.SetHTTP1(true)
		return &http.Transport{Protocols: p}
	}},
	{"Protocols HTTP/1 and HTTP/2, a dialer of its own", "HTTP/2.0", func() *http.Transport {
		p := new(http.Protocols)
		p.SetHTTP1(true)
		p.SetHTTP2(true)
		return &http.Transport{Protocols: p, DialContext: (&net.Dialer{}).DialContext}
	}},
}

// A facilitator client built on a caller's *http.Transport reaches an
// HTTPS facilitator with the protocol that transport itself speaks to it,
// HTTP/2 or HTTP/1.1, for each of callersTransports. The calls run in a
// child process that trusts the facilitator's certificate through the
// system roots (SSL_CERT_FILE, read once per process), as a transport
// with no TLSClientConfig of its own does. (Before: the client's copy of
// a transport on which net/http turns HTTP/2 on by default, the zero one
// or one with only pool sizes or a proxy, offered h2 in its TLS
// handshake, which Clone had added to the transport's TLS config, but
// had no HTTP/2 of its own, its dialer keeping net/http from setting it
// up: it wrote HTTP/1.1 on the connection the server took as h2, /verify
// failed and every /settle was an unknown outcome that settled nothing.)
func TestHTTPFacilitatorSpeaksItsTransportsProtocols(t *testing.T) {
	var mu sync.Mutex
	protos := map[string]string{} // path -> protocol
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		protos[r.URL.Path] = r.Proto
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if strings.HasSuffix(r.URL.Path, "/settle") {
			io.WriteString(w, `{"success":true,"transaction":"0xabc","network":"eip155:84532"}`)
			return
		}
		io.WriteString(w, `{"isValid":true,"payer":"0x857b06519E91e3A54538791bDbb0E22373e36b66"}`)
	}))
	srv.EnableHTTP2 = true
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the HTTP/1.1 written on h2 (Before)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	roots := filepath.Join(t.TempDir(), "roots.pem")
	if err := os.WriteFile(roots, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHTTPFacilitatorOnCallersTransportProcess$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "AOV_TEST_FACILITATOR_URL="+srv.URL, "SSL_CERT_FILE="+roots)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("the calls in the child process: %v\n%s", err, out)
	}
	mu.Lock()
	defer mu.Unlock()
	for i, c := range callersTransports {
		direct, verify, settle := protos[callerPath(i, "direct")], protos[callerPath(i, "verify")], protos[callerPath(i, "settle")]
		if direct != c.proto || verify != c.proto || settle != c.proto {
			t.Errorf("%s: the transport itself reached the facilitator with %q, the facilitator client built on it with %q (/verify) and %q (/settle); want %s for all three", c.name, direct, verify, settle, c.proto)
		}
	}
}

// callerPath is the path that the calls over callersTransports[i] use.
func callerPath(i int, call string) string { return "/" + string(rune('a'+i)) + "/" + call }

// TestHTTPFacilitatorOnCallersTransportProcess is the child process of
// TestHTTPFacilitatorSpeaksItsTransportsProtocols: over each of
// callersTransports, a request of the transport's own and a facilitator's
// verify and settle.
func TestHTTPFacilitatorOnCallersTransportProcess(t *testing.T) {
	base := os.Getenv("AOV_TEST_FACILITATOR_URL")
	if base == "" {
		t.Skip("run by TestHTTPFacilitatorSpeaksItsTransportsProtocols")
	}
	p, req := samplePayment(t)
	for i, c := range callersTransports {
		client := &http.Client{Transport: c.new()}
		resp, err := client.Post(base+callerPath(i, "direct"), "application/json", strings.NewReader("{}"))
		if err != nil {
			t.Errorf("%s: the transport itself: %v", c.name, err)
			continue
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		f := NewHTTPFacilitator(HTTPFacilitatorConfig{URL: base + strings.TrimSuffix(callerPath(i, ""), "/"), Client: client, Timeout: 10 * time.Second})
		if _, err := f.Verify(context.Background(), p, req); err != nil {
			t.Errorf("%s: Verify: %v", c.name, err)
		}
		if _, err := f.Settle(context.Background(), p, req); err != nil {
			t.Errorf("%s: Settle: %T %v", c.name, err, err)
		}
	}
}

// Facilitators built on one Client share one pool of connections, as they
// would the Client's transport's own: five of them, calling one after
// another, open one connection, which any of them closes once idle
// (CloseIdleConnections). (Before: each facilitator made a copy of the
// transport of its own, and so a connection of its own, which nothing the
// caller could reach closed: with a transport that has no
// IdleConnTimeout, as the zero one, connections and their goroutines
// piled up with every facilitator built.)
func TestHTTPFacilitatorsShareTheirTransportsPool(t *testing.T) {
	var opened, open atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"isValid":true,"payer":"0x857b06519E91e3A54538791bDbb0E22373e36b66"}`)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			opened.Add(1)
			open.Add(1)
		case http.StateClosed, http.StateHijacked:
			open.Add(-1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	client := &http.Client{Transport: &http.Transport{}} // no IdleConnTimeout
	p, req := samplePayment(t)
	var fs []*HTTPFacilitator
	for range 5 {
		f := NewHTTPFacilitator(HTTPFacilitatorConfig{URL: srv.URL, Client: client, Timeout: 5 * time.Second})
		if _, err := f.Verify(context.Background(), p, req); err != nil {
			t.Fatal(err)
		}
		fs = append(fs, f)
	}
	if n := opened.Load(); n != 1 {
		t.Fatalf("%d facilitators on one Client, calling one after another, opened %d connections; want 1", len(fs), n)
	}
	fs[len(fs)-1].CloseIdleConnections()
	for open.Load() != 0 { // the server sees the close; the test's own deadline bounds the wait
		time.Sleep(10 * time.Millisecond)
	}
}

// A caller's transport is held weakly by the facilitator client: once the
// caller no longer holds it, its entry (and the copy, when no facilitator
// holds it) is forgotten, so a caller making transports does not pile
// them up.
func TestHTTPFacilitatorForgetsDroppedTransports(t *testing.T) {
	tr := &http.Transport{}
	key := weak.Make(tr)
	NewHTTPFacilitator(HTTPFacilitatorConfig{URL: "http://127.0.0.1:1", Client: &http.Client{Transport: tr}})
	if _, ok := countingCopies.Load(key); !ok {
		t.Fatal("no copy of the transport kept")
	}
	for { // tr is no longer used; cleanups run after a collection, on a goroutine of their own; the test's deadline bounds the wait
		runtime.GC()
		if _, ok := countingCopies.Load(key); !ok {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
