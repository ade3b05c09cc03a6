package x402

import (
	"errors"
	"fmt"
	"math/big"
	"strings"
)

// maxUint256 bounds every amount: EVM tokens count in uint256.
var maxUint256 = new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), 256), big.NewInt(1))

// canonicalUint reports whether s is a decimal integer with no sign, no
// leading zeros (except "0" itself) and no other characters.
func canonicalUint(s string) bool {
	if s == "" || len(s) > 78 { // 2^256 has 78 digits
		return false
	}
	if s[0] == '0' && len(s) > 1 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// parseUint256 parses a canonical decimal string that fits in uint256.
func parseUint256(s string) (*big.Int, bool) {
	if !canonicalUint(s) {
		return nil, false
	}
	v, ok := new(big.Int).SetString(s, 10)
	if !ok || v.Cmp(maxUint256) > 0 {
		return nil, false
	}
	return v, true
}

// MaxDecimals is the most decimals an asset can have: 10^77 still fits
// uint256 (10^78 does not), so any price in such an asset can be stated in
// atomic units a token contract can move.
const MaxDecimals = 77

// ParsePrice converts a human price in whole units of an asset ("$0.02",
// "0.02", "$1") into its atomic amount for an asset with the given decimals
// ("20000" for 6 decimals). It is exact decimal string arithmetic, never
// floating point: "$0.000001" is exactly 1 unit of USDC.
//
// Accepted: an optional "$", then digits, optionally "." and at least one
// more digit. Refused, each with its own error: empty input, signs,
// exponents, NaN/Inf, spaces, thousands separators, leading zeros ("01"),
// more fractional digits than the asset has (a price the asset cannot
// express must not be silently rounded), zero (a free route has no price;
// configure it without payment) and amounts beyond uint256.
func ParsePrice(price string, decimals int) (string, error) {
	if decimals < 0 || decimals > MaxDecimals {
		return "", fmt.Errorf("parsing price: decimals %d out of range 0-%d", decimals, MaxDecimals)
	}
	s := strings.TrimPrefix(price, "$")
	if s == "" {
		return "", errors.New("parsing price: empty")
	}
	whole, frac, hasDot := strings.Cut(s, ".")
	if whole == "" || (hasDot && frac == "") {
		return "", fmt.Errorf("parsing price %q: write digits on both sides of the decimal point", truncate(price))
	}
	for _, part := range []string{whole, frac} {
		for i := 0; i < len(part); i++ {
			if part[i] < '0' || part[i] > '9' {
				return "", fmt.Errorf("parsing price %q: only digits, an optional leading $ and one decimal point are allowed", truncate(price))
			}
		}
	}
	if len(whole) > 1 && whole[0] == '0' {
		return "", fmt.Errorf("parsing price %q: leading zeros are not allowed", truncate(price))
	}
	if len(frac) > decimals {
		return "", fmt.Errorf("parsing price %q: more than %d decimal places, the asset's precision", truncate(price), decimals)
	}
	digits := strings.TrimLeft(whole+frac+strings.Repeat("0", decimals-len(frac)), "0")
	if digits == "" {
		return "", fmt.Errorf("parsing price %q: price is zero; configure a free route without payment instead", truncate(price))
	}
	if _, ok := parseUint256(digits); !ok {
		return "", fmt.Errorf("parsing price %q: amount does not fit in uint256", truncate(price))
	}
	return digits, nil
}

// ParseAmount accepts an amount already in atomic units ("20000") and
// returns it unchanged. It must be a canonical decimal integer (no sign,
// no leading zeros, no decimal point), greater than zero and within uint256,
// because Match compares amounts as strings: one amount, one spelling.
func ParseAmount(amount string) (string, error) {
	if !canonicalUint(amount) {
		return "", fmt.Errorf("parsing amount %q: must be a decimal integer of atomic units without sign or leading zeros", truncate(amount))
	}
	if amount == "0" {
		return "", errors.New("parsing amount: amount is zero; configure a free route without payment instead")
	}
	if _, ok := parseUint256(amount); !ok {
		return "", fmt.Errorf("parsing amount %q: does not fit in uint256", truncate(amount))
	}
	return amount, nil
}

// FormatAmount renders an atomic amount as a decimal number of whole units
// ("20000", 6 → "0.02"), for logs and human-facing pages. It returns amount
// unchanged when it is not a canonical integer.
func FormatAmount(amount string, decimals int) string {
	if !canonicalUint(amount) || decimals <= 0 {
		return amount
	}
	if len(amount) <= decimals {
		amount = strings.Repeat("0", decimals-len(amount)+1) + amount
	}
	whole, frac := amount[:len(amount)-decimals], strings.TrimRight(amount[len(amount)-decimals:], "0")
	if frac == "" {
		return whole
	}
	return whole + "." + frac
}
