package walletauth

import (
	"strings"
)

// siwe holds the fields of one EIP-4361 message, already checked; text
// writes them in the order and layout EIP-4361's ABNF fixes.
type siwe struct {
	domain, address, statement, uri, version string
	chainID                                  string // the numeric EIP-155 reference, not CAIP-2
	nonce, issuedAt, expirationTime          string
	notBefore, requestID                     string
	resources                                []string
}

// text is the EIP-4361 message. It matches viem's createSiweMessage and the
// siwe library byte for byte for the same fields (tested against viem).
func (m *siwe) text() string {
	var b strings.Builder
	b.Grow(256 + len(m.statement) + 64*len(m.resources))
	b.WriteString(m.domain)
	b.WriteString(" wants you to sign in with your Ethereum account:\n")
	b.WriteString(m.address)
	b.WriteString("\n\n")
	if m.statement != "" {
		b.WriteString(m.statement)
		b.WriteString("\n")
	}
	b.WriteString("\nURI: ")
	b.WriteString(m.uri)
	b.WriteString("\nVersion: ")
	b.WriteString(m.version)
	b.WriteString("\nChain ID: ")
	b.WriteString(m.chainID)
	b.WriteString("\nNonce: ")
	b.WriteString(m.nonce)
	b.WriteString("\nIssued At: ")
	b.WriteString(m.issuedAt)
	if m.expirationTime != "" {
		b.WriteString("\nExpiration Time: ")
		b.WriteString(m.expirationTime)
	}
	if m.notBefore != "" {
		b.WriteString("\nNot Before: ")
		b.WriteString(m.notBefore)
	}
	if m.requestID != "" {
		b.WriteString("\nRequest ID: ")
		b.WriteString(m.requestID)
	}
	if len(m.resources) > 0 {
		b.WriteString("\nResources:")
		for _, r := range m.resources {
			b.WriteString("\n- ")
			b.WriteString(r)
		}
	}
	return b.String()
}

// Resource URNs of X-Wallet-Auth: they put the method and the agent id
// under the signature in a form every EIP-4361 library accepts as a URI.
// The namespace is X-Wallet-Auth's alone: every X-Wallet-Auth text lists
// its method URN, and a sign-in-with-x proof may list none of them (see
// isWalletAuthResource), so no signed text is both kinds of proof.
const (
	walletAuthURNPrefix = "urn:x-wallet-auth:"
	methodURNPrefix     = walletAuthURNPrefix + "method:"
	agentURNPrefix      = walletAuthURNPrefix + "agent:"
)

// isWalletAuthResource reports whether r is in X-Wallet-Auth's URN
// namespace, in any letter case (RFC 8141 compares a URN's scheme and
// namespace without regard to case).
func isWalletAuthResource(r string) bool {
	return len(r) >= len(walletAuthURNPrefix) && strings.EqualFold(r[:len(walletAuthURNPrefix)], walletAuthURNPrefix)
}

// AgentURN returns the resource that binds agentID in the signed text:
// urn:x-wallet-auth:agent: followed by agentID with every byte outside the
// RFC 3986 unreserved set (A–Z a–z 0–9 - . _ ~) written as %XX in upper-case
// hex. JavaScript clients get the same with
// encodeURIComponent(id).replace(/[!'()*]/g, c => "%" + c.charCodeAt(0).toString(16).toUpperCase()).
func AgentURN(agentID string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(agentURNPrefix) + 3*len(agentID))
	b.WriteString(agentURNPrefix)
	for i := 0; i < len(agentID); i++ {
		c := agentID[i]
		if 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}

// MethodURN returns the resource that binds the HTTP method in the signed
// text.
func MethodURN(method string) string { return methodURNPrefix + method }
