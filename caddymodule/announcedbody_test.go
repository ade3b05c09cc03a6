package caddymodule

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/internal/growread"
)

// Over HTTP/2 a HEADERS frame of a few bytes (HPACK) is a request: one
// connection opens up to 250 such streams, each passing rateWait (it
// spends nothing at arrival), and each announcing a body it never sends,
// until read_body cuts it. The gate's buffer grows with the bytes that
// arrive (growread.Read), so what it holds for them is the streams' own
// bookkeeping whatever they announce. (Before: a body announced up to
// 64 KiB was given one allocation of that size before a byte of it came:
// 200 streams, 3 KB sent, +15 MiB held, against +1 MiB for bodies
// announced one byte larger.)
func TestAnnouncedBodiesUnsentHoldNoMemoryOverHTTP2(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	port := freePort(t)
	cfg := fmt.Sprintf("{\n\tadmin off\n\tauto_https off\n\tpersist_config off\n\thttp_port %d\n\tstorage file_system %s\n\tlog {\n\t\toutput discard\n\t}\n\tservers {\n\t\tprotocols h1 h2c\n\t\ttimeouts {\n\t\t\tread_header 5s\n\t\t\tread_body 15s\n\t\t}\n\t}\n}\n", port, caddyStorage)
	cfg += strings.NewReplacer("{port}", strconv.Itoa(port), "{data}", dataDir(t)).Replace(gateSite(up.URL, fac, 5, ""))
	js, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatal(err)
	}
	if err := caddy.Load(js, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { caddy.Stop() })
	waitServing(t, port)

	// Control: streams announcing a body of one byte, as little as a body
	// can be announced.
	ctlHeld, ctlSent := holdAnnouncingStreams(t, port, 1)
	held, sent := holdAnnouncingStreams(t, port, 65536)
	const streams = heldStreams
	t.Logf("control: %d streams announcing 1-byte bodies, %d bytes sent: live heap +%d KiB (%d KiB a stream)", streams, ctlSent, ctlHeld>>10, ctlHeld/streams>>10)
	t.Logf("%d streams announcing 65536-byte bodies, %d bytes sent by the client in all: live heap +%d KiB (%d KiB a stream)",
		streams, sent, held>>10, held/streams>>10)
	if held > ctlHeld+4<<20 {
		t.Errorf("one HTTP/2 connection that sent %d bytes (no body byte) has the gate hold +%d MiB of live heap (the control, announcing 1 byte, +%d MiB; want within 4 MiB of it): memory grows with what a client announces, not with what it sends",
			sent, held>>20, ctlHeld>>20)
	}
}

const heldStreams = 200

// holdAnnouncingStreams opens one h2c connection with heldStreams POSTs each
// announcing contentLength body bytes and sending none, and returns the
// live heap the process holds for them, and the bytes the client sent.
func holdAnnouncingStreams(t *testing.T, port int, contentLength int) (int64, int) {
	conn, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	counter := &countingWriter{w: conn}
	if _, err := io.WriteString(counter, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(counter, conn)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	go func() {
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			if s, ok := f.(*http2.SettingsFrame); ok && !s.IsAck() {
				mu.Lock()
				fr.WriteSettingsAck()
				mu.Unlock()
			}
		}
	}()
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	runtime.GC()
	before := heapObjects()
	for i := range heldStreams {
		hb.Reset()
		for _, f := range []hpack.HeaderField{
			{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"},
			{Name: ":authority", Value: "127.0.0.1:" + strconv.Itoa(port)}, {Name: ":path", Value: "/verify/schema"},
			{Name: "content-type", Value: "application/json"}, {Name: "content-length", Value: strconv.Itoa(contentLength)},
		} {
			enc.WriteField(f)
		}
		mu.Lock()
		err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: hb.Bytes(), EndHeaders: true})
		mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(2 * time.Second) // the handlers start and allocate
	runtime.GC()
	return int64(heapObjects()) - int64(before), counter.n
}

type countingWriter struct {
	w io.Writer
	n int
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += n
	return n, err
}

// readBodyUpTo reads a body that arrives in pieces whole, at its announced
// length or unannounced, refuses one over the limit with 413 and one cut
// short of its announced length with 422, and reads a body announced
// within growread.First in one allocation of its size.
func TestReadBodyUpToGrowsWithTheBytesThatArrive(t *testing.T) {
	want := strings.Repeat("0123456789", 10_000) // 100,000 bytes, over growread.First
	for _, announced := range []bool{true, false} {
		r := httptest.NewRequest(http.MethodPost, "/", iotest.OneByteReader(strings.NewReader(want)))
		if !announced {
			r.ContentLength = -1
		}
		got, err := readBodyUpTo(r, 1<<20)
		if err != nil || string(got) != want {
			t.Fatalf("announced %v: read %d bytes, %v; want the %d bytes sent", announced, len(got), err, len(want))
		}
		again, _ := io.ReadAll(r.Body)
		if string(again) != want || r.ContentLength != int64(len(want)) {
			t.Errorf("announced %v: the upstream reads %d bytes, Content-Length %d", announced, len(again), r.ContentLength)
		}
	}

	r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(want))
	r.ContentLength = -1
	if _, err := readBodyUpTo(r, int64(len(want))-1); apierr.From(err).Status != http.StatusRequestEntityTooLarge {
		t.Errorf("unannounced body one byte over the limit: %v, want 413", err)
	}

	r = httptest.NewRequest(http.MethodPost, "/", strings.NewReader(want[:10]))
	r.ContentLength = 20
	if _, err := readBodyUpTo(r, 1<<20); apierr.From(err).Status != http.StatusUnprocessableEntity {
		t.Errorf("body cut short of its announced length: %v, want 422", err)
	}

	small := want[:growread.First]
	allocs := testing.AllocsPerRun(20, func() {
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(small))
		readBodyUpTo(r, 1<<20)
	})
	base := testing.AllocsPerRun(20, func() {
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(small))
		setBody(r, []byte(small))
	})
	if allocs > base+1 {
		t.Errorf("a body announced at growread.First took %v allocations to read, %v without the read: want one for the body", allocs, base)
	}
}
