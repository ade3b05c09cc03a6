package x402

import (
	"bytes"
	"encoding/json"
	"unicode"
	"unicode/utf8"
)

// checkJSONObject reports whether data is one UTF-8 JSON object whose
// objects, at every depth, have member names that stay distinct under Unicode
// case folding.
//
// Why case folding: encoding/json matches member names to struct fields
// case-insensitively and lets the last duplicate win, while JavaScript peers
// (the official facilitator) take names exactly. {"to":A,"To":B} would be read
// as B here and A there. Refusing such objects removes the disagreement.
func checkJSONObject(data []byte) error {
	if !utf8.Valid(data) {
		return &PaymentError{Kind: ErrHeaderJSON, Reason: ReasonInvalidPayload, Problem: "is not valid UTF-8"}
	}
	if !json.Valid(data) {
		return &PaymentError{Kind: ErrHeaderJSON, Reason: ReasonInvalidPayload, Problem: "is not valid JSON"}
	}
	if t := bytes.TrimLeft(data, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return &PaymentError{Kind: ErrHeaderJSON, Reason: ReasonInvalidPayload, Problem: "is not a JSON object"}
	}
	if !distinctKeys(data) {
		return &PaymentError{Kind: ErrHeaderJSON, Reason: ReasonInvalidPayload, Problem: "has duplicate member names"}
	}
	return nil
}

// distinctKeys scans valid JSON and reports whether no object repeats a
// member name (compared after case folding).
func distinctKeys(data []byte) bool {
	type frame struct {
		obj       bool
		expectKey bool
		keys      []string
		set       map[string]struct{}
	}
	var stack []frame
	for i := 0; i < len(data); {
		switch c := data[i]; c {
		case '{':
			stack = append(stack, frame{obj: true, expectKey: true})
			i++
		case '[':
			stack = append(stack, frame{})
			i++
		case '}', ']':
			stack = stack[:len(stack)-1]
			i++
		case ',':
			if top := &stack[len(stack)-1]; top.obj {
				top.expectKey = true
			}
			i++
		case '"':
			end, escaped := stringEnd(data, i)
			if len(stack) > 0 {
				if top := &stack[len(stack)-1]; top.obj && top.expectKey {
					top.expectKey = false
					var key string
					if escaped {
						if json.Unmarshal(data[i:end], &key) != nil {
							return false
						}
					} else {
						key = string(data[i+1 : end-1])
					}
					key = foldKey(key)
					if top.set != nil {
						if _, dup := top.set[key]; dup {
							return false
						}
						top.set[key] = struct{}{}
					} else {
						for _, k := range top.keys {
							if k == key {
								return false
							}
						}
						top.keys = append(top.keys, key)
						if len(top.keys) > 16 { // switch to a set: no quadratic scan on wide objects
							top.set = make(map[string]struct{}, 32)
							for _, k := range top.keys {
								top.set[k] = struct{}{}
							}
							top.keys = nil
						}
					}
				}
			}
			i = end
		default:
			i++
		}
	}
	return true
}

// stringEnd returns the index just past the closing quote of the JSON string
// starting at data[start] and whether it contains escapes. data is valid JSON.
func stringEnd(data []byte, start int) (int, bool) {
	escaped := false
	for i := start + 1; i < len(data); i++ {
		switch data[i] {
		case '\\':
			escaped = true
			i++
		case '"':
			return i + 1, escaped
		}
	}
	return len(data), escaped
}

// foldKey maps s to a representative of its case-folding class: every rune
// becomes the smallest rune of its simple-folding orbit (lower case for
// ASCII letters), the relation encoding/json uses to match names. "K", "k"
// and the Kelvin sign all become "k".
func foldKey(s string) string {
	ascii := true
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			ascii = false
			break
		}
	}
	if ascii {
		return toLowerASCII(s)
	}
	var b []rune
	for _, r := range s {
		m := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			if f < m {
				m = f
			}
		}
		if 'A' <= m && m <= 'Z' { // agree with the ASCII fast path
			m += 'a' - 'A'
		}
		b = append(b, m)
	}
	return string(b)
}

func toLowerASCII(s string) string {
	for i := 0; i < len(s); i++ {
		if 'A' <= s[i] && s[i] <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if 'A' <= b[j] && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
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
