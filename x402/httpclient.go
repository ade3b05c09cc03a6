package x402

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"weak"
)

// Defaults of HTTPFacilitatorConfig.
const (
	DefaultFacilitatorTimeout = 30 * time.Second // the reference gateways' facilitator timeout
	DefaultDialTimeout        = 5 * time.Second
	DefaultMaxResponseBytes   = 1 << 20
	DefaultRetries            = 2
	DefaultBackoff            = 200 * time.Millisecond
	// maxRetryWait is the longest Retry-After the client itself waits
	// before retrying /verify or /supported within one call.
	maxRetryWait = 5 * time.Second
)

// MaxRetryAfter bounds the wait a facilitator's Retry-After can impose:
// FacilitatorError.RetryAfter is at most this long, so the gate's 503 to
// its buyer and the x402_facilitator handler's answer to its own clients
// (which a gate in front passes on) ask for no longer. The value is the
// remote's to send: a day would park a buyer's retry for a day, for a
// rate limit that lifts in seconds.
const MaxRetryAfter = 60 * time.Second

// ParseRetryAfter reads a Retry-After value as RFC 9110 (section 10.2.3)
// defines it, delay-seconds or an HTTP-date (each format http.ParseTime
// accepts), as the wait from now: 0 for an empty, negative or malformed
// value, or a date not after now; a longer wait than MaxRetryAfter is
// MaxRetryAfter, whatever its digits (18446744074 seconds, multiplied
// into a time.Duration, would wrap to 290 ms). The one reading of the
// header, for every reply of a facilitator.
func ParseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if strings.Trim(v, "0123456789") == "" {
		n, err := strconv.ParseUint(v, 10, 64)
		switch {
		case err != nil, n >= uint64(MaxRetryAfter/time.Second): // only too many digits fail
			return MaxRetryAfter
		}
		return time.Duration(n) * time.Second
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0
	}
	return min(max(t.Sub(now), 0), MaxRetryAfter)
}

// RetryAfterSeconds is d, a facilitator's Retry-After, as delay-seconds
// to pass on: whole seconds, rounded up, at most MaxRetryAfter's.
func RetryAfterSeconds(d time.Duration) int {
	return int((min(d, MaxRetryAfter) + time.Second - 1) / time.Second)
}

// HTTPFacilitatorConfig configures a client of a remote facilitator.
type HTTPFacilitatorConfig struct {
	// URL is the facilitator's base URL; /verify, /settle and /supported
	// are appended to its path.
	URL string
	// Headers are sent with every request, e.g. a static Authorization.
	Headers map[string]string
	// Timeout bounds one call (Verify, Settle or Supported) including its
	// retries. Default DefaultFacilitatorTimeout.
	Timeout time.Duration
	// DialTimeout bounds connecting to the facilitator (TCP and TLS), so an
	// unreachable facilitator is known quickly and Settle can tell the
	// caller that nothing was sent. Default DefaultDialTimeout. Ignored
	// when Client is set.
	DialTimeout time.Duration
	// Client is the HTTP client; default one whose transport bounds the
	// dial (DialTimeout) and the wait for the reply's headers (Timeout),
	// with no timeout of its own (Timeout governs the whole call). Its
	// CheckRedirect is replaced (on a copy): a redirect is never followed
	// (refuseRedirect). An *http.Transport (nil: http.DefaultTransport) is
	// used as a copy whose connections count the bytes written on them
	// (countWrites), so that a settle's attempts are told written or not
	// (sendTrace); over any other transport, or a connection its
	// DialTLSContext or Dial made, a settle that got a connection is taken
	// as sent. The copy speaks the protocols the transport would, and all
	// facilitators built on one transport share one copy (countingCopy),
	// so one pool of connections: the Client's CloseIdleConnections does
	// not reach it, HTTPFacilitator.CloseIdleConnections does, and the
	// transport's MaxConnsPerHost bounds the facilitators' connections
	// together, apart from the transport's own.
	Client *http.Client
	// MaxResponseBytes caps a reply body. Default DefaultMaxResponseBytes.
	MaxResponseBytes int64
	// Retries is how many times Verify and Supported are retried after 429,
	// a 5xx without an answer, or a connection error (default
	// DefaultRetries; negative disables). Settle is never retried.
	Retries int
	// Backoff is the wait before the first retry, doubled for each next one;
	// a Retry-After of at most 5 s from the facilitator takes precedence.
	// Default DefaultBackoff.
	Backoff time.Duration
}

// HTTPFacilitator is a Facilitator reached over the x402 facilitator HTTP
// API (POST /verify, POST /settle, GET /supported).
type HTTPFacilitator struct {
	cfg  HTTPFacilitatorConfig
	base *url.URL // without its userinfo, so that no error repeats it
	user *url.Userinfo
	err  error
}

// CloseIdleConnections closes the idle connections of f's transport: its
// own, or the copy of the Client's transport that every facilitator built
// on that transport shares (HTTPFacilitatorConfig.Client).
func (f *HTTPFacilitator) CloseIdleConnections() { f.cfg.Client.CloseIdleConnections() }

// Timeout is how long one call may take at most, retries included
// (HTTPFacilitatorConfig.Timeout, its default filled in). A caller that
// bounds a call by less cuts short the time its operator gave the
// facilitator: a settlement it then completes is one the caller never
// hears of.
func (f *HTTPFacilitator) Timeout() time.Duration { return f.cfg.Timeout }

// NewHTTPFacilitator returns a client for the facilitator at cfg.URL. A bad
// URL is reported by every call (and by Err), so construction never fails.
func NewHTTPFacilitator(cfg HTTPFacilitatorConfig) *HTTPFacilitator {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultFacilitatorTimeout
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	var c http.Client
	if cfg.Client == nil {
		c.Transport = countWrites(deadlineTransport(cfg.DialTimeout, cfg.Timeout))
	} else {
		c = *cfg.Client
		rt := c.Transport
		if rt == nil {
			rt = http.DefaultTransport
		}
		if tr, ok := rt.(*http.Transport); ok {
			c.Transport = countingCopy(tr)
		}
	}
	c.CheckRedirect = refuseRedirect
	cfg.Client = &c
	if cfg.MaxResponseBytes <= 0 {
		cfg.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if cfg.Retries == 0 {
		cfg.Retries = DefaultRetries
	}
	if cfg.Backoff <= 0 {
		cfg.Backoff = DefaultBackoff
	}
	f := &HTTPFacilitator{cfg: cfg}
	u, err := url.Parse(cfg.URL)
	switch {
	case err != nil:
		// url.Error repeats the URL, credentials and all: give the reason
		// alone.
		if ue, ok := errors.AsType[*url.Error](err); ok {
			err = ue.Err
		}
		f.err = fmt.Errorf("facilitator url does not parse: %w", err)
	case (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		f.err = errors.New("facilitator url must be an absolute http or https URL")
	default:
		u.Path = strings.TrimSuffix(u.Path, "/")
		// The userinfo is sent as basic auth, as net/http would, but kept
		// out of the URL: net/http masks a password in its errors, not a
		// key given as the user name, and those errors are logged.
		f.user, u.User = u.User, nil
		f.base = u
	}
	return f
}

// Err reports a configuration problem (a bad URL), so a provisioner can
// refuse the configuration at start.
func (f *HTTPFacilitator) Err() error { return f.err }

// FacilitatorError is a call that produced no answer: the facilitator was
// unreachable, replied with an error status and no verdict, or replied
// with something that is not the protocol's JSON. For Settle it is returned
// only when the request certainly did not settle (the connection was never
// made, the facilitator refused the request with a 4xx, or it answered
// facilitator_unavailable: it sent nothing); otherwise Settle returns
// *UnknownOutcomeError.
type FacilitatorError struct {
	Op     string // "verify", "settle" or "supported"
	Status int    // HTTP status, 0 when there was no reply
	// RetryAfter is the Retry-After the facilitator sent with its refusal
	// (a 429 or 503, say), 0 without one: when the caller's own client may
	// try again. At most MaxRetryAfter (ParseRetryAfter).
	RetryAfter time.Duration
	Err        error
}

// Error reports the operation, the status and the cause.
func (e *FacilitatorError) Error() string {
	if e.Status != 0 {
		return fmt.Sprintf("facilitator %s: status %d: %v", e.Op, e.Status, e.Err)
	}
	return fmt.Sprintf("facilitator %s: %v", e.Op, e.Err)
}

// Unwrap returns the cause.
func (e *FacilitatorError) Unwrap() error { return e.Err }

// UnknownOutcomeError is a settlement whose result is not known: the
// request may have reached the facilitator (a timeout, a dropped
// connection, a 5xx, a malformed reply, or a failure that may follow a
// send: settleUnknown). The money may have moved. The caller must not release the
// resource and must not ask the payer to pay again; it keeps the payment
// marked as used and reports a retryable error. Re-sending the same
// authorization later is safe for EIP-3009 (its nonce can settle at most
// once), but it is not done automatically here.
type UnknownOutcomeError struct {
	Op string
	// Reply is the facilitator's answer when it gave one that leaves the
	// outcome unknown (settlement_pending, or a failure naming the
	// transaction it sent); nil when there was no usable answer.
	Reply *SettleResponse
	Err   error
}

// Error says that the outcome is unknown and must not be treated as a
// failure.
func (e *UnknownOutcomeError) Error() string {
	return fmt.Sprintf("facilitator %s: outcome unknown (the payment may have settled; do not ask for a new payment): %v", e.Op, e.Err)
}

// Unwrap returns the cause.
func (e *UnknownOutcomeError) Unwrap() error { return e.Err }

// pendingReasons are settle errorReasons that say the transfer may have
// been submitted and its result is unknown. A reply with one of them is not
// a failure: reporting it as one would make the payer pay twice.
//
// The transaction_failed codes are among them because the official
// facilitators answer them for sends they could not see through, not only
// for transactions that reverted: @x402/evm's settleEIP3009 answers
// invalid_exact_evm_transaction_failed with transaction "" when the send's
// RPC call throws (after the node may have taken the transaction) and,
// naming the transaction, when its receipt wait failed and its pending
// settlement store could not keep it; @x402/svm answers
// invalid_exact_svm_transaction_failed for the same two faults. A
// transaction that did revert is found so by the chain read that resolves
// the unknown outcome.
var pendingReasons = map[string]bool{
	ReasonSettlementPending:          true,
	ReasonExactEVMFailedToGetReceipt: true,
	ReasonUnexpectedSettleError:      true,
	ReasonExactEVMTransactionFailed:  true,
	ReasonExactSVMTransactionFailed:  true,
}

// settledByAnotherReasons are the failures whose named transaction is
// another settlement's of the same payment (a /settle repeated after a
// lost reply, or a concurrent one): this call sent nothing, and the reason
// itself tells the payer not to pay again.
var settledByAnotherReasons = map[string]bool{
	ReasonExactEVMNonceAlreadyUsed: true,
	ReasonDuplicateSettlement:      true,
}

// settleUnknown reports whether a success:false settle reply leaves the
// outcome unknown: a pending reason, or any other failure that names a
// transaction (the facilitator sent one, so the money may have moved:
// transfer_event_mismatch, post_settlement_transfer_not_confirmed, a
// pending store's failure reported under another code), except the
// settledByAnotherReasons. A failure naming none with any other reason
// (a bad signature, amount or balance found before sending) is a refusal.
func settleUnknown(sr SettleResponse) bool {
	return !sr.Success && (pendingReasons[sr.ErrorReason] || (sr.Transaction != "" && !settledByAnotherReasons[sr.ErrorReason]))
}

// Verify asks the facilitator whether p pays for req. An isValid:false
// reply with any status (some facilitators answer 400) is an answer; 429, a
// 5xx without a verdict and connection errors are retried; anything else
// without a verdict is a *FacilitatorError.
func (f *HTTPFacilitator) Verify(ctx context.Context, p PaymentPayload, req PaymentRequirements) (VerifyResponse, error) {
	var out VerifyResponse
	body, err := json.Marshal(FacilitatorRequest{X402Version: Version, PaymentPayload: p, PaymentRequirements: req})
	if err != nil {
		return out, &FacilitatorError{Op: "verify", Err: err}
	}
	err = f.callWithRetry(ctx, "verify", http.MethodPost, "/verify", body, func(status int, reply []byte) (bool, error) {
		m, isObj := replyMembers(reply)
		raw, has := m["isValid"]
		if !isObj || !has || (string(raw) != "true" && string(raw) != "false") {
			return retryable(status), &FacilitatorError{Op: "verify", Status: status, Err: errors.New("reply carries no isValid verdict")}
		}
		if err := json.Unmarshal(reply, &out); err != nil {
			return false, &FacilitatorError{Op: "verify", Status: status, Err: errors.New("reply is not a VerifyResponse")}
		}
		if out.IsValid && (status < 200 || status > 299) {
			return false, &FacilitatorError{Op: "verify", Status: status, Err: errors.New("isValid true with an error status")}
		}
		return false, nil
	})
	return out, err
}

// Supported fetches the facilitator's kinds, extensions and signers; it is
// retried like Verify and needs a 200 reply.
func (f *HTTPFacilitator) Supported(ctx context.Context) (SupportedResponse, error) {
	var out SupportedResponse
	err := f.callWithRetry(ctx, "supported", http.MethodGet, "/supported", nil, func(status int, reply []byte) (bool, error) {
		if status != http.StatusOK {
			return retryable(status), &FacilitatorError{Op: "supported", Status: status, Err: errors.New("unexpected status")}
		}
		m, isObj := replyMembers(reply)
		if _, has := m["kinds"]; !isObj || !has || json.Unmarshal(reply, &out) != nil {
			return false, &FacilitatorError{Op: "supported", Status: status, Err: errors.New("reply is not a SupportedResponse")}
		}
		return false, nil
	})
	return out, err
}

// Settle asks the facilitator to execute p for req, exactly once: it is
// never retried, and net/http never sends it again either (sendTrace's
// bodyWhileUnsent). A reply carrying a success verdict is an answer
// whatever its status but a 3xx (success:true means the money moved),
// except success:false with facilitator_unavailable and no transaction,
// which is a *FacilitatorError: the facilitator sent nothing. Without a
// verdict: a request of which no byte was written (its connection never
// made, refused or its TLS handshake failed, or a kept-alive one that
// failed before taking a byte: sendTrace.unsent) or a 4xx (other than 408
// and 409) is a *FacilitatorError, as nothing settled; everything else
// (timeout, dropped connection, 3xx whatever its body, 5xx, malformed or
// oversized reply, success:false that may follow a send: settleUnknown) is
// an *UnknownOutcomeError.
func (f *HTTPFacilitator) Settle(ctx context.Context, p PaymentPayload, req PaymentRequirements) (SettleResponse, error) {
	var out SettleResponse
	if f.err != nil {
		return out, &FacilitatorError{Op: "settle", Err: f.err}
	}
	body, err := json.Marshal(FacilitatorRequest{X402Version: Version, PaymentPayload: p, PaymentRequirements: req})
	if err != nil {
		return out, &FacilitatorError{Op: "settle", Err: err}
	}
	ctx, cancel := context.WithTimeout(ctx, f.cfg.Timeout)
	defer cancel()
	r, err := f.do(ctx, http.MethodPost, "/settle", body, true)
	if err != nil {
		if r.unsent {
			return out, &FacilitatorError{Op: "settle", Err: err}
		}
		return out, &UnknownOutcomeError{Op: "settle", Err: err}
	}
	status := r.status
	m, isObj := replyMembers(r.body)
	raw, has := m["success"]
	if !isObj || !has || (string(raw) != "true" && string(raw) != "false") {
		if status >= 400 && status <= 499 && status != http.StatusRequestTimeout && status != http.StatusConflict {
			return out, &FacilitatorError{Op: "settle", Status: status, RetryAfter: r.retryAfter, Err: errors.New("request refused; nothing settled")}
		}
		return out, &UnknownOutcomeError{Op: "settle", Err: fmt.Errorf("status %d with no success verdict", status)}
	}
	if err := json.Unmarshal(r.body, &out); err != nil {
		return SettleResponse{}, &UnknownOutcomeError{Op: "settle", Err: fmt.Errorf("status %d with a malformed SettleResponse", status)}
	}
	if settleUnknown(out) {
		r := out
		return SettleResponse{}, &UnknownOutcomeError{Op: "settle", Reply: &r, Err: fmt.Errorf("facilitator reports %s", out.ErrorReason)}
	}
	if !out.Success && out.ErrorReason == ReasonFacilitatorUnavailable {
		// Not a refusal of the payment: the facilitator sent nothing (its
		// handler says so for the plain error of the Facilitator
		// contract), so it is that error here too, and a gate handles it
		// as an embedded facilitator's: 503 with the Retry-After it sent,
		// the payment released, no refusal counted.
		return SettleResponse{}, &FacilitatorError{Op: "settle", Status: status, RetryAfter: r.retryAfter, Err: errors.New("facilitator reports facilitator_unavailable; nothing settled")}
	}
	return out, nil
}

// callWithRetry runs one idempotent call: handle decides from a reply
// whether it is an answer (nil error), a retryable miss or a final error.
func (f *HTTPFacilitator) callWithRetry(ctx context.Context, op, method, path string, body []byte, handle func(status int, reply []byte) (bool, error)) error {
	if f.err != nil {
		return &FacilitatorError{Op: op, Err: f.err}
	}
	ctx, cancel := context.WithTimeout(ctx, f.cfg.Timeout)
	defer cancel()
	wait := f.cfg.Backoff
	for attempt := 0; ; attempt++ {
		r, err := f.do(ctx, method, path, body, false)
		var retry bool
		if err != nil {
			err = &FacilitatorError{Op: op, Status: r.status, Err: err}
			retry = ctx.Err() == nil && r.status == 0
		} else {
			retry, err = handle(r.status, r.body)
			if err == nil {
				return nil
			}
			if fe, ok := err.(*FacilitatorError); ok {
				fe.RetryAfter = r.retryAfter
			}
		}
		if !retry || attempt >= f.cfg.Retries {
			return err
		}
		d := wait
		if r.retryAfter > 0 && r.retryAfter <= maxRetryWait {
			d = r.retryAfter
		}
		wait *= 2
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

func retryable(status int) bool {
	return status == http.StatusTooManyRequests || status >= 500
}

// reply is one HTTP answer.
type reply struct {
	status     int
	body       []byte
	retryAfter time.Duration
	// unsent reports, with an error, that no byte of the request left
	// this process (sendTrace.unsent).
	unsent bool
}

// do sends one request and reads a capped reply. A non-nil error with a
// non-zero status means the reply arrived but could not be read whole, or
// was a redirect (refuseRedirect). A request sent once (/settle) is never
// sent again by the transport once a byte of it was written.
func (f *HTTPFacilitator) do(ctx context.Context, method, path string, body []byte, once bool) (reply, error) {
	var st sendTrace
	ctx = httptrace.WithClientTrace(ctx, st.trace())
	u := *f.base
	u.Path += path
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return reply{}, err
	}
	if once && body != nil {
		req.GetBody = st.bodyWhileUnsent(ctx, body)
	}
	if f.user != nil {
		pw, _ := f.user.Password()
		req.SetBasicAuth(f.user.Username(), pw)
	}
	for k, v := range f.cfg.Headers {
		req.Header.Set(k, v)
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := f.cfg.Client.Do(req)
	if err != nil {
		return reply{unsent: st.unsent(ctx, err)}, err
	}
	defer resp.Body.Close()
	r := reply{status: resp.StatusCode}
	r.retryAfter = ParseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
	if r.status >= 300 && r.status <= 399 {
		return r, fmt.Errorf("redirected (status %d): a redirect carries no verdict", r.status)
	}
	if r.body, err = io.ReadAll(io.LimitReader(resp.Body, f.cfg.MaxResponseBytes+1)); err != nil {
		return r, fmt.Errorf("reading reply: %w", err)
	}
	if int64(len(r.body)) > f.cfg.MaxResponseBytes {
		return r, fmt.Errorf("reply larger than %d bytes", f.cfg.MaxResponseBytes)
	}
	return r, nil
}

// replyMembers splits a reply into its top-level members when it is a JSON
// object with distinct member names.
func replyMembers(body []byte) (map[string]json.RawMessage, bool) {
	if _, _, err := checkJSONObject(body); err != nil {
		return nil, false
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(body, &m) != nil {
		return nil, false
	}
	return m, true
}

// refuseRedirect makes a 3xx the reply itself, never followed. A followed
// redirect would send the configured Headers and basic auth to whatever
// host the reply names, and would turn a POST /settle that the facilitator
// took (303 See Other: processed, the result elsewhere) into a GET whose
// 404 or dial error reads as "nothing settled": the payment released after
// it was charged. Unfollowed, a 3xx carries no verdict, whatever its body
// says (do makes it an error): /verify and /supported fail, and /settle's
// outcome is unknown.
func refuseRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// sendTrace follows one call's attempts to tell whether any byte of its
// request left this process. net/http may make several attempts within
// one call: it sends a request again on a new connection when a kept-alive
// one failed before taking a byte, when an HTTP/2 connection could take no
// new stream, or (for a request whose body it can rewind through GetBody)
// when a stream was reset or refused or, with an Idempotency-Key header, a
// kept-alive connection's reply was lost. The transport reports GotConn,
// on the call's goroutine, once an attempt has a connection and before it
// writes a byte of the request on it, so a connection's count of bytes
// written (countingConn) then, and when the call ended, tell whether the
// attempt wrote any. The call sent nothing when no attempt wrote a byte:
// an attempt whose connection was never made (its dial or TLS handshake
// failed, refused, timed out, a certificate not trusted: GetConn without
// GotConn), or one whose kept-alive connection failed before taking a
// byte. A connection that counts nothing (one made by a transport's
// DialTLSContext, or by a transport other than an *http.Transport) may
// have taken the request: a call that got one is taken as sent.
type sendTrace struct {
	mu     sync.Mutex
	asked  bool                    // GetConn: an attempt set out to get a connection
	conns  map[*countingConn]int64 // each connection an attempt got, and its bytes written then
	opaque bool                    // an attempt got a connection that counts nothing
}

func (s *sendTrace) trace() *httptrace.ClientTrace {
	return &httptrace.ClientTrace{
		GetConn: func(string) {
			s.mu.Lock()
			s.asked = true
			s.mu.Unlock()
		},
		GotConn: func(info httptrace.GotConnInfo) { s.got(info.Conn) },
	}
}

// got notes an attempt's connection. Every HTTP/2 attempt and a connection
// reused by a later attempt keep the first count: a byte written on it
// since then by any attempt is this call's (or, over HTTP/2, may be
// another stream's; a call is then taken as sent, which may hold a request
// that sent nothing, never release one that was sent).
func (s *sendTrace) got(c net.Conn) {
	cc := countedConn(c)
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case cc == nil:
		s.opaque = true
	case s.conns == nil:
		s.conns = map[*countingConn]int64{cc: cc.written.Load()}
	default:
		if _, ok := s.conns[cc]; !ok {
			s.conns[cc] = cc.written.Load()
		}
	}
}

// wroteNothing reports whether attempts got connections, each of which
// counts its bytes and took none since.
func (s *sendTrace) wroteNothing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.opaque || len(s.conns) == 0 {
		return false
	}
	for c, at := range s.conns {
		if c.written.Load() != at {
			return false
		}
	}
	return true
}

// unsent reports whether the call of context ctx that failed with err sent
// nothing. A call that got a connection and ended by its context is taken
// as sent: HTTP/2 returns then without waiting for the stream's writer,
// which may still be writing (net/http waits for it on every other
// failure, and for HTTP/1's writer always). A call that traced nothing (a
// transport that reports no GetConn) is judged by its error alone: a dial
// error.
func (s *sendTrace) unsent(ctx context.Context, err error) bool {
	s.mu.Lock()
	got, asked := s.opaque || len(s.conns) > 0, s.asked
	s.mu.Unlock()
	switch {
	case got:
		return ctx.Err() == nil && s.wroteNothing()
	case asked:
		return true
	}
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// errSentOnce is what the transport gets when it would send a /settle
// again: the request may have reached the facilitator.
var errSentOnce = errors.New("not sent again: the request was written, in part or whole, and a settle is sent once")

// bodyWhileUnsent is the GetBody of a request sent once: the transport
// rewinds the body through it to send the request again, and gets it only
// while no byte of the request was written (wroteNothing), so a request
// that never left (a stale kept-alive connection) is still sent on a new
// one, and one the facilitator may have taken is never sent twice, its
// second reply (an already used nonce, say) taken for the verdict of the
// first.
func (s *sendTrace) bodyWhileUnsent(ctx context.Context, body []byte) func() (io.ReadCloser, error) {
	return func() (io.ReadCloser, error) {
		if ctx.Err() != nil || !s.wroteNothing() {
			return nil, errSentOnce
		}
		return io.NopCloser(bytes.NewReader(body)), nil
	}
}

// countingConn is a connection that counts the bytes written on it: the
// request's, and over TLS the records carrying it (sendTrace).
type countingConn struct {
	net.Conn
	written atomic.Int64
}

func (c *countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.written.Add(int64(n))
	return n, err
}

// countedConn is the countingConn under c (net/http's TLS connection wraps
// the one its dialer made), nil when there is none.
func countedConn(c net.Conn) *countingConn {
	for c != nil {
		switch v := c.(type) {
		case *countingConn:
			return v
		case interface{ NetConn() net.Conn }:
			c = v.NetConn()
		default:
			return nil
		}
	}
	return nil
}

// countingCopies maps a caller's transport, weakly, to its countWrites
// copy (countingCopy).
var countingCopies sync.Map // weak.Pointer[http.Transport] -> *http.Transport

// countingCopy is the countWrites copy of a caller's transport, one per
// transport, so that facilitators built on one Client share one pool of
// connections, as they would the transport's own, instead of each
// keeping connections of its own open. The map holds the transport
// weakly and forgets it once it is collected, so a caller that makes
// transports and drops them does not pile them up (a copy whose
// TLSNextProto refers to its original, as x/net/http2's
// ConfigureTransport sets it, keeps its entry for good).
func countingCopy(tr *http.Transport) *http.Transport {
	key := weak.Make(tr)
	if c, ok := countingCopies.Load(key); ok {
		return c.(*http.Transport)
	}
	c, loaded := countingCopies.LoadOrStore(key, countWrites(tr))
	if !loaded {
		runtime.AddCleanup(tr, func(key weak.Pointer[http.Transport]) { countingCopies.Delete(key) }, key)
	}
	return c.(*http.Transport)
}

// countWrites returns a copy of tr whose dialer's connections are
// countingConns. A DialTLSContext's connections are left as they are:
// net/http reads the TLS state (and HTTP/2) only from a *tls.Conn. A
// transport that dials through its deprecated Dial keeps it, uncounted.
//
// The copy speaks the protocols tr would. Clone sets HTTP/2 up on tr (as
// its first use would), which offers h2 in tr's TLSClientConfig, and
// gives the copy that TLSClientConfig but not the HTTP/2 handler
// net/http added (TLSNextProto). Were the copy left to set HTTP/2 up
// itself, its own dialer would keep it from doing so (net/http enables
// HTTP/2 by default only on a transport with no dialer and no TLS
// config), and it would write HTTP/1.1 on a connection the server took
// as h2: so it is told to.
func countWrites(tr *http.Transport) *http.Transport {
	orig := tr
	tr = tr.Clone()
	if _, h2 := orig.TLSNextProto["h2"]; h2 && tr.TLSNextProto == nil {
		tr.ForceAttemptHTTP2 = true
	}
	if tr.DialContext == nil && tr.Dial != nil {
		return tr
	}
	dial := tr.DialContext
	if dial == nil {
		dial = (&net.Dialer{}).DialContext // what net/http dials with when none is set
	}
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil || c == nil {
			return c, err
		}
		return &countingConn{Conn: c}, nil
	}
	return tr
}

// deadlineTransport is http.DefaultTransport's setup with a dial deadline
// and a deadline for the reply's headers: a facilitator whose socket accepts
// but never answers is given up on, whatever context the caller passed.
//
// Every call goes to the one facilitator host, and a settlement holds its
// connection until the chain confirms (a second or more), so concurrent
// paid calls use as many connections. All of them stay open for the next
// calls (DefaultTransport keeps 2 per host: every other call would dial a
// new connection, and its TLS handshake, and leave one in TIME_WAIT).
func deadlineTransport(dial, header time.Duration) *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DialContext = (&net.Dialer{Timeout: dial, KeepAlive: 30 * time.Second}).DialContext
	tr.TLSHandshakeTimeout = dial
	tr.ResponseHeaderTimeout = header
	tr.MaxIdleConnsPerHost = tr.MaxIdleConns
	return tr
}
