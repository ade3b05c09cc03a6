package x402

import (
	"crypto/ecdsa"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"
)

// EIP-712 type strings and their keccak256 typehashes for the exact scheme's
// EIP-3009 transfer (x402 scheme_exact_evm; the same strings USDC hashes).
const (
	EIP712DomainType              = "EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)"
	TransferWithAuthorizationType = "TransferWithAuthorization(address from,address to,uint256 value,uint256 validAfter,uint256 validBefore,bytes32 nonce)"
)

var (
	// EIP712DomainTypehash is keccak256(EIP712DomainType).
	EIP712DomainTypehash = crypto.Keccak256Hash([]byte(EIP712DomainType))
	// TransferWithAuthorizationTypehash is keccak256(TransferWithAuthorizationType).
	TransferWithAuthorizationTypehash = crypto.Keccak256Hash([]byte(TransferWithAuthorizationType))
)

// ValidAfterSkew is how far in the past SignExactEVM dates validAfter, so a
// payment is valid at once even on a chain whose clock lags the client's.
const ValidAfterSkew = 600 * time.Second

// ExactEVMPayload is the exact scheme's payload for an EIP-3009 transfer:
// the authorization and the payer's signature over its EIP-712 digest.
type ExactEVMPayload struct {
	Signature     string        `json:"signature"`
	Authorization Authorization `json:"authorization"`
}

// Authorization is an EIP-3009 TransferWithAuthorization as it travels in
// JSON: addresses as 0x hex, numbers as decimal strings (uint256 does not fit
// JSON numbers), nonce as 0x + 64 hex digits.
type Authorization struct {
	From        string `json:"from"`
	To          string `json:"to"`
	Value       string `json:"value"`
	ValidAfter  string `json:"validAfter"`
	ValidBefore string `json:"validBefore"`
	Nonce       string `json:"nonce"`
}

// AuthorizationValues is an Authorization parsed into the types the token
// contract takes.
type AuthorizationValues struct {
	From, To    common.Address
	Value       *big.Int
	ValidAfter  *big.Int
	ValidBefore *big.Int
	Nonce       [32]byte
}

// Values parses and checks a: from and to must be 0x + 40 hex digits (any
// case), value, validAfter and validBefore canonical decimal uint256, nonce
// 0x + 64 hex digits. Errors are *PaymentError (invalid_payload) naming the
// member under "authorization".
func (a Authorization) Values() (AuthorizationValues, error) {
	var v AuthorizationValues
	if !isHexAddress(a.From) {
		return v, invalid("authorization.from", "must be 0x followed by 40 hex digits")
	}
	if !isHexAddress(a.To) {
		return v, invalid("authorization.to", "must be 0x followed by 40 hex digits")
	}
	v.From, v.To = common.HexToAddress(a.From), common.HexToAddress(a.To)
	var ok bool
	if v.Value, ok = parseUint256(a.Value); !ok {
		return v, invalid("authorization.value", "must be a canonical decimal uint256 string")
	}
	if v.ValidAfter, ok = parseUint256(a.ValidAfter); !ok {
		return v, invalid("authorization.validAfter", "must be a canonical decimal uint256 string")
	}
	if v.ValidBefore, ok = parseUint256(a.ValidBefore); !ok {
		return v, invalid("authorization.validBefore", "must be a canonical decimal uint256 string")
	}
	n, err := decodeHex(a.Nonce)
	if err != nil || len(n) != 32 {
		return v, invalid("authorization.nonce", "must be 0x followed by 64 hex digits")
	}
	copy(v.Nonce[:], n)
	return v, nil
}

// decodeHex decodes "0x"-prefixed hex of even length, either case.
func decodeHex(s string) ([]byte, error) {
	if len(s) < 2 || s[0] != '0' || (s[1] != 'x' && s[1] != 'X') || len(s)%2 != 0 {
		return nil, fmt.Errorf("not 0x-prefixed hex")
	}
	return hex.DecodeString(s[2:])
}

// DomainSeparator is the EIP-712 domain separator of a token:
// keccak256(typehash, keccak256(name), keccak256(version), chainId, token).
// It equals the token's on-chain DOMAIN_SEPARATOR() when name, version and
// chainID are right, which is how a facilitator can check a token's domain.
func DomainSeparator(chainID *big.Int, name, version string, token common.Address) common.Hash {
	var buf [5 * 32]byte
	copy(buf[0:], EIP712DomainTypehash[:])
	copy(buf[32:], crypto.Keccak256([]byte(name)))
	copy(buf[64:], crypto.Keccak256([]byte(version)))
	// The mask keeps an out-of-range chain id (never produced by ChainID)
	// from panicking in FillBytes; such an id cannot match any token anyway.
	new(big.Int).And(chainID, maxUint256).FillBytes(buf[96:128])
	copy(buf[128+12:], token[:])
	return crypto.Keccak256Hash(buf[:])
}

// StructHash is the EIP-712 hashStruct of the TransferWithAuthorization.
func (v AuthorizationValues) StructHash() common.Hash {
	var buf [7 * 32]byte
	copy(buf[0:], TransferWithAuthorizationTypehash[:])
	copy(buf[32+12:], v.From[:])
	copy(buf[64+12:], v.To[:])
	v.Value.FillBytes(buf[96:128])
	v.ValidAfter.FillBytes(buf[128:160])
	v.ValidBefore.FillBytes(buf[160:192])
	copy(buf[192:], v.Nonce[:])
	return crypto.Keccak256Hash(buf[:])
}

// TypedDataDigest is keccak256("\x19\x01" || domainSeparator || structHash),
// the EIP-712 hash that is signed.
func TypedDataDigest(domainSeparator, structHash common.Hash) [32]byte {
	var buf [2 + 64]byte
	buf[0], buf[1] = 0x19, 0x01
	copy(buf[2:], domainSeparator[:])
	copy(buf[34:], structHash[:])
	return crypto.Keccak256Hash(buf[:])
}

// TransferWithAuthorizationDigest is the EIP-712 digest a payer signs for a,
// on the token at address token whose EIP-712 domain is (tokenName,
// tokenVersion) on chain chainID. Errors come from parsing a (Values).
func TransferWithAuthorizationDigest(chainID *big.Int, tokenName, tokenVersion string, token common.Address, a Authorization) ([32]byte, error) {
	if chainID == nil || chainID.Sign() <= 0 || chainID.BitLen() > 256 {
		return [32]byte{}, fmt.Errorf("computing digest: chain id must be a positive uint256")
	}
	v, err := a.Values()
	if err != nil {
		return [32]byte{}, err
	}
	return TypedDataDigest(DomainSeparator(chainID, tokenName, tokenVersion, token), v.StructHash()), nil
}

// secp256k1 group order and half of it: a signature with s above the half is
// the malleable twin of one below it.
var (
	secp256k1N     = crypto.S256().Params().N
	secp256k1HalfN = new(big.Int).Rsh(secp256k1N, 1)
)

// RecoverAuthorizer returns the address whose key made sig over digest.
//
// sig is 65 bytes r || s || v with v either 0/1 or 27/28 (wallets use both;
// the token's v,r,s entry point takes 27/28). Signatures with s in the upper
// half of the curve order are refused: each has a twin with the same signer,
// so accepting both would let anyone re-spell a payment, and USDC's own
// ECRecover refuses them too, so they could never settle. Longer signatures
// (ERC-1271 smart wallets, ERC-6492 wrappers) are not recoverable here; a
// facilitator checks those on chain.
//
// Errors are *PaymentError wrapping ErrInvalidSignature with reason
// invalid_exact_evm_signature.
func RecoverAuthorizer(digest [32]byte, sig []byte) (common.Address, error) {
	bad := func(problem string) (common.Address, error) {
		return common.Address{}, &PaymentError{Kind: ErrInvalidSignature, Reason: ReasonExactEVMSignature, Field: "signature", Problem: problem}
	}
	if len(sig) != 65 {
		return bad("must be 65 bytes to recover a signer")
	}
	v := sig[64]
	if v == 27 || v == 28 {
		v -= 27
	}
	if v > 1 {
		return bad("has a recovery id other than 0, 1, 27 or 28")
	}
	r, s := new(big.Int).SetBytes(sig[:32]), new(big.Int).SetBytes(sig[32:64])
	if r.Sign() == 0 || s.Sign() == 0 || r.Cmp(secp256k1N) >= 0 || s.Cmp(secp256k1N) >= 0 {
		return bad("has r or s out of range")
	}
	if s.Cmp(secp256k1HalfN) > 0 {
		return bad("has a high s value (malleable)")
	}
	var rsv [65]byte
	copy(rsv[:64], sig[:64])
	rsv[64] = v
	pub, err := crypto.SigToPub(digest[:], rsv[:])
	if err != nil {
		return bad("does not recover to a public key")
	}
	return crypto.PubkeyToAddress(*pub), nil
}

// ERC1271Accepts reports whether out, the answer of an EIP-1271
// isValidSignature call, accepts the signature: its first ABI word is the
// magic value 0x1626ba7e followed by 28 zero bytes, as a contract
// returning bytes4 encodes it. Return data after that word is ignored, as
// OpenZeppelin's SignatureChecker and the token's own check
// (ret.length >= 32) ignore it, so a wallet the token accepts is accepted
// here too. Looking only at the first four bytes is not enough: the magic
// value is also isValidSignature's own selector, so anything that echoes
// its calldata (the identity precompile, a proxy's fallback) would
// "accept" every signature; an echo's first word is the selector followed
// by the hash, never by 28 zero bytes unless the hash starts with them.
// Callers also require code at the address: a contract wallet has some,
// and a precompile has none.
func ERC1271Accepts(out []byte) bool {
	return len(out) >= 32 && [4]byte(out[:4]) == erc1271Magic && [28]byte(out[4:32]) == [28]byte{}
}

// erc1271Magic is isValidSignature's answer for a valid signature.
var erc1271Magic = [4]byte{0x16, 0x26, 0xba, 0x7e}

// ParseSignature decodes a 0x-prefixed hex signature. It accepts any length
// of at least 65 bytes (smart-wallet signatures are longer) and at most 16
// KiB.
func ParseSignature(s string) ([]byte, error) {
	if len(s) > 2+2*16384 {
		return nil, invalid("signature", "is longer than 16 KiB")
	}
	b, err := decodeHex(s)
	if err != nil {
		return nil, invalid("signature", "must be 0x-prefixed hex")
	}
	if len(b) < 65 {
		return nil, invalid("signature", "must be at least 65 bytes")
	}
	return b, nil
}

// ParseExactEVMPayload decodes and checks an exact EVM EIP-3009 payload
// (PaymentPayload.Payload). The object must be exactly what the scheme
// defines and official clients send: a signature (ParseSignature rules) and
// an authorization of six string members that satisfy Authorization.Values,
// and nothing else. Names are matched exactly. Errors are *PaymentError with
// paths relative to the payload ("authorization.nonce").
//
// It is strict, unlike the header around it, because facilitators read the
// shape: the official @x402/evm facilitator takes any payload with a
// permit2Authorization member for a Permit2 payment, whatever else it
// carries, so a payload that is accepted here must be read the same way
// everywhere. A permit2Authorization member is reason
// unsupported_payload_type; any other member the scheme does not define is
// invalid_payload, and the refusal names where it is, never the member.
func ParseExactEVMPayload(raw json.RawMessage) (ExactEVMPayload, error) {
	p, _, err := parseExactEVM(raw)
	return p, err
}

// parseExactEVM is ParseExactEVMPayload returning the authorization's values
// too, so that no caller parses the numbers twice.
func parseExactEVM(raw json.RawMessage) (ExactEVMPayload, AuthorizationValues, error) {
	m, _, err := checkJSONObject(raw)
	if err != nil {
		return ExactEVMPayload{}, AuthorizationValues{}, invalid("", "must be a JSON object with distinct member names")
	}
	return exactEVMObject(m)
}

// exactEVMObject is parseExactEVM's reading of the payload m, an object
// as checkJSONObject reads one (alone, or as a member of the payment).
func exactEVMObject(m map[string]any) (ExactEVMPayload, AuthorizationValues, error) {
	var p ExactEVMPayload
	var v AuthorizationValues
	var err error
	if _, permit2 := m["permit2Authorization"]; permit2 {
		return p, v, &PaymentError{Kind: ErrInvalidPayment, Reason: ReasonUnsupportedPayloadType,
			Field: "permit2Authorization", Problem: "Permit2 payloads are not supported; use an EIP-3009 authorization"}
	}
	if !onlyMembers(m, exactEVMPayloadMembers) {
		return p, v, invalid("", "must have only the members signature and authorization")
	}
	if p.Signature, err = stringMember(m, "", "signature"); err != nil {
		return p, v, err
	}
	if _, err := ParseSignature(p.Signature); err != nil {
		return p, v, err
	}
	av, ok := m["authorization"]
	if !ok {
		return p, v, invalid("authorization", "is required")
	}
	am, err := object(av, "authorization")
	if err != nil {
		return p, v, err
	}
	if !onlyMembers(am, authorizationMembers) {
		return p, v, invalid("authorization", "must have only the members from, to, value, validAfter, validBefore and nonce")
	}
	a := &p.Authorization
	for _, f := range []struct {
		name string
		dst  *string
	}{{"from", &a.From}, {"to", &a.To}, {"value", &a.Value}, {"validAfter", &a.ValidAfter}, {"validBefore", &a.ValidBefore}, {"nonce", &a.Nonce}} {
		if *f.dst, err = stringMember(am, "authorization", f.name); err != nil {
			return p, v, err
		}
	}
	if v, err = a.Values(); err != nil {
		return p, v, err
	}
	return p, v, nil
}

// The members of an exact EVM EIP-3009 payload and of its authorization.
var (
	exactEVMPayloadMembers = []string{"signature", "authorization"}
	authorizationMembers   = []string{"from", "to", "value", "validAfter", "validBefore", "nonce"}
)

// onlyMembers reports whether every member of m is one of names.
func onlyMembers(m map[string]any, names []string) bool {
	if len(m) > len(names) {
		return false
	}
	for k := range m {
		if !slices.Contains(names, k) {
			return false
		}
	}
	return true
}

// ExactEVMValues reads the authorization of an exact EVM payment p as a
// gate must before it claims or forwards it: ParseExactEVMPayload's rules,
// then the numbers the token will take. What it accepts every reader (this
// package, a facilitator using BigInt) takes for the same transfer, so a
// claim named and timed by these values holds whoever settles. Errors are
// *PaymentError with paths from the header's root
// ("payload.authorization.validBefore").
func ExactEVMValues(p PaymentPayload) (AuthorizationValues, error) {
	_, v, err := parseExactEVM(p.Payload)
	if err != nil {
		return v, prefixField(err, "payload")
	}
	return v, nil
}

// ExactEVMDomain returns the EIP-712 domain that exact EVM payments for req
// sign: chain id from req.Network, token from req.Asset and name/version
// from req.Extra. A missing name or version is reason
// invalid_exact_evm_missing_eip712_domain, as in the reference facilitator.
func ExactEVMDomain(req PaymentRequirements) (chainID *big.Int, name, version string, token common.Address, err error) {
	if chainID, err = ChainID(req.Network); err != nil {
		return nil, "", "", token, &PaymentError{Kind: ErrInvalidPayment, Reason: ReasonInvalidNetwork, Field: "network", Problem: "is not an eip155 network"}
	}
	if !isHexAddress(req.Asset) {
		return nil, "", "", token, &PaymentError{Kind: ErrInvalidPayment, Reason: ReasonInvalidPaymentRequirements, Field: "asset", Problem: "must be 0x followed by 40 hex digits"}
	}
	name, _ = req.Extra["name"].(string)
	version, _ = req.Extra["version"].(string)
	if name == "" || version == "" {
		return nil, "", "", token, &PaymentError{Kind: ErrInvalidPayment, Reason: ReasonExactEVMMissingEIP712Domain, Field: "extra", Problem: "must carry the token's EIP-712 name and version"}
	}
	return chainID, name, version, common.HexToAddress(req.Asset), nil
}

// RecoverExactEVM returns the address that signed p for the requirements
// req (the server's own offer): it computes the digest over req's domain
// and recovers the 65-byte signature. It checks no amounts, times or
// recipients; see CheckExactEVM for those.
func RecoverExactEVM(req PaymentRequirements, p ExactEVMPayload) (common.Address, error) {
	chainID, name, version, token, err := ExactEVMDomain(req)
	if err != nil {
		return common.Address{}, err
	}
	digest, err := TransferWithAuthorizationDigest(chainID, name, version, token, p.Authorization)
	if err != nil {
		return common.Address{}, err
	}
	sig, err := ParseSignature(p.Signature)
	if err != nil {
		return common.Address{}, err
	}
	return RecoverAuthorizer(digest, sig)
}

// SignExactEVM makes an exact EVM EIP-3009 payment for req with key, as the
// official TypeScript client does: validAfter = now − 10 min, validBefore =
// now + maxTimeoutSeconds, a random 32-byte nonce, to = payTo (checksummed),
// value = amount, a 65-byte signature with v 27/28, and Accepted an
// unmodified copy of req. It is the Go client for tests and tools.
func SignExactEVM(key *ecdsa.PrivateKey, req PaymentRequirements, resource *Resource, now time.Time) (PaymentPayload, error) {
	if req.Scheme != SchemeExact {
		return PaymentPayload{}, fmt.Errorf("signing payment: scheme %q is not %q", truncate(req.Scheme), SchemeExact)
	}
	chainID, name, version, token, err := ExactEVMDomain(req)
	if err != nil {
		return PaymentPayload{}, fmt.Errorf("signing payment: %w", err)
	}
	if !isHexAddress(req.PayTo) {
		return PaymentPayload{}, fmt.Errorf("signing payment: payTo is not an EVM address")
	}
	if _, err := ParseAmount(req.Amount); err != nil {
		return PaymentPayload{}, fmt.Errorf("signing payment: %w", err)
	}
	var nonce [32]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return PaymentPayload{}, fmt.Errorf("signing payment: reading nonce: %w", err)
	}
	after := now.Add(-ValidAfterSkew).Unix()
	if after < 0 {
		after = 0
	}
	auth := Authorization{
		From:        crypto.PubkeyToAddress(key.PublicKey).Hex(),
		To:          common.HexToAddress(req.PayTo).Hex(),
		Value:       req.Amount,
		ValidAfter:  fmt.Sprint(after),
		ValidBefore: fmt.Sprint(now.Unix() + int64(req.MaxTimeoutSeconds)),
		Nonce:       "0x" + hex.EncodeToString(nonce[:]),
	}
	digest, err := TransferWithAuthorizationDigest(chainID, name, version, token, auth)
	if err != nil {
		return PaymentPayload{}, fmt.Errorf("signing payment: %w", err)
	}
	sig, err := crypto.Sign(digest[:], key)
	if err != nil {
		return PaymentPayload{}, fmt.Errorf("signing payment: %w", err)
	}
	sig[64] += 27
	payload, err := json.Marshal(ExactEVMPayload{Signature: "0x" + hex.EncodeToString(sig), Authorization: auth})
	if err != nil {
		return PaymentPayload{}, fmt.Errorf("signing payment: %w", err)
	}
	return PaymentPayload{X402Version: Version, Resource: resource, Accepted: req, Payload: payload}, nil
}

// sameHexAddress compares two 0x addresses ignoring case.
func sameHexAddress(a, b string) bool {
	return isHexAddress(a) && isHexAddress(b) && strings.EqualFold(a[2:], b[2:])
}
