// Package x402 implements the x402 version 2 payment protocol as the gateway
// and the facilitators need it: the wire types and their JSON names, the
// PAYMENT-* header codec, matching a client's chosen requirements against the
// server's offers, prices in atomic units, networks and assets, the "exact"
// scheme on EVM chains (EIP-712 / EIP-3009 digests, signing and recovery), and
// the facilitator HTTP API as both a client and a server handler.
//
// It is not a gateway: it holds no replay state, decides no HTTP status for a
// paid route and talks to no chain. The Caddy modules own those decisions; the
// local EVM facilitator owns the chain. Everything here is pure or speaks only
// the facilitator HTTP API, so the same code serves the gateway, the
// facilitator and the tests.
//
// Untrusted input enters through DecodePaymentSignature (the PAYMENT-SIGNATURE
// header), ParseExactEVMPayload (the scheme payload inside it) and the
// facilitator handler (request bodies). Each rejects what it cannot prove
// well-formed, returns a typed error that says which rule failed, and never
// copies the input into an error message.
package x402
