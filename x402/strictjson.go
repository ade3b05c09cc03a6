package x402

import (
	"encoding/json"
	"errors"
	"strings"
	"unicode/utf8"

	"github.com/aovhq/aov/strictjson"
)

// checkJSONObject reports whether data is one JSON object that strictjson
// accepts with FoldedNames: valid UTF-8, no byte-order mark, nothing after
// the value, and member names that stay distinct under case folding at
// every depth. It returns the object as strictjson read it (numbers as
// json.Number, exactly as sent) and each member's value as its bytes in
// data, so a caller reads the document from this one parse instead of
// parsing it again.
//
// Why case folding: encoding/json matches member names to struct fields
// case-insensitively and lets the last duplicate win, while JavaScript peers
// (the official facilitator) take names exactly. {"to":A,"To":B} would be read
// as B here and A there. Refusing such objects removes the disagreement.
func checkJSONObject(data []byte) (map[string]any, map[string][]byte, error) {
	if !utf8.Valid(data) {
		return nil, nil, &PaymentError{Kind: ErrHeaderJSON, Reason: ReasonInvalidPayload, Problem: "is not valid UTF-8"}
	}
	m, spans, err := strictjson.DecodeMembers(data, strictjson.Limits{FoldedNames: true})
	if err != nil {
		return nil, nil, &PaymentError{Kind: ErrHeaderJSON, Reason: ReasonInvalidPayload, Problem: problemOf(err)}
	}
	if m == nil {
		return nil, nil, &PaymentError{Kind: ErrHeaderJSON, Reason: ReasonInvalidPayload, Problem: "is not a JSON object"}
	}
	return m, spans, nil
}

// payloadBytes returns the bytes of the member "payload" of obj, a JSON
// object inside a document checkJSONObject accepted (nil when there is
// none, or obj is no object). The document was checked whole (valid UTF-8,
// member names distinct under case folding at every depth), so the one
// member encoding/json matches to "payload", case-insensitively, is the
// member spelt "payload" whenever the strict parse of obj has one, and a
// caller takes the bytes only then. It skips the other members' values
// without building them: checking obj again with checkJSONObject, only for
// these bytes, cost a second strict parse of the payment (a quarter of
// reading a facilitator request).
func payloadBytes(obj []byte) []byte {
	var m struct {
		Payload json.RawMessage `json:"payload"`
	}
	if json.Unmarshal(obj, &m) != nil {
		return nil
	}
	return m.Payload
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

// object is v, a member of a document checkJSONObject read, as an object.
func object(v any, field string) (map[string]any, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return nil, invalid(field, "must be a JSON object")
	}
	return m, nil
}

// stringMember reads the required string member name of m, the object at
// path (the member's own path is built only for a refusal).
func stringMember(m map[string]any, path, name string) (string, error) {
	v, ok := m[name]
	if !ok {
		return "", invalid(join(path, name), "is required")
	}
	s, ok := v.(string)
	if !ok {
		return "", invalid(join(path, name), "must be a string")
	}
	if s == "" {
		return "", invalid(join(path, name), "must not be empty")
	}
	return s, nil
}

// optStringMember reads an optional string member; absent and null are "".
func optStringMember(m map[string]any, path, name string) (string, error) {
	v, ok := m[name]
	if !ok || v == nil {
		return "", nil
	}
	s, ok := v.(string)
	if !ok {
		return "", invalid(join(path, name), "must be a string")
	}
	return s, nil
}

// objectMember reads an optional JSON object member; absent and null give
// nil. Its numbers are json.Number, exactly as sent, so re-encoding the map
// (to forward it to a facilitator) does not round them through float64.
func objectMember(m map[string]any, path, name string) (map[string]any, error) {
	v, ok := m[name]
	if !ok || v == nil {
		return nil, nil
	}
	return object(v, join(path, name))
}
