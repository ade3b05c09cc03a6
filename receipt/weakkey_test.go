package receipt

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
)

// weakKeys are Ed25519 public keys under which signatures can be forged:
// the eight points of small order (Wycheproof's and RFC 8032 test lists;
// the identity 01 00…00 first), and non-canonical encodings (a y of p or
// more, or x = 0 with the sign bit set) that decode to such points or that
// strict readers refuse.
var weakKeys = []string{
	"0100000000000000000000000000000000000000000000000000000000000000",
	"ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
	"0000000000000000000000000000000000000000000000000000000000000000",
	"0000000000000000000000000000000000000000000000000000000000000080",
	"c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",
	"c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa",
	"26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",
	"26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc85",
	// Non-canonical: y = p + 1 (the identity again), y = p (y = 0),
	// the identity with the sign bit set, y = 2^255 - 1.
	"eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
	"edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
	"0100000000000000000000000000000000000000000000000000000000000080",
	"ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
}

// forgedReceipt is a receipt nobody signed, with the signature
// 01 00…00 ‖ 00…00 that crypto/ed25519 accepts on any message under the
// identity key.
func forgedReceipt() []byte {
	sig := make([]byte, ed25519.SignatureSize)
	sig[0] = 1
	return []byte(`{"result":"pass","task_id":"anything","output_hash":"` + strings.Repeat("ab", 32) +
		`","verified_at":"2026-11-29T21:22:28Z","verify":{"key_version":"k1"},"attestation":{"algorithm":"Ed25519","key_version":"k1","timestamp":"2026-11-29T21:22:28Z","signature":"` +
		base64.StdEncoding.EncodeToString(sig) + `"}}`)
}

func cardWithKey(pub []byte) []byte {
	card, _ := json.Marshal(map[string]any{"capabilities": map[string]any{"extensions": []any{
		map[string]any{"uri": ExtensionURI, "params": map[string]any{"publicKeys": []any{
			map[string]any{"keyVersion": "k1", "algorithm": "Ed25519", "publicKeyEncoding": "base64", "status": "current",
				"publicKey": base64.StdEncoding.EncodeToString(pub)}}}}}}})
	return card
}

// A key of small order, or not canonically encoded, is refused wherever a
// key is read: on a card, given bare (aov receipt verify --public-key), or
// handed to SingleKey. Under the identity key crypto/ed25519 accepts
// a signature anyone can write on any receipt.
func TestWeakPublicKeysAreRefusedWhereKeysAreRead(t *testing.T) {
	forged := forgedReceipt()
	if !ed25519.Verify(mustHex(t, weakKeys[0]), []byte("any message"), mustHex(t, "01"+strings.Repeat("00", 63))) {
		t.Fatal("the forgery this guards against no longer verifies in crypto/ed25519; the vectors are wrong")
	}
	for _, h := range weakKeys {
		pub := mustHex(t, h)
		if err := CheckPublicKey(pub); err == nil {
			t.Errorf("CheckPublicKey(%s) accepts it", h)
		}
		if _, err := KeysFromCard(cardWithKey(pub)); err == nil || !strings.Contains(err.Error(), "publicKeys[0]: public key is") {
			t.Errorf("KeysFromCard with key %s: %v, want the card refused", h, err)
		}
		if _, err := ParsePublicKey(base64.StdEncoding.EncodeToString(pub)); err == nil {
			t.Errorf("ParsePublicKey(%s) accepts it", h)
		}
		for _, ks := range []KeySet{SingleKey("", pub), SingleKey("k1", pub)} {
			if err := VerifyReceipt(forged, ks, ""); err == nil || err == ErrSignature {
				t.Errorf("the forged receipt under SingleKey(%s): %v, want the key refused", h, err)
			}
		}
	}
	// A real key still reads, and its receipts verify.
	pub, priv, _ := ed25519.GenerateKey(nil)
	if err := CheckPublicKey(pub); err != nil {
		t.Fatal(err)
	}
	ks, err := KeysFromCard(cardWithKey(pub))
	if err != nil {
		t.Fatal(err)
	}
	genuine := attach(t, priv, ContextVerify, "k1", fixtureTime, fullResponse(t, "k1"))
	if err := VerifyReceipt(genuine, ks, ""); err != nil {
		t.Fatal(err)
	}
	if err := VerifyReceipt(forged, ks, ""); err != ErrSignature {
		t.Fatalf("the forged receipt under a real key: %v", err)
	}
}
