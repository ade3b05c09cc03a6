package caddymodule

import (
	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
)

// A config whose x402 gates or wallet_auth keep their state in a shared
// store (Redis) is one of several instances behind a load balancer. Any
// of them left on Badger, the default when `store` is omitted, keeps its
// state on this machine only: a wallet_auth there makes wallet-proof and
// sign-in-with-x nonces single-use per instance (a proof replays on
// another instance) and paid-access records per instance (a payer who paid
// on one is asked to pay again on another); a gate there grants its free
// allowance and guards its claims per instance. One instance alone is
// still correct, so this is a warning at provision time, not a refusal.

// badgerStoreID is the module that keeps state on this machine only.
const badgerStoreID = "x402.stores.badger"

// storeUse is one gate's or wallet_auth's store in one config.
type storeUse struct {
	directive string // "x402" or "wallet_auth"
	module    string // the store module's ID
	logger    *zap.Logger
	warned    bool
}

// storeUses holds, per config being provisioned, the stores its gates and
// wallet_auth use.
var storeUses perConfig[[]*storeUse]

// noteStore records that directive (provisioning in ctx) uses store
// module mod, and warns, once per module, about each one on Badger while
// another in the same config uses a shared store. Modules provision in
// config order, so whichever of the two comes second finds the first.
func noteStore(ctx caddy.Context, directive string, mod any) {
	m, ok := mod.(caddy.Module)
	if !ok {
		return
	}
	storeUses.with(ctx, func(uses *[]*storeUse) {
		*uses = append(*uses, &storeUse{directive: directive, module: string(m.CaddyModule().ID), logger: ctx.Logger()})
		shared := ""
		for _, u := range *uses {
			if u.module != badgerStoreID {
				shared = u.module
				break
			}
		}
		if shared == "" {
			return
		}
		for _, u := range *uses {
			if u.module != badgerStoreID || u.warned {
				continue
			}
			u.warned = true
			u.logger.Warn("this "+u.directive+" keeps its state in Badger on this machine only, while others in this config use a shared store: "+
				storeMixEffect[u.directive]+"; give it the same store (e.g. `store redis { ... }`, or import the snippet the others use)",
				zap.String("store", badgerStoreID), zap.String("shared_store", shared))
		}
	})
}

// storeIdentifier is a store module that can tell which state it keeps:
// two modules with one identity are one store (one Badger folder, one
// Redis database and prefix), and share every count and claim.
type storeIdentifier interface {
	StoreIdentity() string
}

// storeIdentity is the identity of store module mod: its module ID and
// what it says of itself. A module that says nothing is taken as one
// store with every other of its module ID, so checks between the gates of
// one store (checkFreePool) hold it to the others' terms rather than
// miss a conflict.
func storeIdentity(mod any) string {
	id := ""
	if m, ok := mod.(caddy.Module); ok {
		id = string(m.CaddyModule().ID)
	}
	if s, ok := mod.(storeIdentifier); ok {
		id += "\x00" + s.StoreIdentity()
	}
	return id
}

// storeMixEffect says what a directive's state on one machine costs when
// several instances share the traffic.
var storeMixEffect = map[string]string{
	"wallet_auth": "across instances a wallet-proof or sign-in-with-x nonce is single-use per instance (a proof can be replayed on another) and a paid-access record is per instance (a payer is asked to pay again on another)",
	"x402":        "across instances its free allowance is granted per instance and its payment claims guard one instance only",
}
