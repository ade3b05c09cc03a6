package walletauth

import (
	"crypto/ecdsa"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ethereum/go-ethereum/accounts"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/strictjson"
)

// HeaderName is the request header that carries an Envelope.
const HeaderName = "X-Wallet-Auth"

// Fixed values of the format.
const (
	// Version is the EIP-4361 message version, the only one there is.
	Version = "1"
	// TypeEIP191 is an EIP-191 personal_sign signature by an EVM account
	// (or, through EIP-1271, by a contract account's owner).
	TypeEIP191 = "eip191"
	// DefaultMaxLifetime bounds expiration_time − issued_at unless the
	// verifier is configured otherwise: a stolen header is useless soon.
	DefaultMaxLifetime = 5 * time.Minute
	// DefaultClockSkew is how far a client's clock may run ahead of ours.
	DefaultClockSkew = 30 * time.Second
	// MaxHeaderBytes caps an encoded header; a real one is under 1.5 KiB.
	MaxHeaderBytes = 8 << 10
	// MaxAgentIDChars is the agent_id limit of the verification request
	// (SPEC §3), so any agent that can be verified can be bound.
	MaxAgentIDChars = store.MaxAgentIDChars
)

// Envelope is the decoded X-Wallet-Auth header: the EIP-4361 fields of the
// signed message, the request it is for, and the signature. See the package
// documentation for the wire form and the signed text.
type Envelope struct {
	Domain         string `json:"domain"`
	Address        string `json:"address"`
	URI            string `json:"uri"`
	Version        string `json:"version"`
	ChainID        string `json:"chain_id"`
	Nonce          string `json:"nonce"`
	IssuedAt       string `json:"issued_at"`
	ExpirationTime string `json:"expiration_time"`
	NotBefore      string `json:"not_before,omitempty"`
	Statement      string `json:"statement,omitempty"`
	Method         string `json:"method"`
	Path           string `json:"path"`
	AgentID        string `json:"agent_id,omitempty"`
	Type           string `json:"type"`
	Signature      string `json:"signature"`
}

// envelopeFields lists the members of the JSON object: required ones true.
// Anything else is refused, so one header cannot mean two things.
var envelopeFields = map[string]bool{
	"domain": true, "address": true, "uri": true, "version": true,
	"chain_id": true, "nonce": true, "issued_at": true, "expiration_time": true,
	"not_before": false, "statement": false, "method": true, "path": true,
	"agent_id": false, "type": true, "signature": true,
}

func (e *Envelope) field(name string) *string {
	switch name {
	case "domain":
		return &e.Domain
	case "address":
		return &e.Address
	case "uri":
		return &e.URI
	case "version":
		return &e.Version
	case "chain_id":
		return &e.ChainID
	case "nonce":
		return &e.Nonce
	case "issued_at":
		return &e.IssuedAt
	case "expiration_time":
		return &e.ExpirationTime
	case "not_before":
		return &e.NotBefore
	case "statement":
		return &e.Statement
	case "method":
		return &e.Method
	case "path":
		return &e.Path
	case "agent_id":
		return &e.AgentID
	case "type":
		return &e.Type
	case "signature":
		return &e.Signature
	}
	return nil
}

// Parse decodes an X-Wallet-Auth value and checks the syntax of every field
// (not the signature, the time or the request: see Verifier). The value
// must be standard padded base64 of one JSON object with exactly the
// members of Envelope, all strings, without duplicate names. Errors are
// *Error of kind ErrMalformed.
func Parse(header string) (*Envelope, error) {
	obj, err := decodeObject(HeaderName, header)
	if err != nil {
		return nil, err
	}
	e := new(Envelope)
	for name, v := range obj {
		dst := e.field(name)
		if dst == nil {
			return nil, malformed(HeaderName, "", "has an unknown member", "Send only the members of the X-Wallet-Auth format.")
		}
		s, ok := v.(string)
		if !ok {
			return nil, malformed(HeaderName, name, "is not a string", "Send every member as a JSON string.")
		}
		*dst = s
	}
	for name, required := range envelopeFields {
		if _, ok := obj[name]; required && !ok {
			return nil, malformed(HeaderName, name, "is missing", "Include every required member.")
		}
	}
	if err := e.check(); err != nil {
		return nil, err
	}
	return e, nil
}

// decodeObject undoes the base64 and JSON layers of a header strictly.
func decodeObject(header, value string) (map[string]any, error) {
	if value == "" {
		return nil, malformed(header, "", "is empty", "Send a signed proof.")
	}
	if len(value) > MaxHeaderBytes {
		return nil, malformed(header, "", fmt.Sprintf("is longer than %d bytes", MaxHeaderBytes), "Send a proof of the documented format.")
	}
	for i := 0; i < len(value); i++ {
		c := value[i]
		if !('A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '+' || c == '/' || c == '=') {
			return nil, malformed(header, "", "is not standard base64", "Encode the JSON with standard base64 (A–Z a–z 0–9 + /, with = padding).")
		}
	}
	raw, err := base64.StdEncoding.Strict().DecodeString(value)
	if err != nil {
		return nil, malformed(header, "", "is not standard base64", "Encode the JSON with standard base64 (A–Z a–z 0–9 + /, with = padding).")
	}
	v, err := strictjson.Decode(raw, strictjson.Limits{MaxDepth: 4})
	if err != nil {
		return nil, malformed(header, "", "is not one well-formed JSON object", "Encode exactly one JSON object, without duplicate member names.")
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, malformed(header, "", "is not a JSON object", "Encode exactly one JSON object.")
	}
	return obj, nil
}

func malformed(header, field, problem, fix string) *Error {
	return refuse(ErrMalformed, header, field, problem, fix)
}

var (
	nonceRE   = regexp.MustCompile(`^[A-Za-z0-9]{16,128}$`)
	methodRE  = regexp.MustCompile(`^[A-Z]{1,16}$`)
	chainIDRE = regexp.MustCompile(`^eip155:[1-9][0-9]{0,31}$`)
	// authority is host[:port] with a DNS name, IPv4 address or bracketed
	// IPv6 address: what a Host header holds.
	authorityRE = regexp.MustCompile(`^(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]{2,45}\])(?::[0-9]{1,5})?$`)
)

// check validates the syntax of every field.
func (e *Envelope) check() error {
	h := HeaderName
	if !authorityRE.MatchString(e.Domain) {
		return malformed(h, "domain", "is not a host name with an optional port", "Set domain to the host the request is sent to.")
	}
	solana := IsSolanaChain(e.ChainID)
	if solana {
		if err := checkSolanaWallet(h, e.Address, e.Type, e.Signature); err != nil {
			return err
		}
	} else if err := checkAddress(h, e.Address); err != nil {
		return err
	}
	if e.Version != Version {
		return malformed(h, "version", `is not "1"`, `Set version to "1".`)
	}
	if !solana && !chainIDRE.MatchString(e.ChainID) {
		return malformed(h, "chain_id", "is not an eip155 or solana CAIP-2 chain id", `Use a CAIP-2 id such as "eip155:8453".`)
	}
	if !nonceRE.MatchString(e.Nonce) {
		return malformed(h, "nonce", "is not 16 to 128 letters and digits", "Use a fresh random nonce of at least 16 letters and digits.")
	}
	if _, err := parseTime(h, "issued_at", e.IssuedAt); err != nil {
		return err
	}
	if _, err := parseTime(h, "expiration_time", e.ExpirationTime); err != nil {
		return err
	}
	if e.NotBefore != "" {
		if _, err := parseTime(h, "not_before", e.NotBefore); err != nil {
			return err
		}
	}
	if err := checkStatement(h, "statement", e.Statement); err != nil {
		return err
	}
	if !methodRE.MatchString(e.Method) {
		return malformed(h, "method", "is not an upper-case HTTP method", `Set method to the request's method, e.g. "POST".`)
	}
	if !strings.HasPrefix(e.Path, "/") || len(e.Path) > 2048 || !utf8.ValidString(e.Path) || !printable(e.Path) {
		return malformed(h, "path", "is not an absolute request path", `Set path to the request's path without query, e.g. "/verify/schema".`)
	}
	u, err := checkURI(h, "uri", e.URI)
	if err != nil {
		return err
	}
	// The uri is what the text signs; path names the same path, escaped
	// (a decoded path with no encoded "/" or other delimiter is the same:
	// CanonicalPath encodes what a path may not hold raw).
	if !strings.EqualFold(u.Host, e.Domain) || !SamePath(u.EscapedPath(), e.Path) || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		return malformed(h, "uri", "is not scheme://domain followed by path", "Set uri to the request's URL without query: scheme, domain and path.")
	}
	if e.AgentID != "" {
		if store.ImitatesAddress(e.AgentID) {
			return malformed(h, "agent_id", "writes an address in lookalike characters", "Write an address in ASCII letters and digits only, or use a name that is not an address.")
		}
		if store.ImitatesTestAgent(e.AgentID) {
			return malformed(h, "agent_id", "writes test- in lookalike characters", "test- ids are examples nobody owns: write test- in ASCII to use one, or use a name that does not read as test-.")
		}
		if !store.BindableAgentID(e.AgentID) {
			return malformed(h, "agent_id", fmt.Sprintf("is not 1 to %d visible characters in NFC (RFC 8264 FreeformClass)", MaxAgentIDChars), "Use the agent_id your verification requests carry, without invisible or blank characters, in NFC.")
		}
		// The id travels on in a header (X-Aov-Wallet-Agent), whose ends
		// HTTP trims: verifierd would bind an id the wallet never signed.
		if strings.TrimSpace(e.AgentID) != e.AgentID {
			return malformed(h, "agent_id", "begins or ends with whitespace", "Remove the whitespace around the agent_id, and send it the same way in your verification requests.")
		}
	}
	if solana {
		return nil // type and signature checked with the address
	}
	if e.Type != TypeEIP191 {
		return malformed(h, "type", `is not "eip191"`, `Sign with EIP-191 personal_sign and set type to "eip191".`)
	}
	if _, err := parseSignature(h, e.Signature); err != nil {
		return err
	}
	return nil
}

func checkAddress(header, s string) error {
	if !common.IsHexAddress(s) || !strings.HasPrefix(s, "0x") || common.HexToAddress(s).Hex() != s {
		return malformed(header, "address", "is not an EIP-55 checksummed address", "Send the address in its EIP-55 mixed-case form.")
	}
	return nil
}

func parseTime(header, field, s string) (time.Time, error) {
	if len(s) > 64 {
		return time.Time{}, malformed(header, field, "is not an RFC 3339 time", `Use an RFC 3339 UTC time such as "2026-11-29T21:22:28Z".`)
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, malformed(header, field, "is not an RFC 3339 time", `Use an RFC 3339 UTC time such as "2026-11-29T21:22:28Z".`)
	}
	return t, nil
}

func checkStatement(header, field, s string) error {
	if len(s) > 512 || !utf8.ValidString(s) || !printable(s) {
		return malformed(header, field, "is not one printable line of at most 512 bytes", "Use a short statement without line breaks, or none.")
	}
	return nil
}

// checkURI parses an absolute http(s) URI made of printable ASCII.
func checkURI(header, field, s string) (*url.URL, error) {
	bad := malformed(header, field, "is not an absolute http or https URI", "Use the request's URL, e.g. https://host/path.")
	if len(s) > 4096 {
		return nil, bad
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return nil, bad
		}
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.Opaque != "" {
		return nil, bad
	}
	return u, nil
}

// printable reports whether s has no control characters (C0, DEL, and
// line or paragraph separators that could split the signed text).
func printable(s string) bool {
	for _, r := range s {
		if r < ' ' || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == '\u2028' || r == '\u2029' || r == utf8.RuneError {
			return false
		}
	}
	return true
}

// parseSignature decodes a 0x-prefixed hex signature of 65 bytes (an
// account's) up to 2 KiB (a contract wallet's, checked with EIP-1271).
func parseSignature(header, s string) ([]byte, error) {
	bad := malformed(header, "signature", "is not 0x-prefixed hex of 65 bytes or more", "Send the personal_sign signature as 0x followed by hex.")
	if !strings.HasPrefix(s, "0x") || len(s) < 2+130 || len(s) > 2+4096 || len(s)%2 != 0 {
		return nil, bad
	}
	b, err := hex.DecodeString(s[2:])
	if err != nil {
		return nil, bad
	}
	return b, nil
}

// chainReference is the reference part of a CAIP-2 id: the numeric chain
// id of eip155, the genesis-hash prefix of solana.
func chainReference(caip2 string) string {
	_, ref, _ := strings.Cut(caip2, ":")
	return ref
}

func (e *Envelope) siwe() *siwe {
	res := []string{MethodURN(e.Method)}
	if e.AgentID != "" {
		res = append(res, AgentURN(e.AgentID))
	}
	return &siwe{
		domain: e.Domain, address: e.Address, statement: e.Statement, uri: e.URI,
		version: e.Version, chainID: chainReference(e.ChainID), nonce: e.Nonce,
		issuedAt: e.IssuedAt, expirationTime: e.ExpirationTime, notBefore: e.NotBefore,
		resources: res,
	}
}

// Message is the EIP-4361 text the signature is over, rebuilt from the
// fields. Call it on a parsed (checked) envelope; the text of an envelope
// that fails Parse's checks means nothing.
func (e *Envelope) Message() string { return e.siwe().textFor(e.ChainID) }

// Encode returns the header value: standard padded base64 of the JSON.
func (e *Envelope) Encode() (string, error) {
	b, err := json.Marshal(e)
	if err != nil {
		return "", fmt.Errorf("encoding %s: %w", HeaderName, err)
	}
	s := base64.StdEncoding.EncodeToString(b)
	if len(s) > MaxHeaderBytes {
		return "", fmt.Errorf("encoding %s: longer than %d bytes", HeaderName, MaxHeaderBytes)
	}
	return s, nil
}

// Sign sets Address from key, checks the envelope and sets Signature to
// the EIP-191 personal_sign of its text.
func (e *Envelope) Sign(key *ecdsa.PrivateKey) error {
	return e.SignAs(key, crypto.PubkeyToAddress(key.PublicKey))
}

// SignAs signs for account with key: for a contract wallet (EIP-1271)
// whose owner key signs on its behalf, account is the wallet's address and
// the verifier asks the wallet's contract. For an ordinary account it is
// Sign.
func (e *Envelope) SignAs(key *ecdsa.PrivateKey, account common.Address) error {
	e.Address = account.Hex()
	e.Type = TypeEIP191
	e.Signature = "0x" + strings.Repeat("00", 65) // placeholder for the syntax check
	if err := e.check(); err != nil {
		return fmt.Errorf("signing %s: %w", HeaderName, err)
	}
	sig, err := crypto.Sign(accounts.TextHash([]byte(e.Message())), key)
	if err != nil {
		return fmt.Errorf("signing %s: %w", HeaderName, err)
	}
	sig[64] += 27 // the personal_sign convention wallets use
	e.Signature = "0x" + hex.EncodeToString(sig)
	return nil
}

// Request describes the request a new envelope is for.
type Request struct {
	// Method is the HTTP method ("POST").
	Method string
	// URL is the full URL the request is sent to; its host becomes the
	// domain, and scheme, host and path the uri (the query is not bound).
	URL string
	// ChainID is the CAIP-2 chain of the wallet. Default "eip155:8453"
	// (Base); only a contract wallet's chain matters to the verifier.
	ChainID string
	// AgentID, when set, binds this agent to the wallet.
	AgentID string
	// Statement is an optional human-readable line shown by wallets.
	Statement string
	// TTL is how long the proof is valid. Default DefaultMaxLifetime.
	TTL time.Duration
	// Now is the issue time. Default time.Now().
	Now time.Time
	// Nonce overrides the random nonce (tests only).
	Nonce string
}

// DefaultChainID is the chain an envelope names when the caller does not
// say: Base mainnet.
const DefaultChainID = "eip155:8453"

// New builds the unsigned envelope for req (Sign completes it).
func New(req Request) (*Envelope, error) {
	u, err := url.Parse(req.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, errors.New("the URL must be an absolute http or https URL")
	}
	now := req.Now
	if now.IsZero() {
		now = time.Now()
	}
	ttl := req.TTL
	if ttl <= 0 {
		ttl = DefaultMaxLifetime
	}
	chain := req.ChainID
	if chain == "" {
		chain = DefaultChainID
	}
	nonce := req.Nonce
	if nonce == "" {
		nonce = NewNonce()
	}
	// The path as the request will send it, escaped: decoding it would
	// sign /a%2Fb as /a/b, another resource.
	path := CanonicalPath(u.EscapedPath())
	if path == "" {
		path = "/"
	}
	issued := now.UTC().Truncate(time.Second)
	return &Envelope{
		Domain:         u.Host,
		URI:            u.Scheme + "://" + u.Host + path,
		Version:        Version,
		ChainID:        chain,
		Nonce:          nonce,
		IssuedAt:       issued.Format(time.RFC3339),
		ExpirationTime: issued.Add(ttl).Format(time.RFC3339),
		Statement:      req.Statement,
		Method:         strings.ToUpper(req.Method),
		Path:           path,
		AgentID:        req.AgentID,
		Type:           TypeEIP191,
	}, nil
}

// SignRequest builds, signs and encodes a header value for req in one step
// (the aov command and Go clients use it).
func SignRequest(key *ecdsa.PrivateKey, req Request) (string, error) {
	e, err := New(req)
	if err != nil {
		return "", err
	}
	if err := e.Sign(key); err != nil {
		return "", err
	}
	return e.Encode()
}

// NewNonce returns a fresh random nonce: 26 upper-case letters and digits
// (crypto/rand.Text, 130 bits).
func NewNonce() string { return rand.Text() }
