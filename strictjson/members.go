package strictjson

// DecodeMembers is Decode for a document that should be one object.
// Besides the object it returns each member's value as its bytes in data
// (a subslice, not a copy), so a caller that passes a member on byte for
// byte takes it from this one parse instead of parsing the document again.
// A valid document that is not an object gives a nil map, nil spans and no
// error.
func DecodeMembers(data []byte, lim Limits) (map[string]any, map[string][]byte, error) {
	spans := make(map[string][]byte)
	v, err := decode(data, lim, spans)
	if err != nil {
		return nil, nil, err
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, nil, nil
	}
	return m, spans, nil
}
