package x402

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// scripted is one facilitator answer; status 0 means "drop the
// connection without answering".
type scripted struct {
	status int
	body   string
	header map[string]string
	delay  time.Duration
}

// scriptServer answers the i-th request with replies[i] (the last one
// repeats) and counts requests.
func scriptServer(t *testing.T, replies ...scripted) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	srv, n := scriptedServer(replies)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, n
}

// scriptedServer is scriptServer's server, not started (to start it with
// TLS).
func scriptedServer(replies []scripted) (*httptest.Server, *atomic.Int32) {
	var n atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i := int(n.Add(1)) - 1
		if i >= len(replies) {
			i = len(replies) - 1
		}
		rep := replies[i]
		io.Copy(io.Discard, r.Body) // lets the server notice a client that gives up
		if rep.delay > 0 {
			select {
			case <-time.After(rep.delay):
			case <-r.Context().Done():
				return
			}
		}
		if rep.status == 0 {
			hj, ok := w.(http.Hijacker)
			if !ok { // HTTP/2: reset the stream
				panic(http.ErrAbortHandler)
			}
			if conn, _, err := hj.Hijack(); err == nil {
				conn.Close()
			}
			return
		}
		for k, v := range rep.header {
			w.Header().Set(k, v)
		}
		w.WriteHeader(rep.status)
		io.WriteString(w, rep.body)
	}))
	return srv, &n
}

func testClient(url string) *HTTPFacilitator {
	return NewHTTPFacilitator(HTTPFacilitatorConfig{URL: url, Timeout: 2 * time.Second, Backoff: time.Millisecond})
}

func samplePayment(t *testing.T) (PaymentPayload, PaymentRequirements) {
	t.Helper()
	p, err := DecodePaymentSignature(b64(validPayloadJSON))
	if err != nil {
		t.Fatal(err)
	}
	return p, p.Accepted
}

func TestHTTPFacilitatorVerify(t *testing.T) {
	p, req := samplePayment(t)
	for _, tc := range []struct {
		desc      string
		replies   []scripted
		timeout   time.Duration
		wantValid *bool // nil: an error is expected
		wantCalls int32
	}{
		{"a 200 isValid:true is a valid answer", []scripted{{status: 200, body: `{"isValid":true,"payer":"0xabc"}`}}, 0, ptr(true), 1},
		{"a 200 isValid:false is an answer", []scripted{{status: 200, body: `{"isValid":false,"invalidReason":"insufficient_funds"}`}}, 0, ptr(false), 1},
		{"a 400 carrying isValid:false is an answer, not an error", []scripted{{status: 400, body: `{"isValid":false,"invalidReason":"invalid_payload"}`}}, 0, ptr(false), 1},
		{"a 500 carrying isValid:false is an answer and is not retried", []scripted{{status: 500, body: `{"isValid":false,"invalidReason":"unexpected_verify_error"}`}}, 0, ptr(false), 1},
		{"a 503 then a 200 is retried into an answer", []scripted{{status: 503, body: `oops`}, {status: 200, body: `{"isValid":true}`}}, 0, ptr(true), 2},
		{"a 429 then a 200 is retried into an answer", []scripted{{status: 429, body: ``}, {status: 200, body: `{"isValid":true}`}}, 0, ptr(true), 2},
		{"a dropped connection then a 200 is retried into an answer", []scripted{{status: 0}, {status: 200, body: `{"isValid":true}`}}, 0, ptr(true), 2},
		{"a 500 without a verdict is an error after the retries", []scripted{{status: 500, body: `{"error":"boom"}`}}, 0, nil, 3},
		{"a 404 without a verdict is an error and is not retried", []scripted{{status: 404, body: `not found`}}, 0, nil, 1},
		{"a 200 that is not JSON is an error and is not retried", []scripted{{status: 200, body: `<html>`}}, 0, nil, 1},
		{"a 200 without isValid is an error", []scripted{{status: 200, body: `{"valid":true}`}}, 0, nil, 1},
		{"isValid as a string is an error", []scripted{{status: 200, body: `{"isValid":"true"}`}}, 0, nil, 1},
		{"isValid:true with a 500 is an error", []scripted{{status: 500, body: `{"isValid":true}`}}, 0, nil, 1},
		{"a reply with duplicate members is an error", []scripted{{status: 200, body: `{"isValid":false,"isValid":true}`}}, 0, nil, 1},
		{"a reply with a wrongly typed member is an error", []scripted{{status: 200, body: `{"isValid":true,"payer":5}`}}, 0, nil, 1},
		{"a reply over the size cap is an error", []scripted{{status: 200, body: `{"isValid":true,"x":"` + strings.Repeat("a", DefaultMaxResponseBytes) + `"}`}}, 0, nil, 1},
		{"a facilitator slower than the timeout is an error", []scripted{{status: 200, body: `{"isValid":true}`, delay: 5 * time.Second}}, 200 * time.Millisecond, nil, 1},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			srv, calls := scriptServer(t, tc.replies...)
			c := testClient(srv.URL)
			if tc.timeout > 0 {
				c.cfg.Timeout = tc.timeout
			}
			got, err := c.Verify(context.Background(), p, req)
			if tc.wantValid == nil {
				var fe *FacilitatorError
				if !errors.As(err, &fe) || fe.Op != "verify" {
					t.Fatalf("got %+v, %v; want a *FacilitatorError", got, err)
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				if got.IsValid != *tc.wantValid {
					t.Fatalf("isValid %v", got.IsValid)
				}
				if !got.IsValid && got.InvalidReason == "" {
					t.Fatal("the reason was lost")
				}
			}
			if n := calls.Load(); n != tc.wantCalls {
				t.Fatalf("%d requests, want %d", n, tc.wantCalls)
			}
		})
	}
}

func TestHTTPFacilitatorHonoursRetryAfter(t *testing.T) {
	p, req := samplePayment(t)
	srv, calls := scriptServer(t, scripted{status: 429, header: map[string]string{"Retry-After": "1"}}, scripted{status: 200, body: `{"isValid":true}`})
	start := time.Now()
	if _, err := testClient(srv.URL).Verify(context.Background(), p, req); err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 2 {
		t.Fatalf("%d requests", calls.Load())
	}
	if time.Since(start) < time.Second {
		t.Fatal("the retry did not wait for Retry-After")
	}
}

// A refusal whose Retry-After is longer than the client waits itself
// (past maxRetryWait) ends the call, and the error carries it for the
// caller to pass on, from verify and from settle alike.
func TestHTTPFacilitatorErrorCarriesRetryAfter(t *testing.T) {
	p, req := samplePayment(t)
	srv, _ := scriptServer(t, scripted{status: 429, header: map[string]string{"Retry-After": "30"}, body: `{"code":"rate_limited"}`})
	c := testClient(srv.URL)
	_, verr := c.Verify(context.Background(), p, req)
	_, serr := c.Settle(context.Background(), p, req)
	for op, err := range map[string]error{"verify": verr, "settle": serr} {
		var fe *FacilitatorError
		if !errors.As(err, &fe) || fe.Status != 429 || fe.RetryAfter != 30*time.Second {
			t.Errorf("%s: %#v, want a FacilitatorError with status 429 and RetryAfter 30s", op, err)
		}
	}
}

func TestHTTPFacilitatorSettle(t *testing.T) {
	p, req := samplePayment(t)
	const (
		answer  = "answer"
		refused = "refused" // *FacilitatorError: certainly not settled
		unknown = "unknown" // *UnknownOutcomeError
	)
	for _, tc := range []struct {
		desc    string
		reply   scripted
		timeout time.Duration
		want    string
		success bool
	}{
		{"a 200 success:true is an answer", scripted{status: 200, body: `{"success":true,"transaction":"0xabc","network":"eip155:84532","payer":"0x1"}`}, 0, answer, true},
		{"a 200 success:false is an answer", scripted{status: 200, body: `{"success":false,"errorReason":"invalid_exact_evm_insufficient_balance","transaction":"","network":"eip155:84532"}`}, 0, answer, false},
		{"a 400 carrying success:false is an answer", scripted{status: 400, body: `{"success":false,"errorReason":"invalid_payload","transaction":"","network":""}`}, 0, answer, false},
		{"a 500 carrying success:true is an answer: the money moved", scripted{status: 500, body: `{"success":true,"transaction":"0xabc","network":"eip155:84532"}`}, 0, answer, true},
		{"a 400 without a verdict is a refusal: nothing settled", scripted{status: 400, body: `{"error":"bad request"}`}, 0, refused, false},
		{"a 429 is a refusal: nothing settled", scripted{status: 429, body: ``}, 0, refused, false},
		{"a 500 without a verdict is an unknown outcome", scripted{status: 500, body: `{"error":"boom"}`}, 0, unknown, false},
		{"a 503 is an unknown outcome", scripted{status: 503, body: ``}, 0, unknown, false},
		{"a 502 from a proxy is an unknown outcome", scripted{status: 502, body: `<html>bad gateway</html>`}, 0, unknown, false},
		{"a 408 is an unknown outcome", scripted{status: 408, body: ``}, 0, unknown, false},
		{"a 200 that is not JSON is an unknown outcome", scripted{status: 200, body: `ok`}, 0, unknown, false},
		{"a 200 with a malformed SettleResponse is an unknown outcome", scripted{status: 200, body: `{"success":true,"transaction":5}`}, 0, unknown, false},
		{"a reply over the size cap is an unknown outcome", scripted{status: 200, body: `{"success":true,"x":"` + strings.Repeat("a", DefaultMaxResponseBytes) + `"}`}, 0, unknown, false},
		{"success:false with settlement_pending is an unknown outcome", scripted{status: 200, body: `{"success":false,"errorReason":"settlement_pending","transaction":"0xabc","network":"eip155:84532"}`}, 0, unknown, false},
		{"success:false with failed_to_get_receipt is an unknown outcome", scripted{status: 200, body: `{"success":false,"errorReason":"invalid_exact_evm_failed_to_get_receipt","transaction":"","network":"eip155:84532"}`}, 0, unknown, false},
		// (Before: the official facilitators' failures after a send were
		// refusals, and the payer, charged, was asked to pay again.)
		{"success:false with evm transaction_failed and no transaction is an unknown outcome (the send's RPC call may fail after the node took it)", scripted{status: 200, body: `{"success":false,"errorReason":"invalid_exact_evm_transaction_failed","errorMessage":"HTTP request failed. Status: 504","transaction":"","network":"eip155:84532"}`}, 0, unknown, false},
		{"success:false with svm transaction_failed and no transaction is an unknown outcome", scripted{status: 200, body: `{"success":false,"errorReason":"invalid_exact_svm_transaction_failed","transaction":"","network":"solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1"}`}, 0, unknown, false},
		{"success:false naming a transaction is an unknown outcome whatever its reason", scripted{status: 200, body: `{"success":false,"errorReason":"invalid_exact_evm_transfer_event_mismatch","transaction":"0xabc","network":"eip155:84532"}`}, 0, unknown, false},
		{"success:false with nonce_already_used naming another settlement's transaction is an answer", scripted{status: 200, body: `{"success":false,"errorReason":"invalid_exact_evm_nonce_already_used","transaction":"0xabc","network":"eip155:84532"}`}, 0, answer, false},
		{"success:false with duplicate_settlement naming another settlement's transaction is an answer", scripted{status: 200, body: `{"success":false,"errorReason":"duplicate_settlement","transaction":"5abc","network":"solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1"}`}, 0, answer, false},
		{"success:false with a signature refusal before any send is an answer", scripted{status: 200, body: `{"success":false,"errorReason":"invalid_exact_evm_signature","transaction":"","network":"eip155:84532"}`}, 0, answer, false},
		{"a connection dropped after the request is an unknown outcome", scripted{status: 0}, 0, unknown, false},
		{"a facilitator slower than the timeout is an unknown outcome", scripted{status: 200, body: `{"success":true}`, delay: 5 * time.Second}, 200 * time.Millisecond, unknown, false},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			srv, calls := scriptServer(t, tc.reply)
			c := testClient(srv.URL)
			if tc.timeout > 0 {
				c.cfg.Timeout = tc.timeout
			}
			got, err := c.Settle(context.Background(), p, req)
			var ue *UnknownOutcomeError
			var fe *FacilitatorError
			switch tc.want {
			case answer:
				if err != nil {
					t.Fatal(err)
				}
				if got.Success != tc.success {
					t.Fatalf("success %v", got.Success)
				}
			case refused:
				if !errors.As(err, &fe) || errors.As(err, &ue) {
					t.Fatalf("got %v; want a *FacilitatorError", err)
				}
			case unknown:
				if !errors.As(err, &ue) {
					t.Fatalf("got %+v, %v; want an *UnknownOutcomeError", got, err)
				}
				if !strings.Contains(err.Error(), "do not ask for a new payment") {
					t.Fatalf("the error does not say not to charge again: %v", err)
				}
				if got.Success {
					t.Fatal("an unknown outcome came with success")
				}
			}
			if n := calls.Load(); n != 1 {
				t.Fatalf("settle was sent %d times; it must be sent exactly once", n)
			}
		})
	}
	t.Run("a failure naming its transaction is kept for the caller", func(t *testing.T) {
		srv, _ := scriptServer(t, scripted{status: 200, body: `{"success":false,"errorReason":"invalid_exact_evm_transaction_failed","errorMessage":"settlement_pending, but failed to persist for retry","transaction":"0xabc","network":"eip155:84532"}`})
		_, err := testClient(srv.URL).Settle(context.Background(), p, req)
		var ue *UnknownOutcomeError
		if !errors.As(err, &ue) || ue.Reply == nil || ue.Reply.Transaction != "0xabc" {
			t.Fatalf("got %v; want an *UnknownOutcomeError whose Reply names 0xabc", err)
		}
	})
	t.Run("a pending reply is kept for the caller", func(t *testing.T) {
		srv, _ := scriptServer(t, scripted{status: 200, body: `{"success":false,"errorReason":"settlement_pending","transaction":"0xabc","network":"eip155:84532"}`})
		_, err := testClient(srv.URL).Settle(context.Background(), p, req)
		var ue *UnknownOutcomeError
		if !errors.As(err, &ue) || ue.Reply == nil || ue.Reply.Transaction != "0xabc" {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("a refused connection is not an unknown outcome: nothing was sent", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		_, err = testClient("http://"+addr).Settle(context.Background(), p, req)
		var ue *UnknownOutcomeError
		var fe *FacilitatorError
		if !errors.As(err, &fe) || errors.As(err, &ue) {
			t.Fatalf("got %v; want a *FacilitatorError", err)
		}
	})
}

func TestHTTPFacilitatorSupported(t *testing.T) {
	good := `{"kinds":[{"x402Version":2,"scheme":"exact","network":"eip155:1337"}],"extensions":[],"signers":{"eip155:*":["0x1"]}}`
	for _, tc := range []struct {
		desc      string
		replies   []scripted
		ok        bool
		wantCalls int32
	}{
		{"a 200 SupportedResponse is an answer", []scripted{{status: 200, body: good}}, true, 1},
		{"a 503 then a 200 is retried into an answer", []scripted{{status: 503}, {status: 200, body: good}}, true, 2},
		{"a 404 is an error and is not retried", []scripted{{status: 404, body: good}}, false, 1},
		{"a 200 without kinds is an error", []scripted{{status: 200, body: `{"signers":{}}`}}, false, 1},
		{"a 200 with kinds of the wrong type is an error", []scripted{{status: 200, body: `{"kinds":{}}`}}, false, 1},
		{"a 500 is an error after the retries", []scripted{{status: 500}}, false, 3},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			srv, calls := scriptServer(t, tc.replies...)
			got, err := testClient(srv.URL).Supported(context.Background())
			if tc.ok != (err == nil) {
				t.Fatalf("got %+v, %v", got, err)
			}
			if tc.ok && (len(got.Kinds) != 1 || got.Kinds[0].Network != "eip155:1337" || got.Signers["eip155:*"][0] != "0x1") {
				t.Fatalf("got %+v", got)
			}
			if n := calls.Load(); n != tc.wantCalls {
				t.Fatalf("%d requests, want %d", n, tc.wantCalls)
			}
		})
	}
}

func TestHTTPFacilitatorRequests(t *testing.T) {
	p, req := samplePayment(t)
	type seen struct {
		method, path, ctype, auth string
		body                      map[string]json.RawMessage
	}
	got := make(chan seen, 3)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := seen{method: r.Method, path: r.URL.Path, ctype: r.Header.Get("Content-Type"), auth: r.Header.Get("Authorization")}
		data, _ := io.ReadAll(r.Body)
		json.Unmarshal(data, &s.body)
		got <- s
		switch r.URL.Path {
		case "/fac/supported":
			io.WriteString(w, `{"kinds":[],"extensions":[],"signers":{}}`)
		case "/fac/verify":
			io.WriteString(w, `{"isValid":true}`)
		default:
			io.WriteString(w, `{"success":true,"transaction":"0x1","network":"eip155:84532"}`)
		}
	}))
	defer srv.Close()
	c := NewHTTPFacilitator(HTTPFacilitatorConfig{URL: srv.URL + "/fac/", Headers: map[string]string{"Authorization": "Bearer k"}})
	ctx := context.Background()
	if _, err := c.Verify(ctx, p, req); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Settle(ctx, p, req); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Supported(ctx); err != nil {
		t.Fatal(err)
	}
	wantReq, _ := json.Marshal(req)
	for _, want := range []struct{ method, path string }{{"POST", "/fac/verify"}, {"POST", "/fac/settle"}, {"GET", "/fac/supported"}} {
		s := <-got
		if s.method != want.method || s.path != want.path || s.auth != "Bearer k" {
			t.Errorf("%s %s with auth %q, want %s %s", s.method, s.path, s.auth, want.method, want.path)
		}
		if s.method == "POST" {
			if s.ctype != "application/json" {
				t.Errorf("%s content type %q", s.path, s.ctype)
			}
			if string(s.body["x402Version"]) != "2" || len(s.body) != 3 {
				t.Errorf("%s body members %v", s.path, s.body)
			}
			if string(s.body["paymentRequirements"]) != string(wantReq) {
				t.Errorf("%s requirements %s", s.path, s.body["paymentRequirements"])
			}
			var pp map[string]json.RawMessage
			json.Unmarshal(s.body["paymentPayload"], &pp)
			var orig map[string]json.RawMessage
			json.Unmarshal([]byte(validPayloadJSON), &orig)
			if string(pp["payload"]) != string(orig["payload"]) {
				t.Errorf("%s payload was not forwarded byte for byte", s.path)
			}
		}
	}
}

func TestHTTPFacilitatorBadURL(t *testing.T) {
	for _, u := range []string{"", "ftp://x", "/relative", "http://"} {
		c := NewHTTPFacilitator(HTTPFacilitatorConfig{URL: u})
		if c.Err() == nil {
			t.Errorf("%q accepted", u)
		}
		if _, err := c.Supported(context.Background()); err == nil {
			t.Errorf("%q: a call succeeded", u)
		}
		p, req := samplePayment(t)
		var ue *UnknownOutcomeError
		if _, err := c.Settle(context.Background(), p, req); err == nil || errors.As(err, &ue) {
			t.Errorf("%q: settle gave %v", u, err)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// Concurrent calls keep their connections: a second round of as many
// concurrent verifications as the first dials nothing new.
func TestHTTPFacilitatorKeepsConcurrentConnections(t *testing.T) {
	var dials atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		time.Sleep(20 * time.Millisecond) // the calls overlap
		io.WriteString(w, `{"isValid":true,"payer":"0x857b06519E91e3A54538791bDbb0E22373e36b66"}`)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			dials.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	f := testClient(srv.URL)
	p, req := samplePayment(t)
	const concurrent = 16
	round := func() {
		errs := make(chan error, concurrent)
		for range concurrent {
			go func() {
				_, err := f.Verify(context.Background(), p, req)
				errs <- err
			}()
		}
		for range concurrent {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
	}
	round()
	first := dials.Load()
	round()
	if n := dials.Load() - first; n != 0 {
		t.Errorf("the second round of %d concurrent calls dialed %d new connections (the first dialed %d)", concurrent, n, first)
	}
}

// Credentials in the facilitator URL (https://user:password@ or a key as
// the user name) are sent as basic auth, as net/http would, but never
// appear in an error: not in the one a URL that does not parse gives at
// provision, and not in a call's (net/http masks a password there, not a
// key given as the user), which the gate logs on every outage.
func TestFacilitatorURLCredentialsStayOutOfErrors(t *testing.T) {
	if err := NewHTTPFacilitator(HTTPFacilitatorConfig{URL: "https://user:s3cr^t-KEY@fac.example/"}).Err(); err == nil || strings.Contains(err.Error(), "s3cr") {
		t.Fatalf("a URL that does not parse: %v", err)
	}
	var auth atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth.Store(r.Header.Get("Authorization"))
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"kinds":[],"extensions":[],"signers":{}}`)
	}))
	defer srv.Close()
	f := NewHTTPFacilitator(HTTPFacilitatorConfig{URL: strings.Replace(srv.URL, "http://", "http://user:pw-KEY@", 1)})
	if _, err := f.Supported(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := auth.Load(); got != "Basic dXNlcjpwdy1LRVk=" { // user:pw-KEY
		t.Fatalf("Authorization %q: the URL's credentials were not sent", got)
	}
	const key = "apikey0123456789"
	f = NewHTTPFacilitator(HTTPFacilitatorConfig{URL: "http://" + key + "@127.0.0.1:1/", Retries: 1})
	if _, err := f.Verify(t.Context(), PaymentPayload{}, PaymentRequirements{}); err == nil || strings.Contains(err.Error(), key) {
		t.Fatalf("a call's error: %v", err)
	}
}

// A redirect is never followed: the 3xx is the reply. It carries no
// verdict, whatever its body says: to /settle the outcome is unknown (the
// facilitator may have settled: 303 See Other says it processed the POST);
// to /verify and /supported it is an error. The host a redirect names
// receives nothing, not the configured credential headers either.
// (Before: net/http followed it, the 303's GET drew a 404 or a dial error
// that Settle read as "nothing settled", so the gate released a payment
// that was charged, and X-Api-Key went to the other host, whose verdict
// was taken. Before too: a 3xx whose body said success:false or
// isValid:false was read as a refusal, the payment released.)
func TestHTTPFacilitatorRefusesRedirects(t *testing.T) {
	p, req := samplePayment(t)
	var elsewhere atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"isValid":true,"success":true,"transaction":"0xabc","kinds":[]}`)
	}))
	t.Cleanup(other.Close)
	// Same loopback, another host name: a redirect to another host.
	otherURL := strings.Replace(other.URL, "127.0.0.1", "localhost", 1)
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close() // its port now refuses connections
	for _, tc := range []struct {
		desc     string
		status   int
		location string
		call     func(*HTTPFacilitator) error
		unknown  bool // settle: *UnknownOutcomeError, else *FacilitatorError
		body     string
	}{
		{"settle answered 303 with a refusal in its body: outcome unknown", http.StatusSeeOther, "/settle/result/1", func(f *HTTPFacilitator) error {
			_, err := f.Settle(context.Background(), p, req)
			return err
		}, true, `{"success":false,"errorReason":"invalid_exact_evm_payload_signature","transaction":""}`},
		{"verify answered 307 with isValid false in its body: an error", http.StatusTemporaryRedirect, otherURL + "/verify", func(f *HTTPFacilitator) error {
			_, err := f.Verify(context.Background(), p, req)
			return err
		}, false, `{"isValid":false,"invalidReason":"invalid_payload"}`},
		{"settle answered 303 See Other: outcome unknown", http.StatusSeeOther, "/settle/result/1", func(f *HTTPFacilitator) error {
			_, err := f.Settle(context.Background(), p, req)
			return err
		}, true, ""},
		{"settle answered 307 to a dead host: outcome unknown, not a dial error", http.StatusTemporaryRedirect, deadURL + "/settle", func(f *HTTPFacilitator) error {
			_, err := f.Settle(context.Background(), p, req)
			return err
		}, true, ""},
		{"settle answered 307 to another host: outcome unknown", http.StatusTemporaryRedirect, otherURL + "/settle", func(f *HTTPFacilitator) error {
			_, err := f.Settle(context.Background(), p, req)
			return err
		}, true, ""},
		{"verify answered 307 to another host: an error", http.StatusTemporaryRedirect, otherURL + "/verify", func(f *HTTPFacilitator) error {
			_, err := f.Verify(context.Background(), p, req)
			return err
		}, false, ""},
		{"supported answered 302 to another host: an error", http.StatusFound, otherURL + "/supported", func(f *HTTPFacilitator) error {
			_, err := f.Supported(context.Background())
			return err
		}, false, ""},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			elsewhere.Store(0)
			srv, calls := scriptServer(t, scripted{status: tc.status, body: tc.body, header: map[string]string{"Location": tc.location}})
			f := NewHTTPFacilitator(HTTPFacilitatorConfig{URL: srv.URL, Timeout: 2 * time.Second, Backoff: time.Millisecond,
				Headers: map[string]string{"X-Api-Key": "sk-secret"}})
			err := tc.call(f)
			var ue *UnknownOutcomeError
			var fe *FacilitatorError
			switch {
			case tc.unknown && !errors.As(err, &ue):
				t.Fatalf("got %v; want an *UnknownOutcomeError", err)
			case !tc.unknown && (!errors.As(err, &fe) || fe.Status != tc.status):
				t.Fatalf("got %v; want a *FacilitatorError with status %d", err, tc.status)
			}
			if n := calls.Load(); n != 1 {
				t.Fatalf("the facilitator got %d requests, want 1", n)
			}
			if n := elsewhere.Load(); n != 0 {
				t.Fatalf("the host the redirect named got %d requests, want none", n)
			}
		})
	}
}

// A settle whose TLS handshake failed sent nothing: a handshake that never
// completes (DialTimeout bounds it) and a certificate the client does not
// trust are each a *FacilitatorError, and the facilitator got no request.
// A request written whole over TLS whose reply was lost (the connection
// dropped, over HTTP/1.1 and HTTP/2) stays an unknown outcome. (Before: a
// failed TLS handshake was an unknown outcome, so the gate held the
// payment as settlement_pending until it expired, for a request never
// sent.)
func TestHTTPFacilitatorSettleOverTLS(t *testing.T) {
	p, req := samplePayment(t)
	settle := func(f *HTTPFacilitator) error {
		_, err := f.Settle(context.Background(), p, req)
		return err
	}
	t.Run("a handshake that never completes sent nothing", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() { // accepts and reads the ClientHello, never answers
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					io.Copy(io.Discard, c)
					c.Close()
				}()
			}
		}()
		err = settle(NewHTTPFacilitator(HTTPFacilitatorConfig{URL: "https://" + ln.Addr().String(), Timeout: 10 * time.Second, DialTimeout: 200 * time.Millisecond}))
		var fe *FacilitatorError
		if !errors.As(err, &fe) {
			t.Fatalf("got %v; want a *FacilitatorError", err)
		}
	})
	t.Run("an untrusted certificate sent nothing", func(t *testing.T) {
		srv, calls := scriptedServer([]scripted{{status: 200, body: `{"success":true,"transaction":"0xabc"}`}})
		srv.StartTLS()
		t.Cleanup(srv.Close)
		err := settle(testClient(srv.URL))
		var fe *FacilitatorError
		if !errors.As(err, &fe) || calls.Load() != 0 {
			t.Fatalf("got %v after %d requests; want a *FacilitatorError and none", err, calls.Load())
		}
	})
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("a reply lost after the request (HTTP/2 %v) is an unknown outcome", h2), func(t *testing.T) {
			srv, calls := scriptedServer([]scripted{{status: 0}})
			srv.EnableHTTP2 = h2
			srv.StartTLS()
			t.Cleanup(srv.Close)
			err := settle(NewHTTPFacilitator(HTTPFacilitatorConfig{URL: srv.URL, Timeout: 10 * time.Second, Client: srv.Client()}))
			var ue *UnknownOutcomeError
			if !errors.As(err, &ue) || calls.Load() != 1 {
				t.Fatalf("got %v after %d requests; want an *UnknownOutcomeError after 1", err, calls.Load())
			}
		})
	}
}
