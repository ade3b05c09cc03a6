// Package base58 is the Bitcoin-alphabet base58 that Solana writes keys,
// signatures and blockhashes in. One implementation, shared by the x402
// network checks, the Solana facilitator and Solana wallet proofs.
package base58

import (
	"errors"
	"math/big"
)

const b58Alphabet = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"

var b58Index = func() [256]int8 {
	var t [256]int8
	for i := range t {
		t[i] = -1
	}
	for i := 0; i < len(b58Alphabet); i++ {
		t[b58Alphabet[i]] = int8(i)
	}
	return t
}()

// IsDigit reports whether c is one of the 58 digits (no 0, O, I or l).
func IsDigit(c byte) bool { return b58Index[c] >= 0 }

// ErrInvalid is returned for input that is not base58.
var ErrInvalid = errors.New("not base58")

// Encode writes b in base58.
func Encode(b []byte) string {
	zeros := 0
	for zeros < len(b) && b[zeros] == 0 {
		zeros++
	}
	// log(256)/log(58) < 1.37
	out := make([]byte, 0, len(b)*137/100+1)
	n := new(big.Int).SetBytes(b[zeros:])
	mod, base := new(big.Int), big.NewInt(58)
	for n.Sign() > 0 {
		n.DivMod(n, base, mod)
		out = append(out, b58Alphabet[mod.Int64()])
	}
	for i := 0; i < zeros; i++ {
		out = append(out, '1')
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return string(out)
}

// Decode decodes s; it refuses characters outside the alphabet and
// inputs longer than 128 characters (nothing Solana writes is longer).
func Decode(s string) ([]byte, error) {
	if len(s) == 0 || len(s) > 128 {
		return nil, ErrInvalid
	}
	zeros := 0
	for zeros < len(s) && s[zeros] == '1' {
		zeros++
	}
	n, base := new(big.Int), big.NewInt(58)
	for i := zeros; i < len(s); i++ {
		v := b58Index[s[i]]
		if v < 0 {
			return nil, ErrInvalid
		}
		n.Mul(n, base)
		n.Add(n, big.NewInt(int64(v)))
	}
	body := n.Bytes()
	out := make([]byte, zeros+len(body))
	copy(out[zeros:], body)
	return out, nil
}
