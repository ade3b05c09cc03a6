package x402

import (
	"errors"
	"strings"
	"testing"

	"github.com/ethereum/go-ethereum/common"
)

func TestResolveNetwork(t *testing.T) {
	for _, tc := range []struct {
		desc, in, want string
	}{
		{"base is eip155:8453", "base", "eip155:8453"},
		{"base-sepolia is eip155:84532", "base-sepolia", "eip155:84532"},
		{"devnet is eip155:1337", "devnet", "eip155:1337"},
		{"aliases are case-insensitive", "Base-Sepolia", "eip155:84532"},
		{"solana is the mainnet genesis id", "solana", NetworkSolana},
		{"solana-devnet is the devnet genesis id", "solana-devnet", NetworkSolanaDevnet},
		{"a CAIP-2 id passes through", "eip155:10", "eip155:10"},
		{"a non-EVM CAIP-2 id passes through", "cosmos:cosmoshub-4", "cosmos:cosmoshub-4"},
		{"an unknown name is refused", "ethereum-mainnet", ""},
		{"an empty name is refused", "", ""},
		{"an upper-case namespace is refused", "EIP155:8453", ""},
		{"a two-letter namespace is refused", "ab:1", ""},
		{"an empty reference is refused", "eip155:", ""},
		{"a 33-character reference is refused", "solana:" + strings.Repeat("a", 33), ""},
		{"a reference with a dot is refused", "foo:a.b", ""},
		{"an eip155 reference with a leading zero is refused", "eip155:08453", ""},
		{"an eip155 reference that is not a number is refused", "eip155:base", ""},
		{"chain id zero is refused", "eip155:0", ""},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			got, err := ResolveNetwork(tc.in)
			wantParsed(t, got, err, tc.want)
		})
	}
}

func TestChainID(t *testing.T) {
	for _, tc := range []struct {
		desc, in, want string
	}{
		{"Base's chain id is 8453", NetworkBase, "8453"},
		{"the devnet's chain id is 1337", NetworkDevnet, "1337"},
		{"a chain id beyond int64 is exact", "eip155:99999999999999999999", "99999999999999999999"},
		{"Solana has no chain id", NetworkSolana, ""},
		{"an alias is not a CAIP-2 id", "base", ""},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			got, err := ChainID(tc.in)
			if tc.want == "" {
				if err == nil {
					t.Fatalf("accepted as %v", got)
				}
				return
			}
			if err != nil || got.String() != tc.want {
				t.Fatalf("got %v, %v", got, err)
			}
		})
	}
}

func TestUSDC(t *testing.T) {
	for _, tc := range []struct {
		desc, network, address, name string
	}{
		{"Base USDC is USD Coin version 2 at 0x8335…2913", NetworkBase, "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913", "USD Coin"},
		{"Base Sepolia USDC is USDC version 2 at 0x036C…CF7e", NetworkBaseSepolia, "0x036CbD53842c5426634e7929541eC2318f3dCF7e", "USDC"},
		{"Solana USDC is the EPjF… mint", NetworkSolana, "EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v", ""},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			a, ok := USDC(tc.network)
			if !ok || a.Address != tc.address || a.Name != tc.name || a.Decimals != 6 {
				t.Fatalf("got %+v", a)
			}
			if IsEVM(tc.network) && (a.Version != "2" || a.Extra()["name"] != tc.name || a.Extra()["version"] != "2") {
				t.Fatalf("EIP-712 domain %+v", a)
			}
			if _, ok := LookupAsset(tc.network, strings.ToLower(tc.address)); IsEVM(tc.network) && !ok {
				t.Fatal("lookup by lower-case address failed")
			}
		})
	}
	if _, ok := USDC("eip155:999999"); ok {
		t.Fatal("an unknown network has a USDC")
	}
}

func TestRegisterAsset(t *testing.T) {
	const net = "eip155:31337" // a network no other test uses
	good := Asset{Network: net, Address: "0x5fbdb2315678afecb367f032d93f642f64180aa3", Name: "USD Coin", Version: "2", Decimals: 6}
	for _, tc := range []struct {
		desc    string
		a       Asset
		wantErr error // nil: accepted; errAny: any error
	}{
		{"a devnet token with its EIP-712 domain is registered", good, nil},
		{"a re-deployed devnet token replaces the earlier one", Asset{Network: net, Address: "0xe7f1725E7734CE288F8367e1Bb143E90bb3F0512", Name: "USD Coin", Version: "2", Decimals: 6}, nil},
		{"Base's USDC cannot be replaced", Asset{Network: NetworkBase, Address: good.Address, Name: "x", Version: "1", Decimals: 6}, ErrBuiltinAsset},
		{"Base Sepolia's USDC cannot be replaced", Asset{Network: NetworkBaseSepolia, Address: good.Address, Name: "x", Version: "1", Decimals: 6}, ErrBuiltinAsset},
		{"an alias instead of a CAIP-2 id is refused", Asset{Network: "devnet", Address: good.Address, Name: "a", Version: "1"}, errAny},
		{"an EVM token without a name is refused", Asset{Network: net, Address: good.Address, Version: "2", Decimals: 6}, errAny},
		{"an EVM token without a version is refused", Asset{Network: net, Address: good.Address, Name: "USD Coin", Decimals: 6}, errAny},
		{"a short address is refused", Asset{Network: net, Address: "0x5fbdb2315678afecb367f032d93f642f64180a", Name: "a", Version: "1"}, errAny},
		{"a mixed-case address with a bad checksum is refused", Asset{Network: net, Address: "0xE7f1725E7734CE288F8367e1Bb143E90bb3F0512", Name: "a", Version: "1"}, errAny},
		{"78 decimals are refused", Asset{Network: net, Address: good.Address, Name: "a", Version: "1", Decimals: 78}, errAny},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			err := RegisterAsset(tc.a)
			switch {
			case tc.wantErr == nil && err != nil:
				t.Fatal(err)
			case tc.wantErr == errAny && err == nil, tc.wantErr != nil && tc.wantErr != errAny && !errors.Is(err, tc.wantErr):
				t.Fatalf("got %v, want %v", err, tc.wantErr)
			case tc.wantErr == nil:
				got, ok := USDC(tc.a.Network)
				if !ok || !strings.EqualFold(got.Address, tc.a.Address) || got.Name != tc.a.Name {
					t.Fatalf("registered %+v, USDC returns %+v", tc.a, got)
				}
				if got.Address != toChecksum(tc.a.Address) {
					t.Fatalf("address %s is not stored checksummed", got.Address)
				}
			}
		})
	}
	if a, _ := USDC(NetworkBase); a.Name != "USD Coin" {
		t.Fatal("a refused registration changed Base's USDC")
	}
}

var errAny = errors.New("any error")

func TestCheckEVMAddress(t *testing.T) {
	for _, tc := range []struct {
		desc, in string
		ok       bool
	}{
		{"a checksummed address is accepted", "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913", true},
		{"an all-lower-case address is accepted", "0x833589fcd6edb6e08f4c7c32d4f71b54bda02913", true},
		{"an all-upper-case address is accepted", "0x833589FCD6EDB6E08F4C7C32D4F71B54BDA02913", true},
		{"a mixed-case address with a wrong checksum is refused", "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"[:41] + "4", false},
		{"a mixed-case address with one flipped letter is refused", "0x833589FCD6eDb6E08f4c7C32D4f71b54bdA02913", false},
		{"an address without 0x is refused", "833589fcd6edb6e08f4c7c32d4f71b54bda02913aa", false},
		{"a 0X prefix is refused", "0X833589fcd6edb6e08f4c7c32d4f71b54bda02913", false},
		{"a non-hex digit is refused", "0x833589fcd6edb6e08f4c7c32d4f71b54bda0291g", false},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			if err := CheckEVMAddress(tc.in); (err == nil) != tc.ok {
				t.Fatalf("ok=%v err=%v", tc.ok, err)
			}
		})
	}
}

func toChecksum(s string) string { return common.HexToAddress(s).Hex() }
