// Package evmfacilitator is a local x402 facilitator for the "exact" scheme
// on EVM chains (EIP-3009 transferWithAuthorization), and a development chain
// to run it against.
//
// Facilitator verifies payments with the reference facilitator's checks and
// reason codes, reading the token's own state (name, version, nonce,
// balance) and simulating the transfer, and settles them from a relayer key
// it holds, over any JSON-RPC endpoint. It never reports an unknown
// settlement outcome as a failure, and it budgets the settlements each
// payer makes revert on chain, at the relayer's gas (budget.go).
//
// Devnet is an in-process go-ethereum simulated chain (chain id 1337) with a
// USDC-like test token deployed and the ten well-known development accounts
// funded, optionally served over HTTP JSON-RPC for wallets and other tools.
//
// It is not a general wallet or a multi-chain router: one Facilitator settles
// on one network, from one relayer, and Permit2 payloads are refused.
package evmfacilitator
