package x402

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"unicode/utf8"

	"github.com/aovhq/aov/strictjson"
)

// checkJSONObject reports whether data is one JSON object that strictjson
// accepts with FoldedNames: valid UTF-8, no byte-order mark, nothing after
// the value, and member names that stay distinct under case folding at
// every depth.
//
// Why case folding: encoding/json matches member names to struct fields
// case-insensitively and lets the last duplicate win, while JavaScript peers
// (the official facilitator) take names exactly. {"to":A,"To":B} would be read
// as B here and A there. Refusing such objects removes the disagreement.
func checkJSONObject(data []byte) error {
	if !utf8.Valid(data) {
		return &PaymentError{Kind: ErrHeaderJSON, Reason: ReasonInvalidPayload, Problem: "is not valid UTF-8"}
	}
	v, err := strictjson.Decode(data, strictjson.Limits{FoldedNames: true})
	if err != nil {
		return &PaymentError{Kind: ErrHeaderJSON, Reason: ReasonInvalidPayload, Problem: problemOf(err)}
	}
	if _, ok := v.(map[string]any); !ok {
		return &PaymentError{Kind: ErrHeaderJSON, Reason: ReasonInvalidPayload, Problem: "is not a JSON object"}
	}
	return nil
}

// problemOf words a strictjson refusal as the problem of a payment; it
// names the place, never the content.
func problemOf(err error) string {
	var se *strictjson.Error
	if !errors.As(err, &se) {
		return "is not valid JSON"
	}
	switch {
	case strings.Contains(se.Problem, "more than once"):
		return "has duplicate member names"
	case se.Path == "":
		return "is not valid JSON: " + se.Problem
	}
	return "is not valid JSON at " + se.Path + ": " + se.Problem
}

// members splits a JSON object into its members by exact name. The caller has
// already checked the document with checkJSONObject, or gets an error here.
func members(raw json.RawMessage, field string) (map[string]json.RawMessage, error) {
	t := bytes.TrimLeft(raw, " \t\r\n")
	if len(t) == 0 || t[0] != '{' {
		return nil, invalid(field, "must be a JSON object")
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, invalid(field, "must be a JSON object")
	}
	return m, nil
}

// stringMember reads the required string member name of m.
func stringMember(m map[string]json.RawMessage, name, path string) (string, error) {
	raw, ok := m[name]
	if !ok {
		return "", invalid(path, "is required")
	}
	s, ok := unquote(raw)
	if !ok {
		return "", invalid(path, "must be a string")
	}
	if s == "" {
		return "", invalid(path, "must not be empty")
	}
	return s, nil
}

// optStringMember reads an optional string member; absent and null are "".
func optStringMember(m map[string]json.RawMessage, name, path string) (string, error) {
	raw, ok := m[name]
	if !ok || string(raw) == "null" {
		return "", nil
	}
	s, ok := unquote(raw)
	if !ok {
		return "", invalid(path, "must be a string")
	}
	return s, nil
}

// unquote decodes a JSON string value. Strings without escapes (almost all
// of them) are sliced rather than decoded; the document is already known to
// be valid UTF-8 JSON.
func unquote(raw json.RawMessage) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return "", false
	}
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw[1 : len(raw)-1]), true
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

// objectMember reads an optional JSON object member as a map; absent and
// null give nil.
func objectMember(m map[string]json.RawMessage, name, path string) (map[string]any, error) {
	raw, ok := m[name]
	if !ok || string(raw) == "null" {
		return nil, nil
	}
	if len(raw) == 0 || raw[0] != '{' {
		return nil, invalid(path, "must be a JSON object")
	}
	// UseNumber keeps numbers exactly as sent, so re-encoding the map
	// (to forward it to a facilitator) does not round them through float64.
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v map[string]any
	if err := dec.Decode(&v); err != nil {
		return nil, invalid(path, "must be a JSON object")
	}
	return v, nil
}
