package caddymodule

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/aovhq/aov/internal/caddyopt"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// FacilitatorDiscovery bounds the facilitator's bazaar discovery list (GET
// <prefix>/discovery/resources), or turns it off. The list is kept in the
// facilitator's store, so it survives reloads and restarts, and instances
// on one Redis store list the same resources; give them the same bounds.
type FacilitatorDiscovery struct {
	// Off serves no list (the endpoint is 404) and records nothing.
	Off bool `json:"off,omitempty"`
	// MaxEntries is the most resources listed; a new one on a full list
	// evicts the one settled for longest ago. Default 1000.
	MaxEntries int `json:"max_entries,omitempty"`
	// MaxEntryBytes bounds what one resource keeps of its bazaar extension
	// and description; a larger one is not listed. Default 32 KiB.
	MaxEntryBytes int `json:"max_entry_bytes,omitempty"`
	// MaxAge drops a resource no payment was settled for in this long.
	// Default 720h (30 days).
	MaxAge caddy.Duration `json:"max_age,omitempty"`
	// Origins, when set, are the only origins (scheme://host[:port], as
	// your sites are addressed) whose resources are listed. The resource
	// URL is the payer's choice: without it, anyone who pays for one of
	// your routes may list a URL of their own under its description.
	// Placeholders such as {env.AOV_PUBLIC_BASE_URL} are expanded.
	Origins []string `json:"origins,omitempty"`
	// ListUnauthenticatedSettles lists, as the caller describes them,
	// the resources a settle without the facilitator's token names that no
	// gate of this process serves (the caller names the URL, description
	// and bazaar extension; the facilitator checks only that the money goes
	// to pay_to). Off by default: without a token such a settle is
	// answered but lists nothing, and only this process's gates' routes are
	// listed, as their configuration describes them. Refused with a
	// token, where no settle is unauthenticated.
	ListUnauthenticatedSettles bool `json:"list_unauthenticated_settles,omitempty"`
}

// discoveryStore is a store module that keeps a discovery list (badger,
// redis).
type discoveryStore interface {
	Discovery(store.DiscoveryLimits) store.Discovery
}

// Discovery returns the facilitator's discovery list in this database.
func (s *BadgerStore) Discovery(l store.DiscoveryLimits) store.Discovery { return s.db.Discovery(l) }

// discoveryConfig is the x402 facilitator handler's configuration: the
// discovery list in the configured store unless it is off.
func (h *FacilitatorHandler) discoveryConfig(ctx caddy.Context) (x402.FacilitatorHandlerConfig, error) {
	d := h.Discovery
	if d == nil {
		d = new(FacilitatorDiscovery)
	}
	if d.Off {
		if h.StoreRaw != nil {
			return x402.FacilitatorHandlerConfig{}, errors.New("x402_facilitator: store is set but discovery is off; drop one")
		}
		return x402.FacilitatorHandlerConfig{}, nil
	}
	if d.MaxEntries < 0 || d.MaxEntryBytes < 0 || d.MaxAge < 0 {
		return x402.FacilitatorHandlerConfig{}, errors.New("x402_facilitator: discovery bounds must not be negative")
	}
	if h.StoreRaw == nil {
		h.StoreRaw = json.RawMessage(`{"type":"badger"}`)
	}
	mod, err := ctx.LoadModule(h, "StoreRaw")
	if err != nil {
		return x402.FacilitatorHandlerConfig{}, fmt.Errorf("loading store module: %v", err)
	}
	st, ok := mod.(discoveryStore)
	if !ok {
		return x402.FacilitatorHandlerConfig{}, fmt.Errorf("store module %T does not keep a discovery list", mod)
	}
	lim := store.DiscoveryLimits{MaxEntries: d.MaxEntries, MaxItemBytes: d.MaxEntryBytes, MaxAge: time.Duration(d.MaxAge)}
	log := ctx.Logger()
	var origins []string
	for _, raw := range d.Origins {
		// The rule and its error are public_base_url's: an origin may come
		// from {env.NAME}, and its expansion never reaches the error.
		o, err := publicOrigin(raw)
		if err != nil {
			return x402.FacilitatorHandlerConfig{}, fmt.Errorf("x402_facilitator: discovery origins: %v", err)
		}
		origins = append(origins, o)
	}
	// A token makes every caller the operator's own (a request without it
	// never gets here); without one, a settle's caller is anyone.
	callers := x402.CallersNotListed
	switch {
	case h.gated && d.ListUnauthenticatedSettles:
		return x402.FacilitatorHandlerConfig{}, errors.New("x402_facilitator: discovery list_unauthenticated_settles: with a token no settle is unauthenticated; drop one")
	case h.gated:
		callers = x402.CallersAuthenticated
	case d.ListUnauthenticatedSettles:
		callers = x402.CallersPublic
	}
	return x402.FacilitatorHandlerConfig{
		Origins:   origins,
		Operator:  discovery.listing,
		Callers:   callers,
		Discovery: st.Discovery(lim),
		OnDiscoveryError: func(err error) {
			log.Warn("discovery list", zap.Error(err))
		},
	}, nil
}

// parseFacilitatorDiscovery parses
//
//	discovery off
//	discovery {
//		max_entries     <n>
//		max_entry_bytes <size>
//		max_age         <duration>
//		origins         <scheme://host[:port]>...
//		list_unauthenticated_settles
//	}
func parseFacilitatorDiscovery(d *caddyfile.Dispenser) (*FacilitatorDiscovery, error) {
	fd := new(FacilitatorDiscovery)
	if d.NextArg() {
		if d.Val() != "off" || d.NextArg() {
			return nil, d.Errf("discovery takes 'off' or a block")
		}
		fd.Off = true
		return fd, nil
	}
	seen := caddyopt.Once{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		if d.Val() != "origins" {
			if err := seen.Check(d); err != nil {
				return nil, err
			}
		}
		switch d.Val() {
		case "max_entries":
			var s string
			if err := facOneArg(d, &s); err != nil {
				return nil, err
			}
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 {
				return nil, d.Errf("max_entries: want a positive whole number, got %q", s)
			}
			fd.MaxEntries = n
		case "max_entry_bytes":
			var n int64
			if err := sizeArg(d, &n); err != nil {
				return nil, err
			}
			if n < 1 || n > 1<<20 {
				return nil, d.Errf("max_entry_bytes: want 1 B to 1 MiB")
			}
			fd.MaxEntryBytes = int(n)
		case "max_age":
			if err := facDurationArg(d, &fd.MaxAge); err != nil {
				return nil, err
			}
			if fd.MaxAge <= 0 {
				return nil, d.Err("max_age must be positive")
			}
		case "list_unauthenticated_settles":
			if d.NextArg() {
				return nil, d.ArgErr()
			}
			fd.ListUnauthenticatedSettles = true
		case "origins":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return nil, d.ArgErr()
			}
			fd.Origins = append(fd.Origins, args...)
		default:
			return nil, d.Errf("unrecognized discovery option '%s'", d.Val())
		}
	}
	return fd, nil
}
