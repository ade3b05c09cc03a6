// Command caddy is the Caddy server of this repository: Caddy v2 with its
// standard modules plus the aov gateway modules, pinned by this module's
// go.sum so it builds offline from the module cache (`go build ./cmd/caddy`).
//
// It is what `make run` and the end-to-end tests use. Operators who want
// extra third-party plugins build their own binary with xcaddy.sh instead;
// this one carries exactly what the repository pins.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	// Caddy's standard modules (http, tls, reverse_proxy, file_server, ...).
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	// The gateway: x402 payment gate, free allowance, discovery, stores.
	_ "github.com/aovhq/aov/caddymodule"
	// x402.stores.redis: shared state for several gateway instances.
	_ "github.com/aovhq/aov/plugins/redisstore"
)

func main() {
	caddycmd.Main()
}
