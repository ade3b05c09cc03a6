package strictjson

// Cut locates one object member in a document: data[Start:End] is the
// member (its name, the colon and its value) with the comma that separates
// it from a neighbour, so the document without those bytes is the document
// without that member and with every other byte as it was sent. The zero
// Cut locates nothing.
type Cut struct{ Start, End int }

// DecodeCut is Decode that also locates the member at path, member names
// from the root object down (["params", "_meta", "x402/payment"] is
// params._meta["x402/payment"]); the Cut is zero when the document has no
// such member. It exists for a reader that must pass a document on without
// one member: encoding the decoded tree again would change what the rest
// says (a number a double cannot hold would be rounded), so the member's
// bytes are cut out of the document instead, located by this one parse.
// Member names are unique (Decode refuses duplicates), so the member is
// unambiguous.
func DecodeCut(data []byte, lim Limits, path []string) (any, Cut, error) {
	if len(path) == 0 {
		v, err := Decode(data, lim)
		return v, Cut{}, err
	}
	e, err := DecodeEnvelope(data, lim, path, nil)
	return e.Value, e.Cut, err
}

// Envelope is a document DecodeEnvelope read.
type Envelope struct {
	Value any // the document, as Decode reads it
	Cut   Cut // where the member at the cut path is (DecodeCut)
	// Data is the first refusal, nil for none, of a value below the data
	// path that Decode of the data alone would refuse for itself: a
	// number (an integer outside ±(2^53−1), a number a double cannot hold
	// or written too long), kept in Value as written; a string with an
	// unpaired surrogate escape, kept with U+FFFD in its place; an array
	// or object nesting past the limit, which counts the data value as
	// its level 1 (Limits.MaxDepth less the data path's length), nil in
	// Value. Its path is the document's.
	Data *Error
}

// DecodeEnvelope is DecodeCut for a document that carries another reader's
// data at dataPath (member names from the root object down, as for the
// cut path): a value below it that Decode would refuse for itself (a
// number, an unpaired surrogate escape, nesting too deep) does not refuse
// the document, since it is that reader's to refuse in its own terms (a
// JSON-RPC message whose tool arguments hold 1e400 is a readable message,
// and the tool's refusal is the answer to its call). Its refusal is
// Envelope.Data; everything else (syntax, duplicate names, invalid UTF-8)
// is refused as Decode refuses it, the data included, and the document
// outside the data keeps every limit.
func DecodeEnvelope(data []byte, lim Limits, cutPath, dataPath []string) (Envelope, error) {
	d := decoder{data: data, maxDepth: lim.MaxDepth, folded: lim.FoldedNames, cutPath: cutPath, dataPath: dataPath}
	v, err := d.run()
	if err != nil {
		return Envelope{}, err
	}
	return Envelope{Value: v, Cut: d.cut, Data: d.data1}, nil
}

// Remove returns a copy of data without the bytes c locates (data itself,
// not a copy, when c is zero).
func (c Cut) Remove(data []byte) []byte {
	if c.End == 0 {
		return data
	}
	out := make([]byte, 0, len(data)-(c.End-c.Start))
	out = append(out, data[:c.Start]...)
	return append(out, data[c.End:]...)
}

// atCut reports whether member k of the object whose path is d.path[:top]
// is the member DecodeCut locates.
func (d *decoder) atCut(top int, k string) bool {
	if top != len(d.cutPath)-1 || k != d.cutPath[top] {
		return false
	}
	for i, s := range d.path[:top] {
		if s.index >= 0 || s.key != d.cutPath[i] {
			return false
		}
	}
	return true
}

// markCut records the member from keyStart to valueEnd, d.pos being at the
// next token: with the comma after it when there is one, else with the
// comma before it (prevComma, -1 for none), else alone.
func (d *decoder) markCut(keyStart, valueEnd, prevComma int) {
	switch {
	case d.pos < len(d.data) && d.data[d.pos] == ',':
		d.cut = Cut{keyStart, d.pos + 1}
	case prevComma >= 0:
		d.cut = Cut{prevComma, valueEnd}
	default:
		d.cut = Cut{keyStart, valueEnd}
	}
}
