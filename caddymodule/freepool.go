package caddymodule

import (
	"fmt"

	"github.com/caddyserver/caddy/v2"
)

// A free_allowance pool is one allowance: the store keeps one count per
// pool, client and UTC day, and each gate grants a free call while that
// count is below its own per_day. Two gates naming one pool with different
// per_day would not share an allowance but each grant against the other's
// calls (with 100 on one route and 1 on another, the second grants
// nothing once the first has served a call), and with different keys they
// count different clients and share nothing; the documents, which state a
// pool's terms once, would be wrong for one of them. So within a config
// every gate naming a pool must give it the same per_day and key.

// freePoolTerms is what the first gate of a config to name a pool gave it.
type freePoolTerms struct {
	perDay int
	key    string
	route  string // that gate's route, for the refusal
}

// freePoolsSeen holds, per config being provisioned, each pool's terms.
var freePoolsSeen perConfig[map[string]freePoolTerms]

// checkFreePool records the terms free (of the gate of route, provisioning
// in ctx) gives its pool, and refuses them when another gate of the config
// gave the pool other terms.
func checkFreePool(ctx caddy.Context, route string, free *FreeAllowance) error {
	var err error
	freePoolsSeen.with(ctx, func(pools *map[string]freePoolTerms) {
		if *pools == nil {
			*pools = map[string]freePoolTerms{}
		}
		first, seen := (*pools)[free.Pool]
		if !seen {
			(*pools)[free.Pool] = freePoolTerms{perDay: free.PerDay, key: free.Key, route: route}
			return
		}
		if first.perDay != free.PerDay || first.key != free.Key {
			err = fmt.Errorf("pool %q is one allowance, and %s gives it per_day %d, key %s, while %s gives it per_day %d, key %s: give every route of a pool the same per_day and key, or name another pool",
				free.Pool, routeOrUnnamed(first.route), first.perDay, first.key, routeOrUnnamed(route), free.PerDay, free.Key)
		}
	})
	return err
}

// routeOrUnnamed names a gate by its route for a config error.
func routeOrUnnamed(route string) string {
	if route == "" {
		return "a gate without route"
	}
	return fmt.Sprintf("route %q", route)
}
