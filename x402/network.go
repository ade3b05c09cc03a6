package x402

import (
	"errors"
	"fmt"
	"math/big"
	"strings"
	"sync"

	"github.com/ethereum/go-ethereum/common"

	"github.com/aovhq/aov/internal/base58"
)

// CAIP-2 chain ids of the networks operators name by alias.
const (
	NetworkBase         = "eip155:8453"
	NetworkBaseSepolia  = "eip155:84532"
	NetworkDevnet       = "eip155:1337" // go-ethereum's simulated chain and geth --dev
	NetworkSolana       = "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp"
	NetworkSolanaDevnet = "solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1"
)

var networkAliases = map[string]string{
	"base":          NetworkBase,
	"base-sepolia":  NetworkBaseSepolia,
	"devnet":        NetworkDevnet,
	"solana":        NetworkSolana,
	"solana-devnet": NetworkSolanaDevnet,
}

// ResolveNetwork turns an operator's network name into a CAIP-2 chain id.
// The aliases are base, base-sepolia, devnet (eip155:1337), solana and
// solana-devnet, matched case-insensitively. Anything else must already be a
// CAIP-2 id (namespace:reference, namespace [-a-z0-9]{3,8}, reference
// [-_a-zA-Z0-9]{1,32}); eip155 references must be canonical decimal chain
// ids, so one chain has one spelling and matching stays a string compare.
func ResolveNetwork(name string) (string, error) {
	if id, ok := networkAliases[strings.ToLower(name)]; ok {
		return id, nil
	}
	if !ValidCAIP2(name) {
		return "", fmt.Errorf("network %q is neither a known alias (base, base-sepolia, devnet, solana, solana-devnet) nor a CAIP-2 chain id", truncate(name))
	}
	return name, nil
}

// ValidCAIP2 reports whether s is a CAIP-2 chain id, and for eip155 whether
// its reference is a canonical positive decimal chain id.
func ValidCAIP2(s string) bool {
	ns, ref, ok := strings.Cut(s, ":")
	if !ok || len(ns) < 3 || len(ns) > 8 || len(ref) < 1 || len(ref) > 32 {
		return false
	}
	for i := 0; i < len(ns); i++ {
		c := ns[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-') {
			return false
		}
	}
	for i := 0; i < len(ref); i++ {
		c := ref[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	if ns == "eip155" {
		return canonicalUint(ref) && ref != "0"
	}
	return true
}

// IsEVM reports whether network is an eip155 chain.
func IsEVM(network string) bool { return strings.HasPrefix(network, "eip155:") }

// IsSolana reports whether network is a solana chain.
func IsSolana(network string) bool { return strings.HasPrefix(network, "solana:") }

// CheckSolanaAddress accepts a base58 Solana account address (32 bytes).
// It is for addresses an operator types (payTo, mints).
func CheckSolanaAddress(s string) error {
	if b, err := base58.Decode(s); err != nil || len(b) != 32 {
		return fmt.Errorf("address %q is not a base58 Solana address", truncate(s))
	}
	return nil
}

// ChainID returns the EIP-155 chain id of an eip155 CAIP-2 network; it is the
// chainId of the EIP-712 domain that exact EVM payments sign.
func ChainID(network string) (*big.Int, error) {
	if !IsEVM(network) || !ValidCAIP2(network) {
		return nil, fmt.Errorf("network %q is not an eip155 CAIP-2 chain id", truncate(network))
	}
	id, _ := new(big.Int).SetString(strings.TrimPrefix(network, "eip155:"), 10)
	return id, nil
}

// Asset is a token that payments can be made in. For EVM tokens Name and
// Version are the EIP-712 domain the token verifies signatures against
// (they go into PaymentRequirements.Extra as "name" and "version"); they are
// unused on Solana.
type Asset struct {
	Network  string
	Address  string
	Name     string
	Version  string
	Decimals int
}

// Extra returns the requirements' extra members an exact EVM client needs
// to sign for this asset: {"name": ..., "version": ...}. Nil for non-EVM
// assets.
func (a Asset) Extra() map[string]any {
	if !IsEVM(a.Network) {
		return nil
	}
	return map[string]any{"name": a.Name, "version": a.Version}
}

// Built-in USDC deployments. The EVM domains are those the contracts report
// on chain (Base: "USD Coin" v2, Base Sepolia: "USDC" v2).
var builtinAssets = []Asset{
	{Network: NetworkBase, Address: "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913", Name: "USD Coin", Version: "2", Decimals: 6},
	{Network: NetworkBaseSepolia, Address: "0x036CbD53842c5426634e7929541eC2318f3dCF7e", Name: "USDC", Version: "2", Decimals: 6},
	{Network: NetworkSolana, Address: "EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v", Decimals: 6},
	{Network: NetworkSolanaDevnet, Address: "4zMMC9srt5Ri5X14GAgXhaHii3GnPAEERYPJgZJDncDU", Decimals: 6},
}

var (
	assetsMu sync.RWMutex
	assets   = func() map[string]Asset {
		m := make(map[string]Asset, len(builtinAssets))
		for _, a := range builtinAssets {
			m[a.Network] = a
		}
		return m
	}()
)

// ErrBuiltinAsset is returned by RegisterAsset for a network whose USDC is
// built in: a plugin must not be able to redirect payments on a real chain
// to a token of its choosing.
var ErrBuiltinAsset = errors.New("the network's USDC is built in and cannot be replaced")

// USDC returns the USDC (or, on a devnet, the USDC-like test token) of a
// CAIP-2 network. The devnet's token has no fixed address: the devnet
// registers it with RegisterAsset when it deploys it.
func USDC(network string) (Asset, bool) {
	assetsMu.RLock()
	defer assetsMu.RUnlock()
	a, ok := assets[network]
	return a, ok
}

// LookupAsset returns the registered asset of network at address (EVM
// addresses compared case-insensitively); a facilitator uses it to learn a
// token's EIP-712 domain and decimals.
func LookupAsset(network, address string) (Asset, bool) {
	a, ok := USDC(network)
	if !ok || !sameAddress(network, a.Address, address) {
		return Asset{}, false
	}
	return a, true
}

// RegisterAsset makes a the USDC of its network, replacing an earlier
// registration (a restarted devnet deploys its token at a new address). It
// refuses the built-in networks (ErrBuiltinAsset) and malformed assets: the
// network must be CAIP-2, an EVM asset needs a 0x address (with a valid
// EIP-55 checksum when mixed-case), an EIP-712 name and version, and
// decimals must be 0–77 (so that any amount fits uint256 arithmetic).
func RegisterAsset(a Asset) error {
	if !ValidCAIP2(a.Network) {
		return fmt.Errorf("registering asset: network %q is not a CAIP-2 chain id", truncate(a.Network))
	}
	for _, b := range builtinAssets {
		if b.Network == a.Network {
			return fmt.Errorf("registering asset on %s: %w", a.Network, ErrBuiltinAsset)
		}
	}
	if a.Decimals < 0 || a.Decimals > MaxDecimals {
		return fmt.Errorf("registering asset: decimals %d out of range 0-%d", a.Decimals, MaxDecimals)
	}
	if IsEVM(a.Network) {
		if err := CheckEVMAddress(a.Address); err != nil {
			return fmt.Errorf("registering asset: %w", err)
		}
		if a.Name == "" || a.Version == "" {
			return errors.New("registering asset: an EVM token needs its EIP-712 name and version")
		}
		a.Address = common.HexToAddress(a.Address).Hex()
	} else if a.Address == "" {
		return errors.New("registering asset: address is empty")
	}
	assetsMu.Lock()
	assets[a.Network] = a
	assetsMu.Unlock()
	return nil
}

// isHexAddress reports whether s is "0x" followed by 40 hex digits.
func isHexAddress(s string) bool {
	if len(s) != 42 || s[0] != '0' || (s[1] != 'x' && s[1] != 'X') {
		return false
	}
	for i := 2; i < 42; i++ {
		if !isHex(s[i]) {
			return false
		}
	}
	return true
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// CheckEVMAddress accepts "0x" + 40 hex digits; an address that mixes upper
// and lower case must carry a valid EIP-55 checksum. It is for addresses an
// operator types (payTo, assets), where a checksum catches a typo before
// money goes to the wrong place. Addresses from clients are compared
// checksum-agnostically instead (see Match).
func CheckEVMAddress(s string) error {
	if !isHexAddress(s) || s[1] != 'x' {
		return fmt.Errorf("address %q is not 0x followed by 40 hex digits", truncate(s))
	}
	body := s[2:]
	if body == strings.ToLower(body) || body == strings.ToUpper(body) {
		return nil
	}
	if common.HexToAddress(s).Hex() != s {
		return fmt.Errorf("address %q has an invalid EIP-55 checksum", truncate(s))
	}
	return nil
}

// CheckPayTo accepts payTo as the receiver of payments in asset on network:
// an address of the network's form (CheckEVMAddress, CheckSolanaAddress)
// that is neither the zero address nor asset's own. Both are black holes
// no format check catches: USDC refuses a transfer to address(0), so every
// settlement fails after the paid work was done; a transfer to the token's
// contract (on Solana, to an account owned by the mint or by the system
// program, the all-zero key) succeeds, and nobody can ever move the money
// again. Other addresses nobody controls cannot be told from a wallet,
// and are the operator's to get right. With network "" only the zero
// address of either form is refused (an operator's address list that
// spans networks).
func CheckPayTo(network, payTo, asset string) error {
	switch {
	case IsEVM(network):
		if err := CheckEVMAddress(payTo); err != nil {
			return err
		}
	case IsSolana(network):
		if err := CheckSolanaAddress(payTo); err != nil {
			return err
		}
	}
	if isZeroAddress(payTo) {
		return fmt.Errorf("address %q is the zero address, which no one controls: a payment to it is refused or lost", truncate(payTo))
	}
	if asset != "" && sameAddress(network, payTo, asset) {
		return fmt.Errorf("address %q is the address of the offer's asset: a payment to the token itself is lost", truncate(payTo))
	}
	return nil
}

// isZeroAddress reports whether s is the EVM zero address (in any case) or
// the all-zero Solana key (the system program's id).
func isZeroAddress(s string) bool {
	if isHexAddress(s) {
		return strings.Trim(s[2:], "0") == ""
	}
	b, err := base58.Decode(s)
	return err == nil && len(b) == 32 && strings.Trim(string(b), "\x00") == ""
}

// sameAddress compares two asset or payee addresses of network: EVM
// addresses case-insensitively (checksums are presentation), anything else
// (Solana base58 is case-sensitive) exactly.
func sameAddress(network, a, b string) bool {
	if IsEVM(network) || (isHexAddress(a) && isHexAddress(b)) {
		return isHexAddress(a) && isHexAddress(b) && strings.EqualFold(a[2:], b[2:])
	}
	return a == b
}

// truncate shortens operator input quoted in errors.
func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
