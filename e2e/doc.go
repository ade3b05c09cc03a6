// Package e2e holds the end-to-end tests of the whole service: the real
// binaries (Caddy built from cmd/caddy, certd, verifierd, the aov command)
// built into a temporary folder, started as separate processes on free
// loopback ports with their own temporary data (real Badger, real keys),
// and driven over HTTP through Caddy configured by Caddyfile.example, the
// file operators start from.
//
// It has no code of its own; it is here to catch what unit tests of the
// parts cannot: wiring, flags, headers between processes, failure of one
// process while the others run.
package e2e
