// Package caddyopt holds what the modules' Caddyfile parsers share.
package caddyopt

import "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

// Once remembers the single-value options one Caddyfile block has given, so
// that a second one is refused. A parser that simply assigns lets the last
// line win without a word: a second facilitator, store or free_allowance
// silently replaced the first, and the config that loaded was not the one
// its reader sees. Options that add to a list (accept, origins, domains,
// pay_to ...) are not passed to it.
type Once map[string]bool

// Check records the option d is on (d.Val(), read before its arguments)
// and returns an error at its line when the block already gave it.
func (o Once) Check(d *caddyfile.Dispenser) error {
	name := d.Val()
	if o[name] {
		return d.Errf("%s given twice: it takes one value, and a second would silently replace the first", name)
	}
	o[name] = true
	return nil
}
