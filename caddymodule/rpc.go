package caddymodule

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/strictjson"
	"github.com/aovhq/aov/verify"
)

// The gate's reading of a JSON-RPC message on a priced MCP endpoint. It
// decides whether a call is paid for, so it must never read a message
// differently from the MCP server behind it. The SDK reads member names
// exactly, lets the last duplicate win and ignores what follows the value;
// encoding/json would match names in any letter case. The gate reads the
// whole message with strictjson (exact names, no name twice, nothing after
// the value, no byte-order mark) and refuses every message it does not
// fully understand: a batch, an unknown member, a member of the wrong type.
// Nothing it cannot read goes upstream.
//
// Names equal in another letter case ("name" and "Name") are refused where
// a server reads the bytes into named fields, since a case-insensitive
// reader there may take either: the envelope, params, _meta (payments are
// decoded into structs) and a tool's own argument names (a tool's SDK may
// decode its arguments into a struct). Below a tool's argument names the
// values are the tool's data (a verification's submitted_output and
// expected_schema), kept as free-form JSON by every reader that sees them:
// the gate (strictjson, exact keys), verifierd's MCP SDK (the arguments as
// raw bytes) and verifierd's request parser and request hash (exact keys,
// canonical JSON). There such names are distinct keys, as they are in the
// REST body, so MCP accepts them exactly where REST does and both give one
// verdict and one request hash (FuzzMCPEnvelopeAgreesWithTheSDK,
// TestCaseTwinsAreOneRuleForRESTAndMCP).

// JSON-RPC error codes the gate answers with.
const (
	rpcParseError     = -32700
	rpcInvalidRequest = -32600
	rpcInternalError  = -32603
)

// maxRPCID bounds the id the gate repeats in its answers, so an answer
// never carries more of the request than the protocol needs.
const maxRPCID = 128

// rpcDepth is the nesting the envelope adds around a tool's arguments
// (message, params): arguments may nest as deep as a verification request.
const rpcDepth = verify.DefaultMaxDepth + 2

// paymentPath is where a tools/call carries its payment:
// params._meta["x402/payment"].
var paymentPath = []string{"params", "_meta", mcpMetaPayment}

// argumentsPath is where a tools/call carries its tool's arguments. A value
// in them that strictjson refuses for itself (a number such as an integer
// beyond ±(2^53−1) or 1e400, an unpaired surrogate escape, nesting deeper
// than a verification request's 64 levels counted from the arguments)
// leaves the message readable: it is the tool's data, refused as the
// call's invalid_request tool result (argsErr), in the words verifierd's
// own parser uses, as REST refuses it with 422, rather than the whole
// message as unreadable, which an MCP client's transport takes for a
// failure of its session. The envelope around them keeps every limit.
var argumentsPath = []string{"params", "arguments"}

// rpcMessage is one JSON-RPC message as the gate read it.
type rpcMessage struct {
	id      json.RawMessage // the id as the gate will repeat it; nil for none
	method  string          // "" for a response
	tree    map[string]any  // the whole message
	body    []byte          // the message as sent
	payment strictjson.Cut  // where body holds the payment; zero for none

	// Set for tools/call only.
	tool string         // params.name
	args any            // params.arguments; nil when absent
	meta map[string]any // params._meta; nil when absent
	// argsErr refuses the arguments for holding a value REST refuses
	// for itself (argumentsPath); nil when they hold none.
	argsErr *apierr.Error
}

// rpcRefusal is a message the gate will not pass on, with the JSON-RPC
// code and the SPEC §6 error it answers with.
type rpcRefusal struct {
	code int
	err  *apierr.Error
}

// refuseRPC builds a refusal of the message itself: a transport-level
// refusal, which MCP's Streamable HTTP transport answers with HTTP 400 Bad
// Request (as the official SDK does), here with a JSON-RPC error (code
// -32700 or -32600, id null) whose data is the SPEC §6 invalid_message
// error. Wrong arguments of a readable tools/call are not this: they are a
// tool error with invalid_request (422), like REST.
func refuseRPC(code int, field, problem, fix string) *rpcRefusal {
	return &rpcRefusal{code: code, err: apierr.InvalidMessage(apierr.Field{Field: field, Problem: problem, Fix: fix})}
}

// refuseCharset refuses a message declared in a charset other than UTF-8
// (bodyNotUTF8): the gate could not tell which call it is.
func refuseCharset(r *http.Request) *rpcRefusal {
	if f := bodyNotUTF8(r); f != nil {
		return refuseRPC(rpcParseError, f.Field, f.Problem, f.Fix)
	}
	return nil
}

// readRPC reads one JSON-RPC message strictly. The refusal names the member
// and the problem, never its content.
func readRPC(body []byte) (*rpcMessage, *rpcRefusal) {
	env, err := strictjson.DecodeEnvelope(body, strictjson.Limits{MaxDepth: rpcDepth}, paymentPath, argumentsPath)
	if err != nil {
		var se *strictjson.Error
		if !errors.As(err, &se) {
			return nil, refuseRPC(rpcParseError, "body", "could not be read", "Send one JSON-RPC message as JSON.")
		}
		return nil, unreadable(se)
	}
	v, payment := env.Value, env.Cut
	tree, ok := v.(map[string]any)
	if !ok {
		if _, batch := v.([]any); batch {
			// A batch could hide a priced call among free ones; MCP no
			// longer allows batches.
			return nil, refuseRPC(rpcInvalidRequest, "body", "is a JSON-RPC batch, which a paid MCP endpoint does not accept", "Send one JSON-RPC request per HTTP request.")
		}
		return nil, refuseRPC(rpcInvalidRequest, "body", "is not a JSON-RPC message object", "Send one JSON-RPC 2.0 message object.")
	}
	m := &rpcMessage{tree: tree, body: body, payment: payment}
	for k := range tree {
		switch k {
		case "jsonrpc", "id", "method", "params", "result", "error":
		default:
			return nil, refuseRPC(rpcInvalidRequest, memberPath("", k), "is not a member of a JSON-RPC message", "Send only jsonrpc, id, method and params (or result or error).")
		}
	}
	if tree["jsonrpc"] != "2.0" {
		return nil, refuseRPC(rpcInvalidRequest, "jsonrpc", "must be \"2.0\"", `Send "jsonrpc": "2.0".`)
	}
	if id, ok := tree["id"]; ok {
		var bad *rpcRefusal
		if m.id, bad = rpcID(id); bad != nil {
			return nil, bad
		}
	}
	method, hasMethod := tree["method"]
	if !hasMethod {
		// A response to a request of the server: never priced.
		_, hasResult := tree["result"]
		_, hasError := tree["error"]
		if m.id == nil || hasResult == hasError || tree["params"] != nil {
			return nil, refuseRPC(rpcInvalidRequest, "method", "is required", "Send a JSON-RPC request with a method, or a response with an id and either result or error.")
		}
		for _, k := range []string{"result", "error"} {
			if bad := foldedTwins(k, tree[k], true); bad != nil {
				return nil, bad
			}
		}
		if env.Data != nil {
			return nil, unreadable(env.Data)
		}
		return m, nil
	}
	if m.method, ok = method.(string); !ok || m.method == "" {
		return nil, refuseRPC(rpcInvalidRequest, "method", "must be a non-empty string", "Send the method name as a string.")
	}
	if _, ok := tree["result"]; ok {
		return nil, refuseRPC(rpcInvalidRequest, "result", "is not a member of a request", "Remove it.")
	}
	if _, ok := tree["error"]; ok {
		return nil, refuseRPC(rpcInvalidRequest, "error", "is not a member of a request", "Remove it.")
	}
	params, hasParams := tree["params"]
	if hasParams && params != nil {
		switch params.(type) {
		case map[string]any, []any:
		default:
			return nil, refuseRPC(rpcInvalidRequest, "params", "must be an object or an array", "Send params as an object.")
		}
	}
	if m.method != "tools/call" {
		if bad := foldedTwins("params", params, true); bad != nil {
			return nil, bad
		}
		if env.Data != nil {
			return nil, unreadable(env.Data) // no tool's arguments
		}
		return m, nil
	}
	if m.id == nil {
		return nil, refuseRPC(rpcInvalidRequest, "id", "is required for tools/call", "Send tools/call as a request with an id.")
	}
	p, ok := params.(map[string]any)
	if !ok {
		return nil, refuseRPC(rpcInvalidRequest, "params", "must be an object for tools/call", `Send params as {"name": ..., "arguments": {...}}.`)
	}
	for k, v := range p {
		switch k {
		case "name":
			if m.tool, ok = v.(string); !ok || m.tool == "" {
				return nil, refuseRPC(rpcInvalidRequest, "params.name", "must be a non-empty string", "Send the tool's name as a string.")
			}
		case "arguments":
			if _, ok := v.(map[string]any); !ok {
				return nil, refuseRPC(rpcInvalidRequest, "params.arguments", "must be an object", "Send the tool's arguments as a JSON object.")
			}
			m.args = v
		case "_meta":
			if m.meta, ok = v.(map[string]any); !ok {
				return nil, refuseRPC(rpcInvalidRequest, "params._meta", "must be an object", "Send _meta as a JSON object.")
			}
		// A multi-round-trip call's retry (SEP-2322): the client's answers
		// to the tool's input requests, and the state the tool asked it to
		// echo. They go to the tool as sent; the gate neither prices them
		// nor names the request by them (requestParts), so the retry is
		// the same call, paid by the same payment, as the round before.
		case "inputResponses":
			if _, ok := v.(map[string]any); !ok {
				return nil, refuseRPC(rpcInvalidRequest, "params.inputResponses", "must be an object", "Send the answers to the tool's input requests as a JSON object.")
			}
		case "requestState":
			if _, ok := v.(string); !ok {
				return nil, refuseRPC(rpcInvalidRequest, "params.requestState", "must be a string", "Send back the tool's requestState as it was sent.")
			}
		default:
			return nil, refuseRPC(rpcInvalidRequest, memberPath("params", k), "is not a member of tools/call params", "Send only name, arguments, _meta, inputResponses and requestState.")
		}
	}
	if m.tool == "" {
		return nil, refuseRPC(rpcInvalidRequest, "params.name", "is required", "Send the tool's name.")
	}
	if bad := foldedTwins("params._meta", p["_meta"], true); bad != nil {
		return nil, bad
	}
	// The arguments' own names only: below them is the tool's data.
	if bad := foldedTwins("params.arguments", m.args, false); bad != nil {
		return nil, bad
	}
	if se := env.Data; se != nil {
		field := strings.TrimPrefix(strings.TrimPrefix(se.Path, "params.arguments"), ".")
		if field == "" {
			field = "arguments" // a name of the arguments object itself
		}
		m.argsErr = apierr.Invalid(apierr.Field{Field: field, Problem: se.Problem, Fix: se.Fix})
	}
	return m, nil
}

// unreadable is the refusal of a message strictjson refused.
func unreadable(se *strictjson.Error) *rpcRefusal {
	field := se.Path
	if field == "" {
		field = "body"
	}
	return refuseRPC(rpcParseError, field, se.Problem, se.Fix)
}

// rpcID is the id the gate repeats for a message's id as strictjson read
// it, or the refusal of an id the gate does not take. It is the one rule
// for ids: the id of a call, and the id an answer must name to be the
// call's (sameRPCID).
func rpcID(id any) (json.RawMessage, *rpcRefusal) {
	switch x := id.(type) {
	case string:
		if len(x) > maxRPCID {
			return nil, refuseRPC(rpcInvalidRequest, "id", "is longer than "+strconv.Itoa(maxRPCID)+" bytes", "Use a short string or a number as the request id.")
		}
		b, _ := json.Marshal(x)
		return b, nil
	case json.Number:
		// The MCP SDK reads a numeric id as an int64 and answers under
		// that: 1.5 and 1e0 would be answered as 1 and -0 as 0, an id
		// the client did not send, so it would drop an answer it may
		// have paid for. strictjson keeps integers within ±(2^53−1).
		if strings.ContainsAny(string(x), ".eE") || x == "-0" {
			return nil, refuseRPC(rpcInvalidRequest, "id", "is a number that is not an integer written without a fraction or exponent", "Use a string or an integer such as 1 as the request id.")
		}
		return json.RawMessage(x), nil
	}
	return nil, refuseRPC(rpcInvalidRequest, "id", "must be a string or a number", "Use a string or a number as the request id.")
}

// sameRPCID reports whether an answer's id (its raw JSON value; nil when it
// has none) names the call whose id the gate read as call. The answer's id
// is read by the call's rule (rpcID), so that one id written two ways
// ("<" and "\u003c", as the SDK and encoding/json write it) is one id, and
// an id the gate would not take from a call names no call of the gate.
// The SDK's own answers repeat the id as the gate does, so the bytes
// compare equal and nothing is decoded.
func sameRPCID(answer, call json.RawMessage) bool {
	if len(answer) == 0 || len(call) == 0 {
		return false
	}
	if bytes.Equal(answer, call) {
		return true
	}
	v, err := strictjson.Decode(answer, strictjson.Limits{MaxDepth: 1})
	if err != nil {
		return false
	}
	id, bad := rpcID(v)
	return bad == nil && bytes.Equal(id, call)
}

// foldedTwins refuses an object at path (and, deep, every object below it)
// with two member names equal in another letter case (strictjson's
// FoldedNames relation); see the top of this file for where that applies.
// Of several, it names the first in key order, so a message always gets the
// same refusal.
func foldedTwins(path string, v any, deep bool) *rpcRefusal {
	at, ok := findTwin(v, deep)
	if !ok {
		return nil
	}
	for i := len(at) - 1; i >= 0; i-- { // at is innermost first
		switch seg := at[i].(type) {
		case string:
			path = memberPath(path, seg)
		case int:
			path += "[" + strconv.Itoa(seg) + "]"
		}
	}
	return refuseRPC(rpcInvalidRequest, path, "appears more than once when letter case is ignored",
		"Send each name once per object, in one letter case; some readers match names in any case.")
}

// findTwin returns the path below v (member names and indexes, innermost
// first) of the first name with a twin in another letter case, and false
// when there is none.
func findTwin(v any, deep bool) ([]any, bool) {
	switch x := v.(type) {
	case map[string]any:
		if k, twin := strictjson.FoldedTwin(x); twin {
			return []any{k}, true
		}
		if !deep {
			return nil, false
		}
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			if at, ok := findTwin(x[k], true); ok {
				return append(at, k), true
			}
		}
	case []any:
		if !deep {
			return nil, false
		}
		for i, e := range x {
			if at, ok := findTwin(e, true); ok {
				return append(at, i), true
			}
		}
	}
	return nil, false
}

// memberPath renders member name of the object at path for a refusal
// (cut when long, as strictjson cuts keys).
func memberPath(path, name string) string {
	var b strings.Builder
	b.WriteString(path)
	strictjson.AppendKey(&b, name)
	return b.String()
}

// withoutPayment is the message without params._meta["x402/payment"]: what
// the tool receives for a paid call (a REST upstream never sees
// PAYMENT-SIGNATURE either). The member's bytes are cut out of the message
// as sent and every other byte is kept: encoding the tree again would write
// each number as a double, so the tool would check 1 where the buyer sent
// 1.00000000000000000001, a number verifierd refuses as inexact over REST
// and in a free call (FuzzMCPEnvelopeAgreesWithTheSDK holds the rest of the
// message to what was sent).
func (m *rpcMessage) withoutPayment() []byte {
	return m.payment.Remove(m.body)
}

func rpcResult(id json.RawMessage, result any) map[string]any {
	return map[string]any{"jsonrpc": "2.0", "id": rawID(id), "result": result}
}

// rpcError is a JSON-RPC error carrying the SPEC §6 error in data. Its
// message is the gate's own wording, never the request's content.
func rpcError(id json.RawMessage, code int, e *apierr.Error) map[string]any {
	return map[string]any{"jsonrpc": "2.0", "id": rawID(id), "error": map[string]any{"code": code, "message": e.Message, "data": e}}
}

func rawID(id json.RawMessage) json.RawMessage {
	if len(id) == 0 {
		return json.RawMessage("null")
	}
	return id
}

func writeRPC(w http.ResponseWriter, status int, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, err = w.Write(body)
	return err
}
