package svmfacilitator

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/plugins/redisstore"
	"github.com/aovhq/aov/x402"
)

// skipPreflightNode is a FAKE RPC node in front of the real simulated
// chain at upstream that sends as Agave does with skipPreflight: it
// forwards the transaction and answers its signature whatever the chain
// made of it (a transaction it already processed included: the leader
// drops the duplicate). Every other call is forwarded. hook runs first on
// every call, with its method, and may block it.
func skipPreflightNode(t *testing.T, upstream string, hook func(method string)) string {
	return proxy(t, upstream, func(w http.ResponseWriter, id json.RawMessage, method string, params []json.RawMessage) bool {
		hook(method)
		if method != "sendTransaction" {
			return false
		}
		body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
		if resp, err := http.Post(upstream, "application/json", bytes.NewReader(body)); err == nil {
			resp.Body.Close()
		}
		var s string
		json.Unmarshal(params[0], &s)
		raw, _ := base64.StdEncoding.DecodeString(s)
		w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(id) + `,"result":"` + base58.Encode(raw[1:65]) + `"}`))
		return true
	}, nil)
}

// Two instances with one fee payer sharing a Redis store settle one payment
// at the same moment: the second finds nothing on chain and its
// simulation passes (the first's send has not landed), but the first's
// record, claimed in the store before its send, has it send nothing and
// poll the first's transaction. Exactly one success (the first to mark the
// record answered), the other duplicate_settlement naming the
// transaction. (Before: both sent, and both answered success.)
func TestSettleSharedStoreTwoInstancesOneSuccess(t *testing.T) {
	srv := servers.StartRedis(t)
	shared := func() SentStore {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { rdb.Close() })
		st, err := redisstore.New(context.Background(), rdb, redisstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return st.Claims().(SentStore)
	}
	e := newEnv(t, Config{})
	ctx := context.Background()
	pp := Payload(e.payment(t).Transaction(), e.req)

	sending, release := make(chan struct{}), make(chan struct{})
	var sendingOnce, releaseOnce sync.Once
	var mu sync.Mutex
	sendsA, sendsB, statusesB := 0, 0, 0
	// A's send waits until B has gone as far as it goes (B sends, or polls
	// after its look-up).
	cfgA := e.f.cfg
	cfgA.Sent = shared()
	cfgA.RPC = &RPC{URL: skipPreflightNode(t, e.chain.URL, func(method string) {
		if method == "sendTransaction" {
			mu.Lock()
			sendsA++
			mu.Unlock()
			sendingOnce.Do(func() { close(sending) })
			select {
			case <-release:
			case <-time.After(20 * time.Second):
			}
		}
	})}
	cfgB := e.f.cfg
	cfgB.Sent = shared()
	cfgB.RPC = &RPC{URL: skipPreflightNode(t, e.chain.URL, func(method string) {
		mu.Lock()
		defer mu.Unlock()
		switch method {
		case "sendTransaction":
			sendsB++
		case "getSignatureStatuses":
			if statusesB++; statusesB < 2 {
				return
			}
		default:
			return
		}
		releaseOnce.Do(func() { close(release) })
	})}
	a, err := New(cfgA)
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(cfgB)
	if err != nil {
		t.Fatal(err)
	}

	type result struct {
		r   x402.SettleResponse
		err error
	}
	resA := make(chan result, 1)
	go func() {
		r, err := a.Settle(ctx, pp, e.req)
		resA <- result{r, err}
	}()
	select {
	case <-sending:
	case <-time.After(20 * time.Second):
		t.Fatal("instance A never sent")
	}
	rb, errB := b.Settle(ctx, pp, e.req)
	ra := <-resA
	if ra.err != nil || errB != nil {
		t.Fatalf("settles: A %v, B %v", ra.err, errB)
	}
	won, lost := ra.r, rb
	if rb.Success {
		won, lost = rb, ra.r
	}
	if !won.Success || lost.Success || lost.ErrorReason != ReasonDuplicateSettlement || lost.Transaction != won.Transaction {
		t.Fatalf("A success=%v reason=%q tx=%s; B success=%v reason=%q tx=%s; want one success and the other duplicate_settlement naming its transaction",
			ra.r.Success, ra.r.ErrorReason, ra.r.Transaction, rb.Success, rb.ErrorReason, rb.Transaction)
	}
	mu.Lock()
	defer mu.Unlock()
	if sendsA != 1 || sendsB != 0 {
		t.Errorf("sends: A %d, B %d; want A 1, B none", sendsA, sendsB)
	}
	if p, q := e.balances(t); p != 1_000_000-20000 || q != 20000 {
		t.Fatalf("balances payer %d payee %d (paid once)", p, q)
	}
}
