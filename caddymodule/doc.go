// Package caddymodule is the gateway: the Caddy v2 modules that take payment
// for routes an operator names (x402 v2), hand out a daily free allowance,
// publish what is for sale at /.well-known/x402, and serve our facilitator.
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
