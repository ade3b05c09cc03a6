package x402

import "testing"

func TestCheckSolanaAddress(t *testing.T) {
	for _, c := range []struct {
		addr string
		ok   bool
	}{
		{"EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v", true},
		{"11111111111111111111111111111111", true},
		{"EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZw", false}, // 28 bytes
		{"EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1vv", false},
		{"0PjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v", false}, // 0 is not base58
		{"0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913", false},
		{"", false},
	} {
		if err := CheckSolanaAddress(c.addr); (err == nil) != c.ok {
			t.Errorf("%q: %v", c.addr, err)
		}
	}
	if !IsSolana(NetworkSolanaDevnet) || IsSolana(NetworkBase) {
		t.Fatal("IsSolana")
	}
}
