package caddymodule

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/x402"
)

// MCP keys of the x402 MCP transport (x402 specs/transports-v2/mcp.md).
const (
	mcpMetaPayment         = "x402/payment"
	mcpMetaPaymentResponse = "x402/payment-response"
)

// rpcRequest is the part of a JSON-RPC request the gate reads.
type rpcRequest struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Method  string          `json:"method"`
	Params  struct {
		Name      string                     `json:"name"`
		Arguments json.RawMessage            `json:"arguments"`
		Meta      map[string]json.RawMessage `json:"_meta"`
	} `json:"params"`
}

// serveMCP prices one MCP tool on a Streamable HTTP endpoint. Only a
// tools/call of that tool is gated; initialize, tools/list, notifications and
// every other method pass through free. The order of decisions is the
// REST one: invalid arguments are a tool error before any payment logic; a
// payment in params._meta["x402/payment"] is verified, the tool run and the
// payment settled only if the result is not an error; otherwise the call is
// served from the free allowance while it lasts, or answered with a
// payment-required tool result.
func (g *Gate) serveMCP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if r.Method != http.MethodPost {
		return next.ServeHTTP(w, r)
	}
	body, err := g.readBody(r)
	if err != nil {
		return g.refuse(w, err)
	}
	if trimmed := bytes.TrimLeft(body, " \t\r\n"); len(trimmed) > 0 && trimmed[0] == '[' {
		// A batch could hide a priced call among free ones; MCP no longer
		// allows batches, so refuse them all.
		return writeRPC(w, http.StatusBadRequest, rpcError(nil, -32600, "JSON-RPC batches are not accepted on a paid MCP endpoint; send one request per call"))
	}
	var req rpcRequest
	if json.Unmarshal(body, &req) != nil || req.Method != "tools/call" || req.Params.Name != g.MCPTool {
		return next.ServeHTTP(w, r)
	}
	ex := mcpExchange{g: g, id: req.ID, tool: g.MCPTool}
	if g.verifier != nil {
		args := req.Params.Arguments
		if len(args) == 0 {
			args = []byte("{}")
		}
		if _, err := g.verifier.Parse(args); err != nil {
			metrics.outcomes.WithLabelValues(apierr.From(err).Code).Inc()
			return ex.toolError(w, apierr.From(err))
		}
	}
	if raw, ok := req.Params.Meta[mcpMetaPayment]; ok {
		payload, err := x402.ParsePaymentPayload(raw)
		if err != nil {
			return ex.demand(w, r, http.StatusOK, "Invalid payment: "+err.Error(), reasonFor(err, x402.ReasonInvalidPayload), nil)
		}
		// The tool never sees the payment, as a REST upstream never sees
		// PAYMENT-SIGNATURE.
		if stripped, err := withoutPayment(body); err == nil {
			setBody(r, stripped)
		}
		return g.servePaid(w, r, next, ex, payload, string(raw))
	}
	if g.Free != nil && int64(len(body)) <= g.Free.MaxBody {
		return g.serveFreeMCP(w, r, next, ex)
	}
	return ex.demand(w, r, http.StatusOK, "Payment required", "", nil)
}

// serveFreeMCP runs one tool call from the caller's allowance. The result is
// held so that a tool error (isError) gives the unit back.
func (g *Gate) serveFreeMCP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, ex mcpExchange) error {
	f := g.Free
	res, t, ok, err := g.reserveFree(w, r, ex)
	if !ok {
		return err
	}
	buf := getBuffer()
	defer putBuffer(buf)
	bw := &bufferedWriter{header: make(http.Header), buf: buf, limit: g.MaxBuffer}
	err = runUpstream(next, bw, r, neverReached)
	ctx := context.WithoutCancel(r.Context())
	if err != nil || bw.overflow || !ex.billable(bw) {
		if rerr := g.state.Allowance().Release(ctx, res); rerr != nil {
			g.logger.Warn("releasing free allowance unit", zap.Error(rerr))
		}
		if err != nil {
			return err
		}
		if bw.overflow {
			return g.refuse(w, apierr.Internal(errBufferFull))
		}
		bw.replay(w)
		return nil
	}
	if cerr := g.state.Allowance().Commit(ctx, res); cerr != nil {
		g.logger.Warn("committing free allowance unit", zap.Error(cerr))
	}
	metrics.outcomes.WithLabelValues("free").Inc()
	f.setHeaders(w.Header(), res, t)
	bw.replay(w)
	return nil
}

// mcpExchange is x402 over MCP: demands are tool results with isError and
// the PaymentRequired document (x402 MCP transport), always with HTTP 200,
// because they are answers of the JSON-RPC call.
type mcpExchange struct {
	g    *Gate
	id   json.RawMessage
	tool string
}

func (e mcpExchange) demand(w http.ResponseWriter, r *http.Request, _ int, msg, reason string, failed *x402.SettleResponse) error {
	g := e.g
	pr := x402.PaymentRequired{
		X402Version: x402.Version,
		Error:       msg,
		Resource:    x402.Resource{URL: "mcp://tool/" + e.tool, Description: g.Description, MimeType: "application/json"},
		Accepts:     g.offers,
	}
	text, err := json.Marshal(pr)
	if err != nil {
		return g.refuse(w, apierr.Internal(err))
	}
	meta := map[string]any{}
	if failed != nil {
		meta[mcpMetaPaymentResponse] = failed
	}
	if reason != "" {
		meta["reason"] = reason
	}
	if g.Free != nil {
		trial := g.Free.trial(r, g)
		meta["free_trial"] = trial
		if trial.Code != "" {
			meta["code"] = trial.Code
		}
	}
	label := reason
	if label == "" {
		label = "payment_required"
	}
	metrics.outcomes.WithLabelValues(label).Inc()
	w.Header().Set("Cache-Control", "no-store")
	return writeRPC(w, http.StatusOK, rpcResult(e.id, map[string]any{
		"content":           []any{map[string]any{"type": "text", "text": string(text)}},
		"structuredContent": pr,
		"isError":           true,
		"_meta":             meta,
	}))
}

// toolError answers a tool call with an error of the SPEC §6 shape, as the
// tool itself would.
func (e mcpExchange) toolError(w http.ResponseWriter, ae *apierr.Error) error {
	text, _ := json.Marshal(ae)
	return writeRPC(w, http.StatusOK, rpcResult(e.id, map[string]any{
		"content":           []any{map[string]any{"type": "text", "text": string(text)}},
		"structuredContent": ae,
		"isError":           true,
	}))
}

// billable reports whether the held answer is a successful tool result. An
// answer the gate cannot read is turned into a JSON-RPC error in place: the
// gate must not release what it cannot tell was a success, and must not
// charge for it either.
func (e mcpExchange) billable(bw *bufferedWriter) bool {
	if bw.status() >= 400 {
		return false
	}
	var resp struct {
		Result *struct {
			IsError bool `json:"isError"`
		} `json:"result"`
	}
	if err := json.Unmarshal(bw.buf.Bytes(), &resp); err != nil {
		bw.buf.Reset()
		bw.header.Set("Content-Type", "application/json")
		body, _ := json.Marshal(rpcError(e.id, -32603, "the tool's answer could not be read by the payment gateway (it must answer with application/json, not a stream); nothing was charged"))
		bw.buf.Write(body)
		return false
	}
	return resp.Result != nil && !resp.Result.IsError
}

// deliver adds the settlement to the result's _meta (and PAYMENT-RESPONSE
// to the HTTP answer) and writes it.
func (e mcpExchange) deliver(w http.ResponseWriter, bw *bufferedWriter, sr x402.SettleResponse) {
	var resp map[string]json.RawMessage
	if err := json.Unmarshal(bw.buf.Bytes(), &resp); err == nil {
		var result map[string]json.RawMessage
		if err := json.Unmarshal(resp["result"], &result); err == nil {
			meta := map[string]json.RawMessage{}
			if raw, ok := result["_meta"]; ok {
				json.Unmarshal(raw, &meta)
			}
			if b, err := json.Marshal(sr); err == nil {
				meta[mcpMetaPaymentResponse] = b
			}
			result["_meta"], _ = json.Marshal(meta)
			resp["result"], _ = json.Marshal(result)
			if body, err := json.Marshal(resp); err == nil {
				bw.buf.Reset()
				bw.buf.Write(body)
			}
		}
	}
	e.g.setPaidHeaders(w.Header(), sr)
	bw.replay(w)
}

// withoutPayment removes params._meta["x402/payment"] from a JSON-RPC
// request body.
func withoutPayment(body []byte) ([]byte, error) {
	var req map[string]json.RawMessage
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, err
	}
	var params map[string]json.RawMessage
	if err := json.Unmarshal(req["params"], &params); err != nil {
		return nil, err
	}
	var meta map[string]json.RawMessage
	if err := json.Unmarshal(params["_meta"], &meta); err != nil {
		return nil, err
	}
	delete(meta, mcpMetaPayment)
	var err error
	if params["_meta"], err = json.Marshal(meta); err != nil {
		return nil, err
	}
	if req["params"], err = json.Marshal(params); err != nil {
		return nil, err
	}
	return json.Marshal(req)
}

func rpcResult(id json.RawMessage, result any) map[string]any {
	return map[string]any{"jsonrpc": "2.0", "id": rawID(id), "result": result}
}

func rpcError(id json.RawMessage, code int, msg string) map[string]any {
	return map[string]any{"jsonrpc": "2.0", "id": rawID(id), "error": map[string]any{"code": code, "message": msg}}
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
