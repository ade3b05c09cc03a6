package caddymodule

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	sjson "github.com/segmentio/encoding/json"
	"go.uber.org/zap"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/receipt"
	"github.com/aovhq/aov/score"
	"github.com/aovhq/aov/x402"
)

// MCP keys of the x402 MCP transport (x402 specs/transports-v2/mcp.md).
const (
	mcpMetaPayment         = "x402/payment"
	mcpMetaPaymentResponse = "x402/payment-response"
)

// serveMCP prices one MCP tool on a Streamable HTTP endpoint. Only a
// tools/call of that tool is gated; initialize, tools/list, notifications and
// every other method pass through free, but only once the gate has read the
// message completely (readRPC): a message it cannot read is refused and
// never reaches the tool. The order of decisions for the priced tool is the
// REST one: a payment in params._meta["x402/payment"] is verified, the tool
// run and the payment settled only if the result is not an error; otherwise
// the call is served from the free allowance while it lasts, or answered
// with a payment-required tool result. Whenever the gate answers itself,
// invalid arguments are a tool error first (never a demand for payment).
func (g *Gate) serveMCP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if r.Method != http.MethodPost {
		return next.ServeHTTP(w, r)
	}
	// One gate per priced tool: the first reads the message, the others
	// reuse its reading (a gate that changes the body never passes it on).
	read, _ := caddyhttp.GetVar(r.Context(), varRPCMessage).(*rpcRead)
	if read == nil {
		// A message that cannot be read is refused, and counted, only once
		// the client passed its budget's check: a refusal is counted even
		// past an empty budget (rateZone.note), and so is never counted
		// for a request that did not pass it. The message is read as far
		// as any mcp_tool gate of the server reads its tool's calls, not
		// this gate's max_body: which tool is called is known only once
		// it is read, and each gate holds its own tool's calls to its own
		// limit below, as a tool result.
		body, err := readBodyUpTo(r, g.mcpRead.Load())
		if err != nil {
			if wait := g.rateWait(r, false); wait > 0 {
				err = apierr.RateLimited(wait)
			}
			return g.refuse(w, r, err)
		}
		var msg *rpcMessage
		bad := refuseCharset(r)
		if bad == nil {
			msg, bad = readRPC(body)
		}
		if bad != nil {
			if wait := g.rateWait(r, false); wait > 0 {
				return g.refuse(w, r, apierr.RateLimited(wait))
			}
			metrics.outcomes.WithLabelValues("invalid_jsonrpc").Inc()
			g.noteRefusal(r)
			return writeRPC(w, http.StatusBadRequest, rpcError(nil, bad.code, bad.err))
		}
		read = &rpcRead{msg: msg, size: len(body)}
		caddyhttp.SetVar(r.Context(), varRPCMessage, read)
	}
	msg := read.msg
	if msg.method != "tools/call" || msg.tool != g.MCPTool {
		return next.ServeHTTP(w, r)
	}
	// One call, one price: when gates of one request price the same tool
	// (two mcp_tool blocks of one name in a route, or in nested routes),
	// the first gates the call and the later ones pass it on. Gating it
	// again would take a second free unit for one call, and refuse every
	// paid call (its payment is already claimed by the first gate). A gate
	// cannot see the other gates of its route when it is provisioned, so
	// this is decided per request.
	if read.gated {
		g.warnShadowed()
		return next.ServeHTTP(w, r)
	}
	read.gated = true
	_, paying := msg.meta[mcpMetaPayment]
	ex := &mcpExchange{g: g, id: msg.id, tool: g.MCPTool, requestCheck: requestCheck{paying: paying}}
	if wait := g.rateWait(r, paying); wait > 0 {
		return ex.rateLimited(w, r, wait)
	}
	// The message was read up to the largest max_body of the server's
	// mcp_tool gates: this gate's applies to its own tool's calls only,
	// and, the message being read, is answered as a tool result.
	if int64(read.size) > g.MaxBody {
		return ex.toolError(w, r, apierr.TooLarge(g.MaxBody))
	}
	if ae := g.checkURL(r); ae != nil {
		return ex.toolError(w, r, ae)
	}
	if msg.argsErr != nil {
		return ex.toolError(w, r, msg.argsErr)
	}
	if g.Validator == validateScore {
		args, _ := msg.args.(map[string]any) // an object or absent (readRPC)
		if _, err := score.ToolAgent(args); err != nil {
			return ex.toolError(w, r, apierr.From(err))
		}
	}
	if g.verifier != nil {
		args := msg.args
		if args == nil {
			args = map[string]any{}
		}
		ex.check = func() error {
			return g.precheck(r, ex.verified, ex.payer, func() error { return g.verifier.PrecheckTree(args) })
		}
	}
	// From here the tool may run, and the gate judges its answer
	// (billable): it asks the tool server for what it can read.
	r = plainWholeRequest(r)
	if raw, ok := msg.meta[mcpMetaPayment]; ok {
		// The payment is read from its canonical form, which is also what
		// its replay claim is keyed on: a re-encoded copy is the same claim.
		canon, err := receipt.AppendCanonical(nil, raw)
		if err != nil {
			return ex.demand(w, r, http.StatusBadRequest, "Invalid payment: not a JSON object", x402.ReasonInvalidPayload, nil)
		}
		pay, err := x402.ParsePayment(canon)
		if err != nil {
			return ex.demand(w, r, http.StatusBadRequest, "Invalid payment: "+err.Error(), reasonFor(err, x402.ReasonInvalidPayload), nil)
		}
		setBody(r, msg.withoutPayment())
		return g.servePaid(w, r, next, ex, pay, string(canon))
	}
	if g.Free != nil && int64(read.size) <= g.Free.MaxBody {
		return g.serveFree(w, r, next, ex)
	}
	return ex.demand(w, r, http.StatusPaymentRequired, "Payment required", "", nil)
}

// mcpReadLimits holds, per config being provisioned, the largest max_body
// of each server's mcp_tool gates.
var mcpReadLimits perConfig[map[*caddyhttp.Server]*atomic.Int64]

// mcpReadLimit is how far the mcp_tool gates of srv read a JSON-RPC
// message, raised to maxBody, for a gate provisioning in ctx. Whichever
// gate of a route comes first reads the message for all of them, before
// the tool it calls is known, so it must read as far as the gate with the
// largest max_body needs (a call of that gate's tool, or a message no
// gate prices, within that limit), while each gate holds its own tool's
// calls to its own. A gate cannot see the other gates of its route, but
// every gate of a config is provisioned before the config serves, so by
// then the limit is the largest of the server's: bounded, and read
// without a lock per request. Outside a config load the gate reads up to
// its own max_body.
func mcpReadLimit(ctx caddy.Context, srv *caddyhttp.Server, maxBody int64) *atomic.Int64 {
	var limit *atomic.Int64
	mcpReadLimits.with(ctx, func(m *map[*caddyhttp.Server]*atomic.Int64) {
		if *m == nil {
			*m = map[*caddyhttp.Server]*atomic.Int64{}
		}
		if limit = (*m)[srv]; limit == nil {
			limit = new(atomic.Int64)
			(*m)[srv] = limit
		}
	})
	if limit == nil {
		limit = new(atomic.Int64)
	}
	for {
		if cur := limit.Load(); cur >= maxBody || limit.CompareAndSwap(cur, maxBody) {
			return limit
		}
	}
}

// varRPCMessage holds the gates' reading of the request's JSON-RPC message.
const varRPCMessage = "aov.x402.rpc"

// rpcRead is a message as read, with the size of its body.
type rpcRead struct {
	msg   *rpcMessage
	size  int
	gated bool // a gate of the request has taken its tools/call (serveMCP)
}

// warnShadowed tells the operator, once per gate, that an earlier gate of
// the same requests prices this gate's route or MCP tool, so this gate's
// price and allowance are never used.
func (g *Gate) warnShadowed() {
	if g.shadowed == nil || !g.shadowed.CompareAndSwap(false, true) {
		return
	}
	if g.MCPTool != "" {
		g.logger.Warn("mcp_tool is priced by an earlier x402 gate of the same request; this gate passes its calls on: remove one of the two",
			zap.String("mcp_tool", g.MCPTool))
		return
	}
	g.logger.Warn("route is priced by an earlier x402 gate of the same request; this gate passes its requests on: remove one of the two",
		zap.String("route", g.Route))
}

// mcpExchange is x402 over MCP: demands are tool results with isError and
// the PaymentRequired document (x402 MCP transport), always with HTTP 200,
// because they are answers of the JSON-RPC call.
type mcpExchange struct {
	g          *Gate
	id         json.RawMessage
	tool       string
	unreadable bool // billable replaced the tool's answer (unbilled)
	interim    bool // billable found a round of a multi-round-trip call (unbilled)
	requestCheck
}

// demand answers with a payment-required tool result (HTTP 200), for a
// refused payment too: status tells a demand for payment (402) from the
// refusal of a payment the gate could not read (400), which runs no
// request check (requestCheck.offered).
func (e *mcpExchange) demand(w http.ResponseWriter, r *http.Request, status int, msg, reason string, failed *x402.SettleResponse) error {
	if ae := e.offered(status); ae != nil {
		return e.toolError(w, r, ae)
	}
	msg = e.offerNote(msg)
	g := e.g
	live := g.liveOffers().offers
	if len(live) == 0 {
		return e.toolError(w, r, errFeePayersUnknown())
	}
	// The resource is the MCP endpoint's URL (the bazaar specification's
	// form, which a catalog can locate; the tool is named in the bazaar
	// extension), not x402's placeholder mcp://tool/<name>.
	res := g.resource(r)
	res.MimeType = "application/json"
	pr := x402.PaymentRequired{
		X402Version: x402.Version,
		Error:       msg,
		Resource:    res,
		Accepts:     live,
	}
	if g.bazaar != nil {
		pr.Extensions = map[string]any{"bazaar": g.bazaar}
	}
	pr.Extensions = g.PaymentIdentifier.declare(pr.Extensions)
	text, err := json.Marshal(pr)
	if err != nil {
		return e.toolError(w, r, apierr.Internal(err))
	}
	meta := map[string]any{}
	if failed != nil {
		meta[mcpMetaPaymentResponse] = failed
	}
	if reason != "" {
		meta["reason"] = reason
	}
	if trial := g.Free.trial(r, g); trial != nil {
		meta["free_trial"] = trial
		if trial.Code != "" {
			meta["code"] = trial.Code
		}
	}
	label := reason
	if label == "" {
		label = "payment_required"
	}
	metrics.outcomes.WithLabelValues(outcomeLabel(label)).Inc()
	g.noteRefusal(r)
	w.Header().Set("Cache-Control", "no-store")
	return writeRPC(w, http.StatusOK, rpcResult(e.id, map[string]any{
		"content":           []any{map[string]any{"type": "text", "text": string(text)}},
		"structuredContent": pr,
		"isError":           true,
		"_meta":             meta,
	}))
}

// rateLimited answers a priced tool call past its client's rate_limit as a
// rate_limited tool result (HTTP 200), as an MCP client expects a tool's
// refusal; the REST gate answers 429 (restExchange.rateLimited).
func (e *mcpExchange) rateLimited(w http.ResponseWriter, r *http.Request, wait int) error {
	return e.toolError(w, r, apierr.RateLimited(wait))
}

// refuse answers a refusal of the gate (an outage, an invalid request) as a
// tool error, as the tool itself would.
func (e *mcpExchange) refuse(w http.ResponseWriter, r *http.Request, ae *apierr.Error) error {
	return e.toolError(w, r, e.answer(ae))
}

// upstreamFailed answers a call whose tool failed before answering as the
// call's tool error (upstream_unavailable, retryable, nothing charged): a
// bare HTTP 502 or 504 is no answer to an MCP client's call, whose
// transport fails the call and loses both "charged": false and when to
// retry. The upstream's error is logged as the refusal's cause.
func (e *mcpExchange) upstreamFailed(w http.ResponseWriter, r *http.Request, err error) error {
	ae := apierr.Unavailable("tool", 1, err)
	if he, ok := errors.AsType[caddyhttp.HandlerError](err); ok && he.StatusCode == http.StatusGatewayTimeout {
		ae.Message = "The tool did not answer in time and nothing was charged; retry after 1 second."
	}
	return e.refuse(w, r, ae)
}

// toolError answers a tool call with an error of the SPEC §6 shape, as the
// tool itself would, and counts it.
func (e *mcpExchange) toolError(w http.ResponseWriter, r *http.Request, ae *apierr.Error) error {
	e.g.counted(r, ae)
	if ae.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(ae.RetryAfter))
	}
	text, _ := json.Marshal(ae)
	return writeRPC(w, http.StatusOK, rpcResult(e.id, map[string]any{
		"content":           []any{map[string]any{"type": "text", "text": string(text)}},
		"structuredContent": ae,
		"isError":           true,
	}))
}

// billable reports whether the held answer is a successful tool result
// the buyer's MCP client takes as the answer to this call. An answer the
// gate cannot read, or the client would not take, is turned into a
// JSON-RPC error in place: the gate must not release what it cannot tell
// was a success, and must not charge for it either. Such an answer is the
// tool server's fault, not the buyer's (answerUnreadable).
//
// Free and paid calls read the answer one way (judgeAnswer): with exact
// member names, as the buyer's client reads it. encoding/json's struct
// matching takes a field in any letter case and keeps the last, so
// {"isError":true,"IsError":false} would be a success to a struct and an
// error to the client.
//
// The answer must be application/json: the client reads a
// text/event-stream answer as events, and a JSON body sent under that
// type is no event at all to it (and any other type is refused), so what
// the gate would read as a success the client never sees.
func (e *mcpExchange) billable(bw *bufferedWriter) bool {
	// The gate asked for plain bytes in full (plainWholeRequest);
	// compressed ones it cannot read, status or not. Nor can it read a
	// part (206), even one that parses: it cannot tell that part is the
	// whole answer, and its Content-Range describes the tool server's
	// bytes, not the gate's reply, which is whole and goes out as 200.
	var err error
	if bw.status() == http.StatusPartialContent {
		err = errors.New("it is a part (206) although the whole answer was asked for")
		bw.code = http.StatusOK
	} else if why := notPlain(bw.header); why != "" {
		err = errors.New(why)
	} else if bw.status() >= 400 {
		handOverErrorStatus(bw, e.id)
		return false
	}
	var a rpcAnswer
	var ok, interim bool
	if err == nil {
		a, ok, interim, err = judgeAnswer(bw.buf.Bytes(), e.id)
	}
	if err == nil && !isJSONAnswer(bw.header) {
		err = errors.New("the answer is not application/json")
	}
	if err == nil && !ok {
		err = handOverUncharged(bw, e.id, a)
	}
	if err != nil {
		e.unreadable = true
		e.g.logger.Error("MCP tool answer withheld: the buyer's client cannot read it", zap.String("code", codeAnswerUnreadable), zap.Error(err))
		bw.header.Set("Content-Type", "application/json")
		body, _ := json.Marshal(rpcError(e.id, rpcInternalError, &apierr.Error{
			Code: codeAnswerUnreadable,
			Message: "The tool's answer could not be read by the payment gateway (it must answer with application/json, not a stream, " +
				"one JSON-RPC 2.0 answer to this call: a result the MCP client decodes, or an error without a result) and nothing was charged.",
			Status:      http.StatusBadGateway,
			NextActions: []apierr.Action{{Action: "contact_operator"}},
		}))
		rewriteHeld(bw, body)
		return false
	}
	e.interim = interim
	if ok {
		dropToolX402Meta(bw, a)
	}
	return ok
}

// rewriteHeld makes body, which the gate wrote, the held answer's body:
// the headers the tool server sent about its own bytes go
// (dropBodyHeaders), and replay sizes the new body.
func rewriteHeld(bw *bufferedWriter, body []byte) {
	bw.buf.Reset()
	bw.buf.Write(body)
	dropBodyHeaders(bw.header)
}

// handOverUncharged rewrites a held answer the gate hands over uncharged
// (an error alone, a null or absent result, a result with isError, a round
// of a multi-round-trip call) to what the buyer's SDK client reads of it,
// and nothing else: its jsonrpc, the call's id, and either its error
// (appendRPCError) or a result rebuilt by unchargedResult.
// judgeAnswer judges the answer by exact member names, as the SDK reads
// it; a member it does not read (a case twin "Result", "Content" or
// "StructuredContent", which encoding/json's struct decoding takes for the
// exact one, or a "Message" inside an input request) could carry the
// tool's content to a client reading the answer another way, uncharged.
// a is the answer as judgeAnswer read it. An answer it cannot rebuild is
// left for billable to replace.
func handOverUncharged(bw *bufferedWriter, id json.RawMessage, a rpcAnswer) error {
	out := make([]byte, 0, len(a.err)+len(a.result)+len(id)+40)
	out = append(out, `{"jsonrpc":"2.0","id":`...)
	out = append(out, rawID(id)...)
	switch {
	case a.err != nil && string(a.err) != "null":
		out = append(out, `,"error":`...)
		out = appendRPCError(out, a.err)
	case a.result == nil:
	case string(a.result) == "null":
		out = append(out, `,"result":null`...)
	default:
		res, err := unchargedResult(a.result)
		if err != nil {
			return err
		}
		out = append(out, `,"result":`...)
		out = append(out, res...)
	}
	out = append(out, '}')
	rewriteHeld(bw, out)
	return nil
}

// handOverErrorStatus rewrites a held answer of HTTP status 400 or more,
// which is never charged and keeps its status, when its body reads as
// JSON-RPC (rpcShaped): to its jsonrpc, the call's id and the error the
// SDK's client reads in it (appendRPCError, decoded again by the SDK's own
// decoder; none when it reads none), and never a result. The client
// surfaces that error as its call's error and reads nothing else of an
// error status, but a client reading the raw answer would take a result
// there (the tool's content, a forged x402 payment response) uncharged,
// and judgeAnswer's judgement, which handOverUncharged relies on, is no
// guard here: the status alone decides. Any other body (the SDK server's
// plain-text errors, a 404's "session not found" among them, which the
// client reads by status) is handed over as the tool server sent it: it
// has no result, so no result._meta where x402 clients read a payment
// response.
func handOverErrorStatus(bw *bufferedWriter, id json.RawMessage) {
	body := bw.buf.Bytes()
	if !rpcShaped(bw.header, body) {
		return
	}
	head := append([]byte(`{"jsonrpc":"2.0","id":`), rawID(id)...)
	out := append(slices.Clone(head), '}')
	if a, err := readAnswer(body); err == nil && a.err != nil && string(a.err) != "null" {
		withErr := append(append(head, `,"error":`...), appendRPCError(nil, a.err)...)
		withErr = append(withErr, '}')
		if msg, err := jsonrpc.DecodeMessage(withErr); err == nil {
			if resp, ok := msg.(*jsonrpc.Response); ok && resp.Error != nil {
				out = withErr
			}
		}
	}
	rewriteHeld(bw, out)
	bw.header.Set("Content-Type", "application/json")
}

// rpcShaped reports whether a held body reads as JSON-RPC to some client:
// a text/event-stream (a stream of JSON-RPC messages), a JSON value other
// than an object (a batch), a body that opens as JSON but is not (it
// cannot be told apart), or an object with a member named jsonrpc, id,
// result, error or method in any letter case. A JSON object without one
// (a problem document) is not, nor is a body that is not JSON at all.
func rpcShaped(h http.Header, body []byte) bool {
	if hasMediaType(h, "text/event-stream") {
		return true
	}
	i := skipSpace(body, 0)
	if i == len(body) || (body[i] != '{' && body[i] != '[') {
		return false
	}
	if body[i] == '[' || !sjson.Valid(body) {
		return true
	}
	shaped := false
	eachMember(body[i:], func(key, _ []byte, _ int) {
		for _, name := range rpcMemberNames {
			shaped = shaped || quotedNameFold(key, name)
		}
	})
	return shaped
}

var rpcMemberNames = [...][]byte{[]byte("jsonrpc"), []byte("id"), []byte("result"), []byte("error"), []byte("method")}

// appendRPCError writes a JSON-RPC error object (one answerError passed:
// an object whose code is an integer and whose message a string) as its
// code, message and data, each the last member of its exact name, as the
// SDK's decoder reads them.
func appendRPCError(out, obj []byte) []byte {
	out = append(out, '{')
	for _, name := range [...]string{"code", "message", "data"} {
		if v, _, _ := lastMember(obj, name); v != nil {
			out = appendMember(out, name, v)
		}
	}
	return append(out, '}')
}

// unchargedResult rebuilds a tool result handed over uncharged from the
// members the SDK's client reads of its kind, each under its exact name
// once: for a round of a multi-round-trip call (readToolResult) its
// inputRequests, requestState, _meta and resultType; for any other result
// its content, structuredContent, isError, _meta and resultType. The
// protocol's own structures (content items, input requests) are written
// again from the SDK's decoding of them, so what is handed over is what
// the SDK read: its InputRequestMap is decoded by encoding/json, which
// takes {"Message":..} for message. The other values are copied as the
// gate read them (the last member of the exact name, as the SDK reads
// them): structuredContent, the tool's own document, is not rewritten, so
// its numbers keep their digits. _meta loses every x402 member
// (withoutX402): those are the gate's to write, and on an answer nobody
// paid for a settlement receipt would be a forgery.
func unchargedResult(result []byte) ([]byte, error) {
	var res mcp.CallToolResult
	if err := res.UnmarshalJSON(result); err != nil {
		return nil, err
	}
	out := []byte{'{'}
	member := func(name string, val []byte) { out = appendMember(out, name, val) }
	if res.InputRequests != nil {
		ir, err := json.Marshal(res.InputRequests)
		if err != nil {
			return nil, err
		}
		member("inputRequests", ir)
		if v, _, _ := lastMember(result, "requestState"); v != nil {
			member("requestState", v)
		}
	} else {
		content := []byte("[]")
		if res.Content != nil {
			dropContentX402(res.Content)
			b, err := json.Marshal(res.Content)
			if err != nil {
				return nil, err
			}
			content = b
		}
		member("content", content)
		if v, _, _ := lastMember(result, "structuredContent"); v != nil {
			member("structuredContent", v)
		}
		if res.IsError {
			member("isError", []byte("true"))
		}
	}
	if v, _, _ := lastMember(result, "_meta"); v != nil {
		if meta := withoutX402(v); meta != nil {
			member("_meta", meta)
		}
	}
	if v, _, _ := lastMember(result, "resultType"); v != nil {
		member("resultType", v)
	}
	return append(out, '}'), nil
}

// dropContentX402 drops the x402 members of the _meta of content items
// the gate writes again (unchargedResult): an uncharged answer carries no
// x402 member the gate did not write, wherever it writes. A charged
// answer's content is the tool's, paid for, and handed over as written;
// x402 clients read a payment response at result._meta only.
func dropContentX402(content []mcp.Content) {
	x402 := func(k string, _ any) bool { return isX402Key(k) }
	for _, c := range content {
		switch c := c.(type) {
		case *mcp.TextContent:
			maps.DeleteFunc(c.Meta, x402)
		case *mcp.ImageContent:
			maps.DeleteFunc(c.Meta, x402)
		case *mcp.AudioContent:
			maps.DeleteFunc(c.Meta, x402)
		case *mcp.ResourceLink:
			maps.DeleteFunc(c.Meta, x402)
		case *mcp.EmbeddedResource:
			maps.DeleteFunc(c.Meta, x402)
			if c.Resource != nil {
				maps.DeleteFunc(c.Resource.Meta, x402)
			}
		}
	}
}

// withoutX402 returns the _meta object meta without its x402 members
// (isX402Key), as an object of its other members in key order; nil when
// meta is not an object.
func withoutX402(meta []byte) []byte {
	var m map[string]json.RawMessage
	if json.Unmarshal(meta, &m) != nil || m == nil {
		return nil
	}
	maps.DeleteFunc(m, func(k string, _ json.RawMessage) bool { return isX402Key(k) })
	return appendMembers(nil, m)
}

// isX402Key reports whether a _meta member name is in x402's namespace
// ("x402/", in any letter case: a client matching names loosely must not
// find a forged one either).
func isX402Key(k string) bool {
	return len(k) >= 5 && strings.EqualFold(k[:5], "x402/")
}

// dropToolX402Meta drops the x402 members a tool server wrote in the _meta
// of a held result the gate charges for: the gate's own payment-response
// is the only one a paid answer carries (deliver adds it), and a free
// answer carries none. A tool server's would be a receipt for a
// settlement that is not the buyer's, or for none at all. Every member of
// the result named _meta in any letter case is cleared: a client decoding
// names case-insensitively (encoding/json's struct decoding, the last
// matching member winning) reads a "_Meta" twin as the result's _meta. The
// twin's other members are the tool's, paid for, and stay. The result is
// left as it is, and nothing allocated, unless one of those members has
// an x402 member; then it is written again in its place with each of them
// rewritten (withoutX402), as deliver writes it. a is the answer as
// judgeAnswer read it.
func dropToolX402Meta(bw *bufferedWriter, a rpcAnswer) {
	body, raw, at := bw.buf.Bytes(), a.result, a.resultAt
	if len(raw) == 0 || raw[0] != '{' {
		return
	}
	found := false
	eachMember(raw, func(key, val []byte, _ int) {
		if !found && quotedNameFold(key, metaName) && len(val) > 0 && val[0] == '{' {
			eachMember(val, func(k, _ []byte, _ int) {
				found = found || quotedX402Key(k)
			})
		}
	})
	if !found {
		return
	}
	var result map[string]json.RawMessage
	if json.Unmarshal(raw, &result) != nil {
		return
	}
	for k, v := range result {
		if strings.EqualFold(k, "_meta") {
			if meta := withoutX402(v); meta != nil {
				result[k] = meta
			}
		}
	}
	out := make([]byte, 0, len(body))
	out = append(out, body[:at]...)
	out = appendMembers(out, result)
	out = append(out, body[at+len(raw):]...)
	rewriteHeld(bw, out)
}

// quotedX402Key is isX402Key of a quoted member name as written, read
// without allocating unless it is escaped.
func quotedX402Key(quoted []byte) bool {
	if bytes.IndexByte(quoted, '\\') >= 0 {
		var s string
		return json.Unmarshal(quoted, &s) == nil && isX402Key(s)
	}
	return len(quoted) >= 7 && bytes.EqualFold(quoted[1:6], x402Prefix)
}

// quotedNameFold reports whether the quoted member name reads as name in
// any letter case, as encoding/json's struct decoding matches it; read
// without allocating unless it is escaped.
func quotedNameFold(quoted, name []byte) bool {
	if bytes.IndexByte(quoted, '\\') >= 0 {
		var s string
		return json.Unmarshal(quoted, &s) == nil && strings.EqualFold(s, string(name))
	}
	return len(quoted) == len(name)+2 && bytes.EqualFold(quoted[1:len(quoted)-1], name)
}

var x402Prefix, metaName = []byte("x402/"), []byte("_meta")

// codeAnswerUnreadable is the refusal of an MCP tool's answer its client
// cannot take (billable).
const codeAnswerUnreadable = "upstream_answer_unreadable"

// unbilled is what an answer billable did not find billable is worth:
// unreadable when billable replaced it (the tool ran all the same, so the
// call counts as any unsettled one does: workRan),
// interim when it is a round of a multi-round-trip call (not the call's
// answer at all), and otherwise an error answer.
func (e *mcpExchange) unbilled() outcome {
	switch {
	case e.unreadable:
		return outcomeUnreadable
	case e.interim:
		return outcomeInterim
	}
	return outcomeNotBilled
}

// isJSONAnswer reports whether an answer's media type is application/json,
// read as the MCP SDK's client reads it (mime.ParseMediaType, parameters
// allowed). The SDK's own servers write exactly "application/json", which
// is compared without parsing.
func isJSONAnswer(h http.Header) bool {
	return hasMediaType(h, "application/json")
}

// hasMediaType reports whether an answer's media type is want, read as
// the MCP SDK's client reads it (isJSONAnswer).
func hasMediaType(h http.Header, want string) bool {
	ct := h.Get("Content-Type")
	if ct == want {
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == want
}

// judgeAnswer reports whether a JSON-RPC answer is a successful tool
// result of the call whose id the gate read as id: an answer the buyer's
// MCP client (the official SDK's jsonrpc2 decoder, its wait for the call's
// answer and its CallToolResult decoding) takes as this call's result,
// with an isError that is absent, false or null.
//
// The answer is unreadable (an error) when it is not JSON, nested deeper
// than maxClientAnswerDepth, not an object, or not an answer to this call: its
// jsonrpc is not "2.0", it has a method (a request, to the client), or its
// id is not the call's (sameRPCID; the client drops an answer under
// another id and waits on). A result the SDK's CallToolResult does not
// decode (content not a list, a content type it does not know, a text that
// is not a string, isError not a boolean) is unreadable too: the client's
// CallTool fails on it, so the call was not served and must not be
// charged. An error answer is readable only as an error alone (answerError):
// handed over uncharged, a result beside it would be the tool's content
// given away to a client that reads the raw answer. A result null or
// absent, or one with isError true, is readable and not successful.
// interim reports a result that is not the call's answer yet, but a round
// of a multi-round-trip call (readToolResult).
//
// The envelope is read as encoding/json reads it into maps of raw members
// (exact names, the last of duplicates, as JSON.parse keeps;
// FuzzToolSucceeded holds it to that, and to the SDK's decoder) without
// decoding it; the result is read as the SDK's own type decodes it
// (readToolResult), the one reading of it that cannot drift from the
// client's. a is the answer's members as it read them, which
// handOverUncharged and dropToolX402Meta write from.
func judgeAnswer(body []byte, id json.RawMessage) (a rpcAnswer, ok, interim bool, err error) {
	a, err = readAnswer(body)
	switch {
	case err != nil:
		return a, false, false, err
	case a.depth > maxClientAnswerDepth:
		return a, false, false, errors.New("the answer is nested deeper than the MCP client reads")
	case !isJSONRPC2(a.jsonrpc):
		return a, false, false, errors.New(`the answer's jsonrpc is not "2.0"`)
	case a.method != nil:
		return a, false, false, errors.New("the answer has a method: it is a request")
	case !sameRPCID(a.id, id):
		return a, false, false, errors.New("the answer's id is not the call's")
	case a.err != nil && string(a.err) != "null":
		return a, false, false, answerError(body, a)
	}
	if a.result == nil || string(a.result) == "null" {
		return a, false, false, nil
	}
	isError, interim, err := readToolResult(a.result)
	return a, err == nil && !isError && !interim, interim, err
}

// readToolResult reads a result as the SDK's CallToolResult decodes it:
// its isError, or an error when the SDK refuses it. The common result
// (text content, a structured document, _meta) is judged by a walk,
// plainToolResult, that accepts only what the SDK certainly decodes and
// allocates nothing; any other result is decoded by the SDK itself.
// Decoding verifierd's answer with the SDK costs about twice the rest of
// the gate's free MCP call (BenchmarkGateMCPFreeDirect), most of it
// spent building maps of the signed document nobody reads.
//
// interim reports a round of a multi-round-trip call (SEP-2322, the
// SDK's default protocol 2026-07-28): a tool that needs the client's
// input (an elicitation, a sampling, the roots) answers with its
// inputRequests, and the SDK's client does not return that to its caller:
// it answers the requests and calls again, with the same params and
// payment. Such a round is no answer to charge for. It is one the SDK's
// client retries: inputRequests not null (an empty map being a server
// shedding load), exactly the SDK's own test (mrtr.go). It carries no
// content (the SDK's server refuses to send both): one that does is
// unreadable, for it would be the tool's content handed over uncharged.
// A result that reads as needing input (NeedsInput) or has a resultType
// other than the final one ("complete", or empty as the SDK reads an
// absent one) without input requests is unreadable too: the SDK's client
// returns it to its caller as the answer, with whatever it carries
// (its _meta, say), though it is no final answer the gate can charge for.
func readToolResult(result []byte) (isError, interim bool, err error) {
	if isError, plain := plainToolResult(result); plain {
		return isError, false, nil
	}
	var res mcp.CallToolResult
	if err := res.UnmarshalJSON(result); err != nil {
		return false, false, fmt.Errorf("the result is not a tool result the MCP client reads: %w", err)
	}
	rt, _, _ := lastMember(result, "resultType")
	switch {
	case res.InputRequests != nil:
		if len(res.Content) > 0 || res.StructuredContent != nil {
			return false, false, errors.New("the result asks for the client's input and carries content")
		}
		return res.IsError, true, nil
	case res.NeedsInput() || (rt != nil && !finalResultType(rt)):
		// Not a round the client retries (it has no input requests):
		// the SDK's client returns it to its caller as the call's
		// answer, with whatever it carries, though it is no final one.
		return false, false, errors.New("the result is neither the call's final answer nor a round asking for input")
	}
	return res.IsError, false, nil
}

// finalResultType reports whether a result's resultType (its raw value,
// one the SDK decoded) marks the call's answer: "complete", or null or ""
// (the SDK reads both as absent, which is complete).
func finalResultType(rt []byte) bool {
	if string(rt) == "null" {
		return true
	}
	s := jsonString(rt)
	return s == "" || s == "complete"
}

// plainToolResult reports whether result is one the SDK's CallToolResult
// certainly decodes, and its isError: an object of at most one each of
// content (a list of {"type":"text","text":<string>}), isError (a boolean
// or null), structuredContent and _meta (an object or null), in both of
// which every number fits a float64 (floatsOnly: the SDK decodes them into
// any, and refuses 1e400), and resultType written exactly "complete": the
// SDK's server writes it in every answer to a client of its default
// protocol (2026-07-28), so without it nearly every answer would be
// decoded by the SDK. Anything else, a duplicate or another member
// included, is not plain, and is left to the SDK: this is a shortcut, never
// a second reading (FuzzToolSucceeded holds it to the SDK's). A plain
// result is never a round of a multi-round-trip call (readToolResult).
func plainToolResult(result []byte) (isError, plain bool) {
	if len(result) == 0 || result[0] != '{' {
		return false, false
	}
	plain = true
	var seen [5]bool
	eachMember(result, func(key, val []byte, _ int) {
		i := -1
		switch {
		case !plain:
			return
		case memberNamed(key, "content"):
			i, plain = 0, plainContent(val)
		case memberNamed(key, "isError"):
			i = 1
			switch string(val) {
			case "true":
				isError = true
			case "false", "null":
			default:
				plain = false
			}
		case memberNamed(key, "structuredContent"):
			i, plain = 2, floatsOnly(val)
		case memberNamed(key, "_meta"):
			i, plain = 3, (string(val) == "null" || val[0] == '{') && floatsOnly(val)
		case memberNamed(key, "resultType"):
			i, plain = 4, string(val) == `"complete"`
		default:
			plain = false
			return
		}
		plain = plain && !seen[i]
		seen[i] = true
	})
	return isError, plain
}

// plainContent reports whether a content member is a list of text items
// of exactly {"type":"text","text":<string>}, once each, in either order.
func plainContent(list []byte) bool {
	if list[0] != '[' {
		return false
	}
	i := skipSpace(list, 1)
	if i < len(list) && list[i] == ']' {
		return true
	}
	for i < len(list) {
		end, _ := skipValue(list, i)
		if !plainText(list[i:end]) {
			return false
		}
		if i = skipSpace(list, end); i >= len(list) || list[i] != ',' {
			return i < len(list) && list[i] == ']'
		}
		i = skipSpace(list, i+1)
	}
	return false
}

// plainText reports whether a content item is exactly
// {"type":"text","text":<string>}.
func plainText(item []byte) bool {
	if len(item) == 0 || item[0] != '{' {
		return false
	}
	plain, typ, text := true, false, false
	eachMember(item, func(key, val []byte, _ int) {
		switch {
		case memberNamed(key, "type") && !typ:
			typ = string(val) == `"text"`
			plain = plain && typ
		case memberNamed(key, "text") && !text:
			text = true
			plain = plain && val[0] == '"'
		default:
			plain = false
		}
	})
	return plain && typ && text
}

// floatsOnly reports whether every number of the JSON value v (outside its
// strings) certainly fits a float64: no exponent, at most 300 characters.
func floatsOnly(v []byte) bool {
	for i := 0; i < len(v); {
		switch c := v[i]; {
		case c == '"':
			i = skipString(v, i)
		case c == '-' || c >= '0' && c <= '9':
			j := i + 1
			for j < len(v) && (v[j] >= '0' && v[j] <= '9' || v[j] == '.') {
				j++
			}
			if j-i > 300 || j < len(v) && (v[j] == 'e' || v[j] == 'E') {
				return false
			}
			i = j
		default:
			i++
		}
	}
	return true
}

// answerError reports why an answer with an error other than null cannot
// be handed over (nil when it can, alone: handOverUncharged): it has a
// result member (even null), or the SDK's decoder does not read it as a
// JSON-RPC error (an object whose code is an integer and whose message is
// a string). The client returns the error and ignores any result; a
// client reading the raw HTTP answer does not, and would read the tool's
// content unpaid.
// Error answers are rare and small: decoding the whole message with the
// SDK's own decoder costs nothing that matters.
func answerError(body []byte, a rpcAnswer) error {
	if a.result != nil {
		return errors.New("the answer has an error beside its result")
	}
	msg, err := jsonrpc.DecodeMessage(body)
	if err != nil {
		return fmt.Errorf("the answer's error is not a JSON-RPC error the MCP client reads: %w", err)
	}
	if resp, ok := msg.(*jsonrpc.Response); !ok || resp.Error == nil {
		return errors.New("the answer's error is not a JSON-RPC error the MCP client reads")
	}
	return nil
}

// isJSONRPC2 reports whether a jsonrpc member's raw value is the string
// "2.0", however it is escaped.
func isJSONRPC2(v []byte) bool {
	return string(v) == `"2.0"` || (bytes.IndexByte(v, '\\') >= 0 && jsonString(v) == "2.0")
}

// maxAnswerDepth is encoding/json's limit on nesting: an answer nested
// deeper is not JSON to it, so not to the gate either.
const maxAnswerDepth = 10000

// maxClientAnswerDepth is the official MCP SDK's limit on the nesting of a
// message (its internal/json defaultMaxDepth): its client refuses an answer
// nested deeper, so the gate must not charge for one.
const maxClientAnswerDepth = 1000

// rpcAnswer is the members of a JSON-RPC answer the gate reads: each the
// raw value of the last member of that exact name, nil when there is none.
type rpcAnswer struct {
	jsonrpc, id, method, result, err []byte
	resultAt                         int // result's offset in the answer
	depth                            int // the answer's nesting (1 for an object of scalars)
}

// answerResult returns the value of a JSON-RPC answer's result member, and
// its offset in body; nil when the answer is null or has no result. It is an
// error when the answer is not JSON or not an object or null.
func answerResult(body []byte) ([]byte, int, error) {
	a, err := readAnswer(body)
	return a.result, a.resultAt, err
}

// readAnswer reads the members of a JSON-RPC answer; all nil when the
// answer is null. It is an error when the answer is not JSON or not an
// object or null. The members are found by one walk that only finds where
// strings and values end, then the whole answer is checked to be JSON by
// segmentio/encoding's validator (the MCP SDK's JSON library; a quarter of
// encoding/json's Valid's CPU on this answer), which has no nesting limit
// of its own: the walk measures the depth first.
func readAnswer(body []byte) (a rpcAnswer, err error) {
	i := skipSpace(body, 0)
	if i == len(body) || body[i] != '{' {
		if i < len(body) && body[i] == 'n' && sjson.Valid(body) {
			return a, nil
		}
		return a, errors.New("the answer is not a JSON object")
	}
	depth := eachMember(body[i:], func(key, val []byte, at int) {
		switch {
		case memberNamed(key, "jsonrpc"):
			a.jsonrpc = val
		case memberNamed(key, "id"):
			a.id = val
		case memberNamed(key, "method"):
			a.method = val
		case memberNamed(key, "result"):
			a.result, a.resultAt = val, i+at
		case memberNamed(key, "error"):
			a.err = val
		}
	})
	if depth > maxAnswerDepth || !sjson.Valid(body) {
		return rpcAnswer{}, errors.New("the answer is not JSON")
	}
	a.depth = depth
	return a, nil
}

// lastMember returns the value of the last member named name (compared
// after unescaping, exactly) of the JSON object obj starts with, its offset
// in obj (nil when there is none), and the object's nesting depth (1 for an
// object of scalars).
func lastMember(obj []byte, name string) (val []byte, at, depth int) {
	depth = eachMember(obj, func(key, v []byte, i int) {
		if memberNamed(key, name) {
			val, at = v, i
		}
	})
	return val, at, depth
}

// eachMember calls f with each member of the JSON object obj starts with:
// its quoted name, its raw value and the value's offset in obj; and returns
// the object's nesting depth (1 for an object of scalars). The walk only
// finds where strings and values end and checks nothing else: on bytes
// that are not JSON it stops within obj with a meaningless answer, and the
// caller's check of the whole answer discards it.
func eachMember(obj []byte, f func(key, val []byte, at int)) (depth int) {
	depth = 1
	i := skipSpace(obj, 1)
	for i < len(obj) && obj[i] == '"' {
		end := skipString(obj, i)
		key := obj[i:end]
		if i = skipSpace(obj, end); i < len(obj) {
			i++ // the ':'
		}
		i = skipSpace(obj, i)
		vend, d := skipValue(obj, i)
		depth = max(depth, 1+d)
		f(key, obj[i:vend], i)
		if i = skipSpace(obj, vend); i >= len(obj) || obj[i] != ',' {
			break
		}
		i = skipSpace(obj, i+1)
	}
	return depth
}

// memberNamed reports whether the quoted member name reads as name.
func memberNamed(quoted []byte, name string) bool {
	if bytes.IndexByte(quoted, '\\') < 0 {
		return len(quoted) == len(name)+2 && string(quoted[1:len(quoted)-1]) == name
	}
	var s string
	return json.Unmarshal(quoted, &s) == nil && s == name
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the end of the string that starts at b[i].
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(b)
}

// skipValue returns the end of the value that starts at b[i], and its
// nesting depth (0 for a scalar).
func skipValue(b []byte, i int) (end, depth int) {
	if i >= len(b) {
		return len(b), 0
	}
	switch b[i] {
	case '"':
		return skipString(b, i), 0
	case '{', '[':
		open := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = skipString(b, i)
				continue
			case '{', '[':
				open++
				depth = max(depth, open)
			case '}', ']':
				if open--; open == 0 {
					return i + 1, depth
				}
			}
			i++
		}
		return len(b), depth
	}
	for i < len(b) && b[i] != ',' && b[i] != '}' && b[i] != ']' && b[i] != ' ' && b[i] != '\t' && b[i] != '\n' && b[i] != '\r' {
		i++
	}
	return i, 0
}

// retold is a kept answer under this call's JSON-RPC id: an MCP client
// sends each request, a retry too, with an id of its own and drops an
// answer that names another. An answer that is not a JSON object is left
// as it is.
func (e *mcpExchange) retold(body []byte) []byte {
	var resp map[string]json.RawMessage
	if err := json.Unmarshal(body, &resp); err != nil || resp == nil {
		return body
	}
	resp["id"] = e.id
	b, err := json.Marshal(resp)
	if err != nil {
		return body
	}
	return b
}

// deliver adds the settlement to the result's _meta (and PAYMENT-RESPONSE
// to the HTTP answer) and writes it. The result is found as billable finds
// it (answerResult), read into raw members and written back in its place,
// member by member, each value as it was read, with only _meta rewritten:
// the rest of the answer is copied byte for byte and nothing is encoded
// again (json.Marshal of maps of raw members compacts every member once
// more at each level, which cost more than reading the answer;
// BenchmarkMCPDeliver). An answer without a result object is written
// unchanged.
func (e *mcpExchange) deliver(w http.ResponseWriter, bw *bufferedWriter, sr x402.SettleResponse) {
	body := bw.buf.Bytes()
	var result map[string]json.RawMessage
	raw, at, err := answerResult(body)
	if err == nil && raw != nil && json.Unmarshal(raw, &result) == nil && result != nil {
		var meta map[string]json.RawMessage
		if raw, ok := result["_meta"]; ok {
			json.Unmarshal(raw, &meta)
		}
		if meta == nil { // absent, null, or not an object
			meta = map[string]json.RawMessage{}
		}
		if b, err := json.Marshal(sr); err == nil {
			meta[mcpMetaPaymentResponse] = b
		}
		result["_meta"] = appendMembers(nil, meta)
		out := make([]byte, 0, len(body)+len(result["_meta"])+16)
		out = append(out, body[:at]...)
		out = appendMembers(out, result)
		out = append(out, body[at+len(raw):]...)
		rewriteHeld(bw, out)
	}
	e.g.setPaidHeaders(w.Header(), sr)
	bw.replay(w)
}

// appendMembers writes m as a JSON object with its members in key order,
// as encoding/json writes a map, and each value as it was read (valid JSON:
// encoding/json read it).
func appendMembers(b []byte, m map[string]json.RawMessage) []byte {
	b = append(b, '{')
	for _, k := range slices.Sorted(maps.Keys(m)) {
		b = appendMember(b, k, m[k])
	}
	return append(b, '}')
}

// appendMember writes one member of the JSON object b is writing (b ends
// with its '{' or a member), its value as it was read.
func appendMember(b []byte, name string, val []byte) []byte {
	if b[len(b)-1] != '{' {
		b = append(b, ',')
	}
	b = receipt.AppendString(b, name)
	b = append(b, ':')
	return append(b, val...)
}
