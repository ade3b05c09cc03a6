package caddymodule

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/internal/secretopt"
	"github.com/aovhq/aov/receipt"
	"github.com/aovhq/aov/strictjson"
	"github.com/aovhq/aov/verify"
)

func init() {
	caddy.RegisterModule(VerifyResponse{})
}

// Headers verify_response puts on the answers it checked.
const (
	// HeaderVerificationReceipt (the default receipt_header) carries the
	// signed receipt of the response body: standard padded base64 (RFC 4648,
	// like the x402 headers) of the receipt JSON exactly as the verification
	// service signed it. Decode it and check it with `aov receipt verify` or
	// receipt.VerifyReceipt; its output_hash is the SHA-256 of the RFC 8785
	// form of the body (or of the envelope's "output").
	HeaderVerificationReceipt = "Verification-Receipt"
	// HeaderVerificationStatus is "pass" or "fail" (the receipt's result)
	// or "unverified" (on_error fail_open let an unchecked response through;
	// no receipt).
	HeaderVerificationStatus = "Verification-Status"
)

// VerificationVar is the request variable (placeholder
// {http.vars.aov.verification.result}) where verify_response records what
// happened to the response: "pass" or "fail" (verified, receipt attached),
// "blocked" (on_fail block withheld a failing output), "error" (on_error
// fail_closed withheld an unverifiable output), "unverified" (fail_open let
// it through unchecked) or "unchecked" (not a response it checks: another
// status or content type, a HEAD request, or none at all: nothing behind
// it answered). The x402 gate's settle_on reads it; the upstream cannot
// set it.
const VerificationVar = "aov.verification.result"

// verificationStartedVar marks a request verify_response is handling
// (set while its ServeHTTP runs). The x402 gate settles, releases or withholds an answer by the
// outcome verify_response records, so verify_response must run inside the
// gate; in a `route` block directives run in the order written, and one
// that writes verify_response first has the gate settle (or release) before
// anything is verified, while verify_response then tells the buyer
// "nothing was charged". Caddy gives a handler no view of its siblings, so
// the order is checked on the request: a gate that finds this mark refuses
// before it claims a payment or a free unit (errGateInsideVerify), and so
// does a second verify_response, whose outcome the first would overwrite
// (errNestedVerify).
const verificationStartedVar = "aov.verification.started"

// verificationRouteVar marks a request verify_response handled, whatever
// it then did with it, and stays set once it returned: how a gate in front
// of it learns that its route checks answers, and so cannot sell a
// protocol switch (Gate.noteVerified).
const verificationRouteVar = "aov.verification.route"

// Why a misordered request is refused (500 internal_error, logged at
// Error level with this text: the fix is the operator's).
var (
	errGateInsideVerify = errors.New("verify_response runs before this x402 gate, which would settle the payment before the answer is verified: write x402 before verify_response (inside a `route` block directives run in the order written)")
	errNestedVerify     = errors.New("two verify_response handle this request, and the outer one would overwrite the outcome of the inner one that the x402 gate settles on: keep one verify_response per request")
	errVerifyMCP        = errors.New("verify_response runs behind an mcp_tool gate, where the answer is a JSON-RPC message, not the agent's output: it would check the envelope against the schema (and, by the default settle_on pass, decide the charge on that); verify an MCP tool's output in the tool itself, or give verify_response a matcher that leaves /mcp out")
)

// verificationErrorVar holds the code of the refusal with which on_error
// fail_closed withheld an answer it could not verify: what the gate
// reads to tell an outage on the operator's side from an answer the
// buyer's request produced (outcomeOf).
const verificationErrorVar = "aov.verification.error"

// verificationIDVar holds the verification_id of the receipt, for logs
// ({http.vars.aov.verification.id}).
const verificationIDVar = "aov.verification.id"

// receiptNameVar holds the name of the header a verify_response put its
// receipt under on the request's answer (receipt_header), which a gate in
// front keeps with an answer it holds (keptHeader).
const receiptNameVar = "aov.verification.receipt_header"

// Outcomes recorded in VerificationVar.
const (
	outcomePass       = "pass"
	outcomeFail       = "fail"
	outcomeBlocked    = "blocked"
	outcomeError      = "error"
	outcomeUnverified = "unverified"
	outcomeUnchecked  = "unchecked"
)

// Error codes of verify_response refusals (SPEC §6 shape).
const (
	// codeResponseUnverifiable: the response itself cannot be verified (not
	// JSON, compressed, larger than max_response, or refused by the
	// verification service). 503, retryable: the agent may answer
	// differently next time.
	codeResponseUnverifiable = "response_unverifiable"
	// codeOutputFailedVerification: on_fail block withheld an output that
	// failed verification. 502, with the verifier's hints.
	codeOutputFailedVerification = "output_failed_verification"
)

// Defaults of verify_response.
const (
	defaultMaxResponse     = 1 << 20
	defaultVerifierTimeout = 10 * time.Second
	verifierDialTimeout    = 5 * time.Second
	defaultTaskID          = "{http.request.uuid}"
	// maxReceiptBytes caps what is read back from the verification service:
	// a full receipt with every list at its cap is far below it.
	maxReceiptBytes = 4 << 20
	// maxConfigFileBytes caps a schema, bounds or rules file.
	maxConfigFileBytes = 4 << 20
)

// VerifyResponse (Caddyfile directive `verify_response`) checks a seller
// agent's JSON answers at the gateway and attaches a signed receipt. It asks
// the upstream for an uncompressed body, holds a selected response (status
// and content type) in a bounded buffer, sends it to the verification
// service (verifierd's POST /verify/schema) with the configured schema,
// bounds and rules, and releases it with the receipt in the
// Verification-Receipt header (and, with envelope, in the body). The receipt
// is attached only after checking that its output_hash is the hash of the
// exact bytes being released.
//
// A failing output passes with its fail receipt (on_fail pass) or is
// withheld with a 502 carrying the verifier's hints (on_fail block). A
// response that cannot be verified (not JSON, over max_response, the
// verifier down) is withheld with a 503 (on_error fail_closed) or let
// through marked Verification-Status: unverified (fail_open).
//
// It records its outcome in the request variable aov.verification.result,
// which the x402 gate's settle_on reads: by default a gate in the same route
// settles a payment only for an output that passed.
//
// Its registered Caddyfile order is after encode: inside the x402 gate
// (before encode) and inside encode, so it sees the upstream's plain JSON
// and the gate sees its final answer. Inside a `route` block, write x402,
// then verify_response, then the proxy: a gate written after it refuses
// every request (verificationStartedVar).
type VerifyResponse struct {
	// Schema is the JSON Schema the output must satisfy: inline JSON, or
	// the path of a file holding it. Required.
	Schema json.RawMessage `json:"schema,omitempty"`
	// Bounds (SPEC §3: path → {min, max, if_present}), inline or a file path.
	Bounds json.RawMessage `json:"bounds,omitempty"`
	// Rules (SPEC §3: an array of rule objects), inline or a file path.
	Rules json.RawMessage `json:"rules,omitempty"`
	// EnforceRules makes rule violations block a pass.
	EnforceRules bool `json:"enforce_rules,omitempty"`
	// StrictContentCheck also fails undeclared properties and placeholders.
	StrictContentCheck bool `json:"strict_content_check,omitempty"`

	// TaskID is the task_id of each verification, with placeholders of
	// the request (expanded before the upstream runs, so that an id
	// verifierd would refuse is refused before any work: ids). Default
	// {http.request.uuid}. An empty expansion falls back to it.
	TaskID string `json:"task_id,omitempty"`
	// AgentID is the agent_id of each verification, with placeholders of
	// the request as TaskID (e.g. a fixed name, or
	// {http.auth.wallet.address}). Default: none.
	AgentID string `json:"agent_id,omitempty"`

	// Statuses are the response statuses that are checked. Default 200, 201.
	Statuses []int `json:"status,omitempty"`
	// ContentTypes are the media types that are checked (parameters such
	// as charset are ignored). Default application/json. Other responses
	// pass through unchanged and without a receipt.
	ContentTypes []string `json:"content_types,omitempty"`
	// MaxResponse caps a checked response body. A larger one cannot be
	// verified (see on_error). Default 1 MiB.
	MaxResponse int64 `json:"max_response,omitempty"`

	// VerifierURL is the verification service's base URL, e.g.
	// http://127.0.0.1:8081 (POST /verify/schema is appended). Required.
	VerifierURL string `json:"verifier_url,omitempty"`
	// VerifierToken is sent as X-Aov-Gateway-Token. Global placeholders
	// such as {env.AOV_GATEWAY_TOKEN} are resolved at load time, which
	// keeps the token out of the loaded JSON config; a literal is warned
	// about (secretopt).
	VerifierToken string `json:"verifier_token,omitempty"`
	// CardURL is the verification service's agent card, whose public
	// keys every receipt's signature is checked against before it is
	// attached or the gate settles on it (receiptKeys). Default
	// <verifier_url>/.well-known/agent-card.json. certd serves the card
	// (with `make run`, on its own listener, 127.0.0.1:8082), verifierd
	// does not: with verifierd's address as verifier_url, set it. One
	// that answers with no card is logged once (receiptKeys.read).
	CardURL string `json:"card_url,omitempty"`
	// VerifierTimeout bounds one call to the verification service.
	// Default 10s (also for 0), at most 1m (maxVerifierTimeout: a free
	// call's reservation must outlive it); a negative one is refused.
	VerifierTimeout caddy.Duration `json:"verifier_timeout,omitempty"`

	// ReceiptHeader names the header that carries the receipt. Default
	// Verification-Receipt.
	ReceiptHeader string `json:"receipt_header,omitempty"`
	// Envelope replaces the body with {"output": <the original JSON>,
	// "verification": <the signed receipt>}, for clients that keep bodies
	// but not headers. The header is sent as well.
	Envelope bool `json:"envelope,omitempty"`
	// Detail is the receipt's detail: "compact" (default; small enough for
	// a header) or "full" (adds errors, flags and hints). Default "full"
	// with on_fail block, whose 502 carries the hints; a passing full
	// receipt has empty lists and stays small.
	Detail string `json:"detail,omitempty"`
	// OnFail is what happens to an output that fails verification: "pass"
	// (default) releases it with its fail receipt; "block" answers 502
	// output_failed_verification with the verifier's hints and no output.
	OnFail string `json:"on_fail,omitempty"`
	// OnError is what happens when a response cannot be verified (not
	// JSON, compressed, over max_response, verifier unreachable or
	// failing): "fail_closed" (default) answers 503 with no output;
	// "fail_open" releases it with Verification-Status: unverified and no
	// receipt.
	OnError string `json:"on_error,omitempty"`

	template    []byte // the verification request up to `"task_id":`
	schemaHash  string
	rulesHash   string
	endpoint    string
	token       string
	client      *http.Client
	contentSet  []string
	receiptName string
	keys        *receiptKeys
	logger      *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (VerifyResponse) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.verify_response",
		New: func() caddy.Module { return new(VerifyResponse) },
	}
}

// Provision loads the schema, bounds and rules, checks them exactly as the
// verification service will (so a bad schema fails at load, not on the
// first sale), and prepares the request template.
func (v *VerifyResponse) Provision(ctx caddy.Context) error {
	v.logger = ctx.Logger()
	registerVerifyMetrics(ctx)
	if v.TaskID == "" {
		v.TaskID = defaultTaskID
	}
	if len(v.Statuses) == 0 {
		v.Statuses = []int{http.StatusOK, http.StatusCreated}
	}
	if len(v.ContentTypes) == 0 {
		v.ContentTypes = []string{"application/json"}
	}
	v.contentSet = make([]string, len(v.ContentTypes))
	for i, ct := range v.ContentTypes {
		v.contentSet[i] = strings.ToLower(strings.TrimSpace(ct))
	}
	if v.MaxResponse == 0 {
		v.MaxResponse = defaultMaxResponse
	}
	if v.VerifierTimeout == 0 {
		v.VerifierTimeout = caddy.Duration(defaultVerifierTimeout)
	}
	v.receiptName = v.ReceiptHeader
	if v.receiptName == "" {
		v.receiptName = HeaderVerificationReceipt
	}
	if v.OnFail == "" {
		v.OnFail = "pass"
	}
	if v.OnError == "" {
		v.OnError = "fail_closed"
	}
	if v.Detail == "" {
		v.Detail = verify.DetailCompact
		if v.OnFail == "block" {
			v.Detail = verify.DetailFull
		}
	}
	v.token = caddy.NewReplacer().ReplaceKnown(v.VerifierToken, "")
	secretopt.WarnIfLiteral(v.logger, "verifier_token", v.VerifierToken, v.token)
	secretopt.WarnIfURLCredentials(v.logger, "verifier_url", v.VerifierURL, v.VerifierURL) // used as written
	secretopt.WarnIfURLCredentials(v.logger, "card_url", v.CardURL, v.CardURL)

	schema, err := loadJSONOption(v.Schema, "schema")
	if err != nil {
		return err
	}
	if schema == nil {
		return errors.New("verify_response: schema is required")
	}
	bounds, err := loadJSONOption(v.Bounds, "bounds")
	if err != nil {
		return err
	}
	rules, err := loadJSONOption(v.Rules, "rules")
	if err != nil {
		return err
	}
	t := []byte(`{"expected_schema":`)
	t = append(t, schema...)
	if bounds != nil {
		t = append(t, `,"bounds":`...)
		t = append(t, bounds...)
	}
	if rules != nil {
		t = append(t, `,"rules":`...)
		t = append(t, rules...)
	}
	t = fmt.Appendf(t, `,"enforce_rules":%t,"strict_content_check":%t,"detail":%q,"task_id":`, v.EnforceRules, v.StrictContentCheck, v.Detail)
	v.template = t

	// The same parse the verification service runs, on a sample request.
	sample := append(slices.Clip(v.template), `"load-check","submitted_output":null}`...)
	req, err := verify.New(verify.Config{MaxBodyBytes: int64(len(sample)) + 1}).Parse(sample)
	if err != nil {
		return fmt.Errorf("verify_response: the schema, bounds or rules would be refused: %v", describeRefusal(err))
	}
	v.schemaHash, v.rulesHash = req.Hashes.Schema, req.Hashes.Rules

	if v.VerifierURL != "" {
		v.endpoint = strings.TrimRight(v.VerifierURL, "/") + "/verify/schema"
	}
	v.client = &http.Client{
		Timeout: time.Duration(v.VerifierTimeout),
		Transport: &http.Transport{
			Proxy: http.ProxyFromEnvironment,
			// Deadlines of this hop (the whole call: Timeout above): a
			// verification service that accepts and never answers is
			// given up on, never waited for.
			DialContext:           (&net.Dialer{Timeout: verifierDialTimeout}).DialContext,
			ResponseHeaderTimeout: time.Duration(v.VerifierTimeout),
			MaxIdleConns:          256,
			MaxIdleConnsPerHost:   256,
			IdleConnTimeout:       90 * time.Second,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	card := v.CardURL
	if card == "" && v.VerifierURL != "" {
		card = strings.TrimRight(v.VerifierURL, "/") + "/.well-known/agent-card.json"
	}
	v.keys = newReceiptKeys(card, &http.Client{Transport: v.client.Transport}, time.Duration(v.VerifierTimeout), v.logger)
	return nil
}

// describeRefusal turns a verify refusal into one line naming every field.
func describeRefusal(err error) string {
	var e *apierr.Error
	if !errors.As(err, &e) || len(e.Fields) == 0 {
		return err.Error()
	}
	parts := make([]string, len(e.Fields))
	for i, f := range e.Fields {
		parts[i] = fmt.Sprintf("%s %s (%s)", strings.Replace(f.Field, "expected_schema", "schema", 1), f.Problem, f.Fix)
	}
	return strings.Join(parts, "; ")
}

// loadJSONOption reads a schema, bounds or rules option: inline JSON, or a
// JSON string naming a file (or holding the JSON itself), compacted.
func loadJSONOption(raw json.RawMessage, name string) ([]byte, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	data := []byte(raw)
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("verify_response: %s: %v", name, err)
		}
		s = strings.TrimSpace(s)
		if s == "" {
			return nil, nil
		}
		if s[0] == '{' || s[0] == '[' {
			data = []byte(s)
		} else {
			f, err := os.Open(s)
			if err != nil {
				return nil, fmt.Errorf("verify_response: %s file: %v", name, err)
			}
			data, err = io.ReadAll(io.LimitReader(f, maxConfigFileBytes+1))
			f.Close()
			if err != nil {
				return nil, fmt.Errorf("verify_response: reading %s file: %v", name, err)
			}
			if len(data) > maxConfigFileBytes {
				return nil, fmt.Errorf("verify_response: %s file %s is larger than %d bytes", name, s, maxConfigFileBytes)
			}
		}
	}
	var out bytes.Buffer
	if err := json.Compact(&out, data); err != nil {
		return nil, fmt.Errorf("verify_response: %s is not valid JSON: %v", name, err)
	}
	return out.Bytes(), nil
}

// Validate checks the configuration before it is used.
func (v *VerifyResponse) Validate() error {
	if v.VerifierURL == "" {
		return errors.New("verify_response: verifier_url is required")
	}
	u, err := url.Parse(v.VerifierURL)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // without the URL, which may hold a password
		}
		return fmt.Errorf("verify_response: verifier_url does not parse: %v", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("verify_response: verifier_url %q must be an http:// or https:// URL", withoutUserinfo(u))
	}
	if v.CardURL != "" {
		c, err := url.Parse(v.CardURL)
		if err != nil || (c.Scheme != "http" && c.Scheme != "https") || c.Host == "" {
			return errors.New("verify_response: card_url must be an http:// or https:// URL")
		}
	}
	switch d := time.Duration(v.VerifierTimeout); {
	case d < 0:
		// Every call would start past its deadline: each answer
		// unverifiable (fail_closed: an outage; fail_open: every answer
		// out unchecked, and free under settle_on pass). 0 is the default.
		return fmt.Errorf("verify_response: verifier_timeout %s must be positive (leave it out for the default %s)", d, defaultVerifierTimeout)
	case d > maxVerifierTimeout:
		// Behind a gate's free allowance the check runs while the call
		// holds its reserved unit (see maxVerifierTimeout).
		return fmt.Errorf("verify_response: verifier_timeout %s is over %s: behind an x402 free allowance the check runs while the free call holds its reserved unit, which must not lapse", d, maxVerifierTimeout)
	}
	if v.OnFail != "pass" && v.OnFail != "block" {
		return fmt.Errorf("verify_response: on_fail must be pass or block, not %q", v.OnFail)
	}
	if v.OnError != "fail_closed" && v.OnError != "fail_open" {
		return fmt.Errorf("verify_response: on_error must be fail_closed or fail_open, not %q", v.OnError)
	}
	if v.Detail != verify.DetailCompact && v.Detail != verify.DetailFull {
		return fmt.Errorf("verify_response: detail must be compact or full, not %q", v.Detail)
	}
	for _, s := range v.Statuses {
		if s < 200 || s > 599 {
			return fmt.Errorf("verify_response: status %d is not a final HTTP status", s)
		}
	}
	if v.MaxResponse < 0 {
		return errors.New("verify_response: max_response must be positive")
	}
	if !validHeaderName(v.receiptName) {
		return fmt.Errorf("verify_response: receipt_header %q is not a valid header name", v.receiptName)
	}
	if reservedReceiptName(v.receiptName) {
		return fmt.Errorf("verify_response: receipt_header %q names a header the gateway sets, reads or removes itself; choose a name of your own, such as X-Verification-Receipt", v.receiptName)
	}
	return nil
}

// reservedReceiptName reports whether name is one receipt_header may not
// take: a header verify_response, the x402 gate, CORS or net/http set, read
// or remove on the answers that carry a receipt. Under such a name the
// receipt is overwritten (Verification-Status, Vary), removed
// (Payment-Response behind a settle after gate), or removes what it names
// (Content-Type: the upstream's is dropped as the receipt's own, so no
// answer is checked at all).
func reservedReceiptName(name string) bool {
	k := http.CanonicalHeaderKey(name)
	if k == HeaderVerificationStatus || isGateHeader(k) {
		return true
	}
	for _, prefix := range [...]string{"Content-", "Access-Control-", "Proxy-"} {
		if strings.HasPrefix(k, prefix) {
			return true
		}
	}
	switch k {
	case "Transfer-Encoding", "Trailer", "Connection", "Keep-Alive", "Te", "Upgrade",
		"X-Content-Type-Options", "Cache-Control", "Vary", "Retry-After", "Www-Authenticate",
		"Location", "Link", "Allow", "Set-Cookie", "Date", "Server", "Etag", "Last-Modified",
		"Expires", "X-Frame-Options", "Referrer-Policy":
		return true
	}
	return false
}

// withoutUserinfo is u for an error message or a log: a user name and
// password (the verification service's basic auth, a secret) replaced by
// xxxxx. url.URL.Redacted keeps the user name, which may be the token.
func withoutUserinfo(u *url.URL) string {
	if u.User == nil {
		return u.String()
	}
	c := *u
	c.User = url.User("xxxxx")
	return c.String()
}

// validHeaderName reports whether s is an RFC 9110 token.
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			continue
		}
		return false
	}
	return true
}

// Cleanup closes the idle connections to the verification service.
func (v *VerifyResponse) Cleanup() error {
	if v.client != nil {
		v.client.CloseIdleConnections()
	}
	return nil
}

// ServeHTTP runs the upstream into a hold, verifies what it holds, and
// releases the answer the policy calls for.
func (v *VerifyResponse) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if isReport(r) {
		return next.ServeHTTP(w, r)
	}
	var misplaced error
	switch {
	case caddyhttp.GetVar(r.Context(), verificationStartedVar) != nil:
		misplaced = errNestedVerify
	case caddyhttp.GetVar(r.Context(), varRPCMessage) != nil:
		misplaced = errVerifyMCP // a gate read the body as a JSON-RPC message
	}
	if misplaced != nil {
		e := apierr.Internal(misplaced)
		v.logger.Error("request refused", zap.String("code", e.Code), zap.Error(e.Cause))
		v.refuse(w, r, e)
		return nil
	}
	caddyhttp.SetVar(r.Context(), verificationRouteVar, true)
	// A 101 is no answer the hold can take: the upstream's tunnel would
	// open, then be cut off unseen, the call failed (and, under settle_on
	// any, charged for nothing). Refused before the upstream runs, with
	// the gate's own refusal of a switch it cannot sell (upgrade.go).
	if upgradeRequest(r) {
		v.refuse(w, r, errUpgradeUnsupported())
		return nil
	}
	ids, bad := v.ids(r)
	if bad != nil {
		v.refuse(w, r, bad)
		return nil
	}
	caddyhttp.SetVar(r.Context(), verificationStartedVar, true)
	// Only while it runs: handle_errors, run after it returned, is not
	// inside it.
	defer caddyhttp.SetVar(r.Context(), verificationStartedVar, nil)
	// The check reads JSON, and the receipt hashes what is released.
	up := plainWholeRequest(r)

	buf := getBuffer()
	defer putBuffer(buf)
	hw := v.hold(w, buf, r.Method == http.MethodHead)
	// Over max_response the hold fails the proxy's writes; that abort is
	// the overflow handled below, not an upstream failure.
	if err := runUpstream(next, hw, up, hw.reached); err != nil && !(err == errUpstreamAborted && hw.overflow) {
		return err
	}
	if hw.code == 0 {
		// Nothing behind it answered: the end of Caddy's handler chain,
		// no answer to check and none to make up. Written as an empty 200
		// it would reach a gate in front as an answer (settled under
		// settle_on any, a free call spent), where nothing written is
		// refused 502 no_upstream, uncharged (Gate.noUpstream); so it is
		// left unwritten, and without a gate net/http answers its empty
		// 200, as for any chain that ends unanswered. Headers set behind
		// it go on as any other's.
		v.dropOwn(hw.header)
		copyHeader(w.Header(), hw.header)
		v.record(r, outcomeUnchecked)
		return nil
	}
	if hw.held && !hw.spilled() {
		// Whatever it releases or withholds, the gate in front reports the
		// call's outcome to an upstream that asked for it.
		takeReportRequest(r, hw)
	}
	switch {
	case !hw.held:
		hw.passTrailers(v.foreignTrailer)
		v.record(r, outcomeUnchecked)
		return nil
	case hw.spilled():
		v.logUnverifiable(r, errors.New("response larger than max_response"))
		v.record(r, outcomeUnverified)
		return nil
	case hw.overflow:
		return v.unverifiable(w, hw, r, v.responseError(fmt.Sprintf("it is larger than the gateway's %d-byte limit", v.MaxResponse), nil))
	}
	return v.verifyHeld(w, hw, r, ids)
}

// verifyHeld verifies the held response and releases what the policy says.
func (v *VerifyResponse) verifyHeld(w http.ResponseWriter, hw *bufferedWriter, r *http.Request, ids verificationIDs) error {
	body := hw.buf.Bytes()
	// Readers take different values of a repeated header (Get the first, a
	// browser the last valid Content-Type), so the answer would be checked
	// as one thing and read as another: JSON verified and receipted, then
	// rendered as text/html on the gateway's origin; plain bytes checked,
	// then decoded as gzip.
	if len(hw.header.Values("Content-Type")) > 1 {
		return v.unverifiable(w, hw, r, v.responseError("it has more than one Content-Type", nil))
	}
	if why := notPlain(hw.header); why != "" {
		return v.unverifiable(w, hw, r, v.responseError(why, nil))
	}
	if why := notUTF8(hw.header.Get("Content-Type")); why != "" {
		return v.unverifiable(w, hw, r, v.responseError(why, nil))
	}
	// The output hash the receipt must carry, computed the way the
	// verification service computes it (strict decoding, RFC 8785). Member
	// names equal under case folding ("total" and "Total") are refused,
	// as the x402 payload decoder refuses them: the verification reads
	// names exactly, while a buyer's Go client (encoding/json matches a
	// field's name in any letter case, the last twin winning) would read
	// values nobody checked, "Total": 1 for a verified "total": 129.5.
	tree, err := strictjson.Decode(body, strictjson.Limits{FoldedNames: true})
	if err != nil {
		if se := (*strictjson.Error)(nil); errors.As(err, &se) && se.Problem == strictjson.ProblemFoldedName {
			return v.unverifiable(w, hw, r, v.responseError("it has two member names that are equal when letter case is ignored, which readers take differently", err))
		}
		return v.unverifiable(w, hw, r, v.responseError("it is not a single valid JSON value that can be canonicalized", err))
	}
	cb, err := receipt.AppendCanonical(make([]byte, 0, len(body)), tree)
	if err != nil {
		return v.unverifiable(w, hw, r, v.responseError("it cannot be canonicalized", err))
	}
	outputHash := receipt.Hash(cb)

	rc, err := v.call(r, body, outputHash, ids)
	if err != nil {
		return v.unverifiable(w, hw, r, apierr.From(err))
	}
	caddyhttp.SetVar(r.Context(), verificationIDVar, rc.view.VerificationID)

	if rc.view.Result == outcomeFail && v.OnFail == "block" {
		v.record(r, outcomeBlocked)
		return v.writeBlocked(w, r, rc)
	}
	v.record(r, rc.view.Result)

	h := w.Header()
	v.releaseHeader(h, hw.header)
	h.Set(v.receiptName, base64.StdEncoding.EncodeToString(rc.raw))
	caddyhttp.SetVar(r.Context(), receiptNameVar, v.receiptName)
	h.Set(HeaderVerificationStatus, rc.view.Result)
	h.Add("Access-Control-Expose-Headers", v.receiptName+", "+HeaderVerificationStatus)
	out := body
	if v.Envelope {
		out = envelope(bytes.TrimSpace(body), rc.raw)
		dropBodyHeaders(h)
	}
	h.Set("Content-Length", strconv.Itoa(len(out)))
	w.WriteHeader(hw.status())
	_, err = w.Write(out)
	return err
}

// plainWholeRequest is r as it goes to an upstream whose answer the
// gateway reads before it releases it (verify_response checks it, an
// mcp_tool gate judges the tool's result): asking for the answer in plain
// bytes (Accept-Encoding: identity; the client's own, gzip by default in
// Go's and the MCP SDK's clients, would get bytes the gateway cannot
// read) and in full (no Range: a part cannot be read as a whole). The
// client's own request is left as it was, for logs.
func plainWholeRequest(r *http.Request) *http.Request {
	up := new(http.Request)
	*up = *r
	up.Header = r.Header.Clone()
	up.Header.Set("Accept-Encoding", "identity")
	up.Header.Del("Range")
	up.Header.Del("If-Range")
	return up
}

// notPlain says why a held answer's body is not the plain bytes
// plainWholeRequest asked for, or "" when it is: an upstream may compress
// all the same. Two Content-Encodings are refused too, since readers take
// different ones (Get the first, a client decoding the list all of them).
func notPlain(h http.Header) string {
	ce := h.Values("Content-Encoding")
	switch {
	case len(ce) > 1:
		return "it has more than one Content-Encoding"
	case len(ce) == 1 && ce[0] != "" && !strings.EqualFold(strings.TrimSpace(ce[0]), "identity"):
		return "it is compressed (" + headerValueShort(ce[0]) + ") although identity was asked for"
	}
	return ""
}

// notUTF8 says why an answer of content type ct is not text read as UTF-8,
// or "" when it is: the check reads the bytes as UTF-8 JSON (RFC 8259),
// and the answer is released under the agent's own header, so one
// labelled with another charset would be decoded by its readers (a
// browser, Python's requests) into other text than was checked, under a
// pass receipt: an invoice under utf-16le unreadable, under iso-8859-1
// every non-ASCII string changed. Relabelling it utf-8 instead would
// release it as something the agent did not say. ct is the one value
// selects parsed. Any label of UTF-8 is UTF-8 (utf8Labels). It is also the
// rule for a request body a gate reads to price it (bodyNotUTF8).
//
// A value naming a charset twice, or one Go's parser refuses although it
// names one, is not UTF-8 either: other parsers read such values
// otherwise (npm's content-type, under Express's body-parser, lets the last
// of two charset parameters win and ignores RFC 2231's charset*0, which
// Go's parser decodes), so the label the check trusts may not be the one
// a reader decodes by.
func notUTF8(ct string) string {
	switch n := strings.Count(strings.ToLower(ct), "charset"); {
	case n > 1:
		return "it names a charset more than once, and only UTF-8 is checked"
	case n == 0:
		return ""
	}
	_, params, err := mime.ParseMediaType(ct)
	if err != nil {
		return "its charset cannot be read, and only UTF-8 is checked"
	}
	if cs, ok := params["charset"]; ok && !utf8Labels[strings.ToLower(strings.TrimSpace(cs))] {
		return "it is labelled charset " + headerValueShort(cs) + ", and only UTF-8 is checked"
	}
	return ""
}

// utf8Labels are the labels of UTF-8 in the WHATWG Encoding standard, in
// lower case (a label is matched in any case, without surrounding
// spaces): what browsers, and Python's codecs for utf8, decode as UTF-8,
// so an answer labelled with any of them is read as the check read it.
var utf8Labels = map[string]bool{
	"unicode-1-1-utf-8": true,
	"unicode11utf8":     true,
	"unicode20utf8":     true,
	"utf-8":             true,
	"utf8":              true,
	"x-unicode20utf8":   true,
}

// bodyHeaders are the headers of an answer that describe its body's bytes
// rather than what it means: their length, encoding, range and digests
// (an Etag validates those bytes too). An answer whose body the gateway writes
// itself (verify_response's envelope, an MCP answer the gate rewrote or
// replaced) loses them all, or they would describe bytes it no longer
// carries; Content-Length is set again for the body sent.
var bodyHeaders = []string{"Content-Length", "Content-Encoding", "Content-Range", "Etag", "Content-Md5", "Digest", "Content-Digest", "Repr-Digest"}

// dropBodyHeaders removes bodyHeaders from h.
func dropBodyHeaders(h http.Header) {
	for _, k := range bodyHeaders {
		h.Del(k)
	}
}

// envelope builds {"output": <output>, "verification": <receipt>}.
func envelope(output, rcpt []byte) []byte {
	out := make([]byte, 0, len(output)+len(rcpt)+36)
	out = append(out, `{"output":`...)
	out = append(out, output...)
	out = append(out, `,"verification":`...)
	out = append(out, rcpt...)
	return append(out, "}\n"...)
}

// releaseHeader sets the header of a held answer on h, the header of the
// answer verify_response releases: without trailers (bufferedWriter.Header)
// and with cleanReleased's treatment.
func (v *VerifyResponse) releaseHeader(h, held http.Header) {
	dropTrailers(held)
	copyHeader(h, held)
	v.cleanReleased(h)
}

// cleanReleased makes h, the upstream's header copied onto an answer
// verify_response releases (checked, or unverified under fail_open: held,
// or spilled past max_response), safe to send: without the names only the
// gateway sets (the upstream's own receipt and status never go out,
// whether sent as headers or as trailers), and with nosniff, so a browser
// reads the answer as the Content-Type it was checked under and nothing
// else. An unverified answer may carry several Content-Types, and readers
// take different ones (a browser the last valid one, which nosniff does
// not stop from being text/html): it goes out as
// application/octet-stream, a type no browser renders.
func (v *VerifyResponse) cleanReleased(h http.Header) {
	v.dropOwn(h)
	if len(h.Values("Content-Type")) > 1 {
		h.Set("Content-Type", "application/octet-stream")
	}
	h.Set("X-Content-Type-Options", "nosniff")
}

// dropOwn removes from h, an upstream's header, the names only
// verify_response sets (ownName).
func (v *VerifyResponse) dropOwn(h http.Header) {
	for k := range h {
		if v.ownName(k) {
			delete(h, k)
		}
	}
}

// ownName reports whether k names a header only verify_response sets: its
// receipt header, and the default receipt and status headers.
func (v *VerifyResponse) ownName(k string) bool {
	k = http.CanonicalHeaderKey(k)
	return k == http.CanonicalHeaderKey(v.receiptName) || k == HeaderVerificationReceipt || k == HeaderVerificationStatus
}

// foreignTrailer reports whether k names a trailer an upstream may not
// send through verify_response on an answer it lets pass unchecked: its
// own names (ownName), and the gate's (gateHeaders), which a gate in front
// that streams the answer drops too (settle before), but nothing else
// does when there is none.
func (v *VerifyResponse) foreignTrailer(k string) bool {
	return v.ownName(k) || isGateHeader(http.CanonicalHeaderKey(k))
}

// markUnverified marks the header of an answer on_error fail_open lets
// through unchecked.
func markUnverified(h http.Header) {
	h.Set(HeaderVerificationStatus, outcomeUnverified)
	h.Add("Access-Control-Expose-Headers", HeaderVerificationStatus)
}

// copyHeader sets every header of src on dst.
func copyHeader(dst, src http.Header) {
	for k, vv := range src {
		dst[k] = vv
	}
}

// headerValueShort renders a header value for an error message: short,
// printable ASCII only.
func headerValueShort(s string) string {
	if len(s) > 32 {
		s = s[:32]
	}
	return strings.Map(func(r rune) rune {
		if r < ' ' || r > '~' {
			return '?'
		}
		return r
	}, s)
}

// responseError reports a response that cannot be verified.
func (v *VerifyResponse) responseError(why string, cause error) *apierr.Error {
	return &apierr.Error{
		Code:        codeResponseUnverifiable,
		Message:     "The response could not be verified because " + why + "; it was withheld and nothing was charged; retry later.",
		Status:      http.StatusServiceUnavailable,
		Retryable:   true,
		RetryAfter:  1,
		NextActions: []apierr.Action{{Action: "retry", After: 1}},
		Cause:       cause,
	}
}

// unverifiable applies on_error to a response that could not be verified.
func (v *VerifyResponse) unverifiable(w http.ResponseWriter, hw *bufferedWriter, r *http.Request, e *apierr.Error) error {
	v.logUnverifiable(r, e)
	if v.OnError == "fail_open" {
		v.record(r, outcomeUnverified)
		h := w.Header()
		v.releaseHeader(h, hw.header)
		markUnverified(h)
		w.WriteHeader(hw.status())
		_, err := w.Write(hw.buf.Bytes())
		return err
	}
	v.record(r, outcomeError)
	caddyhttp.SetVar(r.Context(), verificationErrorVar, e.Code)
	v.refuse(w, r, e)
	return nil
}

// refuse writes a refusal of verify_response in the SPEC §6 shape, as the
// buyer must read it (chargeAware): every refusal but on_fail block's 502,
// whose body carries more and which applies chargeAware itself. A refusal
// can follow a settlement whatever its cause (a gate that settles before
// its upstream, a run again after a settlement resolved from the chain),
// so none is written without it.
func (v *VerifyResponse) refuse(w http.ResponseWriter, r *http.Request, e *apierr.Error) {
	apierr.Write(w, v.chargeAware(r, e))
}

// varSettledBefore is set (true) on a request whose payment the gate
// settled before its upstream ran (paidStream): settle before mode, or a
// run again after a settlement resolved from the chain.
const varSettledBefore = "aov.x402.settled_before"

// chargeAware returns e as the buyer must read it: a verify_response
// after a gate that settled before the agent answered withholds the output
// all the same (on_fail block, on_error fail_closed, a misplaced
// verify_response's refusal), but the payment is
// made, so the answer says so (charged: true) and an error is logged: a
// seller who wants to be paid only for passing outputs needs settle after.
func (v *VerifyResponse) chargeAware(r *http.Request, e *apierr.Error) *apierr.Error {
	if before, _ := caddyhttp.GetVar(r.Context(), varSettledBefore).(bool); !before {
		return e
	}
	v.logger.Error("verify_response withheld an answer whose payment was settled before the agent answered; use settle after on the x402 gate to be paid only for outputs that pass",
		zap.String("uri", r.RequestURI), zap.String("code", e.Code))
	return e.SettledBefore()
}

func (v *VerifyResponse) logUnverifiable(r *http.Request, err error) {
	if ce := v.logger.Check(zapcore.WarnLevel, "response not verified"); ce != nil {
		ce.Write(zap.String("on_error", v.OnError), zap.String("uri", r.RequestURI), zap.Error(err))
	}
}

// record notes what happened to the response: in the request variable
// the gate's settle_on reads, and in the outcome counter.
func (v *VerifyResponse) record(r *http.Request, outcome string) {
	caddyhttp.SetVar(r.Context(), VerificationVar, outcome)
	verifyMetrics.WithLabelValues(outcome).Inc()
}

// verifyMetrics counts responses by outcome. Created once per process and
// registered into each config's registry (Caddy makes a new one on reload).
var verifyMetrics = prometheus.NewCounterVec(prometheus.CounterOpts{
	Namespace: "aov",
	Subsystem: "verify_response",
	Name:      "outcomes_total",
	Help:      "Responses by what verify_response did: pass, fail, blocked, error, unverified, unchecked.",
}, []string{"outcome"})

func registerVerifyMetrics(ctx caddy.Context) {
	reg := ctx.GetMetricsRegistry()
	if reg == nil {
		return
	}
	if err := reg.Register(verifyMetrics); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			ctx.Logger().Warn("registering metrics: " + err.Error())
		}
	}
}

// signedReceipt is the verification service's answer: the exact bytes (as
// signed) and the members the gateway reads.
type signedReceipt struct {
	raw  []byte
	view receiptView
}

type receiptView struct {
	Result         string `json:"result"`
	VerificationID string `json:"verification_id"`
	Summary        struct {
		BlockingChecks []string `json:"blocking_checks"`
	} `json:"summary"`
	Hints       json.RawMessage `json:"hints"`
	HintsTotal  int             `json:"hints_total"`
	Attestation *struct {
		Signature string `json:"signature"`
	} `json:"attestation"`
}

// verificationIDs are the task_id and agent_id ("" for null) of one
// verification.
type verificationIDs struct{ task, agent string }

// ids expands task_id and agent_id for r, or refuses r (400, naming the
// field, never its value) when an expansion is not an id verifierd records
// (verify.ValidID, its own rule): the templates take text from the
// client's request (a query parameter, a header), so such a call would be
// refused by verifierd (an id over 200 characters), or sent as another id
// than the receipt is checked against (text that is not UTF-8, which JSON
// carries as U+FFFD): either way only after the upstream ran, withheld
// with a 503 that no retry can cure. Refused first, nothing runs and
// nothing is charged (the gate gives its free unit back: not billable).
func (v *VerifyResponse) ids(r *http.Request) (verificationIDs, *apierr.Error) {
	ids := verificationIDs{task: v.TaskID, agent: v.AgentID}
	if repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); repl != nil {
		ids.task = repl.ReplaceAll(ids.task, "")
		if ids.task == "" {
			ids.task = repl.ReplaceAll(defaultTaskID, "")
		}
		ids.agent = repl.ReplaceAll(ids.agent, "")
	}
	switch {
	case !verify.ValidID(ids.task):
		return ids, invalidID("task_id")
	case ids.agent != "" && !verify.ValidID(ids.agent):
		return ids, invalidID("agent_id")
	}
	return ids, nil
}

// invalidID refuses a request whose expansion of verify_response's field
// (task_id or agent_id) is not a valid id. 400, not 422: no body field of
// the client's is wrong, the URL or headers the template reads are.
func invalidID(field string) *apierr.Error {
	e := apierr.Invalid(apierr.Field{Field: field,
		Problem: fmt.Sprintf("must be 1 to %d characters of UTF-8 text", verify.MaxIDChars),
		Fix:     fmt.Sprintf("The gateway builds %s from this request's URL or headers; send values that make it 1 to %d characters of UTF-8 text.", field, verify.MaxIDChars)})
	e.Status = http.StatusBadRequest
	return e
}

// call sends one verification request for body, whose output hash is
// outputHash, with ids, and reads the receipt. An error is an
// *apierr.Error ready for on_error: upstream_unavailable when the service
// is down or failing, or its receipt does not verify or is about another
// request; response_unverifiable when it refused the response.
func (v *VerifyResponse) call(r *http.Request, body []byte, outputHash string, ids verificationIDs) (*signedReceipt, error) {
	// The receipt is checked against exactly the ids sent: valid UTF-8
	// (ids), which JSON carries unchanged.
	taskID, agentID := ids.task, ids.agent
	want := receipt.Expected{
		Hashes:             receipt.Hashes{Output: outputHash, Schema: v.schemaHash, Rules: v.rulesHash},
		TaskID:             taskID,
		StrictContentCheck: v.StrictContentCheck,
		EnforceRules:       v.EnforceRules,
	}
	if agentID != "" {
		want.AgentID = &agentID
	}
	reqBody := make([]byte, 0, len(v.template)+len(body)+128)
	reqBody = append(reqBody, v.template...)
	reqBody = appendJSONString(reqBody, taskID)
	reqBody = append(reqBody, `,"agent_id":`...)
	if agentID == "" {
		reqBody = append(reqBody, "null"...)
	} else {
		reqBody = appendJSONString(reqBody, agentID)
	}
	reqBody = append(reqBody, `,"submitted_output":`...)
	reqBody = append(reqBody, body...)
	reqBody = append(reqBody, '}')

	// The verification must finish even if the client leaves: it is
	// recorded by the service either way (a gate in front then settles
	// nothing: serveCharged). It must not outlast verifier_timeout, nor
	// the deadline of a gate in front (answerBy), whichever comes first:
	// past that the gate has given up on the answer.
	by := time.Now().Add(time.Duration(v.VerifierTimeout))
	if gate := answerBy(r); !gate.IsZero() && gate.Before(by) {
		by = gate
	}
	ctx, cancel := context.WithDeadline(context.WithoutCancel(r.Context()), by)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, v.endpoint, bytes.NewReader(reqBody))
	if err != nil {
		return nil, apierr.Internal(fmt.Errorf("building verification request: %w", err))
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	if v.token != "" {
		req.Header.Set("X-Aov-Gateway-Token", v.token)
		// verifierd reads it only beside the token: by then the answer must
		// be back, so a stalled history store gets verifierd's own 503 in
		// time (its store wait is bounded by it), and a verification whose
		// answer would come after this call gave up is not recorded.
		dl, _ := ctx.Deadline()
		req.Header.Set(HeaderUpstreamAnswerBy, strconv.FormatInt(dl.UnixMilli(), 10))
	}
	resp, err := v.client.Do(req)
	if err != nil {
		return nil, apierr.Unavailable("verification service", 2, fmt.Errorf("calling the verification service: %w", err))
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxReceiptBytes+1))
	if err != nil {
		return nil, apierr.Unavailable("verification service", 2, fmt.Errorf("reading the verification answer: %w", err))
	}
	rc, err := v.readAnswer(resp.StatusCode, resp.Header.Get("Content-Type"), raw)
	if err != nil {
		return nil, err
	}
	// Within the same deadline: a call waits for a read of the card no
	// longer than for the verification (the read has its own).
	if err := v.keys.verify(ctx, rc.raw); err != nil {
		return nil, err
	}
	// Never attach (or count as a pass) a receipt about other bytes or
	// another request: the one check `aov receipt verify --request` makes.
	// A receipt's hashes do not cover task_id, agent_id,
	// strict_content_check or enforce_rules, so a genuine receipt made
	// with enforce_rules turned off on the way (rule violations only
	// warned about) would otherwise be charged as a pass for a request
	// that enforced them.
	if err := receipt.CheckRequest(rc.raw, want); err != nil {
		return nil, apierr.Unavailable("verification service", 2, fmt.Errorf("the receipt is not about the request sent: %w", err))
	}
	return rc, nil
}

// readAnswer turns the verification service's answer into a receipt, or
// into the error on_error applies. The answer is untrusted input: it is
// size-capped, and only a JSON object with a pass or fail result and an
// attestation is accepted.
func (v *VerifyResponse) readAnswer(status int, contentType string, raw []byte) (*signedReceipt, error) {
	if len(raw) > maxReceiptBytes {
		return nil, apierr.Unavailable("verification service", 2, errors.New("verification answer larger than the receipt limit"))
	}
	switch {
	case status == http.StatusOK:
	case status >= 500 || status == http.StatusTooManyRequests:
		return nil, apierr.Unavailable("verification service", 2, fmt.Errorf("verification service answered %d (%s)", status, errorCode(raw)))
	default:
		return nil, v.responseError("the verification service refused it", fmt.Errorf("verification service answered %d (%s)", status, errorCode(raw)))
	}
	if mt, _, _ := mime.ParseMediaType(contentType); mt != "application/json" {
		return nil, apierr.Unavailable("verification service", 2, fmt.Errorf("verification answer has content type %q", headerValueShort(contentType)))
	}
	rc := &signedReceipt{raw: bytes.TrimSpace(raw)}
	if len(rc.raw) == 0 || rc.raw[0] != '{' {
		return nil, apierr.Unavailable("verification service", 2, errors.New("verification answer is not a JSON object"))
	}
	if err := json.Unmarshal(rc.raw, &rc.view); err != nil {
		return nil, apierr.Unavailable("verification service", 2, fmt.Errorf("verification answer is not a receipt: %w", err))
	}
	if (rc.view.Result != outcomePass && rc.view.Result != outcomeFail) || rc.view.Attestation == nil || rc.view.Attestation.Signature == "" {
		return nil, apierr.Unavailable("verification service", 2, errors.New("verification answer has no result or no attestation"))
	}
	return rc, nil
}

// errorCode extracts the code of a SPEC §6 error body, for logs.
func errorCode(raw []byte) string {
	var e struct {
		Code   string `json:"code"`
		Fields []struct {
			Field string `json:"field"`
		} `json:"fields"`
	}
	if json.Unmarshal(raw, &e) != nil || e.Code == "" {
		return "no error code"
	}
	s := headerValueShort(e.Code)
	for i, f := range e.Fields {
		if i == 3 {
			s += ", ..."
			break
		}
		s += " " + headerValueShort(f.Field)
	}
	return s
}

// appendJSONString appends s as a JSON string.
func appendJSONString(dst []byte, s string) []byte {
	b, _ := json.Marshal(s) // a string always marshals
	return append(dst, b...)
}

// blockedAnswer is the 502 of on_fail block: the SPEC §6 shape, plus what
// a seller's agent needs to repair its output (the blocking checks and the
// verifier's hints) and the signed fail receipt of the withheld output. The
// output itself is not included.
type blockedAnswer struct {
	*apierr.Error
	BlockingChecks []string        `json:"blocking_checks"`
	Hints          json.RawMessage `json:"hints"`
	HintsTotal     int             `json:"hints_total"`
	Verification   json.RawMessage `json:"verification"`
}

func (v *VerifyResponse) writeBlocked(w http.ResponseWriter, r *http.Request, rc *signedReceipt) error {
	ans := blockedAnswer{
		Error: v.chargeAware(r, &apierr.Error{
			Code:        codeOutputFailedVerification,
			Message:     "The output failed verification and was withheld; nothing was charged; repair it using the hints and verify again.",
			Status:      http.StatusBadGateway,
			NextActions: []apierr.Action{{Action: "repair_and_reverify", Using: "hints"}},
		}),
		BlockingChecks: rc.view.Summary.BlockingChecks,
		Hints:          rc.view.Hints,
		HintsTotal:     rc.view.HintsTotal,
		Verification:   rc.raw,
	}
	if ans.BlockingChecks == nil {
		ans.BlockingChecks = []string{}
	}
	if len(ans.Hints) == 0 {
		ans.Hints = json.RawMessage("[]")
	}
	body, err := json.Marshal(ans)
	if err != nil {
		return err
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set(HeaderVerificationStatus, outcomeFail)
	w.WriteHeader(http.StatusBadGateway)
	_, err = w.Write(append(body, '\n'))
	return err
}

// selects reports whether a response with this status and header is one
// verify_response checks.
func (v *VerifyResponse) selects(status int, h http.Header) bool {
	if !slices.Contains(v.Statuses, status) {
		return false
	}
	// Any of several values selects the answer, which is then held and
	// found unverifiable (verifyHeld): none may go out unchecked under a
	// type verify_response checks.
	for _, ct := range h.Values("Content-Type") {
		if mt, _, err := mime.ParseMediaType(ct); err == nil && slices.Contains(v.contentSet, mt) {
			return true
		}
	}
	return false
}

// hold is the bounded writer between verify_response and the upstream. A
// response it does not check (per status and content type, or a HEAD)
// goes straight through; one it checks is held, up to max_response, until
// verified (with fail_open, a larger one goes through marked unverified).
// Receipt and status headers from the upstream are always dropped: only
// the gateway attaches them.
func (v *VerifyResponse) hold(w http.ResponseWriter, buf *bytes.Buffer, head bool) *bufferedWriter {
	b := &bufferedWriter{header: make(http.Header), buf: buf, limit: v.MaxResponse, through: w}
	b.choose = func(status int, h http.Header) bool {
		v.dropOwn(h)
		return !head && v.selects(status, h)
	}
	if v.OnError == "fail_open" {
		// Released unverified, as one under max_response would be.
		b.spill = func(h http.Header) {
			v.cleanReleased(h)
			markUnverified(h)
		}
	}
	return b
}

// settleAllowed applies the gate's settle_on to the answer the upstream
// gave: "any" settles every answer below 400; "pass" only one whose output
// verify_response found passing; the default is "pass" when verify_response
// handled the request and "any" when it did not.
func (g *Gate) settleAllowed(r *http.Request) bool {
	outcome, _ := caddyhttp.GetVar(r.Context(), VerificationVar).(string)
	switch g.SettleOn {
	case settleOnAny:
		return true
	case settleOnPass:
		// An answer no verify_response saw ("") is withheld if it has
		// content, and logged then (uncheckedContent).
		return outcome == outcomePass
	default:
		return outcome == "" || outcome == outcomePass
	}
}

// settle_on values.
const (
	settleOnPass = "pass"
	settleOnAny  = "any"
)

// validateSettleOn checks the gate's settle_on against its settle mode and
// what it prices. verify_response does not read MCP: on an mcp_tool route
// it would check the whole JSON-RPC answer against the seller's schema, not
// the tool's result, so under pass every call would be refused, or charged
// by the wrong document.
func (g *Gate) validateSettleOn() error {
	switch g.SettleOn {
	case "", settleOnAny:
	case settleOnPass:
		if g.Settle == "before" {
			return errors.New("x402: settle_on pass needs settle after: a payment settled before the upstream runs cannot wait for its verification")
		}
		if g.MCPTool != "" {
			return errors.New("x402: settle_on pass cannot price an MCP tool (mcp_tool): verify_response does not read MCP and would check the whole JSON-RPC answer, not the tool's result; an MCP tool is charged for any result that is not a tool error, so leave settle_on out or use any")
		}
	default:
		return fmt.Errorf("x402: settle_on must be pass or any, not %q", g.SettleOn)
	}
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner           = (*VerifyResponse)(nil)
	_ caddy.Validator             = (*VerifyResponse)(nil)
	_ caddy.CleanerUpper          = (*VerifyResponse)(nil)
	_ caddyhttp.MiddlewareHandler = (*VerifyResponse)(nil)
	_ http.Flusher                = (*bufferedWriter)(nil)
)
