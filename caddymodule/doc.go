// Package caddymodule is the gateway: the Caddy v2 modules that take payment
// for routes and MCP tools an operator names (x402 v2), hand out a daily free
// allowance, check wallet proofs, verify a seller's answers and attach
// receipts, publish what is for sale, and serve our facilitator.
//
// Handlers (Caddyfile directives):
//
//	x402              the payment gate and free allowance (gate.go, paid.go, free.go, mcp.go)
//	x402_discovery    /.well-known/x402 from the live routes (discovery.go)
//	wallet_auth       X-Wallet-Auth and sign-in-with-x proofs (walletauth.go)
//	verify_response   seller mode: verify the upstream's JSON, attach a receipt (verifyresponse.go)
//	aov_docs          /llms.txt, /openapi.json and /docs (docs.go)
//	x402_facilitator  the x402 facilitator HTTP API (facilitator.go)
//
// The modules are thin adapters: protocol work lives in package x402,
// request validation in package verify, state in package store. What this
// package owns is the order of decisions on a request (which refusal comes
// first, when a payment is verified, when it is settled, what the upstream
// may learn) and the Caddyfile surface.
//
// Guest module namespaces defined here:
//
//	x402.facilitators.*  a facilitator (x402.Facilitator): verify and settle
//	x402.stores.*        gateway state (free allowance counters, replay claims)
package caddymodule
