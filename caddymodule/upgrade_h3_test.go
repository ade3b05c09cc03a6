package caddymodule

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/quic-go/quic-go/http3"
)

// selfSignedLoopbackCert writes a certificate and key for 127.0.0.1 (HTTP/3
// needs TLS) and returns their paths.
func selfSignedLoopbackCert(t *testing.T) (string, string) {
	c, k, err := writeLoopbackCert(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return c, k
}

// writeLoopbackCert writes a self-signed certificate for 127.0.0.1, valid
// for a day, and its key into dir, and returns their paths.
func writeLoopbackCert(dir string) (string, string, error) {
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &k.PublicKey, k)
	if err != nil {
		return "", "", err
	}
	kb, _ := x509.MarshalECPrivateKey(k)
	c, kp := filepath.Join(dir, "c.pem"), filepath.Join(dir, "k.pem")
	if err := os.WriteFile(c, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return "", "", err
	}
	return c, kp, os.WriteFile(kp, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
}

// RFC 9220: a WebSocket over HTTP/3 is an extended CONNECT (:protocol
// websocket), which quic-go's server enables by default and reverse_proxy
// turns into an HTTP/1.1 Upgrade: websocket for the upstream, answering
// the client's CONNECT with a 200 where the gate settles a switch at a
// 101. The gate refuses it with 400 upgrade_unsupported before anything
// is offered, claimed or counted: the upstream never switches, and the
// free call is still there afterwards. Before, the upstream switched on
// every one, past per_day, uncharged.
func TestExtendedConnectOverH3IsRefused(t *testing.T) {
	extendedConnectOverH3(t, "", "")
}

// The same on a route with verify_response (settle_on any), where the
// upstream never runs for a protocol switch.
func TestExtendedConnectOverH3IsRefusedOnAVerifiedRoute(t *testing.T) {
	extendedConnectOverH3(t, "settle_on any", "verify_response {\n\t\tschema `{\"type\":\"object\"}`\n\t\tverifier_url http://127.0.0.1:1\n\t\ton_error fail_open\n\t}")
}

// extendedConnectOverH3 serves a free route (per_day 2) over h1, h2 and
// h3, spends one free call with an h3 GET, sends four WebSocket extended
// CONNECTs, and checks each was refused with no switch and no free call
// counted.
func extendedConnectOverH3(t *testing.T, gateExtra, routeExtra string) {
	_, fac := sharedDevnet(t)
	up, switches, _ := upgradeUpstream(t, "websocket")
	cert, key := selfSignedLoopbackCert(t)
	port := freePort(t)
	cfg := fmt.Sprintf(`{
	admin off
	auto_https off
	persist_config off
	http_port %[1]d
	https_port %[2]d
	storage file_system %[3]s
	log {
		output discard
	}
	servers {
		protocols h1 h2 h3
	}
}
https://127.0.0.1:%[2]d {
	tls %[4]s %[5]s
	x402 {
		accept devnet $0.02 %[6]s
		facilitator http %[7]s
		store badger %[8]s
		free_allowance {
			pool p
			per_day 2
			max_body 2KiB
		}
		%[10]s
	}
	%[11]s
	reverse_proxy %[9]s
}
`, freePort(t), port, t.TempDir(), cert, key, payTo.Hex(), fac, t.TempDir(), strings.TrimPrefix(up.URL, "http://"), gateExtra, routeExtra)
	js, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatal(err)
	}
	if err := caddy.Load(js, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { caddy.Stop() })
	tr := &http3.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}
	defer tr.Close()
	url := fmt.Sprintf("https://127.0.0.1:%d/x", port)
	for try := 0; ; try++ {
		gr, _ := http.NewRequest(http.MethodGet, url, nil)
		r, err := tr.RoundTrip(gr)
		if err == nil {
			b, _ := io.ReadAll(io.LimitReader(r.Body, 200))
			r.Body.Close()
			t.Logf("h3 GET: %d %s %s", r.StatusCode, r.Proto, b)
			break
		}
		if try > 30 {
			t.Fatalf("h3 GET: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var got []string
	for range 4 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodConnect, url, strings.NewReader("hello\n"))
		req.Proto = "websocket"
		var resp *http.Response
		resp, err = tr.RoundTrip(req)
		if err != nil {
			got = append(got, fmt.Sprintf("err %v", err))
			cancel()
			continue
		}
		line := ""
		if resp.StatusCode == 200 {
			line, _ = bufio.NewReader(resp.Body).ReadString('\n')
		} else {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
			line = string(b)
		}
		got = append(got, fmt.Sprintf("%d %q free-remaining=%q", resp.StatusCode, strings.TrimSpace(line), resp.Header.Get(HeaderFreeRemaining)))
		resp.Body.Close()
		cancel()
	}
	time.Sleep(300 * time.Millisecond) // a dropped switch's handler runs on
	for _, g := range got {
		if !strings.HasPrefix(g, "400 ") {
			t.Fatalf("h3 extended CONNECT websocket: answers %v, want each 400 upgrade_unsupported", got)
		}
	}
	if switches.Load() != 0 {
		t.Fatalf("h3 extended CONNECT websocket: the upstream switched %d times; answers %v, want none", switches.Load(), got)
	}
	gr, _ := http.NewRequest(http.MethodGet, url, nil)
	r, err := tr.RoundTrip(gr)
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusOK || r.Header.Get(HeaderFreeRemaining) != "0" {
		t.Fatalf("the free call after refused CONNECTs: %d, %s %q, want 200 with none left (none was counted)", r.StatusCode, HeaderFreeRemaining, r.Header.Get(HeaderFreeRemaining))
	}
}
