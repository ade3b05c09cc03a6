package server_test

import (
	"fmt"
	"net"
	"net/http/httptest"
	"runtime"
	"runtime/metrics"
	"strings"
	"testing"
	"time"
)

// A body announced with Content-Length and not sent costs verifierd only
// what arrived (growread), on every route that reads one: 64 connections
// announcing 1 MiB each and sending one byte hold a few KiB each, not 1
// MiB for as long as -read-timeout lets them wait. (Before: /verify/schema
// allocated the announced size at once, 64 MiB for them.)
func TestAnnouncedBodyCostsWhatArrived(t *testing.T) {
	f := newFixture(t, fixtureOpts{noSync: true, localSigner: true})
	srv := httptest.NewServer(f.h)
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	for _, path := range []string{"/verify/schema", "/verify/deliverable", "/mcp"} {
		const conns = 64
		runtime.GC()
		before := liveHeap()
		var cs []net.Conn
		for range conns {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			cs = append(cs, c)
			fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", path, 1<<20)
		}
		time.Sleep(500 * time.Millisecond) // every handler is reading its body
		runtime.GC()
		held := int64(liveHeap()) - int64(before)
		for _, c := range cs {
			c.Close()
		}
		if held > 16<<20 {
			t.Errorf("%s: %d connections that sent 1 byte of an announced 1 MiB hold %d MiB; want a few KiB each", path, conns, held>>20)
		}
	}
}

func liveHeap() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}
