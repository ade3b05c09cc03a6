package x402

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// nonceUsedReply is what a facilitator answers a /settle of a payment it
// already settled: a refusal, were it taken for the verdict of the first.
const nonceUsedReply = `{"success":false,"errorReason":"invalid_exact_evm_nonce_already_used","transaction":"","network":"eip155:84532"}`

// fakeResettingH2Facilitator is an HTTP/2 facilitator (TLS, ALPN h2)
// written frame by frame: it reads the first /settle whole (headers and
// body to END_STREAM), counts it as taken, and then resets its stream with
// PROTOCOL_ERROR instead of answering. FAKE FOR A FAULT: a server or a
// proxy in front of one may reset a stream so, which net/http's server
// never does. Every other stream is answered 200 with body. It counts the
// /settle requests it got.
func fakeResettingH2Facilitator(t *testing.T, body string) (url string, pool *x509.CertPool, settles *atomic.Int32) {
	t.Helper()
	certSrv := httptest.NewTLSServer(nil) // only for its certificate
	cert := certSrv.TLS.Certificates[0]
	pool = x509.NewCertPool()
	pool.AddCert(certSrv.Certificate())
	certSrv.Close()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	settles = new(atomic.Int32)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serveFakeResettingH2(c, body, settles)
		}
	}()
	return "https://" + ln.Addr().String(), pool, settles
}

func serveFakeResettingH2(c net.Conn, body string, settles *atomic.Int32) {
	defer c.Close()
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c, preface); err != nil {
		return
	}
	fr := http2.NewFramer(c, c)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if fr.WriteSettings() != nil {
		return
	}
	paths := map[uint32]string{}
	var hbuf bytes.Buffer
	enc := hpack.NewEncoder(&hbuf)
	done := func(id uint32) {
		if paths[id] == "/settle" && settles.Add(1) == 1 {
			fr.WriteRSTStream(id, http2.ErrCodeProtocol) // taken whole, then reset
			return
		}
		hbuf.Reset()
		enc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
		enc.WriteField(hpack.HeaderField{Name: "content-type", Value: "application/json"})
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hbuf.Bytes(), EndHeaders: true})
		fr.WriteData(id, true, []byte(body))
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				fr.WriteSettingsAck()
			}
		case *http2.MetaHeadersFrame:
			paths[f.StreamID] = f.PseudoValue("path")
			if f.StreamEnded() {
				done(f.StreamID)
			}
		case *http2.DataFrame:
			if n := len(f.Data()); n > 0 {
				fr.WriteWindowUpdate(0, uint32(n))
			}
			if f.StreamEnded() {
				done(f.StreamID)
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				fr.WritePing(true, f.Data)
			}
		}
	}
}

// roundTripperFunc is a transport other than an *http.Transport, whose
// connections the client cannot count.
type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A /settle that the facilitator read whole over HTTP/2 and whose stream
// was then reset (PROTOCOL_ERROR) is sent once: the facilitator gets one
// /settle and Settle returns an *UnknownOutcomeError, over a transport
// whose connections the client counts and over one it cannot. (Before: the
// body was a bytes.Reader, so net/http set GetBody, and its HTTP/2
// transport sent the request again after a stream reset so
// (golang/go#47635): the second reply, the facilitator's "nonce already
// used" for the payment the first settled, was returned as the verdict, a
// refusal, and the gate released a payment whose money had moved.)
func TestHTTPFacilitatorSettleNotSentAgainAfterStreamReset(t *testing.T) {
	for _, opaque := range []bool{false, true} {
		name := "counted connections"
		if opaque {
			name = "a transport that counts nothing"
		}
		t.Run(name, func(t *testing.T) {
			url, pool, settles := fakeResettingH2Facilitator(t, nonceUsedReply)
			tr := deadlineTransport(2*time.Second, 10*time.Second)
			tr.TLSClientConfig = &tls.Config{RootCAs: pool}
			var rt http.RoundTripper = tr
			if opaque {
				rt = roundTripperFunc(tr.RoundTrip)
			}
			f := NewHTTPFacilitator(HTTPFacilitatorConfig{URL: url, Timeout: 10 * time.Second, Client: &http.Client{Transport: rt}})
			p, req := samplePayment(t)
			out, err := f.Settle(context.Background(), p, req)
			var ue *UnknownOutcomeError
			if n := settles.Load(); n != 1 || !errors.As(err, &ue) {
				t.Fatalf("the facilitator got %d /settle requests; Settle returned %+v, %v; want 1 request and an *UnknownOutcomeError", n, out, err)
			}
		})
	}
}

// The same over HTTP/1.1 with an operator's Idempotency-Key header, which
// makes net/http take a POST as safe to send again: a /settle written whole
// on a kept-alive connection that the facilitator then closed without
// answering is sent once, an *UnknownOutcomeError. /verify, which moves no
// money, may still be sent again. (Before: net/http sent the /settle again
// on a new connection and its "nonce already used" reply was the verdict.)
func TestHTTPFacilitatorSettleNotSentAgainWithIdempotencyKey(t *testing.T) {
	srv, calls := scriptServer(t,
		scripted{status: 200, body: `{"isValid":true,"payer":"0x857b06519E91e3A54538791bDbb0E22373e36b66"}`},
		scripted{status: 0}, // the /settle, read whole, then the connection closed
		scripted{status: 200, body: nonceUsedReply})
	f := NewHTTPFacilitator(HTTPFacilitatorConfig{URL: srv.URL, Timeout: 5 * time.Second, Headers: map[string]string{"Idempotency-Key": "k1"}})
	p, req := samplePayment(t)
	if _, err := f.Verify(context.Background(), p, req); err != nil { // the connection is kept alive
		t.Fatal(err)
	}
	out, err := f.Settle(context.Background(), p, req)
	var ue *UnknownOutcomeError
	if n := calls.Load(); n != 2 || !errors.As(err, &ue) {
		t.Fatalf("the facilitator got %d requests; Settle returned %+v, %v; want 2 (the verify, one settle) and an *UnknownOutcomeError", n, out, err)
	}
}

// fakeWriteFailingConn is a facilitator connection whose writes fail,
// writing nothing (EPIPE), once broken is set. FAKE FOR A FAULT: a
// kept-alive connection that the facilitator reset while the client took
// it from its idle pool, a race no real server loses on demand.
type fakeWriteFailingConn struct {
	net.Conn
	broken *atomic.Bool
}

func (c fakeWriteFailingConn) Write(b []byte) (int, error) {
	if c.broken.Load() {
		return 0, syscall.EPIPE
	}
	return c.Conn.Write(b)
}

// A /settle of which no byte was written (its kept-alive connection's
// first write failed) is sent by net/http on a new connection: when that
// one is made, the settle is answered; when it is refused, nothing of the
// request was sent and Settle returns a *FacilitatorError. (Before: the
// failed kept-alive connection had been got, so the call counted as
// connected and the refused dial was an *UnknownOutcomeError: the gate
// held a payment never sent as settlement_pending until it expired.)
func TestHTTPFacilitatorSettleNothingWritten(t *testing.T) {
	for _, down := range []bool{false, true} {
		name := "the new connection is answered"
		if down {
			name = "the new connection is refused"
		}
		t.Run(name, func(t *testing.T) {
			srv, calls := scriptServer(t,
				scripted{status: 200, body: `{"isValid":true,"payer":"0x857b06519E91e3A54538791bDbb0E22373e36b66"}`},
				scripted{status: 200, body: `{"success":true,"transaction":"0xabc","network":"eip155:84532"}`})
			dead := httptest.NewServer(nil)
			deadAddr := dead.Listener.Addr().String()
			dead.Close() // its port refuses connections
			var broken atomic.Bool
			var dials atomic.Int32
			tr := deadlineTransport(time.Second, 5*time.Second)
			d := &net.Dialer{Timeout: time.Second}
			tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
				first := dials.Add(1) == 1
				if !first && down {
					addr = deadAddr
				}
				c, err := d.DialContext(ctx, network, addr)
				if err != nil || !first {
					return c, err
				}
				return fakeWriteFailingConn{c, &broken}, nil
			}
			f := NewHTTPFacilitator(HTTPFacilitatorConfig{URL: srv.URL, Timeout: 5 * time.Second, Client: &http.Client{Transport: tr}})
			p, req := samplePayment(t)
			if _, err := f.Verify(context.Background(), p, req); err != nil {
				t.Fatal(err)
			}
			broken.Store(true) // the kept-alive connection's writes fail
			out, err := f.Settle(context.Background(), p, req)
			if n := dials.Load(); n != 2 {
				t.Fatalf("%d dials; want 2 (the request sent again on a new connection)", n)
			}
			var fe *FacilitatorError
			switch {
			case down && (!errors.As(err, &fe) || calls.Load() != 1):
				t.Fatalf("Settle: %+v, %v (the facilitator got %d requests); want a *FacilitatorError and the verify alone: nothing of it was sent", out, err, calls.Load())
			case !down && (err != nil || !out.Success || calls.Load() != 2):
				t.Fatalf("Settle: %+v, %v (the facilitator got %d requests); want its success and 2 requests", out, err, calls.Load())
			}
		})
	}
}
