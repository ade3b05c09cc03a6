// Package ed25519key holds the one rule for an Ed25519 public key a
// signature may be checked against, applied wherever a signer's key is
// read: receipt keys (package receipt), Solana wallet proofs (walletauth)
// and the signers of Solana payments (plugins/svmfacilitator).
package ed25519key

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"fmt"

	"filippo.io/edwards25519"
)

// Why Check refuses a key.
var (
	ErrNotCanonical = errors.New("public key is not the canonical encoding of an Ed25519 curve point")
	ErrSmallOrder   = errors.New("public key is of small order: anyone can forge signatures that verify under it")
)

// Check refuses an Ed25519 public key that no signature may be checked
// against: not 32 bytes, not the canonical encoding of a curve point
// (ErrNotCanonical), or a point of small order, the identity among them
// (ErrSmallOrder). crypto/ed25519 accepts the signature 01 00…00 ‖ 00…00
// on any message under the identity key, and other forgeries under the
// other small-order keys. A non-canonical encoding names a point under
// another spelling, which readers that follow RFC 8032 strictly refuse,
// and two spellings of one key would be two accounts. A key made from a
// private key is never one of these, so no signer is refused; a Solana
// address that is not a signer (a program derived address, off the curve
// by design) is not a key to check here.
func Check(pub []byte) error {
	if len(pub) != ed25519.PublicKeySize {
		return fmt.Errorf("public key is %d bytes, want %d", len(pub), ed25519.PublicKeySize)
	}
	p, err := new(edwards25519.Point).SetBytes(pub)
	if err != nil || !bytes.Equal(p.Bytes(), pub) {
		return ErrNotCanonical
	}
	if new(edwards25519.Point).MultByCofactor(p).Equal(edwards25519.NewIdentityPoint()) == 1 {
		return ErrSmallOrder
	}
	return nil
}
