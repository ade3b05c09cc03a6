package svmfacilitator

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/aovhq/aov/internal/base58"
)

// ParseKey reads a fee payer key in either form Solana tools write: the
// solana-keygen JSON array of the 64-byte secret key, or its base58 string
// (as wallets export it). The public half must match the seed. Errors never
// quote the input.
func ParseKey(text string) (ed25519.PrivateKey, error) {
	text = strings.TrimSpace(text)
	var b []byte
	if strings.HasPrefix(text, "[") {
		var nums []int
		if err := json.Unmarshal([]byte(text), &nums); err != nil {
			return nil, errors.New("the key is not a JSON array of bytes")
		}
		for _, n := range nums {
			if n < 0 || n > 255 {
				return nil, errors.New("the key is not a JSON array of bytes")
			}
			b = append(b, byte(n))
		}
	} else {
		var err error
		if b, err = base58.Decode(text); err != nil {
			return nil, errors.New("the key is neither a JSON byte array nor base58")
		}
	}
	if len(b) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("the key is %d bytes, want a 64-byte ed25519 secret key", len(b))
	}
	key := ed25519.NewKeyFromSeed(b[:32])
	if string(key[32:]) != string(b[32:]) {
		return nil, errors.New("the key's public half does not match its seed")
	}
	return key, nil
}

// ReadKeyFile reads a fee payer key from a file that only its owner may
// read (mode 0600 or stricter): a key readable by others is refused before
// it is read.
func ReadKeyFile(path string) (ed25519.PrivateKey, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("fee payer key file: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("fee payer key file %s is readable by others (mode %#o); chmod 600 it", path, st.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("fee payer key file: %w", err)
	}
	k, err := ParseKey(string(b))
	if err != nil {
		return nil, fmt.Errorf("fee payer key file %s: %w", path, err)
	}
	return k, nil
}

// DevFeePayerSeed is the public seed of the development fee payer: its
// ed25519 seed is the SHA-256 of this text. The local chain
// (interop/solana-chain.mjs) funds it at start, so a gateway on that chain
// settles with no key file. Anyone can compute the key: development only.
const DevFeePayerSeed = "aov solana devnet fee payer"

// DevFeePayer returns the development fee payer's key.
func DevFeePayer() ed25519.PrivateKey {
	seed := sha256.Sum256([]byte(DevFeePayerSeed))
	return ed25519.NewKeyFromSeed(seed[:])
}
