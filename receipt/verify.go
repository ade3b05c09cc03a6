package receipt

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ErrSignature reports a signature that does not verify: the receipt was
// changed after signing, or was signed by another key or under another
// context.
var ErrSignature = errors.New("signature does not match")

// NoKeyError reports a receipt whose key_version the key set does not hold.
type NoKeyError struct {
	KeyVersion string
	Known      []string // versions the set does hold
}

// maxKnownListed caps the versions NoKeyError lists: they come from the
// card, which may be hostile, and the message ends up on a terminal.
const maxKnownListed = 10

func (e *NoKeyError) Error() string {
	msg := "no public key for key_version " + quoteShort(e.KeyVersion)
	if len(e.Known) > 0 {
		known := e.Known[:min(len(e.Known), maxKnownListed)]
		quoted := make([]string, len(known))
		for i, v := range known {
			quoted[i] = quoteShort(v)
		}
		msg += " (the keys given are " + strings.Join(quoted, ", ")
		if more := len(e.Known) - len(known); more > 0 {
			msg += fmt.Sprintf(", ... (+%d more)", more)
		}
		msg += ")"
	}
	return msg
}

// CompromisedKeyError reports a receipt signed by a key the card marks
// compromised, dated at or after the moment of compromise.
type CompromisedKeyError struct {
	KeyVersion string
	Since      time.Time // zero: compromised from the start
	Timestamp  string
}

func (e *CompromisedKeyError) Error() string {
	if e.Since.IsZero() {
		return fmt.Sprintf("key %s is marked compromised with no start time, so none of its receipts is trusted", quoteShort(e.KeyVersion))
	}
	return fmt.Sprintf("key %s is marked compromised since %s and this receipt is dated %s", quoteShort(e.KeyVersion), e.Since.UTC().Format(time.RFC3339), quoteShort(e.Timestamp))
}

// MaxSigningSkew is the furthest a signer may date a receipt from its own
// clock: certd refuses an attested_at further than its -max-skew from its
// clock, and refuses a -max-skew above this. So a receipt dated more than
// this after its key was retired, or before it was created, was not signed
// while the key was in service.
const MaxSigningSkew = 5 * time.Minute

// KeyLifetimeError reports a receipt dated outside its key's service life
// (as the card publishes it, widened by MaxSigningSkew): certd never signs
// with a retired key, so such a receipt was made with the key after it left
// service, by whoever still had it.
type KeyLifetimeError struct {
	KeyVersion string
	Created    time.Time // zero: not published
	Retired    time.Time // zero: not retired
	Timestamp  string
}

func (e *KeyLifetimeError) Error() string {
	if !e.Retired.IsZero() {
		return fmt.Sprintf("key %s was retired at %s and this receipt is dated %s, after it left service", quoteShort(e.KeyVersion), e.Retired.UTC().Format(time.RFC3339), quoteShort(e.Timestamp))
	}
	return fmt.Sprintf("key %s was created at %s and this receipt is dated %s, before it existed", quoteShort(e.KeyVersion), e.Created.UTC().Format(time.RFC3339), quoteShort(e.Timestamp))
}

// HashMismatch is one member of a receipt that differs from what the data
// the holder kept gives: a hash (CheckHashes), or a request member the
// receipt states (CheckRequest).
type HashMismatch struct {
	// Field is "output_hash", "schema_hash", "rules_hash", "request_hash",
	// or "task_id", "agent_id", "strict_content_check", "enforce_rules".
	Field string
	// Receipt and Want are the two values as printed: a hash as it is
	// (quoted when it holds anything else than plain characters), a
	// request member as JSON text with every non-ASCII character escaped.
	Receipt string
	Want    string
}

func (m HashMismatch) Error() string {
	return fmt.Sprintf("%s differs: receipt has %s, request gives %s", m.Field, m.Receipt, m.Want)
}

// HashesError lists every member that did not match.
type HashesError struct{ Mismatches []HashMismatch }

func (e *HashesError) Error() string {
	parts := make([]string, len(e.Mismatches))
	for i, m := range e.Mismatches {
		parts[i] = m.Error()
	}
	return strings.Join(parts, "; ")
}

// Unwrap exposes each mismatch to errors.As.
func (e *HashesError) Unwrap() []error {
	errs := make([]error, len(e.Mismatches))
	for i, m := range e.Mismatches {
		errs[i] = m
	}
	return errs
}

// Verified describes a receipt that holds.
type Verified struct {
	Context    string // the context it was verified under
	KeyVersion string
	Timestamp  string
}

// VerifyReceipt checks the attestation of a full or compact response (the
// JSON object as received, attestation included) against keys. It is
// Verify without the details.
func VerifyReceipt(resp []byte, keys KeySet, context string) error {
	_, err := Verify(resp, keys, context)
	return err
}

// Verify checks the attestation of a response and reports under which
// context and key it holds.
//
// With context "" the context is inferred from the response kind: a
// response with an output_hash member is a verification (every full and
// compact verification result carries one; a trust score has nothing to
// hash) and gets ContextVerify; anything else gets ContextScore. The context
// is inside the signed document, so a wrong guess can only make a genuine
// receipt fail, never make a forged one pass; pass the context explicitly to
// get a sharper error.
//
// Beyond the signature it checks what a reader would otherwise trust
// without proof: attestation.algorithm is Ed25519, attestation.key_version
// equals verify.key_version, attestation.timestamp is the same instant as
// verified_at, computed_at and inputs.window.to wherever the response has
// them, whatever the context (under ContextScore computed_at must be there:
// every trust score carries it, the time the score is of), no evidence date
// of a score (inputs.window.from, oldest_evidence_at, newest_evidence_at)
// is more than MaxSigningSkew after it (see checkTimes), the key
// is not marked compromised at the receipt's timestamp, and the timestamp
// lies within the key's service life as the card publishes it (createdAt to
// retiredAt, each widened by MaxSigningSkew).
//
// About retired keys: a retired key's receipts stay valid, but only those
// dated while it was in service. certd never signs with a retired key, so a
// later date means someone signed with a copy of it (an old backup, a
// decommissioned machine); refusing those makes a leaked retired key worth
// nothing without the operator having to notice the leak.
//
// About compromised keys: a card entry with status "compromised" and a
// compromisedSince time rejects receipts dated at or after that time and
// accepts earlier ones, because the card vouches for the key until then.
// The timestamp is signed but chosen by whoever holds the key, so a thief
// can backdate; operators should set compromisedSince to the earliest
// moment the key could have leaked. An entry marked compromised without a
// time rejects every receipt of that key.
func Verify(resp []byte, keys KeySet, context string) (Verified, error) {
	doc, err := decodeResponse(resp)
	if err != nil {
		return Verified{}, err
	}
	att, err := attestationOf(doc)
	if err != nil {
		return Verified{}, err
	}
	delete(doc, "attestation")

	if context == "" {
		context = InferContext(doc)
	}
	if raw, present := doc["verify"]; present {
		vb, ok := raw.(map[string]any)
		if !ok {
			return Verified{}, errors.New("verify is not an object")
		}
		kv, _ := vb["key_version"].(string)
		if kv != att.KeyVersion {
			return Verified{}, fmt.Errorf("attestation.key_version %s differs from verify.key_version %s", quoteShort(att.KeyVersion), quoteShort(kv))
		}
	}
	at, err := ParseTime(att.Timestamp)
	if err != nil {
		return Verified{}, fmt.Errorf("attestation.timestamp %s is not an RFC 3339 time", quoteShort(att.Timestamp))
	}
	if err := checkTimes(timesOf(doc), context, att.Timestamp, at, MaxSigningSkew); err != nil {
		return Verified{}, err
	}

	k, err := keys.lookup(att.KeyVersion)
	if err != nil {
		return Verified{}, err
	}
	if k.compromised && (k.since.IsZero() || !at.Before(k.since)) {
		return Verified{}, &CompromisedKeyError{KeyVersion: att.KeyVersion, Since: k.since, Timestamp: att.Timestamp}
	}
	if !k.retired.IsZero() && at.After(k.retired.Add(MaxSigningSkew)) {
		return Verified{}, &KeyLifetimeError{KeyVersion: att.KeyVersion, Created: k.created, Retired: k.retired, Timestamp: att.Timestamp}
	}
	if !k.created.IsZero() && at.Before(k.created.Add(-MaxSigningSkew)) {
		return Verified{}, &KeyLifetimeError{KeyVersion: att.KeyVersion, Created: k.created, Timestamp: att.Timestamp}
	}

	canon, err := AppendCanonical(nil, doc)
	if err != nil {
		return Verified{}, fmt.Errorf("receipt: %w", err)
	}
	msg, err := appendSigningInputCanonical(nil, context, att.KeyVersion, att.Timestamp, canon)
	if err != nil {
		return Verified{}, fmt.Errorf("receipt: %w", err)
	}
	if !verifySignature(k.pub, msg, att.sig) {
		return Verified{}, ErrSignature
	}
	return Verified{Context: context, KeyVersion: att.KeyVersion, Timestamp: att.Timestamp}, nil
}

// verifySignature is RFC 8032 Ed25519 verification as crypto/ed25519 does
// it: S must be canonical (S < L, so signatures are not malleable), R and
// the public key must decode, and the check is the cofactorless equation.
// Lengths are checked here because ed25519.Verify panics on a short key.
func verifySignature(pub, msg, sig []byte) bool {
	if len(pub) != ed25519.PublicKeySize || len(sig) != ed25519.SignatureSize {
		return false
	}
	return ed25519.Verify(pub, msg, sig)
}

// InferContext reports the signing context a response was made under,
// judged by its shape: ContextVerify when it has an output_hash member,
// ContextScore otherwise (see Verify).
func InferContext(doc map[string]any) string {
	if _, ok := doc["output_hash"]; ok {
		return ContextVerify
	}
	return ContextScore
}

// maxReceiptBytes bounds what Verify and CheckHashes parse; real receipts
// are a few kilobytes, full ones with capped lists well under a megabyte.
const maxReceiptBytes = 8 << 20

// decodeResponse parses a response strictly: JCS rules first (no duplicate
// keys, valid UTF-8, no lone surrogates), so that what is checked is exactly
// what was signed and a reader can never see a different duplicate member.
func decodeResponse(resp []byte) (map[string]any, error) {
	if len(resp) > maxReceiptBytes {
		return nil, fmt.Errorf("receipt is larger than %d bytes", maxReceiptBytes)
	}
	if _, err := Canonicalize(resp); err != nil {
		return nil, fmt.Errorf("receipt is not valid JSON for RFC 8785: %w", err)
	}
	return decodeObject(resp)
}

// decodeObject decodes a JSON object, its numbers as json.Number, as
// Verify reads a receipt, after decodeResponse's RFC 8785 checks.
func decodeObject(resp []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(resp))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("receipt is not valid JSON: %w", err)
	}
	doc, ok := v.(map[string]any)
	if !ok {
		return nil, errors.New("receipt is not a JSON object")
	}
	return doc, nil
}

type parsedAttestation struct {
	Attestation
	sig []byte
}

func attestationOf(doc map[string]any) (parsedAttestation, error) {
	raw, ok := doc["attestation"]
	if !ok {
		return parsedAttestation{}, errors.New("receipt has no attestation")
	}
	a, sig, err := ReadAttestation(raw)
	if err != nil {
		return parsedAttestation{}, fmt.Errorf("attestation%w", err)
	}
	return parsedAttestation{Attestation: a, sig: sig}, nil
}

// ReadAttestation reads an attestation, decoded from JSON, as every
// verifier reads it: the four members by their exact names (encoding/json's
// struct matching would also take "Signature", the last one winning), each
// a non-empty string, the algorithm Ed25519, and the signature with
// DecodeSignature, whose bytes it returns. It is the one reader of an
// attestation: Verify's, and the signer client's of certd's answer, so
// that verifierd never attaches (or charges for) one a verifier refuses.
// It refuses any other member: the attestation is the one part of a
// receipt the signature does not cover, so a member there ("verified":
// true, a second key URL) is text a holder added that a reader may take for
// the service's. Its errors read after the name of what was read: " is not
// an object", ".signature is not standard base64".
func ReadAttestation(v any) (Attestation, []byte, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return Attestation{}, nil, errors.New(" is not an object")
	}
	for name := range m {
		switch name {
		case "algorithm", "key_version", "timestamp", "signature":
		default:
			return Attestation{}, nil, fmt.Errorf(" has a member %s, which is not signed and not one of algorithm, key_version, timestamp, signature", quoteShort(name))
		}
	}
	var a Attestation
	for _, f := range []struct {
		name string
		dst  *string
	}{
		{"algorithm", &a.Algorithm},
		{"key_version", &a.KeyVersion},
		{"timestamp", &a.Timestamp},
		{"signature", &a.Signature},
	} {
		s, ok := m[f.name].(string)
		if !ok || s == "" {
			return Attestation{}, nil, fmt.Errorf(".%s is missing or not a string", f.name)
		}
		*f.dst = s
	}
	if a.Algorithm != Algorithm {
		return Attestation{}, nil, fmt.Errorf(".algorithm is %s, want %s", quoteShort(a.Algorithm), Algorithm)
	}
	sig, err := DecodeSignature(a.Signature)
	if err != nil {
		return Attestation{}, nil, fmt.Errorf(".signature %w", err)
	}
	return a, sig, nil
}

// DecodeSignature decodes attestation.signature: the standard padded base64
// of 64 bytes, with no stray pad bits and no line break. It is the one
// reader of a signature, for Verify and for the signer client that takes
// certd's answer: a signature encoding/base64's lax decoder takes and other
// readers refuse would make verifierd hand out, and bill for, a receipt that
// nobody else can verify. Errors read after "attestation.signature".
func DecodeSignature(s string) ([]byte, error) {
	sig, err := decodeStdBase64(s)
	if err != nil {
		return nil, errors.New("is not standard base64")
	}
	if len(sig) != ed25519.SignatureSize {
		return nil, fmt.Errorf("is %d bytes, want %d", len(sig), ed25519.SignatureSize)
	}
	return sig, nil
}

// CheckHashes compares the hashes a response carries with hashes recomputed
// from the data the holder kept (verify.ComputeHashes of the request body).
// output_hash, schema_hash and rules_hash must be present and equal;
// request_hash is compared only when the response carries it (compact
// responses do not) and want has one. Every mismatch is reported, as a
// *HashesError.
//
// CheckHashes does not check the signature: call VerifyReceipt too. To
// know that a receipt is about a request, use CheckRequest.
func CheckHashes(resp []byte, want Hashes) error {
	doc, err := decodeResponse(resp)
	if err != nil {
		return err
	}
	bad, err := hashMismatches(doc, want)
	if err != nil {
		return err
	}
	if len(bad) > 0 {
		return &HashesError{Mismatches: bad}
	}
	return nil
}

// Expected is what a verification receipt must state about the request
// the holder kept (verify.ComputeExpected of its body): its hashes, and the
// request members the receipt carries.
type Expected struct {
	Hashes
	TaskID             string
	AgentID            *string // nil: null
	StrictContentCheck bool
	EnforceRules       bool
}

// CheckRequest is CheckHashes, and also task_id, agent_id,
// strict_content_check and enforce_rules must be present and equal the
// request's. A compact receipt has no request_hash, and its other hashes
// cover none of these four: without them, a compact receipt made with
// enforce_rules false (rule violations only warned about) would pass for a
// request that enforced its rules, or for another task or agent.
func CheckRequest(resp []byte, want Expected) error {
	doc, err := decodeResponse(resp)
	if err != nil {
		return err
	}
	bad, err := hashMismatches(doc, want.Hashes)
	if err != nil {
		return err
	}
	var agent any
	if want.AgentID != nil {
		agent = *want.AgentID
	}
	for _, f := range []struct {
		name string
		want any
	}{
		{"task_id", want.TaskID},
		{"agent_id", agent},
		{"strict_content_check", want.StrictContentCheck},
		{"enforce_rules", want.EnforceRules},
	} {
		got, present := doc[f.name]
		if !present {
			return fmt.Errorf("receipt has no %s", f.name)
		}
		if got != f.want {
			bad = append(bad, HashMismatch{Field: f.name, Receipt: memberText(got), Want: memberText(f.want)})
		}
	}
	if len(bad) > 0 {
		return &HashesError{Mismatches: bad}
	}
	return nil
}

// memberText prints a decoded string, boolean or null member as JSON text,
// escaping everything but printable ASCII (a receipt's strings come from
// whoever made it) and cutting it short.
func memberText(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case bool:
		return strconv.FormatBool(v)
	case string:
		if len(v) > 80 {
			return strconv.QuoteToASCII(v[:80]) + "…"
		}
		return strconv.QuoteToASCII(v)
	default:
		return fmt.Sprintf("a %T", v)
	}
}

// hashMismatches is CheckHashes's comparison on a decoded response.
func hashMismatches(doc map[string]any, want Hashes) ([]HashMismatch, error) {
	var bad []HashMismatch
	for _, f := range []struct {
		name, want string
		optional   bool
	}{
		{"output_hash", want.Output, false},
		{"schema_hash", want.Schema, false},
		{"rules_hash", want.Rules, false},
		{"request_hash", want.Request, true},
	} {
		raw, present := doc[f.name]
		if !present {
			if f.optional {
				continue
			}
			return nil, fmt.Errorf("receipt has no %s", f.name)
		}
		got, ok := raw.(string)
		if !ok {
			return nil, fmt.Errorf("receipt's %s is not a string", f.name)
		}
		if f.want == "" {
			if f.optional {
				continue
			}
			return nil, fmt.Errorf("no %s was computed to compare with", f.name)
		}
		if got != f.want {
			bad = append(bad, HashMismatch{Field: f.name, Receipt: quoteShort(got), Want: f.want})
		}
	}
	return bad, nil
}

// quoteShort renders a value taken from a receipt for an error message:
// bare when it is short plain text, otherwise quoted and cut, so that a
// hostile receipt cannot put control characters or megabytes into logs.
func quoteShort(s string) string {
	const limit = 80
	plain := len(s) <= limit && s != ""
	for i := 0; plain && i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f || c == '"' || c == '\\' {
			plain = false
		}
	}
	if plain {
		return s
	}
	if len(s) > limit {
		return fmt.Sprintf("%q…", s[:limit])
	}
	return fmt.Sprintf("%q", s)
}

// ParseTime reads a time of a receipt or an agent card (attestation.timestamp,
// verified_at, computed_at, createdAt, retiredAt, compromisedSince): RFC 3339, in the one
// form it is written, YYYY-MM-DDThh:mm:ss, an optional fraction after a
// period, then Z or ±hh:mm. time.Parse alone also takes a one-digit hour, a
// comma before the fraction and offsets of +24:00 or 60 minutes, which
// other readers refuse; a receipt this package verifies must verify by hand
// too (README, "By hand, step by step"). A fraction of more than 9 digits is
// cut to the nanosecond, as time.Parse does. certd signs no attested_at
// this refuses.
func ParseTime(s string) (time.Time, error) {
	if !rfc3339Form(s) {
		return time.Time{}, errors.New("not an RFC 3339 time")
	}
	return time.Parse(time.RFC3339Nano, s)
}

// rfc3339Form reports whether s has ParseTime's form; the ranges of the
// date and time fields are time.Parse's to check.
func rfc3339Form(s string) bool {
	const form = "dddd-dd-ddTdd:dd:dd"
	digit := func(c byte) bool { return c >= '0' && c <= '9' }
	if len(s) <= len(form) {
		return false
	}
	for i := range len(form) {
		if form[i] == 'd' && !digit(s[i]) || form[i] != 'd' && s[i] != form[i] {
			return false
		}
	}
	s = s[len(form):]
	if s[0] == '.' {
		i := 1
		for i < len(s) && digit(s[i]) {
			i++
		}
		if i == 1 {
			return false
		}
		s = s[i:]
	}
	if s == "Z" {
		return true
	}
	return len(s) == 6 && (s[0] == '+' || s[0] == '-') && s[3] == ':' &&
		digit(s[1]) && digit(s[2]) && digit(s[4]) && digit(s[5]) &&
		(s[1]-'0')*10+s[2]-'0' < 24 && (s[4]-'0')*10+s[5]-'0' < 60
}

// decodeStdBase64 decodes strict standard base64 (padded, no stray bits)
// with no line break: encoding/base64 skips CR and LF even in strict mode,
// so a signature or key with one inside would read as the same bytes here
// and be refused by other readers.
func decodeStdBase64(s string) ([]byte, error) {
	if strings.ContainsAny(s, "\r\n") {
		return nil, errors.New("line break in base64")
	}
	return base64.StdEncoding.Strict().DecodeString(s)
}
