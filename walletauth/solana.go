package walletauth

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/store"
)

// Solana accounts prove themselves the same way as EVM ones, with two
// differences: the text says "Solana account" where EIP-4361 says
// "Ethereum account" (CAIP-122's Sign-In with Solana, as @x402/extensions
// 2.27 writes it: its Chain ID line is the 32-character genesis-hash
// reference of the CAIP-2 id), and the signature is ed25519 over the text's
// UTF-8 bytes, base58-encoded, with type "ed25519". The address is the
// account's base58 public key. Domain, time, lifetime and nonce rules are
// the EVM ones.

// TypeEd25519 is an ed25519 signature by a Solana account.
const TypeEd25519 = "ed25519"

// solanaChainRE is a solana CAIP-2 id: the first 32 base58 characters of
// the genesis hash.
var solanaChainRE = regexp.MustCompile(`^solana:[1-9A-HJ-NP-Za-km-z]{32}$`)

// IsSolanaChain reports whether chainID is a solana CAIP-2 id; proofs on
// such a chain are signed by Solana accounts.
func IsSolanaChain(chainID string) bool { return solanaChainRE.MatchString(chainID) }

// solanaKey decodes a base58 Solana account and refuses one that is not a
// signer's key (store.SolanaWalletKey, with ed25519key.Check: a
// non-canonical encoding or a point of small order, under which
// crypto/ed25519 accepts forgeries). The account signs the proof, so it is
// never a program derived address. verifierd reads a bare agent id as a
// Solana account by the same function, so every such id can be proven.
func solanaKey(header, s string) (ed25519.PublicKey, error) {
	key, ok := store.SolanaWalletKey(s)
	if !ok {
		return nil, malformed(header, "address", "is not a base58 Solana account", "Send the wallet's base58 address.")
	}
	return key, nil
}

func solanaSignature(header, s string) ([]byte, error) {
	b, err := base58.Decode(s)
	if err != nil || len(b) != ed25519.SignatureSize {
		return nil, malformed(header, "signature", "is not a base58 ed25519 signature", "Send the wallet's signMessage result in base58.")
	}
	return b, nil
}

// checkSolanaWallet checks the account fields of a proof on a Solana
// chain: address, type and signature syntax.
func checkSolanaWallet(header, address, typ, signature string) error {
	if _, err := solanaKey(header, address); err != nil {
		return err
	}
	if typ != TypeEd25519 {
		return malformed(header, "type", `is not "ed25519"`, `Sign with the Solana wallet (signMessage) and set type to "ed25519".`)
	}
	_, err := solanaSignature(header, signature)
	return err
}

// solanaText is the CAIP-122 text for a Solana account as @x402/extensions
// writes it: "Solana account" in the first line and, unlike EIP-4361, a
// single blank line between the address and URI when there is no
// statement. From "URI: " on it is the EIP-4361 text (domain, address and
// the one-line statement hold no line break, so the first "\nURI: " is the
// field).
func solanaText(m *siwe) string {
	t := m.text()
	head := m.domain + " wants you to sign in with your Solana account:\n" + m.address + "\n\n"
	if m.statement != "" {
		head += m.statement + "\n\n"
	}
	return head + t[strings.Index(t, "\nURI: ")+1:]
}

// verifySolana checks an ed25519 proof by address over text, then claims
// (address, nonce) until until unless spent, as the EVM proofs do, and
// returns the claim it made (claimNonceKey).
func (v *Verifier) verifySolana(ctx context.Context, header, text, address, signature, nonce string, until time.Time, spent bool) (*store.Claim, error) {
	key, err := solanaKey(header, address)
	if err != nil {
		return nil, err
	}
	sig, err := solanaSignature(header, signature)
	if err != nil {
		return nil, err
	}
	if !ed25519.Verify(key, []byte(text), sig) {
		return nil, refuse(ErrBadSignature, header, "signature", "is not a signature of this message by the address", "Sign the CAIP-122 text of exactly these fields with the Solana wallet (signMessage).")
	}
	// Base58 is case-sensitive: the address is the key as given.
	return v.claimNonceKey(ctx, header, nonceKey("solana/"+address, nonce), until, spent)
}

// SignSolana sets Address from key, checks the envelope and sets Signature
// to the ed25519 signature of its text, for a proof on a Solana chain.
func (e *Envelope) SignSolana(key ed25519.PrivateKey) error {
	if !IsSolanaChain(e.ChainID) {
		return fmt.Errorf("signing %s: chain_id %q is not a solana CAIP-2 id", HeaderName, e.ChainID)
	}
	e.Address = base58.Encode(key.Public().(ed25519.PublicKey))
	e.Type = TypeEd25519
	e.Signature = base58.Encode(make([]byte, ed25519.SignatureSize)) // placeholder for the syntax check
	if err := e.check(); err != nil {
		return fmt.Errorf("signing %s: %w", HeaderName, err)
	}
	e.Signature = base58.Encode(ed25519.Sign(key, []byte(e.Message())))
	return nil
}

// SignSolana sets Address from key and Signature to the ed25519 signature
// of the proof's text, as @x402/extensions' createSIWxPayload does with a
// Solana signer.
func (s *SIWX) SignSolana(key ed25519.PrivateKey) error {
	s.Address = base58.Encode(key.Public().(ed25519.PublicKey))
	s.Type = TypeEd25519
	s.Signature = base58.Encode(make([]byte, ed25519.SignatureSize))
	if err := s.check(); err != nil {
		return fmt.Errorf("signing %s: %w", SIWXHeaderName, err)
	}
	s.Signature = base58.Encode(ed25519.Sign(key, []byte(s.Message())))
	return nil
}

// Wallet is the wallet a proof established, as text: the EIP-55 address of
// an EVM account, the base58 address of a Solana account.
func (p Proof) Wallet() string {
	if p.Account != "" {
		return p.Account
	}
	return p.Address.Hex()
}

// textFor is the signed text for a proof on chainID.
func (m *siwe) textFor(chainID string) string {
	if IsSolanaChain(chainID) {
		return solanaText(m)
	}
	return m.text()
}
