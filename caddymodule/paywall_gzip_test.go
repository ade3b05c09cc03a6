package caddymodule

import (
	"bytes"
	"compress/gzip"
	"hash/crc32"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/aovhq/aov/x402"
)

// gunzip decompresses one gzip member, checking its CRC and length.
func gunzip(t testing.TB, b []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("not gzip: %v", err)
	}
	zr.Multistream(false)
	out, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("gunzip: %v", err)
	}
	if rest, _ := io.ReadAll(zr); len(rest) != 0 {
		t.Fatalf("%d bytes after the gzip member", len(rest))
	}
	return out
}

// TestOfficialPaywallIsGzippedForWhoAcceptsIt: a request that accepts gzip
// (as Caddy's encode handler reads Accept-Encoding) gets the official page
// compressed, with its Content-Length, and it decompresses (CRC and length
// checked) to the page the same request gets uncompressed, byte for byte;
// for both pages, and for a configuration script longer than one stored
// block. Every official page varies on Accept-Encoding.
func TestOfficialPaywallIsGzippedForWhoAcceptsIt(t *testing.T) {
	offer := x402.PaymentRequirements{Scheme: "exact", Amount: "10000", Asset: "0x1", PayTo: "0x2"}
	for _, tc := range []struct {
		network, appName string
	}{
		{x402.NetworkBase, "Agent Verifier"},
		{x402.NetworkSolanaDevnet, ""},
		{x402.NetworkDevnet, strings.Repeat("a long name ", 20000)}, // 240 KB: four stored blocks
	} {
		p := &Paywall{Mode: PaywallOfficial, AppName: tc.appName}
		offer.Network = tc.network
		pr := x402.PaymentRequired{X402Version: 2, Resource: x402.Resource{URL: "http://h/score/a"}, Accepts: []x402.PaymentRequirements{offer}}
		get := func(acceptEncoding ...string) *httptest.ResponseRecorder {
			r := httptest.NewRequest(http.MethodGet, "/score/a", nil)
			r.Header["Accept-Encoding"] = acceptEncoding
			rec := httptest.NewRecorder()
			if err := p.serve(rec, r, pr, 6, nil, "http://h/score/a"); err != nil {
				t.Fatal(err)
			}
			if rec.Code != http.StatusPaymentRequired || !headerHasToken(rec.Header(), "Vary", "Accept-Encoding") {
				t.Fatalf("%s, Accept-Encoding %q: status %d, Vary %q", tc.network, acceptEncoding, rec.Code, rec.Header().Values("Vary"))
			}
			return rec
		}
		plain := get().Body.Bytes()
		officialConfigOf(t, string(plain))
		for _, ae := range [][]string{nil, {"identity"}, {"gzip;q=0"}, {"deflate, br"}, {"gzip;q=0, br"}} {
			if rec := get(ae...); rec.Header().Get("Content-Encoding") != "" || !bytes.Equal(rec.Body.Bytes(), plain) {
				t.Errorf("%s, Accept-Encoding %q: Content-Encoding %q, the page differs from the uncompressed one", tc.network, ae, rec.Header().Get("Content-Encoding"))
			}
		}
		for _, ae := range [][]string{{"gzip"}, {"GZip"}, {"br;q=1.0, gzip;q=0.5, *;q=0"}, {"br", "gzip"}, {"gzip, deflate, br, zstd"}} {
			rec := get(ae...)
			body := rec.Body.Bytes()
			if rec.Header().Get("Content-Encoding") != "gzip" || rec.Header().Get("Content-Length") != strconv.Itoa(len(body)) {
				t.Fatalf("%s, Accept-Encoding %q: Content-Encoding %q, Content-Length %q for %d bytes", tc.network, ae, rec.Header().Get("Content-Encoding"), rec.Header().Get("Content-Length"), len(body))
			}
			if got := gunzip(t, body); !bytes.Equal(got, plain) {
				t.Fatalf("%s, Accept-Encoding %q: the gzipped page decompresses to %d bytes that are not the %d of the page", tc.network, ae, len(got), len(plain))
			}
			if tc.appName == "" && len(body)*3 > len(plain) {
				t.Errorf("%s: %d bytes gzipped for a page of %d", tc.network, len(body), len(plain))
			}
		}
	}
}

// FuzzGzipPage: for any page split and any script between its halves, the
// stream built around the script decompresses to the three, with a
// matching CRC and length.
func FuzzGzipPage(f *testing.F) {
	f.Add("<html><head>", "</head><body>x</body></html>", []byte("<script>window.x402 = {};</script>\n"))
	f.Add("", "", []byte(""))
	f.Add(strings.Repeat("ab", 40000), strings.Repeat("ab", 40000), bytes.Repeat([]byte{0}, 70000))
	f.Fuzz(func(t *testing.T, head, rest string, script []byte) {
		parts, n := newGzipPage(officialPage{head: []byte(head), rest: []byte(rest)}).stream(script)
		gz := bytes.Join(parts[:], nil)
		if len(gz) != n {
			t.Fatalf("stream of %d bytes, said %d", len(gz), n)
		}
		want := head + string(script) + rest
		if got := gunzip(t, gz); string(got) != want {
			t.Fatalf("decompressed %d bytes, want %d", len(got), len(want))
		}
	})
}

// FuzzCRC32Combine: the combined CRC of two parts is the CRC of the whole.
func FuzzCRC32Combine(f *testing.F) {
	f.Add([]byte("head"), []byte("rest"))
	f.Add([]byte{}, []byte{})
	f.Add(bytes.Repeat([]byte{0xff}, 5000), []byte{1})
	f.Fuzz(func(t *testing.T, a, b []byte) {
		got := crc32Combine(crc32.ChecksumIEEE(a), crc32.ChecksumIEEE(b), crc32Shift(int64(len(b))))
		if want := crc32.ChecksumIEEE(append(a[:len(a):len(a)], b...)); got != want {
			t.Fatalf("combined %08x, want %08x", got, want)
		}
	})
}

// discardWriter is a ResponseWriter that drops what it is sent, so a
// benchmark measures the writer's own work.
type discardWriter struct{ h http.Header }

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) WriteHeader(int)             {}
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }

// BenchmarkOfficialPaywall: what one official 402 page costs the gateway,
// uncompressed and gzipped (the page built for the request; the bytes
// are not sent).
func BenchmarkOfficialPaywall(b *testing.B) {
	p := &Paywall{Mode: PaywallOfficial, AppName: "Agent Verifier"}
	pr := x402.PaymentRequired{X402Version: 2, Resource: x402.Resource{URL: "http://h/score/a"},
		Accepts: []x402.PaymentRequirements{{Scheme: "exact", Network: x402.NetworkBase, Amount: "10000", Asset: "0x1", PayTo: "0x2"}}}
	evmPage.gzipped()
	for _, ae := range []string{"identity", "gzip"} {
		b.Run(ae, func(b *testing.B) {
			r := httptest.NewRequest(http.MethodGet, "/score/a", nil)
			r.Header.Set("Accept-Encoding", ae)
			b.ReportAllocs()
			for b.Loop() {
				if err := p.serve(&discardWriter{h: http.Header{}}, r, pr, 6, nil, "http://h/score/a"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
