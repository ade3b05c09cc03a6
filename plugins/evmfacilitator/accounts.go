package evmfacilitator

import (
	"crypto/ecdsa"
	"fmt"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"
)

// DevMnemonic is the public test mnemonic every Ethereum development tool
// (Hardhat, Anvil, Foundry) uses. Its keys are known to everyone: never send
// real funds to these accounts.
const DevMnemonic = "test test test test test test test test test test test junk"

// DevAccount is one of the ten well-known development accounts of
// DevMnemonic, derived at m/44'/60'/0'/0/<Index>.
type DevAccount struct {
	Index int
	// Address is the EIP-55 checksummed address.
	Address common.Address
	// PrivateKeyHex is the 32-byte private key as 0x-prefixed hex.
	PrivateKeyHex string
}

// devKeys are the private keys of DevMnemonic at m/44'/60'/0'/0/0..9.
// go-ethereum has no BIP-32/BIP-39 derivation in-tree, so they are written
// out here; TestDevAccounts checks each against its address, and the interop
// test re-derives them from the mnemonic with viem when the npm peers are
// installed.
var devKeys = [10]struct{ key, addr string }{
	{"0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80", "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"},
	{"0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d", "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"},
	{"0x5de4111afa1a4b94908f83103eb1f1706367c2e68ca870fc3fb9a804cdab365a", "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC"},
	{"0x7c852118294e51e653712a81e05800f419141751be58f605c371e15141b007a6", "0x90F79bf6EB2c4f870365E785982E1f101E93b906"},
	{"0x47e179ec197488593b187f80a00eb0da91f1b9d0b13f8733639f19c30a34926a", "0x15d34AAf54267DB7D7c367839AAf71A00a2C6A65"},
	{"0x8b3a350cf5c34c9194ca85829a2df0ec3153be0318b5e2d3348e872092edffba", "0x9965507D1a55bcC2695C58ba16FB37d819B0A4dc"},
	{"0x92db14e403b83dfe3df233f83dfa3a0d7096f21ca9b0d6d6b8d88b2b4ec1564e", "0x976EA74026E726554dB657fA54763abd0C3a0aa9"},
	{"0x4bbbf85ce3377467afe5d46f804f221813b2bb87f24d81f60f1fcdbf7cbf4356", "0x14dC79964da2C08b23698B3D3cc7Ca32193d9955"},
	{"0xdbda1821b80551c9d65939329250298aa3472ba22feea921c0cf5d620ea67b97", "0x23618e81E3f5cdF7f54C3d65f7FBc0aBf5B21E8f"},
	{"0x2a871d0798f97d79848a013d4936a73bf4cc922c825d33c1cf7073dff6d409c6", "0xa0Ee7A142d267C1f36714E4a8F75612F20a79720"},
}

// DevAccounts returns the ten development accounts. On the devnet account 0
// is the deployer of the test token and the facilitator's relayer; accounts
// 1 to 9 are payers, each funded with ETH and 1,000,000 test USDC.
func DevAccounts() []DevAccount {
	out := make([]DevAccount, len(devKeys))
	for i, k := range devKeys {
		out[i] = DevAccount{Index: i, Address: common.HexToAddress(k.addr), PrivateKeyHex: k.key}
	}
	return out
}

// Key parses the account's private key.
func (a DevAccount) Key() *ecdsa.PrivateKey {
	k, err := crypto.HexToECDSA(a.PrivateKeyHex[2:])
	if err != nil {
		panic(fmt.Sprintf("development key %d does not parse: %v", a.Index, err)) // constants, checked by tests
	}
	return k
}

// DevKey returns the private key of development account i (0..9).
func DevKey(i int) *ecdsa.PrivateKey { return DevAccounts()[i].Key() }
