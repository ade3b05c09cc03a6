package caddymodule

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"net/http"
	"slices"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"
	"go.uber.org/zap"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/internal/caddyopt"
	"github.com/aovhq/aov/receipt"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// Payment identifiers: x402's payment-identifier extension.
//
// A route that enables it declares the extension in PAYMENT-REQUIRED (and
// in MCP payment-required results). A client that wants its retries to be
// idempotent sends an id it chose in its payment
// (extensions["payment-identifier"].info.id). The gate then binds the id to
// the call's fingerprint: a hash of the payment (in canonical form) and of
// the request it pays for (method, path and query, and body; for an MCP call
// the tool and its arguments). What a call with an id gets:
//
//   - a new id: the call is served and charged as any paid call; once the
//     payment settled, the answer it bought (status, the upstream's
//     headers, body, and the settlement for PAYMENT-RESPONSE) is saved for
//     the window;
//   - the same id and fingerprint within the window: the saved answer,
//     with the first call's PAYMENT-RESPONSE, and no second settlement
//     (the upstream does not run again);
//   - the same id with another payment or another request: 409
//     payment_identifier_conflict, nothing charged;
//   - the same id and fingerprint while the first call is still running:
//     409 payment_identifier_in_progress, retryable (Retry-After 1);
//   - an answer over max_answer (or any answer in settle before mode,
//     which is streamed, a run again included) is delivered but not
//     saved: a retry gets 409 payment_identifier_answer_not_kept with the
//     first call's PAYMENT-RESPONSE, nothing charged again;
//   - a malformed id is 400 invalid_payment_identifier; no id on a route
//     that requires one is 400 payment_identifier_required. Neither is
//     charged.
//
// The binding never moves money; the payment's claim (paid.go) does. A
// call binds its id only while it holds its payment's claim, so of the
// copies of one payment exactly one runs. It unbinds the id before it
// releases a claim on which nothing was charged (a refused payment, an
// upstream error, a 422, a failed settlement), so a later attempt with
// the same id (and a corrected request or a new payment) is served
// normally. A settlement whose outcome is unknown keeps both: the same
// payment's retry is resolved by pending.go (and the held answer it gets,
// once the transfer is found, becomes the id's saved answer; the held
// record names the id, and serves only a retry carrying it), any other
// payment under the id is a conflict until the binding lapses. A binding
// lives for the window, and at least as long as its payment's claim, so no
// second payment can take an id while the first could still settle.
//
// Bindings and answers live in the gateway store (store.PaymentIDs), so
// they hold across instances sharing a Redis store.

// Defaults of payment_identifier.
const (
	defaultPaymentIDWindow    = time.Hour
	defaultPaymentIDMaxAnswer = 256 << 10
	maxPaymentIDWindow        = maxClaimHold
)

// PaymentIdentifier enables x402's payment-identifier extension on a route.
type PaymentIdentifier struct {
	// Required makes the id mandatory: a payment without one is 400
	// payment_identifier_required (declared as info.required true).
	Required bool `json:"required,omitempty"`
	// Window is how long a settled call's answer is kept for retries with
	// the same id. Default 1h, at most 7 days.
	Window caddy.Duration `json:"window,omitempty"`
	// MaxAnswer bounds one saved answer (body plus headers). A larger
	// answer is delivered but not saved. Default 256 KiB, at most 16 MiB.
	MaxAnswer int64 `json:"max_answer,omitempty"`
}

// paymentIDStore is a gateway store that keeps payment identifiers.
type paymentIDStore interface {
	PaymentIDs() store.PaymentIDs
}

// provision sets the defaults and checks the store.
func (p *PaymentIdentifier) provision(g *Gate) error {
	if p == nil {
		return nil
	}
	if p.Window == 0 {
		p.Window = caddy.Duration(defaultPaymentIDWindow)
	}
	if p.MaxAnswer == 0 {
		p.MaxAnswer = defaultPaymentIDMaxAnswer
	}
	switch {
	case p.Window < 0 || time.Duration(p.Window) > maxPaymentIDWindow:
		return fmt.Errorf("x402: payment_identifier window must be positive and at most %v", maxPaymentIDWindow)
	case p.MaxAnswer < 0 || p.MaxAnswer > store.MaxPaymentIDAnswerBytes/2:
		return fmt.Errorf("x402: payment_identifier max_answer must be positive and at most %s", humanize.IBytes(store.MaxPaymentIDAnswerBytes/2))
	}
	if _, ok := g.state.(paymentIDStore); !ok {
		return fmt.Errorf("x402: payment_identifier needs a store that keeps payment identifiers (badger, redis); %T does not", g.state)
	}
	return nil
}

// declare adds the extension's declaration to a PaymentRequired's
// extensions (creating them when nil) and returns them.
func (p *PaymentIdentifier) declare(ext map[string]any) map[string]any {
	if p == nil {
		return ext
	}
	if ext == nil {
		ext = map[string]any{}
	}
	ext[x402.PaymentIdentifierExtension] = x402.DeclarePaymentIdentifier(p.Required)
	return ext
}

// parsePaymentIdentifier reads
//
//	payment_identifier [optional|required] {
//		window     <duration>
//		max_answer <size>
//	}
func parsePaymentIdentifier(d *caddyfile.Dispenser) (*PaymentIdentifier, error) {
	p := &PaymentIdentifier{}
	if d.NextArg() {
		switch d.Val() {
		case "optional":
		case "required":
			p.Required = true
		default:
			return nil, d.Errf("payment_identifier: %q is neither optional nor required", d.Val())
		}
		if d.NextArg() {
			return nil, d.ArgErr()
		}
	}
	seen := caddyopt.Once{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		if err := seen.Check(d); err != nil {
			return nil, err
		}
		switch d.Val() {
		case "window":
			var s string
			if err := oneArg(d, &s); err != nil {
				return nil, err
			}
			w, err := caddy.ParseDuration(s)
			if err != nil || w <= 0 {
				return nil, d.Errf("payment_identifier window must be a positive duration, not %q", s)
			}
			p.Window = caddy.Duration(w)
		case "max_answer":
			if err := sizeArg(d, &p.MaxAnswer); err != nil {
				return nil, err
			}
		default:
			return nil, d.Errf("payment_identifier: unknown option %q (want window or max_answer)", d.Val())
		}
	}
	return p, nil
}

// Error codes of payment identifiers (SPEC §6).
const (
	codeInvalidPaymentID       = "invalid_payment_identifier"
	codePaymentIDRequired      = "payment_identifier_required"
	codePaymentIDConflict      = "payment_identifier_conflict"
	codePaymentIDInProgress    = "payment_identifier_in_progress"
	codePaymentIDAnswerNotKept = "payment_identifier_answer_not_kept"
)

var (
	errInvalidPaymentID = apierr.Error{
		Code:        codeInvalidPaymentID,
		Message:     fmt.Sprintf("The payment's extensions[\"payment-identifier\"].info.id must be a string of %d to %d characters from a-z, A-Z, 0-9, '_' and '-'; nothing was charged.", x402.PaymentIDMinLength, x402.PaymentIDMaxLength),
		Status:      http.StatusBadRequest,
		NextActions: []apierr.Action{{Action: "fix_request_fields", Fields: []string{"extensions.payment-identifier.info.id"}}},
	}
	errPaymentIDRequired = apierr.Error{
		Code:        codePaymentIDRequired,
		Message:     "This route requires a payment identifier: echo the payment-identifier extension of PAYMENT-REQUIRED in the payment with info.id set (for example with appendPaymentIdentifierToExtensions); nothing was charged.",
		Status:      http.StatusBadRequest,
		NextActions: []apierr.Action{{Action: "fix_request_fields", Fields: []string{"extensions.payment-identifier.info.id"}}},
	}
	errPaymentIDConflict = apierr.Error{
		Code:        codePaymentIDConflict,
		Message:     "This payment identifier is already bound to another payment or another request; nothing was charged. Use a new identifier for a new request.",
		Status:      http.StatusConflict,
		NextActions: []apierr.Action{{Action: "use_new_payment_identifier"}},
	}
	errPaymentIDInProgress = apierr.Error{
		Code:        codePaymentIDInProgress,
		Message:     "A call with this payment identifier and payment is still being served; nothing was charged for this one. Retry the same request shortly to get its answer.",
		Status:      http.StatusConflict,
		Retryable:   true,
		RetryAfter:  1,
		NextActions: []apierr.Action{{Action: "retry", After: 1}},
	}
	errPaymentIDAnswerNotKept = apierr.Error{
		Code:        codePaymentIDAnswerNotKept,
		Message:     "This payment identifier's call was paid and answered (see PAYMENT-RESPONSE), but its answer was too large, or streamed, to be kept for retries; nothing was charged again.",
		Status:      http.StatusConflict,
		NextActions: []apierr.Action{{Action: "contact_operator"}},
	}
)

// fresh returns a copy of one of the errors above to answer with.
func fresh(e apierr.Error) *apierr.Error { return &e }

// paymentIDCall is one paid call that carries a payment identifier on a
// route that enables the extension. A nil *paymentIDCall (no extension, no
// id) does nothing.
type paymentIDCall struct {
	g      *Gate
	ids    store.PaymentIDs
	id, fp string
	// legacy is the call's fingerprint as a version that hashed the
	// payment as sent made it ("" when that is fp): see owns.
	legacy string
	ctx    context.Context // outlives the client: a save or unbind is never abandoned
	bound  bool            // this call holds the binding (it holds the payment's claim)
	// payload is the call's payment, which a saved answer's settlement is
	// told of (serveSaved): the same payment as the call that saved it
	// (fp covers it), on the network its accepted offer names.
	payload x402.PaymentPayload
}

// name is the name of the call's id that a held record keeps (""
// without one).
func (c *paymentIDCall) name() string {
	if c == nil {
		return ""
	}
	return paymentIDName(c.id)
}

// paymentIDName names payment identifier id in a held record
// (heldRecord.PaymentID): its hash, so the store, whose claims any gate
// sharing it lists, keeps no id a client could present.
func paymentIDName(id string) string {
	s := sha256.Sum256([]byte(id))
	return hex.EncodeToString(s[:])
}

// paymentIDOf reads the payment identifier of a paid call: nil when the
// route does not enable the extension or the call carries no id. A
// malformed id, or none where one is required, is an error of the SPEC §6
// shape, answered before anything is claimed.
func (g *Gate) paymentIDOf(r *http.Request, pay x402.Payment, raw string) (*paymentIDCall, error) {
	p := g.PaymentIdentifier
	if p == nil {
		return nil, nil
	}
	payload := pay.PaymentPayload
	id, err := x402.PaymentID(payload)
	switch {
	case err != nil:
		return nil, fresh(errInvalidPaymentID)
	case id == "" && p.Required:
		return nil, fresh(errPaymentIDRequired)
	case id == "":
		return nil, nil
	}
	fp, legacy, err := g.fingerprint(r, pay, raw)
	if err != nil {
		return nil, err
	}
	return &paymentIDCall{g: g, ids: g.state.(paymentIDStore).PaymentIDs(), id: id, fp: fp, legacy: legacy, ctx: context.WithoutCancel(r.Context()), payload: payload}, nil
}

// fingerprint hashes what an id is bound to: the payment and the request
// it pays for, each part length-delimited by its own hash. The payment is
// hashed in its canonical form (receipt.AppendCanonicalJSON, as an MCP
// payment is read and a held payment compared, samePayment): a client
// that encodes the same signed payment anew (its keys in another order,
// as another library writes the same object) sends the same payment, and
// its retry is the same call, not a conflict whose answer would invite a
// second payment.
//
// legacy is the fingerprint over the payment as sent (raw), which
// versions before made; "" when it is fp (over MCP raw is canonical).
// Bindings they made are honoured for their window (owns); once every
// such window has passed (at most a week after an upgrade) it matches
// nothing.
func (g *Gate) fingerprint(r *http.Request, pay x402.Payment, raw string) (fp, legacy string, err error) {
	canon, err := receipt.AppendCanonicalJSON(nil, pay.JSON)
	if err != nil {
		return "", "", apierr.Internal(err) // never: the payment was read as JSON
	}
	h, old := sha256.New(), sha256.New()
	part := partWriter(h)
	part(canon)
	partWriter(old)([]byte(raw))
	if err := g.requestParts(r, func(b []byte) {
		s := sha256.Sum256(b)
		h.Write(s[:])
		old.Write(s[:])
	}, g.readBody); err != nil {
		return "", "", err
	}
	fp, legacy = hex.EncodeToString(h.Sum(nil)), hex.EncodeToString(old.Sum(nil))
	if legacy == fp {
		legacy = ""
	}
	return fp, legacy, nil
}

// owns reports whether fp, the fingerprint the call's id is bound to, is
// the call's own: fp, or legacy, the one an older version made for the
// same call (fingerprint). A legacy binding is then taken as it is: the
// call goes on under its fingerprint, which the store compares on Save and
// Unbind, so a retry of a call bound before an upgrade gets its saved
// answer instead of payment_identifier_conflict.
func (c *paymentIDCall) owns(fp string) bool {
	switch {
	case fp == c.fp:
		return true
	case c.legacy != "" && fp == c.legacy:
		c.fp = fp
		return true
	}
	return false
}

// partWriter writes each part to h as its own hash, so parts are
// length-delimited.
func partWriter(h hash.Hash) func([]byte) {
	return func(b []byte) {
		s := sha256.Sum256(b)
		h.Write(s[:])
	}
}

// requestParts writes the request a payment pays for, part by part: for an
// MCP call the tool and its arguments; otherwise the method, the path and
// query as the client sent them (sentRequest: two public URLs that
// handle_path strips to one path are two requests, often of two
// upstreams), and the body as read returns it (read nil: the body is left
// out, for a held record whose body the gate could not read; pending.go).
func (g *Gate) requestParts(r *http.Request, part func([]byte), read func(*http.Request) ([]byte, error)) error {
	if rr, ok := caddyhttp.GetVar(r.Context(), varRPCMessage).(*rpcRead); ok && g.MCPTool != "" {
		args, err := receipt.AppendCanonical(nil, rr.msg.args)
		if err != nil {
			return apierr.Internal(err)
		}
		part([]byte("mcp"))
		part([]byte(rr.msg.tool))
		part(args)
		return nil
	}
	var body []byte
	if read != nil {
		var err error
		if body, err = read(r); err != nil {
			return err
		}
	}
	method, u := sentRequest(r)
	part([]byte("http"))
	part([]byte(method))
	part([]byte(u.RequestURI()))
	if read != nil {
		part(body)
	}
	return nil
}

// claimed answers a call whose payment is already claimed by another call
// (handled false: the caller answers as without an id).
func (c *paymentIDCall) claimed(w http.ResponseWriter, r *http.Request, ex exchange, cs store.ClaimState) (bool, error) {
	if c == nil {
		return false, nil
	}
	st, err := c.ids.Lookup(c.ctx, c.id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		if cs.Settled {
			return false, nil // the window is over: the payment was used
		}
		return true, ex.refuse(w, r, fresh(errPaymentIDInProgress)) // the first copy is about to bind
	case err != nil:
		return true, ex.refuse(w, r, apierr.Unavailable("payment state store", 1, err))
	case !c.owns(st.Fingerprint):
		return true, ex.refuse(w, r, fresh(errPaymentIDConflict))
	case st.Done:
		return true, c.serveSaved(w, r, ex, st)
	}
	return true, ex.refuse(w, r, fresh(errPaymentIDInProgress))
}

// savedOnly answers with the id's saved answer when this payment and
// request saved one (handled false otherwise): for a payment the gate no
// longer holds a claim of and cannot claim anew (serveHeldUnderOldOffer).
func (c *paymentIDCall) savedOnly(w http.ResponseWriter, r *http.Request, ex exchange) (bool, error) {
	if c == nil {
		return false, nil
	}
	st, err := c.ids.Lookup(c.ctx, c.id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return false, nil
	case err != nil:
		return true, ex.refuse(w, r, apierr.Unavailable("payment state store", 1, err))
	case !c.owns(st.Fingerprint) || !st.Done:
		return false, nil
	}
	return true, c.serveSaved(w, r, ex, st)
}

// holdUntil is until, when a payment's claim would lapse, pushed to the
// end of the id's window. The claim, and with it the record of an unknown
// settlement (pending.go), then lives as long as the id's binding: the
// buyer's retry with the id, within the window but after the
// authorization expired, is resolved by that record (the held answer once
// the transfer is found) instead of being claimed anew, refused by the
// facilitator as expired, and told to sign a new payment though charged.
func (c *paymentIDCall) holdUntil(until time.Time) time.Time {
	if c == nil {
		return until
	}
	if end := now().Add(time.Duration(c.g.PaymentIdentifier.Window)); end.After(until) {
		return end
	}
	return until
}

// bind binds the id to the call while it holds claim (handled true: it
// answered, and released the claim, nothing charged).
func (c *paymentIDCall) bind(w http.ResponseWriter, r *http.Request, ex exchange, claim store.Claim) (bool, error) {
	if c == nil {
		return false, nil
	}
	until := now().Add(time.Duration(c.g.PaymentIdentifier.Window))
	if claim.Until.After(until) {
		until = claim.Until
	}
	st, _, err := c.ids.Bind(c.ctx, c.id, c.fp, until)
	if err == nil && c.owns(st.Fingerprint) && !st.Done {
		// Bound now, or earlier by a copy of this payment whose claim is
		// gone; either way this call holds the payment's claim, so it is
		// the one copy that may charge.
		c.bound = true
		return false, nil
	}
	if rerr := c.g.state.Claims().Release(c.ctx, claim); rerr != nil {
		c.g.logger.Warn("releasing payment claim", zap.Error(rerr))
	}
	switch {
	case err != nil:
		return true, ex.refuse(w, r, apierr.Unavailable("payment state store", 1, err))
	case !c.owns(st.Fingerprint):
		return true, ex.refuse(w, r, fresh(errPaymentIDConflict))
	}
	return true, c.serveSaved(w, r, ex, st) // done, its claim lapsed since
}

// unbind drops the binding of a call on which nothing was charged, before
// its claim is released.
func (c *paymentIDCall) unbind() {
	if c == nil || !c.bound {
		return
	}
	c.bound = false
	if err := c.ids.Unbind(c.ctx, c.id, c.fp); err != nil {
		// Fail closed: the id stays bound to a payment that was not
		// charged until the binding lapses (a conflict for other payments).
		c.g.logger.Warn("unbinding payment identifier", zap.Error(err))
	}
}

// savedAnswer is what a settled call's binding keeps: the settlement, and
// the held answer unless it was over max_answer or streamed (Kept false).
type savedAnswer struct {
	Settlement x402.SettleResponse `json:"settlement"`
	Kept       bool                `json:"kept"`
	Status     int                 `json:"status,omitempty"`
	Header     http.Header         `json:"header,omitempty"`
	Body       []byte              `json:"body,omitempty"`
}

// save records the answer a settled call bought (bw nil: it was streamed).
// A failed save is logged and the answer still delivered: the money moved.
// The binding then stays unfinished until it lapses, and the same
// payment's retry gets payment_identifier_in_progress, never a second
// charge.
func (c *paymentIDCall) save(bw *bufferedWriter, sr x402.SettleResponse) {
	if c == nil || !c.bound {
		return
	}
	c.record(bw, sr)
}

// record writes the answer of a settled payment as the id's saved answer.
// The store takes it only for the binding's own fingerprint (or an id no
// longer bound), so a call may record without holding the binding.
func (c *paymentIDCall) record(bw *bufferedWriter, sr x402.SettleResponse) {
	ans := savedAnswer{Settlement: sr}
	if bw != nil {
		if h, ok := keptHeader(bw, c.g.PaymentIdentifier.MaxAnswer, receiptNameOf(c.ctx)); ok {
			ans.Kept, ans.Status, ans.Header, ans.Body = true, bw.status(), h, bw.buf.Bytes()
		}
	}
	b, err := json.Marshal(ans)
	if err == nil {
		err = c.ids.Save(c.ctx, c.id, c.fp, b, now().Add(time.Duration(c.g.PaymentIdentifier.Window)))
	}
	label := "payment_identifier_saved"
	switch {
	case errors.Is(err, store.ErrPaymentIDTaken):
		label = "payment_identifier_not_saved" // the id is another request's
	case err != nil:
		c.g.logger.Error("saving a payment identifier's answer", zap.Error(err))
		label = "payment_identifier_save_failed"
	case !ans.Kept:
		label = "payment_identifier_not_kept"
	}
	metrics.outcomes.WithLabelValues(label).Inc()
}

// keptHeader is the header a paid answer kept for a later retry goes out
// with (a payment identifier's saved answer, the answer held for an
// unknown settlement): of the header bw, the held answer, was released
// with, the fields keptFields names and the receipt under receipt, the
// name a verify_response gave it (receiptNameOf; "" for none), so the
// retry gets the answer the buyer paid for, checked as it was. Nothing
// else: the retry is anyone who presents the same payment for the same
// request, and the payment is public once on chain, so a field the
// upstream set for the buyer (Set-Cookie, a Location or Link naming the
// buyer's resources) would be handed to a stranger. Content-Length and
// Date are not kept: the delivery sets them anew. ok is false when the
// answer, its body and this header, is over limit bytes, and then it is
// not kept.
func keptHeader(bw *bufferedWriter, limit int64, receipt string) (h http.Header, ok bool) {
	size := int64(bw.buf.Len())
	if size > limit {
		return nil, false
	}
	h = make(http.Header)
	receipt = http.CanonicalHeaderKey(receipt)
	for k, vs := range bw.header {
		if !keptFields[k] && (receipt == "" || k != receipt) {
			continue
		}
		h[k] = slices.Clone(vs)
		for _, v := range vs {
			size += int64(len(k) + len(v) + 4)
		}
	}
	return h, size <= limit
}

// keptFields are the fields of a paid answer's header kept with it for a
// retry (keptHeader), by their canonical names: those describing its
// content (its type, language, the encoding its kept bytes are in, how to
// save it, its validators, the range a 206 holds) and its verification (verify_response's status
// and default receipt header, and nosniff). The gate's own
// (Cache-Control, PAYMENT-RESPONSE, ...) are set anew when it goes out.
var keptFields = map[string]bool{
	"Content-Type":            true,
	"Content-Language":        true,
	"Content-Encoding":        true,
	"Content-Disposition":     true,
	"Content-Range":           true,
	"Etag":                    true,
	"Last-Modified":           true,
	HeaderVerificationReceipt: true,
	HeaderVerificationStatus:  true,
	"X-Content-Type-Options":  true,
}

// receiptNameOf is the name of the receipt header a verify_response put
// on the answer to the request whose context is ctx (receiptNameVar), ""
// when none did.
func receiptNameOf(ctx context.Context) string {
	name, _ := caddyhttp.GetVar(ctx, receiptNameVar).(string)
	return name
}

// resolving is the exchange resolveOnRetry answers through: when an
// unknown settlement turns out done and it delivers the held answer, that
// answer becomes the id's saved answer too, so later retries get it from
// the binding, also once the payment's claim (and the held record with it)
// has lapsed.
func (c *paymentIDCall) resolving(ex exchange) exchange {
	if c == nil {
		return ex
	}
	return &resolvingExchange{exchange: ex, c: c}
}

type resolvingExchange struct {
	exchange
	c *paymentIDCall
}

func (e *resolvingExchange) deliver(w http.ResponseWriter, bw *bufferedWriter, sr x402.SettleResponse) {
	e.c.record(bw, sr)
	e.exchange.deliver(w, bw, sr)
}

// streamed records, when ex keeps a payment identifier's answer
// (resolving), that the answer settlement sr bought is being streamed (a
// run again, which goes to the client by runSettled, not by deliver): the
// id's next retry is told it was paid and answered, its answer not kept,
// with its PAYMENT-RESPONSE, as after any streamed answer.
func streamed(ex exchange, sr x402.SettleResponse) {
	if e, ok := ex.(*resolvingExchange); ok {
		e.c.record(nil, sr)
	}
}

// serveSaved answers a retry with the answer its id's call bought. Its
// settlement is told as every settlement is (toldSettlement): an answer
// saved by an older gateway may carry what a facilitator said beyond it.
// It is not noted as settled (noteSettled): nothing settled now, and the
// call that settled it noted it then, so a retry never renews the wallet's
// sign-in-with-x access.
func (c *paymentIDCall) serveSaved(w http.ResponseWriter, r *http.Request, ex exchange, st store.PaymentIDState) error {
	var ans savedAnswer
	if err := json.Unmarshal(st.Answer, &ans); err != nil {
		return ex.refuse(w, r, apierr.Internal(fmt.Errorf("decoding a saved answer: %w", err)))
	}
	ans.Settlement = toldSettlement(ans.Settlement, payerOf(c.payload, c.payload.Accepted.Network), c.payload.Accepted.Network)
	if !ans.Kept {
		c.g.setPaidHeaders(w.Header(), ans.Settlement)
		return ex.refuse(w, r, fresh(errPaymentIDAnswerNotKept))
	}
	body := ex.retold(ans.Body)
	buf := getBuffer()
	defer putBuffer(buf)
	buf.Write(body)
	header := ans.Header
	if header == nil {
		header = http.Header{}
	}
	metrics.outcomes.WithLabelValues("payment_identifier_replayed").Inc()
	ex.deliver(w, &bufferedWriter{header: header, buf: buf, code: ans.Status, limit: int64(len(body))}, ans.Settlement)
	return nil
}

// PaymentIDs returns the payment identifiers.
func (s *BadgerStore) PaymentIDs() store.PaymentIDs { return s.db.PaymentIDs() }

var _ paymentIDStore = (*BadgerStore)(nil)
