package walletauth

import (
	"context"
	"crypto/ecdsa"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/ethereum/go-ethereum/accounts"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"
)

// SIWXHeaderName is the request header of the x402 sign-in-with-x
// extension.
const SIWXHeaderName = "SIGN-IN-WITH-X"

// SIWXExtension is the extension's key in PaymentRequired.extensions.
const SIWXExtension = "sign-in-with-x"

// SIWXMaxAge is how old a sign-in-with-x proof's issuedAt may be (the
// extension's rule: five minutes).
const SIWXMaxAge = 5 * time.Minute

// SIWX is a decoded SIGN-IN-WITH-X proof: the CAIP-122 message fields the
// server offered in its 402 (plus the client's address and chain) and the
// signature, with the extension's camelCase names.
type SIWX struct {
	Domain          string   `json:"domain"`
	Address         string   `json:"address"`
	Statement       string   `json:"statement,omitempty"`
	URI             string   `json:"uri"`
	Version         string   `json:"version"`
	ChainID         string   `json:"chainId"`
	Type            string   `json:"type"`
	Nonce           string   `json:"nonce"`
	IssuedAt        string   `json:"issuedAt"`
	ExpirationTime  string   `json:"expirationTime,omitempty"`
	NotBefore       string   `json:"notBefore,omitempty"`
	RequestID       string   `json:"requestId,omitempty"`
	Resources       []string `json:"resources,omitempty"`
	SignatureScheme string   `json:"signatureScheme,omitempty"`
	Signature       string   `json:"signature"`
}

var (
	siwxNonceRE = regexp.MustCompile(`^[A-Za-z0-9]{8,128}$`)
	requestIDRE = regexp.MustCompile(`^[\x21-\x7e]{1,256}$`)
)

// ParseSIWX decodes a SIGN-IN-WITH-X value and checks every field's
// syntax. Members this package does not know are ignored (the extension
// may grow); known ones must have the right JSON type. Only EVM proofs
// (type eip191, chainId eip155:*) are accepted.
func ParseSIWX(header string) (*SIWX, error) {
	h := SIWXHeaderName
	obj, err := decodeObject(h, header)
	if err != nil {
		return nil, err
	}
	s := new(SIWX)
	str := func(name string, dst *string, required bool) error {
		v, ok := obj[name]
		if !ok {
			if required {
				return malformed(h, name, "is missing", "Include every required member.")
			}
			return nil
		}
		sv, ok := v.(string)
		if !ok {
			return malformed(h, name, "is not a string", "Send the member as a JSON string.")
		}
		*dst = sv
		return nil
	}
	for _, f := range []struct {
		name     string
		dst      *string
		required bool
	}{
		{"domain", &s.Domain, true}, {"address", &s.Address, true}, {"statement", &s.Statement, false},
		{"uri", &s.URI, true}, {"version", &s.Version, true}, {"chainId", &s.ChainID, true},
		{"type", &s.Type, true}, {"nonce", &s.Nonce, true}, {"issuedAt", &s.IssuedAt, true},
		{"expirationTime", &s.ExpirationTime, false}, {"notBefore", &s.NotBefore, false},
		{"requestId", &s.RequestID, false}, {"signatureScheme", &s.SignatureScheme, false},
		{"signature", &s.Signature, true},
	} {
		if err := str(f.name, f.dst, f.required); err != nil {
			return nil, err
		}
	}
	if v, ok := obj["resources"]; ok {
		list, ok := v.([]any)
		if !ok || len(list) > 32 {
			return nil, malformed(h, "resources", "is not a list of at most 32 URIs", "Send resources as a JSON array of URI strings.")
		}
		for _, item := range list {
			r, ok := item.(string)
			if !ok {
				return nil, malformed(h, "resources", "is not a list of at most 32 URIs", "Send resources as a JSON array of URI strings.")
			}
			s.Resources = append(s.Resources, r)
		}
	}
	if err := s.check(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *SIWX) check() error {
	h := SIWXHeaderName
	if !authorityRE.MatchString(s.Domain) {
		return malformed(h, "domain", "is not a host name with an optional port", "Use the domain the server offered.")
	}
	solana := IsSolanaChain(s.ChainID)
	if solana {
		if err := checkSolanaWallet(h, s.Address, s.Type, s.Signature); err != nil {
			return err
		}
	} else if err := checkAddress(h, s.Address); err != nil {
		return err
	}
	if err := checkStatement(h, "statement", s.Statement); err != nil {
		return err
	}
	if _, err := checkURI(h, "uri", s.URI); err != nil {
		return err
	}
	if s.Version != Version {
		return malformed(h, "version", `is not "1"`, `Set version to "1".`)
	}
	if !solana && !chainIDRE.MatchString(s.ChainID) {
		return malformed(h, "chainId", "is not an eip155 or solana CAIP-2 chain id", "Sign with a wallet on one of the offered chains.")
	}
	if !solana && s.Type != TypeEIP191 {
		return malformed(h, "type", `is not "eip191"`, "Sign with an EVM wallet (EIP-191 personal_sign).")
	}
	if !siwxNonceRE.MatchString(s.Nonce) {
		return malformed(h, "nonce", "is not 8 to 128 letters and digits", "Use the nonce the server offered.")
	}
	if _, err := parseTime(h, "issuedAt", s.IssuedAt); err != nil {
		return err
	}
	if s.ExpirationTime != "" {
		if _, err := parseTime(h, "expirationTime", s.ExpirationTime); err != nil {
			return err
		}
	}
	if s.NotBefore != "" {
		if _, err := parseTime(h, "notBefore", s.NotBefore); err != nil {
			return err
		}
	}
	if s.RequestID != "" && !requestIDRE.MatchString(s.RequestID) {
		return malformed(h, "requestId", "is not 1 to 256 printable ASCII characters without spaces", "Use the request id the server offered, or none.")
	}
	for _, r := range s.Resources {
		if _, err := checkResource(r); err != nil {
			return malformed(h, "resources", "holds an entry that is not a URI", "List only URIs in resources.")
		}
		// Without this, an X-Wallet-Auth proof (whose text is this format's
		// with X-Wallet-Auth's URNs as resources) would be a valid
		// sign-in-with-x proof too, for any path and method.
		if isWalletAuthResource(r) {
			return malformed(h, "resources", "holds an X-Wallet-Auth resource (urn:x-wallet-auth:)", "Sign in with the resources the server offered; an X-Wallet-Auth proof is not a sign-in.")
		}
	}
	if solana {
		return nil // type and signature checked with the address
	}
	if _, err := parseSignature(h, s.Signature); err != nil {
		return err
	}
	return nil
}

// checkResource accepts an absolute URI of printable ASCII (any scheme).
func checkResource(r string) (string, error) {
	if r == "" || len(r) > 2048 {
		return "", fmt.Errorf("bad resource")
	}
	for i := 0; i < len(r); i++ {
		if r[i] <= ' ' || r[i] >= 0x7f {
			return "", fmt.Errorf("bad resource")
		}
	}
	i := strings.IndexByte(r, ':')
	if i < 1 {
		return "", fmt.Errorf("bad resource")
	}
	return r, nil
}

// Message is the EIP-4361 text the signature is over, rebuilt from the
// fields.
func (s *SIWX) Message() string {
	m := &siwe{
		domain: s.Domain, address: s.Address, statement: s.Statement, uri: s.URI,
		version: s.Version, chainID: chainReference(s.ChainID), nonce: s.Nonce,
		issuedAt: s.IssuedAt, expirationTime: s.ExpirationTime, notBefore: s.NotBefore,
		requestID: s.RequestID, resources: s.Resources,
	}
	return m.textFor(s.ChainID)
}

// SIWXExpect is the request a sign-in-with-x proof must be for.
type SIWXExpect struct {
	// Domain is the request's host (with port if addressed with one);
	// ignored when the Verifier has Domains.
	Domain string
	// Scheme is the request's scheme ("https"); "" accepts http and https
	// (a gateway behind a TLS-terminating proxy cannot tell).
	Scheme string
	// Path is the request's path as the client sent it, escaped (not the
	// query), in any of RFC 3986's equivalent forms (CanonicalPath). The
	// proof's uri must name it, and nothing more: the
	// challenge a server offers for a resource is its URL without the
	// query (SIWXChallenge), and a proof is a bearer credential, so one
	// signed for one resource must not act as its wallet on another.
	Path string
	// NonceSpent is Expect.NonceSpent.
	NonceSpent bool
}

// VerifySIWX parses a SIGN-IN-WITH-X value and checks it by the extension's
// rules: domain is this server's (see Verifier.Domains), uri is on that origin
// and names the request's path (want.Path) without a query or fragment,
// issuedAt is at most SIWXMaxAge old and not in the future,
// expirationTime has not passed, notBefore has, the signature is the
// address's, and the nonce was never used. Errors as Verify.
func (v *Verifier) VerifySIWX(ctx context.Context, header string, want SIWXExpect) (Proof, error) {
	s, err := ParseSIWX(header)
	if err != nil {
		return Proof{}, err
	}
	return v.VerifySIWXProof(ctx, s, want)
}

// VerifySIWXProof checks a parsed proof (see VerifySIWX).
func (v *Verifier) VerifySIWXProof(ctx context.Context, s *SIWX, want SIWXExpect) (Proof, error) {
	h := SIWXHeaderName
	if !v.ourDomain(s.Domain, want.Domain) {
		return Proof{}, refuse(ErrWrongRequest, h, "domain", "is not this server's site name", "Sign in on the site name you send the request to.")
	}
	u, _ := checkURI(h, "uri", s.URI)
	if !strings.EqualFold(u.Host, s.Domain) || (want.Scheme != "" && u.Scheme != want.Scheme) {
		return Proof{}, refuse(ErrWrongRequest, h, "uri", "is not on this server's origin", "Sign in with the uri the server offered.")
	}
	if !SamePath(u.EscapedPath(), want.Path) || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		return Proof{}, refuse(ErrWrongRequest, h, "uri", "is not the URL of the requested resource", "Sign in with the challenge of this resource's 402, for each resource.")
	}
	now := v.now()
	issued, _ := parseTime(h, "issuedAt", s.IssuedAt)
	if issued.After(now.Add(v.skew())) {
		return Proof{}, refuse(ErrNotYetValid, h, "issuedAt", "is in the future", "Check your clock and sign in again.")
	}
	until := issued.Add(SIWXMaxAge)
	if !now.Before(until) {
		return Proof{}, refuse(ErrExpired, h, "issuedAt", fmt.Sprintf("is more than %s ago", SIWXMaxAge), "Sign in again with a fresh challenge.")
	}
	if s.ExpirationTime != "" {
		exp, _ := parseTime(h, "expirationTime", s.ExpirationTime)
		if !now.Before(exp) {
			return Proof{}, refuse(ErrExpired, h, "expirationTime", "is in the past", "Sign in again with a fresh challenge.")
		}
		if exp.Before(until) {
			until = exp
		}
	}
	if s.NotBefore != "" {
		nb, _ := parseTime(h, "notBefore", s.NotBefore)
		if nb.After(now.Add(v.skew())) {
			return Proof{}, refuse(ErrNotYetValid, h, "notBefore", "is in the future", "Send the request after notBefore.")
		}
	}
	if IsSolanaChain(s.ChainID) {
		claim, err := v.verifySolana(ctx, h, s.Message(), s.Address, s.Signature, s.Nonce, until, want.NonceSpent)
		if err != nil {
			return Proof{}, err
		}
		return Proof{Account: s.Address, ChainID: s.ChainID, Expires: until, nonce: claim}, nil
	}
	addr := common.HexToAddress(s.Address)
	sig, _ := parseSignature(h, s.Signature)
	contract, err := v.checkSignature(ctx, h, s.Message(), addr, s.ChainID, sig)
	if err != nil {
		return Proof{}, err
	}
	claim, err := v.claimNonce(ctx, h, addr, s.Nonce, until, want.NonceSpent)
	if err != nil {
		return Proof{}, err
	}
	return Proof{Address: addr, ChainID: s.ChainID, Contract: contract, Expires: until, nonce: claim}, nil
}

// SIWXChallenge is the sign-in-with-x entry of a 402's extensions for a
// resource: the message fields the client signs (with a fresh nonce, issued
// now, expiring with SIWXMaxAge) and the chains it may sign on (CAIP-2 eip155
// ids). A gate puts it under extensions[SIWXExtension].
func SIWXChallenge(domain, uri string, chains []string, now time.Time) map[string]any {
	issued := now.UTC().Truncate(time.Millisecond)
	supported := make([]any, 0, len(chains))
	for _, c := range chains {
		typ := TypeEIP191
		if IsSolanaChain(c) {
			typ = TypeEd25519
		}
		supported = append(supported, map[string]any{"chainId": c, "type": typ})
	}
	return map[string]any{
		"info": map[string]any{
			"domain":         domain,
			"uri":            uri,
			"version":        Version,
			"nonce":          strings.ToLower(NewNonce()),
			"issuedAt":       issued.Format("2006-01-02T15:04:05.000Z07:00"),
			"expirationTime": issued.Add(SIWXMaxAge).Format("2006-01-02T15:04:05.000Z07:00"),
			"statement":      "Sign in to use what this wallet already paid for",
			"resources":      []any{uri},
		},
		"supportedChains": supported,
	}
}

// Sign sets Address from key and Signature to the EIP-191 personal_sign of
// the proof's text, as a sign-in-with-x client does after filling the
// server's challenge fields, ChainID and Type.
func (s *SIWX) Sign(key *ecdsa.PrivateKey) error {
	s.Address = crypto.PubkeyToAddress(key.PublicKey).Hex()
	if s.Type == "" {
		s.Type = TypeEIP191
	}
	s.Signature = "0x" + strings.Repeat("00", 65) // placeholder for the syntax check
	if err := s.check(); err != nil {
		return fmt.Errorf("signing %s: %w", SIWXHeaderName, err)
	}
	sig, err := crypto.Sign(accounts.TextHash([]byte(s.Message())), key)
	if err != nil {
		return fmt.Errorf("signing %s: %w", SIWXHeaderName, err)
	}
	sig[64] += 27
	s.Signature = "0x" + hex.EncodeToString(sig)
	return nil
}

// Encode returns the SIGN-IN-WITH-X header value.
func (s *SIWX) Encode() (string, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return "", fmt.Errorf("encoding %s: %w", SIWXHeaderName, err)
	}
	return base64.StdEncoding.EncodeToString(b), nil
}

// SIWXFromChallenge fills a proof from the info of a 402's sign-in-with-x
// extension (see SIWXChallenge) for chain; Sign completes it.
func SIWXFromChallenge(info map[string]any, chain string) *SIWX {
	str := func(k string) string { s, _ := info[k].(string); return s }
	s := &SIWX{
		Domain: str("domain"), URI: str("uri"), Version: str("version"), Nonce: str("nonce"),
		IssuedAt: str("issuedAt"), ExpirationTime: str("expirationTime"), NotBefore: str("notBefore"),
		Statement: str("statement"), RequestID: str("requestId"), ChainID: chain, Type: TypeEIP191,
	}
	if list, ok := info["resources"].([]any); ok {
		for _, r := range list {
			if r, ok := r.(string); ok {
				s.Resources = append(s.Resources, r)
			}
		}
	}
	if list, ok := info["resources"].([]string); ok {
		s.Resources = append(s.Resources, list...)
	}
	return s
}

// SamePath reports whether the escaped URL paths a and b are the same
// path, as RFC 3986 compares them: equal in CanonicalPath's form. It is
// the one comparison of a proof's path with a request's, for
// X-Wallet-Auth (its path and uri members, and the request) and
// sign-in-with-x alike.
func SamePath(a, b string) bool {
	return CanonicalPath(a) == CanonicalPath(b)
}

// CanonicalPath is the escaped URL path p (as url.URL.EscapedPath gives it,
// or a sign-in-with-x uri's) in one form for every way of writing the same
// RFC 3986 path: every byte a path may not hold as is (RFC 3986 §3.3:
// outside unreserved, sub-delims, ":", "@" and "/"; Go leaves "[" and "]"
// raw) is percent-encoded, an encoded unreserved character is decoded
// (§6.2.2.2) and hex digits are upper case (§6.2.2.1). Nothing else is
// decoded: "%2F" stays an encoded slash, so /a%2Fb and /a/b, which a
// server may route as different resources, stay different. A resource's
// URL in a 402, its sign-in-with-x challenge uri, the comparison of a proof
// with the request and a paid-access record all use this form, so a
// wallet signs a valid URI and is let in on exactly the resource it paid
// for.
func CanonicalPath(p string) string {
	const hex = "0123456789ABCDEF"
	clean := true
	for i := 0; i < len(p); i++ {
		if c := p[i]; c == '%' || !pathByte(c) {
			clean = false
			break
		}
	}
	if clean {
		return p
	}
	b := make([]byte, 0, len(p)+8)
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '%' && i+2 < len(p) && isHex(p[i+1]) && isHex(p[i+2]):
			v := unhex(p[i+1])<<4 | unhex(p[i+2])
			if unreserved(v) {
				b = append(b, v)
			} else {
				b = append(b, '%', hex[v>>4], hex[v&15])
			}
			i += 2
		case c != '%' && pathByte(c):
			b = append(b, c)
		default:
			b = append(b, '%', hex[c>>4], hex[c&15])
		}
	}
	return string(b)
}

// unreserved reports whether c is an RFC 3986 unreserved character.
func unreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~'
}

// pathByte reports whether c may stand unencoded in an RFC 3986 path.
func pathByte(c byte) bool {
	return unreserved(c) || strings.IndexByte("!$&'()*+,;=:@/", c) >= 0
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	default:
		return c - 'a' + 10
	}
}
