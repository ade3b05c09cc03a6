package apierr

import "net/http"

// CodeInvalidMessage is the code of an MCP message refused by the
// transport, before any tool is called: a body that is not one JSON-RPC
// message the server fully reads.
const CodeInvalidMessage = "invalid_message"

// InvalidMessage reports an MCP body the transport refuses (400, not 422:
// MCP's Streamable HTTP transport requires HTTP 400 Bad Request for input
// it does not accept for its body, and so does the official SDK). The
// fields name the member and its problem, never its content; the
// arguments of a tool call that are wrong are a tool error instead
// (Invalid, in an isError result), like a REST 422.
func InvalidMessage(fields ...Field) *Error {
	names := make([]string, len(fields))
	for i, f := range fields {
		names[i] = f.Field
	}
	msg := "The body is not an MCP message this server accepts. Nothing was charged; send one JSON-RPC 2.0 message."
	if len(fields) > 0 {
		msg = "The body is not an MCP message this server accepts: " + fields[0].Field + " " + fields[0].Problem + ". Nothing was charged; fix it and send it again."
	}
	return &Error{
		Code:        CodeInvalidMessage,
		Message:     msg,
		Status:      http.StatusBadRequest,
		NextActions: []Action{{Action: "fix_request_fields", Fields: names}},
		Fields:      fields,
	}
}
