package caddymodule

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/aovhq/aov/x402"
)

// fakeResettingRemote is a remote facilitator reached over HTTPS with
// HTTP/2 (what a TLS facilitator negotiates with the gate's default
// transport), written frame by frame in front of the real devnet
// facilitator fac: every request is forwarded to fac and its reply
// returned, except that the first /settle, once fac answered it (the
// transfer made), has its stream reset with PROTOCOL_ERROR instead of
// answered. FAKE FOR A FAULT: a proxy in front of a facilitator may reset
// a stream so, which net/http's server never does. It counts the /settle
// requests it got. Its certificate is trustedCert.
func fakeResettingRemote(t *testing.T, fac string) (url string, settles *atomic.Int32) {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(trustedCert, trustedKey)
	if err != nil {
		t.Fatal(err)
	}
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
			go forwardResettingH2(c, fac, settles)
		}
	}()
	return "https://" + ln.Addr().String(), settles
}

func forwardResettingH2(c net.Conn, fac string, settles *atomic.Int32) {
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
	type stream struct {
		method, path string
		body         bytes.Buffer
	}
	streams := map[uint32]*stream{}
	var hbuf bytes.Buffer
	enc := hpack.NewEncoder(&hbuf)
	done := func(id uint32) {
		s := streams[id]
		delete(streams, id)
		req, _ := http.NewRequest(s.method, fac+s.path, bytes.NewReader(s.body.Bytes()))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			fr.WriteRSTStream(id, http2.ErrCodeInternal)
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if s.path == "/settle" && settles.Add(1) == 1 {
			fr.WriteRSTStream(id, http2.ErrCodeProtocol) // taken and settled, then reset
			return
		}
		hbuf.Reset()
		enc.WriteField(hpack.HeaderField{Name: ":status", Value: strconv.Itoa(resp.StatusCode)})
		enc.WriteField(hpack.HeaderField{Name: "content-type", Value: "application/json"})
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hbuf.Bytes(), EndHeaders: true})
		for len(body) > 0 {
			n := min(len(body), 16000)
			fr.WriteData(id, n == len(body), body[:n])
			body = body[n:]
		}
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
			streams[f.StreamID] = &stream{method: f.PseudoValue("method"), path: f.PseudoValue("path")}
			if f.StreamEnded() {
				done(f.StreamID)
			}
		case *http2.DataFrame:
			if s := streams[f.StreamID]; s != nil {
				s.body.Write(f.Data())
			}
			if n := len(f.Data()); n > 0 {
				fr.WriteWindowUpdate(0, uint32(n))
				fr.WriteWindowUpdate(f.StreamID, uint32(n))
			}
			if f.StreamEnded() && streams[f.StreamID] != nil {
				done(f.StreamID)
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				fr.WritePing(true, f.Data)
			}
		}
	}
}

// README: "/settle is sent exactly once and never retried"; a settle whose
// reply is lost is an unknown outcome, answered 503 settlement_pending,
// never a refusal. A gate whose remote facilitator (facilitator http over
// HTTPS, so HTTP/2, and a multi whose member it is) took the /settle,
// settled it on chain and then had its stream reset (PROTOCOL_ERROR) sends
// it once, and its charged buyer gets the content or 503
// settlement_pending. (Before: net/http's HTTP/2 transport sent the
// /settle again, rewinding its body through GetBody; the second reply, the
// settled nonce's refusal, was taken as the verdict, and the buyer, charged,
// was answered a refusal and not served.)
func TestRemoteSettleNotSentAgainOverHTTP2(t *testing.T) {
	d, fac := sharedDevnet(t)
	for i, tc := range []struct {
		desc string
		site func(t *testing.T, remote string) string
	}{
		{"facilitator http", gatedSite},
		{"a multi whose member it is", func(t *testing.T, remote string) string {
			up := newUpstream(t)
			return startCaddy(t, fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept devnet $0.01 %[3]s
			facilitator multi {
				http %[2]s
			}
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), remote, payTo.Hex())) + "/verify/schema"
		}},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			remote, settles := fakeResettingRemote(t, fac)
			url := tc.site(t, remote)
			pr := paymentRequired(t, post(t, url, "", nil))
			sig := signFor(t, pr, 4+i)
			before := balance(t, d, payTo)
			resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
			body, _ := io.ReadAll(resp.Body)
			moved := new(big.Int).Sub(balance(t, d, payTo), before)
			served := resp.StatusCode == http.StatusOK || (resp.StatusCode == http.StatusServiceUnavailable && bytes.Contains(body, []byte(`"settlement_pending"`)))
			if n := settles.Load(); n != 1 || moved.Sign() <= 0 || !served {
				t.Fatalf("the remote got %d /settle requests; payTo received %s atoms; the buyer got %d %.300s; want one /settle, the transfer and, charged, the content or 503 settlement_pending",
					n, moved, resp.StatusCode, body)
			}
		})
	}
}
