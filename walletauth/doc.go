// Package walletauth proves, per request, that the caller controls a wallet:
// the X-Wallet-Auth header (parse, build, sign, verify), the x402
// sign-in-with-x proof (SIGN-IN-WITH-X), and the record of who already paid
// for a resource that sign-in-with-x grants access on.
//
// # X-Wallet-Auth
//
// The header value is standard padded base64 of one JSON object:
//
//	{
//	  "domain":          "verifier.example",                  // the site name (host[:port]) the request is sent to
//	  "address":         "0x9858EfFD232B4033E47d90003D41EC34EcaEda94", // EIP-55
//	  "uri":             "https://verifier.example/verify/schema",     // scheme://domain + path
//	  "version":         "1",
//	  "chain_id":        "eip155:8453",                       // CAIP-2
//	  "nonce":           "3f9c0d1e7a2b4c5d6e7f8091",          // 16..128 letters and digits, single use
//	  "issued_at":       "2026-11-29T21:22:28Z",              // RFC 3339
//	  "expiration_time": "2026-11-29T21:27:28Z",              // at most the verifier's max lifetime after issued_at
//	  "not_before":      "2026-11-29T21:22:28Z",              // optional
//	  "statement":       "Verify my agent's output",          // optional, one line
//	  "method":          "POST",                              // the request this proof is for
//	  "path":            "/verify/schema",
//	  "agent_id":        "seller-7",                          // optional: binds this agent to the wallet
//	  "type":            "eip191",
//	  "signature":       "0x…"                                // 65 bytes, personal_sign of the text below
//	}
//
// The signature is an EIP-191 personal_sign over the EIP-4361 (Sign-In with
// Ethereum, CAIP-122) text of these fields, which the verifier always
// rebuilds itself; a client never sends the text:
//
//	verifier.example wants you to sign in with your Ethereum account:
//	0x9858EfFD232B4033E47d90003D41EC34EcaEda94
//
//	Verify my agent's output
//
//	URI: https://verifier.example/verify/schema
//	Version: 1
//	Chain ID: 8453
//	Nonce: 3f9c0d1e7a2b4c5d6e7f8091
//	Issued At: 2026-11-29T21:22:28Z
//	Expiration Time: 2026-11-29T21:27:28Z
//	Not Before: 2026-11-29T21:22:28Z
//	Resources:
//	- urn:x-wallet-auth:method:POST
//	- urn:x-wallet-auth:agent:seller-7
//
// The method is bound by the first resource and the path by the URI; the
// agent id, when present, by the second resource (percent-encoded: every
// byte outside A–Z a–z 0–9 - . _ ~ as %XX, upper-case hex). Without a
// statement the line and its following blank line are absent, exactly as
// EIP-4361 and viem's createSiweMessage write it. Any EIP-4361 library can
// therefore produce the signature.
//
// A verifier accepts a header only when every field is well formed, the
// domain is one of the verifier's site names (Verifier.Domains, configured
// by the operator: never the request's Host header, which the client
// chooses), the method and path are those of the request, the current time is
// within [not_before, expiration_time) and after issued_at (with a small
// clock skew), the lifetime is within the configured maximum, the signature
// recovers to the address (or, for a contract wallet on the configured
// chain, its EIP-1271 isValidSignature accepts it), and the nonce was never
// used before by that address. Each refusal says which of these failed and
// never repeats the header's content.
//
// # sign-in-with-x
//
// SIGN-IN-WITH-X carries the x402 extension's proof: base64 JSON with the
// camelCase CAIP-122 fields (domain, address, statement, uri, version,
// chainId, type, nonce, issuedAt, expirationTime, notBefore, requestId,
// resources, signature). Its text is built by the same rules (with the
// client's own resources and request id); the domain must be one of the
// site names, the uri must be on that origin and name the request's path
// (no query: a proof is for one resource), issuedAt at most five
// minutes old, no resource may be X-Wallet-Auth's (urn:x-wallet-auth:…:
// such a text is an X-Wallet-Auth proof, bound to one method and path,
// not a sign-in), and the nonce unused. Both headers claim a wallet's
// nonces in one namespace, so one signature is spent once whichever
// header carries it.
//
// This package has no HTTP server or Caddy code: the gateway's wallet_auth
// handler (package caddymodule) calls it, and the aov command builds headers
// with it. It is not a session system: every proof is for one request.
package walletauth
