package caddymodule

import (
	"fmt"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// A free_allowance pool is one allowance: the store keeps one count per
// pool, client and UTC day, and each gate grants a free call while that
// count is below its own per_day. Two gates naming one pool in one store
// with different per_day would not share an allowance but each grant
// against the other's calls (with 100 on one route and 1 on another, the
// second grants nothing once the first has served a call), and with
// different keys they count different clients and share nothing; the
// documents, which state a pool's terms once (per_day, key and the
// largest body served free), would be wrong for one of them. So within a
// config every gate naming a pool in one store must give it the same
// per_day, key and max_body. Gates in different stores (storeIdentity)
// never meet in a count, whatever their pools are called, and a gate with
// per_day 0 grants nothing and counts nothing: neither is held to
// another's terms.

// freePoolTerms is what the first gate of a config to name a pool in a
// store gave it.
type freePoolTerms struct {
	perDay  int
	key     string
	maxBody int64
	gate    string // that gate, for the refusal (gateName)
}

// freePoolsSeen holds, per config being provisioned, each pool's terms by
// store identity and pool name.
var freePoolsSeen perConfig[map[[2]string]freePoolTerms]

// checkFreePool records the terms free (of the gate named gate, keeping its
// counts in the store free.store names, provisioning in ctx) gives its
// pool, and refuses them when another gate of the config gave the pool
// other terms in the same store.
func checkFreePool(ctx caddy.Context, gate string, free *FreeAllowance) error {
	if free.PerDay == 0 {
		return nil
	}
	var err error
	freePoolsSeen.with(ctx, func(pools *map[[2]string]freePoolTerms) {
		if *pools == nil {
			*pools = map[[2]string]freePoolTerms{}
		}
		k := [2]string{free.store, free.Pool}
		this := freePoolTerms{perDay: free.PerDay, key: free.Key, maxBody: free.MaxBody, gate: gate}
		first, seen := (*pools)[k]
		if !seen {
			(*pools)[k] = this
			return
		}
		if first.perDay != this.perDay || first.key != this.key || first.maxBody != this.maxBody {
			err = fmt.Errorf("pool %q is one allowance in one store, and %s gives it %s, while %s gives it %s: give every route of a pool the same per_day, key and max_body, or name another pool",
				free.Pool, first.gate, first.terms(), this.gate, this.terms())
		}
	})
	return err
}

// terms states t as a config error does.
func (t freePoolTerms) terms() string {
	return fmt.Sprintf("per_day %d, key %s, max_body %d", t.perDay, t.key, t.maxBody)
}

// gateName names the gate of route, provisioning in ctx, for a config
// error: its route and the server it is in (its name and listen
// addresses), so two gates of one config are told apart.
func gateName(ctx caddy.Context, route string) string {
	name := "a gate without route"
	if route != "" {
		name = fmt.Sprintf("route %q", route)
	}
	if srv, _ := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); srv != nil {
		name += fmt.Sprintf(" of server %s (%s)", srv.Name(), strings.Join(srv.Listen, " "))
	}
	return name
}
