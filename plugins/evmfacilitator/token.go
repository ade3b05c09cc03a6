package evmfacilitator

import (
	_ "embed"
	"strings"

	"github.com/ethereum/go-ethereum/accounts/abi"
	"github.com/ethereum/go-ethereum/common"
)

// The test token and test wallet, compiled by contracts/build.mjs (the
// command is in that file); TestCompiledContractsMatchSource checks these
// files against a fresh compile.
var (
	//go:embed devnet/TestUSDC.abi.json
	testUSDCABIJSON string
	//go:embed devnet/TestUSDC.bin
	testUSDCBin string
	//go:embed devnet/TestSmartWallet.abi.json
	testWalletABIJSON string
	//go:embed devnet/TestSmartWallet.bin
	testWalletBin string
)

// tokenABI is the part of an EIP-3009 token the facilitator calls. The test
// token's ABI is a superset of USDC's for these methods, so the facilitator
// uses it for any EIP-3009 token.
var tokenABI = mustABI(testUSDCABIJSON)

// erc1271ABI is EIP-1271's one method, for contract-account payers.
var erc1271ABI = mustABI(`[{"type":"function","name":"isValidSignature","stateMutability":"view",
 "inputs":[{"name":"hash","type":"bytes32"},{"name":"signature","type":"bytes"}],
 "outputs":[{"name":"","type":"bytes4"}]}]`)

// transferEventID is the topic of ERC-20 Transfer(address,address,uint256).
var transferEventID = tokenABI.Events["Transfer"].ID

// The EIP-3009 events that mark a nonce used, as USDC declares them (both
// indexed by authorizer and nonce): AuthorizationUsed when an authorization
// executes (its Transfer follows it), AuthorizationCanceled when the payer
// cancels it. Each (authorizer, nonce) gets at most one of them, ever.
var (
	authorizationUsedEventID     = tokenABI.Events["AuthorizationUsed"].ID
	authorizationCanceledEventID = tokenABI.Events["AuthorizationCanceled"].ID
)

// The two transferWithAuthorization overloads, as solc names them in the ABI
// (the first declared keeps the plain name).
var (
	methodTransferVRS   = findMethod("transferWithAuthorization", 9)
	methodTransferBytes = findMethod("transferWithAuthorization", 7)
)

func mustABI(s string) abi.ABI {
	a, err := abi.JSON(strings.NewReader(s))
	if err != nil {
		panic("embedded ABI does not parse: " + err.Error())
	}
	return a
}

// findMethod finds the overload of name with n inputs.
func findMethod(name string, n int) string {
	for key, m := range tokenABI.Methods {
		if m.RawName == name && len(m.Inputs) == n {
			return key
		}
	}
	panic("embedded ABI lacks an overload of " + name)
}

func hexCode(bin string) []byte {
	return common.FromHex(strings.TrimSpace(bin))
}
