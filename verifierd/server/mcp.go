package server

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/score"
	"github.com/aovhq/aov/strictjson"
)

// MCP tool names (SPEC §2). Each is its REST twin under another transport:
// the same input, the same checks, signing, recording and output.
const (
	ToolVerifySchema          = "verify_schema"
	ToolGetVerificationRecord = "get_verification_record"
)

// The input schemas are written by hand, not inferred from Go types, so a
// client reads exactly the contract of SPEC §3: nullable fields, defaults,
// the rule types, and a description on every field.
var (
	//go:embed mcpschema/verify_schema.input.json
	verifySchemaInput []byte
	//go:embed mcpschema/get_verification_record.input.json
	scoreInput []byte
)

// mcpEnvelope is what /mcp accepts beyond the verification body limit: the
// JSON-RPC envelope around the arguments, and _meta (an x402 payment is a
// few hundred bytes).
const mcpEnvelope = 64 << 10

const mcpInstructions = "Verify a JSON output against a JSON Schema and cross-field rules with verify_schema " +
	"(the arguments are the body of POST /verify/schema); the result is signed with Ed25519 and can be checked offline " +
	"against the agent card's public keys. get_verification_record returns an agent's signed trust score (as GET /score/{agent_id}). " +
	"Errors are tool results with isError true and a structured error: code, message, fields with a fix each."

// newMCP builds the MCP server with its two tools and the Streamable HTTP
// handler that serves it on /mcp: stateless (every POST stands alone, no
// session to pin to one instance) and answering plain JSON, never an
// event stream, so the gateway in front can read a tool result and settle
// its payment.
func (s *Server) newMCP(version string) http.Handler {
	sdkLog := slog.New(warnAndAbove{s.log.Handler()})
	srv := mcp.NewServer(&mcp.Implementation{Name: s.verify.Service, Version: version},
		&mcp.ServerOptions{Instructions: mcpInstructions, Logger: sdkLog})
	notDestructive, closedWorld := false, false
	srv.AddTool(&mcp.Tool{
		Name:  ToolVerifySchema,
		Title: "Verify a JSON output",
		Description: "Check submitted_output against expected_schema (JSON Schema), numeric bounds and cross-field rules " +
			"(sum_equals, gte, lte, exists_in, unique). Returns pass/fail, the share of checks passed, repair hints and " +
			"a receipt signed with Ed25519 over RFC 8785 canonical JSON (context " +
			"json-schema-verifier/verify-schema-attestation/v1). Same input and output as POST /verify/schema, and priced like it; " +
			"a fail is a complete answer.",
		InputSchema: json.RawMessage(verifySchemaInput),
		Annotations: &mcp.ToolAnnotations{
			Title: "Verify a JSON output", DestructiveHint: &notDestructive, OpenWorldHint: &closedWorld,
		},
	}, s.toolVerifySchema)
	srv.AddTool(&mcp.Tool{
		Name:  ToolGetVerificationRecord,
		Title: "Get an agent's trust score",
		Description: "An agent's trust score in [0, 1] from its verification history (time-decayed; of an owned agent only its " +
			"owner's wallet-authenticated evidence counts; Wilson lower bound so few data points score low), with the method, its inputs and " +
			"all-time counts, signed under json-schema-verifier/trust-score-attestation/v1. Same as GET /score/{agent_id}. " +
			"test- agents never get a score.",
		InputSchema: json.RawMessage(scoreInput),
		Annotations: &mcp.ToolAnnotations{
			Title: "Get an agent's trust score", ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: &closedWorld,
		},
	}, s.toolGetVerificationRecord)
	return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{
		Stateless:    true,
		JSONResponse: true,
		Logger:       sdkLog,
		// verifierd listens on loopback behind the gateway, which forwards
		// the public Host: the SDK's DNS-rebinding guard (for MCP servers
		// on a user's own machine) would refuse every proxied call. The
		// tools grant nothing a public caller does not already have.
		DisableLocalhostProtection: true,
		MaxRequestBodyBytes:        s.maxBody + mcpEnvelope,
	})
}

// warnAndAbove is the SDK's view of the service log: its warnings and
// errors only. In stateless mode every POST is a session of its own, and
// the SDK logs "server connecting", "server session connected" and
// "server session disconnected" at info for each: three lines per tool
// call that name no session (the ID is empty) and say nothing the access
// log line does not, at a few microseconds of JSON formatting each.
type warnAndAbove struct{ slog.Handler }

func (h warnAndAbove) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && h.Handler.Enabled(ctx, l)
}

func (h warnAndAbove) WithAttrs(as []slog.Attr) slog.Handler {
	return warnAndAbove{h.Handler.WithAttrs(as)}
}

func (h warnAndAbove) WithGroup(name string) slog.Handler {
	return warnAndAbove{h.Handler.WithGroup(name)}
}

// recKey carries the request's log record to the tool handlers, which the
// SDK calls with a context derived from the HTTP request's.
type recKey struct{}

// serveMCP is POST /mcp. The refusals the SDK would answer in plain text
// (a body over the limit, a body not declared as JSON) are answered here
// in the SPEC §6 shape first. Everything else is JSON-RPC: tool errors are
// results with isError, never HTTP errors, so the gateway sees one shape.
func (s *Server) serveMCP(w http.ResponseWriter, r *http.Request, rec *requestLog) error {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return apierr.UnsupportedMediaType()
	}
	limit := s.maxBody + mcpEnvelope
	// The body and the held answer are pooled buffers: the SDK reads the
	// body into a copy of its own before it decodes anything, and the held
	// answer is copied to the connection by finish; neither is referred to
	// once ServeHTTP has returned.
	bodyBuf := getBuffer()
	body, err := readLimited(w, r, limit, *bodyBuf)
	defer func() { putBuffer(bodyBuf, body) }()
	if err != nil {
		return err
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	// Every answer of /mcp is application/json; a client that did not list
	// text/event-stream as well (the transport requires both) is served
	// all the same.
	r.Header.Set("Accept", "application/json, text/event-stream")
	r = r.WithContext(context.WithValue(r.Context(), recKey{}, rec))
	heldBuf := getBuffer()
	ew := &mcpErrorWriter{ResponseWriter: w, buf: bytes.NewBuffer(*heldBuf)}
	defer func() { putBuffer(heldBuf, ew.buf.Bytes()) }()
	s.mcp.ServeHTTP(ew, r)
	if ew.status != 0 {
		return transportError(ew.status, limit)
	}
	askSettlementReport(ew, rec.payment) // set by a tool that recorded a verification
	ew.finish()
	return nil
}

// mcpErrorWriter holds back the SDK's plain-text refusals of an HTTP
// request (malformed JSON-RPC, an unsupported protocol version, ...), and
// holds its JSON answers until they are complete so that a JSON-RPC error
// can be rewritten: the SDK's error messages quote the request (an unknown
// tool's name, the params it could not decode), and the service never
// echoes its input. Tool results, errors included, pass unchanged.
type mcpErrorWriter struct {
	http.ResponseWriter
	status int // the refusal held back, 0 if none
	code   int // the status of the held JSON answer
	buf    *bytes.Buffer
}

func (w *mcpErrorWriter) WriteHeader(code int) {
	if w.code != 0 || w.status != 0 {
		return
	}
	if code >= 400 {
		if mt, _, _ := mime.ParseMediaType(w.Header().Get("Content-Type")); mt != "application/json" {
			w.status = code
			return
		}
	}
	w.code = code
}

func (w *mcpErrorWriter) Write(b []byte) (int, error) {
	if w.status != 0 {
		return len(b), nil
	}
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.buf.Write(b)
}

// finish sends the held answer, with any JSON-RPC error made content-free.
func (w *mcpErrorWriter) finish() {
	body := w.buf.Bytes()
	if bytes.Contains(body, []byte(`"error":{`)) { // only then decode

		if clean, ok := cleanRPCError(body); ok {
			body = clean
			w.Header().Del("Content-Length")
		}
	}
	if w.code == 0 {
		w.code = http.StatusOK
	}
	w.ResponseWriter.WriteHeader(w.code)
	w.ResponseWriter.Write(body)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *mcpErrorWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// rpcErrorMessages are the messages of rewritten JSON-RPC errors, by code:
// the standard meanings, and nothing of the request.
var rpcErrorMessages = map[int]string{
	-32700: "Parse error: the body is not one JSON-RPC 2.0 message.",
	-32600: "Invalid request: the body is not a valid JSON-RPC 2.0 request.",
	-32601: "Method not found: this server implements initialize, ping, tools/list and tools/call.",
	-32602: "Invalid params: the method's params are malformed, or name something this server does not have (tools/list lists its tools and their input schemas).",
	-32603: "Internal error.",
}

// cleanRPCError rewrites a JSON-RPC error response: the same jsonrpc, id
// and code, a message that names the kind of error only, and no data. It
// reports false for anything that is not an error response.
func cleanRPCError(body []byte) ([]byte, bool) {
	var resp struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   *struct {
			Code int `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &resp) != nil || resp.Error == nil {
		return nil, false
	}
	msg, ok := rpcErrorMessages[resp.Error.Code]
	if !ok {
		msg = "Server error."
	}
	if len(resp.ID) == 0 {
		resp.ID = json.RawMessage("null")
	}
	out, err := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}{JSONRPC: "2.0", ID: resp.ID, Error: struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{resp.Error.Code, msg}})
	if err != nil {
		return nil, false
	}
	return append(out, '\n'), true
}

// transportError is the SPEC §6 form of a refusal by the MCP transport.
func transportError(status int, limit int64) *apierr.Error {
	switch status {
	case http.StatusRequestEntityTooLarge:
		return apierr.TooLarge(limit)
	case http.StatusUnsupportedMediaType:
		return apierr.UnsupportedMediaType()
	case http.StatusMethodNotAllowed:
		return apierr.MethodNotAllowed(http.MethodPost)
	}
	if status >= 500 {
		return apierr.Internal(fmt.Errorf("the MCP transport answered %d", status))
	}
	return apierr.InvalidMessage(apierr.Field{Field: "body",
		Problem: "is not a valid MCP request",
		Fix: "Send one JSON-RPC 2.0 message as the body (for example a tools/call request), " +
			"with an MCP-Protocol-Version header the server supports or none."})
}

// toolRec is the log record of the HTTP request carrying a tool call (a
// throwaway one when the call arrived another way).
func toolRec(ctx context.Context, tool string) *requestLog {
	rec, _ := ctx.Value(recKey{}).(*requestLog)
	if rec == nil {
		rec = &requestLog{}
	}
	rec.tool = tool
	return rec
}

// toolGateway reads the gateway's headers from the HTTP request that
// carried the call.
func (s *Server) toolGateway(req *mcp.CallToolRequest) gatewayInfo {
	var h http.Header
	if req.Extra != nil {
		h = req.Extra.Header
	}
	return s.gatewayInfo(h, "mcp")
}

// toolVerifySchema is the MCP tool verify_schema: the arguments object is
// the REST body, parsed by the same strict parser (so the same request
// gets the same hashes and the same refusals), then checked, signed and
// recorded by the same code.
func (s *Server) toolVerifySchema(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	rec := toolRec(ctx, ToolVerifySchema)
	args := []byte(req.Params.Arguments)
	if len(bytes.TrimSpace(args)) == 0 {
		args = []byte("{}")
	}
	doc, err := s.verifyRequest(ctx, args, s.toolGateway(req), rec, make([]byte, 0, 8<<10))
	if err != nil {
		return s.toolError(rec, err), nil
	}
	return toolDocument(doc), nil
}

// toolGetVerificationRecord is the MCP tool get_verification_record: the
// score document of GET /score/{agent_id}.
func (s *Server) toolGetVerificationRecord(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	rec := toolRec(ctx, ToolGetVerificationRecord)
	gw := s.toolGateway(req)
	if err := s.paidRoute(gw); err != nil {
		return s.toolError(rec, err), nil
	}
	agent, err := scoreArguments(req.Params.Arguments)
	if err != nil {
		return s.toolError(rec, err), nil
	}
	doc, err := s.scoreAgent(ctx, gw, agent)
	if err != nil {
		return s.toolError(rec, err), nil
	}
	return toolDocument(doc), nil
}

// scoreArguments reads {"agent_id": "..."} strictly (no duplicate) and
// checks it with the rule the gateway also applies (score.ToolAgent).
func scoreArguments(raw json.RawMessage) (string, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		raw = []byte("{}")
	}
	tree, err := strictjson.Decode(raw, strictjson.Limits{MaxDepth: 8})
	if err != nil {
		var se *strictjson.Error
		field := "arguments"
		if errors.As(err, &se) && se.Path != "" {
			field = se.Path
		}
		return "", apierr.Invalid(apierr.Field{Field: field, Problem: "is not valid: " + problemOf(err),
			Fix: `Send the arguments as {"agent_id": "seller-7"}.`})
	}
	m, ok := tree.(map[string]any)
	if !ok {
		return "", apierr.Invalid(apierr.Field{Field: "arguments", Problem: "is not a JSON object",
			Fix: `Send the arguments as {"agent_id": "seller-7"}.`})
	}
	return score.ToolAgent(m)
}

// problemOf is the problem of a strictjson error without its position.
func problemOf(err error) string {
	var se *strictjson.Error
	if errors.As(err, &se) && se.Problem != "" {
		return se.Problem
	}
	return "malformed JSON"
}

// toolDocument is a successful tool result: the signed response document
// as structuredContent (embedded verbatim) and, for clients that read only
// text, as the text content.
func toolDocument(doc []byte) *mcp.CallToolResult {
	doc = bytes.TrimRight(doc, "\n")
	return &mcp.CallToolResult{
		Content:           []mcp.Content{&mcp.TextContent{Text: string(doc)}},
		StructuredContent: json.RawMessage(doc),
	}
}

// toolError is a refusal as a tool result: isError, with the SPEC §6 error
// as structuredContent and as text. A Go error returned to the SDK would
// lose the structure, so handlers never return one.
func (s *Server) toolError(rec *requestLog, err error) *mcp.CallToolResult {
	e := apierr.From(err)
	rec.toolError = e.Code
	if e.Status >= 500 {
		s.log.Error("tool call failed", "tool", rec.tool, "status", e.Status, "code", e.Code,
			"error", errString(e.Cause), "verification_id", rec.verificationID)
	}
	body, merr := json.Marshal(e)
	if merr != nil { // cannot happen: every member is a plain value
		body = []byte(fmt.Sprintf(`{"code":%q,"status":%d,"charged":false}`, e.Code, e.Status))
	}
	return &mcp.CallToolResult{
		IsError:           true,
		Content:           []mcp.Content{&mcp.TextContent{Text: string(body)}},
		StructuredContent: json.RawMessage(body),
	}
}
