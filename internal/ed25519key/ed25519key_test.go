package ed25519key

import (
	"crypto/ed25519"
	"encoding/hex"
	"errors"
	"testing"
)

// NonCanonical is y = p + 3 (p = 2^255 - 19): a curve point of large
// order, spelled with a y that is not reduced. filippo.io/edwards25519 and
// crypto/ed25519 decode it; strict RFC 8032 readers do not.
const nonCanonical = "f0ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f"

func TestCheck(t *testing.T) {
	pub, _, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := Check(pub); err != nil {
		t.Fatalf("a generated key: %v", err)
	}
	for _, c := range []struct {
		desc, hex string
		want      error
	}{
		{"the identity", "0100000000000000000000000000000000000000000000000000000000000000", ErrSmallOrder},
		{"a point of order 8", "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a", ErrSmallOrder},
		{"a point of large order with y unreduced", nonCanonical, ErrNotCanonical},
		{"the identity with y unreduced", "eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f", ErrNotCanonical},
		{"the identity with the sign bit set", "0100000000000000000000000000000000000000000000000000000000000080", ErrNotCanonical},
		{"not a curve point", "0200000000000000000000000000000000000000000000000000000000000000", ErrNotCanonical},
	} {
		b, _ := hex.DecodeString(c.hex)
		if err := Check(b); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.desc, err, c.want)
		}
	}
	if err := Check(pub[:31]); err == nil || err.Error() != "public key is 31 bytes, want 32" {
		t.Errorf("31 bytes: %v", err)
	}
}
