package server

import (
	"strings"
	"testing"

	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/internal/ed25519key"
	"github.com/aovhq/aov/store"
)

// FuzzAccountAddress: an agent id read as an account id names exactly the
// address it ends in, is a bare EVM or Solana address or well-formed
// CAIP-10, and only that address (in any letter case for EVM) is its owner;
// an EVM address is 0x and 40 hex digits, nothing that folds onto them;
// 32 bytes written bare in base58 are their own account id exactly when a
// Solana proof can carry them (an Ed25519 key, ed25519key.Check), so no
// bare id belongs to an address nobody can prove.
func FuzzAccountAddress(f *testing.F) {
	for _, s := range []string{
		"0x2222222222222222222222222222222222222222", "0X2222222222222222222222222222222222222222",
		"eip155:8453:0xAbCdEf0123456789aBcDeF0123456789AbCdEf01", "eip155:8453:0x12", "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp:7xKXtg2CW87d97TXJSDpbD5jBkheTqA83TZRuJosgAsU",
		"seller-7", "my-agent:0x2222222222222222222222222222222222222222", "eip155::0x2222222222222222222222222222222222222222", "a:b:c", "EIP155:1:0x2222222222222222222222222222222222222222", "",
		"acme:invoice:v1", "team:billing:0x2222222222222222222222222222222222222222", "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp:v1",
		"solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp:17xKXtg2CW87d97TXJSDpbD5jBkheTqA83TZRuJosgAsU",
		"7xKXtg2CW87d97TXJSDpbD5jBkheTqA83TZRuJosgAsU", "17xKXtg2CW87d97TXJSDpbD5jBkheTqA83TZRuJosgAsU", "11111111111111111111111111111111",
		"MyCompanyTaxReceiptsAgentEuropeanMarketsV2a", "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp:MyCompanyTaxReceiptsAgentEuropeanMarketsV2a",
		"0x" + strings.Repeat("\x10", 40), "eip155:1:0x" + strings.Repeat("\x19", 40),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		if len(id) >= 32 {
			key := base58.Encode([]byte(id[:32]))
			a, ok := accountAddress(key)
			if provable := ed25519key.Check([]byte(id[:32])) == nil; ok != provable || (ok && a != key) {
				t.Fatalf("the bare base58 of 32 bytes %q: account %q %v, want an account exactly when a Solana proof can carry it (%v)", key, a, ok, provable)
			}
		}
		addr, ok := accountAddress(id)
		if !ok {
			if addr != "" {
				t.Fatalf("%q: not an account but address %q", id, addr)
			}
			return
		}
		if addr == "" || (id != addr && !strings.HasSuffix(id, ":"+addr)) {
			t.Fatalf("%q: account address %q is not its end", id, addr)
		}
		if id != addr && strings.Count(id, ":") != 2 {
			t.Fatalf("%q: a CAIP-10 id has exactly three parts", id)
		}
		if b, err := base58.Decode(addr); !store.IsEVMAddress(addr) && (err != nil || len(b) != 32 || base58.Encode(b) != addr) {
			t.Fatalf("%q: an account whose address no wallet proof can carry", id)
		}
		if id == addr && !store.IsEVMAddress(addr) {
			if b, _ := base58.Decode(addr); ed25519key.Check(b) != nil {
				t.Fatalf("%q: a bare Solana account no wallet proof can carry", id)
			}
		}
		if store.IsEVMAddress(addr) && strings.Trim(addr[2:], "0123456789abcdefABCDEF") != "" {
			t.Fatalf("%q: an EVM account whose address is not 40 hex digits", id)
		}
		if strings.HasPrefix(id, "eip155:") && !store.IsEVMAddress(addr) {
			t.Fatalf("%q: an eip155 account whose address is not EVM", id)
		}
		if strings.HasPrefix(id, "solana:") {
			if b, err := base58.Decode(addr); err != nil || len(b) != 32 || base58.Encode(b) != addr {
				t.Fatalf("%q: a solana account whose address is not canonical base58 of 32 bytes", id)
			}
		}
		if !store.SameWallet(addr, addr) || store.SameWallet(addr, addr+"0") || store.SameWallet(addr, "") {
			t.Fatalf("%q: SameWallet is not exact on %q", id, addr)
		}
		if store.IsEVMAddress(addr) && !store.SameWallet(addr, "0x"+strings.ToUpper(addr[2:])) {
			t.Fatalf("%q: EVM addresses must compare in any letter case", id)
		}
	})
}
