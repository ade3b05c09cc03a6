package svmfacilitator

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestRPCKeepsItsConnections runs rounds of calls that are all in flight
// at once, as Settles polling side by side are, and counts the connections
// the node sees: every round after the first reuses the first round's.
func TestRPCKeepsItsConnections(t *testing.T) {
	const inFlight, rounds = 8, 3
	var dialed, arrived atomic.Int32
	var mu sync.Mutex
	release := make(chan struct{})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		wait := release
		mu.Unlock()
		arrived.Add(1)
		<-wait
		w.Write([]byte(`{"jsonrpc":"2.0","id":1,"result":"genesis"}`))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			dialed.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	c := &RPC{URL: srv.URL}
	for round := 1; round <= rounds; round++ {
		var wg sync.WaitGroup
		for range inFlight {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if h, err := c.GenesisHash(context.Background()); err != nil || h != "genesis" {
					t.Errorf("call: %q %v", h, err)
				}
			}()
		}
		for deadline := time.Now().Add(10 * time.Second); arrived.Load() < int32(round*inFlight); {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: %d calls arrived", round, arrived.Load())
			}
			time.Sleep(time.Millisecond)
		}
		mu.Lock()
		close(release)
		release = make(chan struct{})
		mu.Unlock()
		wg.Wait()
	}
	if n := dialed.Load(); n > inFlight {
		t.Fatalf("%d connections for %d rounds of %d calls in flight, want %d: idle ones were closed", n, rounds, inFlight, inFlight)
	}
}

// A provider's API key in the rpc URL's path or query is in no error of a
// call: net/http quotes the whole URL it was given, and the error of a
// failed call is logged. The endpoint is named by scheme and host.
func TestRPCErrorsNameTheEndpointByHostOnly(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	host := l.Addr().String()
	l.Close() // nothing listens: the call fails at once
	const key = "SECRETPATHKEY0123456789"
	for _, u := range []string{"http://" + host + "/v2/" + key, "http://" + host + "/?api-key=" + key} {
		_, err := (&RPC{URL: u, Timeout: time.Second}).Slot(context.Background(), processed)
		if err == nil || strings.Contains(err.Error(), key) || !strings.Contains(err.Error(), "http://"+host) {
			t.Errorf("a failed call to %s: %v; want an error naming http://%s alone", u, err, host)
		}
	}
}
