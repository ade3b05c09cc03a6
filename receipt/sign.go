package receipt

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
)

// VerifyBlock is the "verify" member of every signed response: it tells a
// reader where the public keys are and how the receipt was made, so a receipt
// can be checked by someone who has never heard of the service.
type VerifyBlock struct {
	PublicKeyURL     string `json:"public_key_url"`
	KeyVersion       string `json:"key_version"`
	Canonicalization string `json:"canonicalization"`
	HashAlgorithm    string `json:"hash_algorithm"`
	Service          string `json:"service"`
	MCP              string `json:"mcp"`
}

// Attestation is the "attestation" member of a signed response. Timestamp is
// the attested_at of the signed document (the same instant as verified_at);
// Signature is the standard base64 of the 64-byte Ed25519 signature.
type Attestation struct {
	Algorithm  string `json:"algorithm"`
	KeyVersion string `json:"key_version"`
	Timestamp  string `json:"timestamp"`
	Signature  string `json:"signature"`
}

// AppendJSON appends a as a JSON object, its members in declared order
// (the order encoding/json writes them in), its strings as AppendString
// writes them. certd's sign answer and the attestation verifierd attaches to
// a response are written with it, without encoding/json's reflection.
func (a Attestation) AppendJSON(b []byte) []byte {
	b = append(b, `{"algorithm":`...)
	b = AppendString(b, a.Algorithm)
	b = append(b, `,"key_version":`...)
	b = AppendString(b, a.KeyVersion)
	b = append(b, `,"timestamp":`...)
	b = AppendString(b, a.Timestamp)
	b = append(b, `,"signature":`...)
	b = AppendString(b, a.Signature)
	return append(b, '}')
}

// SigningInput returns the bytes an attestation signs: the RFC 8785 form of
// exactly {"context", "algorithm": "Ed25519", "key_version", "attested_at",
// "response"}. response is the JSON object of the whole response without its
// "attestation" member; one that still carries an attestation is refused,
// because signing it would sign a different document than anyone rebuilds.
//
// Binding the context makes a verification receipt useless as a score
// receipt and vice versa; binding key_version and attested_at stops a
// signature from being moved to another key or instant.
func SigningInput(context, keyVersion, attestedAt string, response []byte) ([]byte, error) {
	if context == "" || keyVersion == "" || attestedAt == "" {
		return nil, errors.New("building the signed document: context, key_version and attested_at are required")
	}
	buf, err := appendSigningPrefix(make([]byte, 0, len(response)+len(context)+len(keyVersion)+len(attestedAt)+96), context, keyVersion, attestedAt)
	if err != nil {
		return nil, err
	}
	start := len(buf)
	if buf, err = AppendCanonicalJSON(buf, response); err != nil {
		return nil, fmt.Errorf("building the signed document: response: %w", err)
	}
	canon := buf[start:]
	if canon[0] != '{' {
		return nil, errors.New("building the signed document: response is not a JSON object")
	}
	if hasTopLevelAttestation(canon) {
		return nil, errors.New("building the signed document: response already carries an attestation; sign the response without it")
	}
	return append(buf, '}'), nil
}

// SigningInputCanonical is SigningInput for a response its writer produced
// in RFC 8785 form already (verify.Result.AppendCanonical): the document is
// assembled around canonResponse as it stands, without a second canonical
// pass over it. The caller vouches for the form (the writer's tests hold it
// to AppendCanonicalJSON); certd still checks it (ParseSigningInput) when
// the input comes over its socket. A response that is not an object, or
// still carries an attestation, is refused as SigningInput refuses it.
func SigningInputCanonical(context, keyVersion, attestedAt string, canonResponse []byte) ([]byte, error) {
	return AppendSigningInputCanonical(nil, context, keyVersion, attestedAt, canonResponse)
}

// AppendSigningInputCanonical is SigningInputCanonical appending to dst,
// for a signer that reuses its buffer from one signature to the next.
func AppendSigningInputCanonical(dst []byte, context, keyVersion, attestedAt string, canonResponse []byte) ([]byte, error) {
	if len(canonResponse) < 2 || canonResponse[0] != '{' || canonResponse[len(canonResponse)-1] != '}' {
		return nil, errors.New("building the signed document: response is not a JSON object")
	}
	if hasTopLevelAttestation(canonResponse) {
		return nil, errors.New("building the signed document: response already carries an attestation; sign the response without it")
	}
	return appendSigningInputCanonical(dst, context, keyVersion, attestedAt, canonResponse)
}

// appendSigningInputCanonical assembles the five-key document around an
// already canonical response, appended to dst (nil: a buffer of the right
// size).
func appendSigningInputCanonical(dst []byte, context, keyVersion, attestedAt string, canonResponse []byte) ([]byte, error) {
	if context == "" || keyVersion == "" || attestedAt == "" {
		return nil, errors.New("building the signed document: context, key_version and attested_at are required")
	}
	if dst == nil {
		dst = make([]byte, 0, len(canonResponse)+len(context)+len(keyVersion)+len(attestedAt)+96)
	}
	buf, err := appendSigningPrefix(dst, context, keyVersion, attestedAt)
	if err != nil {
		return nil, err
	}
	buf = append(buf, canonResponse...)
	return append(buf, '}'), nil
}

// appendSigningPrefix writes the five-key document up to its response
// value. The keys are written in their RFC 8785 order (algorithm <
// attested_at < context < key_version < response).
func appendSigningPrefix(buf []byte, context, keyVersion, attestedAt string) ([]byte, error) {
	buf = append(buf, `{"algorithm":"`+Algorithm+`","attested_at":`...)
	var err error
	if buf, err = appendString(buf, attestedAt); err != nil {
		return nil, fmt.Errorf("building the signed document: attested_at: %w", err)
	}
	buf = append(buf, `,"context":`...)
	if buf, err = appendString(buf, context); err != nil {
		return nil, fmt.Errorf("building the signed document: context: %w", err)
	}
	buf = append(buf, `,"key_version":`...)
	if buf, err = appendString(buf, keyVersion); err != nil {
		return nil, fmt.Errorf("building the signed document: key_version: %w", err)
	}
	return append(buf, `,"response":`...), nil
}

// hasTopLevelAttestation reports whether a canonical JSON object has an
// "attestation" member at its top level. Canonical form has no whitespace, so
// a scan that tracks depth and strings is exact.
func hasTopLevelAttestation(canon []byte) bool {
	const key = `"attestation":`
	depth := 0
	for i := 0; i < len(canon); i++ {
		switch canon[i] {
		case '{', '[':
			depth++
		case '}', ']':
			depth--
		case '"':
			// At depth 1 right after '{' or ',' a string is a key.
			if depth == 1 && (canon[i-1] == '{' || canon[i-1] == ',') && bytes.HasPrefix(canon[i:], []byte(key)) {
				return true
			}
			i = stringEnd(canon, i)
		}
	}
	return false
}

// stringEnd returns the index of the quote that closes the string opened by
// the quote at b[open], or len(b) when none does. Most of a response is
// strings, so they are skipped a quote at a time (bytes.IndexByte), not a
// byte at a time: a quote closes the string unless an odd run of
// backslashes escapes it.
func stringEnd(b []byte, open int) int {
	for from := open + 1; ; {
		k := bytes.IndexByte(b[from:], '"')
		if k < 0 {
			return len(b)
		}
		q := from + k
		escapes := 0
		for p := q - 1; p > open && b[p] == '\\'; p-- {
			escapes++
		}
		if escapes%2 == 0 {
			return q
		}
		from = q + 1
	}
}

// Sign signs response (a JSON object without "attestation") under context
// with priv and returns the attestation to attach. Only certd holds private
// keys; other callers use its signing protocol, which ends here.
func Sign(priv ed25519.PrivateKey, context, keyVersion, attestedAt string, response []byte) (Attestation, error) {
	if len(priv) != ed25519.PrivateKeySize {
		return Attestation{}, fmt.Errorf("signing: private key is %d bytes, want %d", len(priv), ed25519.PrivateKeySize)
	}
	msg, err := SigningInput(context, keyVersion, attestedAt, response)
	if err != nil {
		return Attestation{}, fmt.Errorf("signing: %w", err)
	}
	sig := ed25519.Sign(priv, msg)
	return Attestation{
		Algorithm:  Algorithm,
		KeyVersion: keyVersion,
		Timestamp:  attestedAt,
		Signature:  base64.StdEncoding.EncodeToString(sig),
	}, nil
}

// SigningDocument is a signing input taken apart: what ParseSigningInput
// found in the five-key document a signer was sent.
type SigningDocument struct {
	Context    string
	KeyVersion string
	AttestedAt string
	// Response is the canonical response object, a subslice of the input.
	Response []byte
}

// ParseSigningInput accepts msg only when it is exactly what SigningInput
// builds: RFC 8785 canonical bytes (checked by parsing once and comparing
// with the canonical form) of the five-key object with algorithm Ed25519,
// a context of this service, a key version and an attested_at free of
// escapes, and a response object without an attestation member. A signer
// can then sign msg as it stands: whoever rebuilds the document from the
// response gets the same bytes.
func ParseSigningInput(msg []byte) (SigningDocument, error) {
	var d SigningDocument
	if !IsCanonical(msg) {
		return d, &SigningInputError{Problem: "is not in RFC 8785 canonical form"}
	}
	rest, ok := bytes.CutPrefix(msg, []byte(`{"algorithm":"`+Algorithm+`"`))
	if !ok {
		return d, &SigningInputError{Field: "algorithm", Problem: "is not the first member, or not " + Algorithm}
	}
	if rest, ok = bytes.CutPrefix(rest, []byte(`,"attested_at":`)); !ok {
		return d, &SigningInputError{Field: "attested_at", Problem: "is not the member after algorithm (missing, or a member is extra)"}
	}
	var err error
	if d.AttestedAt, rest, err = plainMember(rest, "attested_at", `,"context":`); err != nil {
		return d, err
	}
	if d.Context, rest, err = plainMember(rest, "context", `,"key_version":`); err != nil {
		return d, err
	}
	if d.Context != ContextVerify && d.Context != ContextScore {
		return d, &SigningInputError{Field: "context", Problem: "is not a signing context of this service"}
	}
	if d.KeyVersion, rest, err = plainMember(rest, "key_version", `,"response":`); err != nil {
		return d, err
	}
	// The document is canonical and "response" sorts last of the five
	// keys, so the response is everything up to the final '}', provided it
	// is one object and no member follows it.
	if len(rest) < 3 || rest[0] != '{' || objectEnd(rest) != len(rest)-1 {
		return d, &SigningInputError{Field: "response", Problem: "is not a JSON object, or members follow it"}
	}
	d.Response = rest[:len(rest)-1]
	if hasTopLevelAttestation(d.Response) {
		return d, &SigningInputError{Field: "response", Problem: "already carries an attestation"}
	}
	return d, nil
}

// CheckTimes refuses a signing document whose response states a time of
// its own that Verify would refuse with this attested_at (verified_at,
// computed_at, inputs.window.to), or a score's evidence dated after it at
// all (Verify allows MaxSigningSkew, for receipts signed before the score
// left such evidence out; nothing signed now has any): certd pins
// attested_at to its clock, and without this whoever reaches it
// (verifierd, which parses untrusted input) could have a score "computed"
// years ahead signed today, under either context. The member at fault is
// reported as "response". Response must be in RFC 8785 form, as
// ParseSigningInput has checked: only the members that state times are
// read (the in-process signer, which builds the document itself, runs the
// same check on every signature).
func (d SigningDocument) CheckTimes() error {
	at, err := ParseTime(d.AttestedAt)
	if err != nil {
		return &SigningInputError{Field: "attested_at", Problem: "is not an RFC 3339 time"}
	}
	t, err := canonicalTimes(d.Response)
	if err != nil {
		return &SigningInputError{Field: "response", Problem: err.Error()}
	}
	if err := checkTimes(t, d.Context, d.AttestedAt, at, 0); err != nil {
		return &SigningInputError{Field: "response", Problem: "states a time verifiers refuse: " + err.Error()}
	}
	return nil
}

// SigningInputError says why ParseSigningInput refused a document: the
// member at fault ("" for the document as a whole) and the problem.
type SigningInputError struct {
	Field   string
	Problem string
}

func (e *SigningInputError) Error() string {
	if e.Field == "" {
		return "signing input " + e.Problem
	}
	return "signing input's " + e.Field + " " + e.Problem
}

// plainMember reads the value of member name: a canonical string without
// escapes at the start of b, followed by next. The three strings of a
// signing document (a context, a key version, an RFC 3339 time) never need
// escapes.
func plainMember(b []byte, name, next string) (string, []byte, error) {
	bad := func(problem string) (string, []byte, error) {
		return "", nil, &SigningInputError{Field: name, Problem: problem}
	}
	if len(b) == 0 || b[0] != '"' {
		return bad("is not a string")
	}
	end := bytes.IndexByte(b[1:], '"') + 1
	if end == 0 {
		return bad("is not a string")
	}
	s := b[1:end]
	if len(s) == 0 {
		return bad("is empty")
	}
	if bytes.IndexByte(s, '\\') >= 0 {
		return bad("has escapes")
	}
	rest, ok := bytes.CutPrefix(b[end+1:], []byte(next))
	if !ok {
		return bad("is not followed by " + next[1:] + " (a member is missing or extra)")
	}
	return string(s), rest, nil
}

// objectEnd returns the length of the canonical JSON object or array at the
// start of b (up to and including its closing bracket), or -1.
func objectEnd(b []byte) int {
	depth := 0
	for i := 0; i < len(b); i++ {
		switch b[i] {
		case '{', '[':
			depth++
		case '}', ']':
			if depth--; depth == 0 {
				return i + 1
			}
		case '"':
			i = stringEnd(b, i)
		}
	}
	return -1
}
