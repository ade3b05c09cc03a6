package caddymodule

import (
	"encoding/json"
	"math"
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"

	"github.com/aovhq/aov/internal/caddyopt"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("x402", parseGate)
	httpcaddyfile.RegisterHandlerDirective("x402_discovery", parseDiscovery)
	// The gate runs after client headers are cleaned up (request_header) and
	// before encode, so it sees requests as the client sent them and buffers
	// the upstream answer before any compression.
	httpcaddyfile.RegisterDirectiveOrder("x402", httpcaddyfile.Before, "encode")
	// aov_rate_limit right after x402 (both before encode, in this order,
	// which is why it is registered here): after x402_cors, so a preflight
	// is answered before it, and after the gates, so it can tell a call a
	// gate serves (never limited) from a message a gate passes on free;
	// before reverse_proxy, aov_docs and every other responder.
	httpcaddyfile.RegisterDirectiveOrder("aov_rate_limit", httpcaddyfile.Before, "encode")
	httpcaddyfile.RegisterDirectiveOrder("x402_discovery", httpcaddyfile.Before, "respond")
}

func parseGate(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	g := new(Gate)
	err := g.UnmarshalCaddyfile(h.Dispenser)
	return g, err
}

func parseDiscovery(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	d := new(Discovery)
	err := d.UnmarshalCaddyfile(h.Dispenser)
	return d, err
}

// UnmarshalCaddyfile sets up the gate from Caddyfile tokens:
//
//	x402 [<matcher>] {
//	    accept [<network> <price> <pay_to>] {
//	        scheme        exact
//	        network       base|base-sepolia|devnet|<CAIP-2>
//	        price         $0.02
//	        amount        20000
//	        asset         <token address>
//	        asset_name    "USD Coin"
//	        asset_version 2
//	        asset_decimals 6
//	        pay_to        <address>
//	        max_timeout   60s
//	    }
//	    description   <text>
//	    mime_type     <type>
//	    resource      <url>
//	    public_base_url <origin>
//	    route         "<METHOD> <path>"
//	    facilitator   <module> { ... }
//	    store         <module> { ... }
//	    settle        after|before
//	    settle_on     pass|any
//	    max_buffer    <size>
//	    max_body      <size>
//	    validate      verify_request|score_request
//	    mcp_tool      <tool name>
//	    siwx
//	    payment_identifier [optional|required] {
//	        window     <duration>
//	        max_answer <size>
//	    }
//	    free_allowance {
//	        pool     <name>
//	        per_day  <n>
//	        key      ip|wallet
//	        max_body <size>
//	        mcp_url  <url>
//	        tool     <name>
//	    }
//	    rate_limit off | [<events> <window>] {
//	        events <n>
//	        window <duration>
//	        zone   <name>
//	    }
//	}
func (g *Gate) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := caddyopt.Once{}
	for d.NextBlock(0) {
		if d.Val() != "accept" {
			if err := seen.Check(d); err != nil {
				return err
			}
		}
		switch d.Val() {
		case "accept":
			var a Accept
			if err := a.unmarshal(d); err != nil {
				return err
			}
			g.Accepts = append(g.Accepts, a)
		case "description":
			if err := oneArg(d, &g.Description); err != nil {
				return err
			}
		case "mime_type":
			if err := oneArg(d, &g.MimeType); err != nil {
				return err
			}
		case "resource":
			if err := oneArg(d, &g.Resource); err != nil {
				return err
			}
		case "public_base_url":
			if err := oneArg(d, &g.PublicBaseURL); err != nil {
				return err
			}
		case "route":
			if err := oneArg(d, &g.Route); err != nil {
				return err
			}
		case "settle":
			if err := oneArg(d, &g.Settle); err != nil {
				return err
			}
		case "settle_on":
			if err := oneArg(d, &g.SettleOn); err != nil {
				return err
			}
		case "validate":
			if err := oneArg(d, &g.Validator); err != nil {
				return err
			}
		case "siwx":
			g.SIWX = true
			if d.NextArg() {
				g.SIWXDomain = d.Val()
			}
			if d.NextArg() {
				return d.ArgErr()
			}
		case "paywall":
			p, err := parsePaywall(d)
			if err != nil {
				return err
			}
			g.Paywall = p
		case "payment_identifier":
			p, err := parsePaymentIdentifier(d)
			if err != nil {
				return err
			}
			g.PaymentIdentifier = p
		case "mcp_tool":
			if err := oneArg(d, &g.MCPTool); err != nil {
				return err
			}
		case "upstream_timeout":
			if !d.NextArg() {
				return d.ArgErr()
			}
			dur, err := caddy.ParseDuration(d.Val())
			if err != nil || dur <= 0 {
				return d.Errf("upstream_timeout: %q is not a positive duration", d.Val())
			}
			g.UpstreamTimeout = caddy.Duration(dur)
			if d.NextArg() {
				return d.ArgErr()
			}
		case "max_buffer":
			if err := sizeArg(d, &g.MaxBuffer); err != nil {
				return err
			}
		case "max_body":
			if err := sizeArg(d, &g.MaxBody); err != nil {
				return err
			}
		case "facilitator":
			raw, err := guestModule(d, "x402.facilitators")
			if err != nil {
				return err
			}
			g.FacilitatorRaw = raw
		case "store":
			raw, err := guestModule(d, "x402.stores")
			if err != nil {
				return err
			}
			g.StoreRaw = raw
		case "free_allowance":
			f := new(FreeAllowance)
			if err := f.unmarshal(d); err != nil {
				return err
			}
			g.Free = f
		case "rate_limit":
			rl := new(RateLimit)
			if err := rl.unmarshal(d); err != nil {
				return err
			}
			g.RateLimit = rl
		default:
			return d.Errf("unrecognized x402 option '%s'", d.Val())
		}
	}
	return nil
}

func (a *Accept) unmarshal(d *caddyfile.Dispenser) error {
	args := d.RemainingArgs()
	seen := caddyopt.Once{}
	switch len(args) {
	case 0:
	case 3:
		a.Network, a.Price, a.PayTo = args[0], args[1], args[2]
		seen["network"], seen["price"], seen["pay_to"] = true, true, true
	default:
		return d.Errf("accept takes either no arguments or <network> <price> <pay_to>")
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		if err := seen.Check(d); err != nil {
			return err
		}
		var err error
		switch d.Val() {
		case "scheme":
			err = oneArg(d, &a.Scheme)
		case "network":
			err = oneArg(d, &a.Network)
		case "price":
			err = oneArg(d, &a.Price)
		case "amount":
			err = oneArg(d, &a.Amount)
		case "asset":
			err = oneArg(d, &a.Asset)
		case "asset_name":
			err = oneArg(d, &a.AssetName)
		case "asset_version":
			err = oneArg(d, &a.AssetVersion)
		case "asset_decimals":
			var s string
			if err = oneArg(d, &s); err == nil {
				// 0 is the JSON's "unset" (the default, 6), so a 0
				// written here is refused at its line; the upper bound
				// is Accept.requirements', for JSON configs too.
				n, perr := strconv.Atoi(s)
				if perr != nil || n < 1 {
					return d.Errf("asset_decimals: %q %s", s, assetDecimalsRange)
				}
				a.AssetDecimals = n
			}
		case "pay_to":
			err = oneArg(d, &a.PayTo)
		case "max_timeout":
			var s string
			if err = oneArg(d, &s); err == nil {
				var dur caddy.Duration
				dur, err = parseDuration(s)
				// 0 is the JSON's "unset" (the default): written here
				// it is shorter than any timeout an offer may have.
				if err == nil && dur == 0 {
					return d.Errf("max_timeout: %s is shorter than %s (leave max_timeout out for its default, %ds)",
						s, minMaxTimeout, defaultMaxTimeout)
				}
				a.MaxTimeout = dur
			}
		default:
			return d.Errf("unrecognized accept option '%s'", d.Val())
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (f *FreeAllowance) unmarshal(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := caddyopt.Once{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		if err := seen.Check(d); err != nil {
			return err
		}
		var err error
		switch d.Val() {
		case "pool":
			err = oneArg(d, &f.Pool)
		case "per_day":
			var s string
			if err = oneArg(d, &s); err == nil {
				f.PerDay, err = strconv.Atoi(s)
				if err != nil {
					return d.Errf("per_day: %v", err)
				}
			}
		case "key":
			err = oneArg(d, &f.Key)
		case "max_body":
			err = sizeArg(d, &f.MaxBody)
		case "mcp_url":
			err = oneArg(d, &f.MCPURL)
		case "tool":
			err = oneArg(d, &f.Tool)
		case "origins":
			if f.Origins = d.RemainingArgs(); len(f.Origins) == 0 {
				return d.ArgErr()
			}
		default:
			return d.Errf("unrecognized free_allowance option '%s'", d.Val())
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// unmarshal reads the rate_limit subdirective of x402 and the
// aov_rate_limit directive, which take the same form; errors name the one
// written.
func (rl *RateLimit) unmarshal(d *caddyfile.Dispenser) error {
	name := d.Val()
	args := d.RemainingArgs()
	seen := caddyopt.Once{}
	switch {
	case len(args) == 1 && args[0] == "off":
		rl.Off = true
		if d.NextBlock(d.Nesting()) {
			return d.Errf("%s off takes no block", name)
		}
		return nil
	case len(args) == 2:
		if err := rl.setEvents(d, name, args[0]); err != nil {
			return err
		}
		if err := rl.setWindow(d, name, args[1]); err != nil {
			return err
		}
		seen["events"], seen["window"] = true, true
	case len(args) != 0:
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		if err := seen.Check(d); err != nil {
			return err
		}
		var s string
		switch d.Val() {
		case "events":
			if err := oneArg(d, &s); err != nil {
				return err
			}
			if err := rl.setEvents(d, name, s); err != nil {
				return err
			}
		case "window":
			if err := oneArg(d, &s); err != nil {
				return err
			}
			if err := rl.setWindow(d, name, s); err != nil {
				return err
			}
		case "zone":
			if err := oneArg(d, &rl.Zone); err != nil {
				return err
			}
		default:
			return d.Errf("unrecognized %s option '%s'", name, d.Val())
		}
	}
	return nil
}

func (rl *RateLimit) setEvents(d *caddyfile.Dispenser, name, s string) error {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return d.Errf("%s events must be a positive number, not %q", name, s)
	}
	rl.Events = n
	return nil
}

func (rl *RateLimit) setWindow(d *caddyfile.Dispenser, name, s string) error {
	w, err := caddy.ParseDuration(s)
	if err != nil || w <= 0 {
		return d.Errf("%s window must be a positive duration, not %q", name, s)
	}
	rl.Window = caddy.Duration(w)
	return nil
}

// UnmarshalCaddyfile sets up the discovery handler:
//
//	x402_discovery {
//	    instructions    <text>
//	    public_base_url <origin>
//	}
func (dh *Discovery) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := caddyopt.Once{}
	for d.NextBlock(0) {
		if err := seen.Check(d); err != nil {
			return err
		}
		switch d.Val() {
		case "instructions":
			if err := oneArg(d, &dh.Instructions); err != nil {
				return err
			}
		case "public_base_url":
			if err := oneArg(d, &dh.PublicBaseURL); err != nil {
				return err
			}
		default:
			return d.Errf("unrecognized x402_discovery option '%s'", d.Val())
		}
	}
	return nil
}

// UnmarshalCaddyfile sets up the Badger store:
//
//	store badger [<path>] {
//	    path    <folder>
//	    no_sync
//	    allowance_flush <interval>|off [<units>]
//	}
func (s *BadgerStore) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // module name
	seen := caddyopt.Once{}
	if d.NextArg() {
		s.Path = d.Val()
		seen["path"] = true
		if d.NextArg() {
			return d.ArgErr()
		}
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		if err := seen.Check(d); err != nil {
			return err
		}
		switch d.Val() {
		case "path":
			if err := oneArg(d, &s.Path); err != nil {
				return err
			}
		case "no_sync":
			s.NoSync = true
		case "allowance_flush":
			args := d.RemainingArgs()
			if len(args) < 1 || len(args) > 2 {
				return d.ArgErr()
			}
			if args[0] == "off" && len(args) == 1 {
				s.AllowanceFlush, s.AllowanceFlushUnits = 0, 0
				continue
			}
			every, err := caddy.ParseDuration(args[0])
			if err != nil || every <= 0 {
				return d.Errf("allowance_flush: interval %q must be a positive duration", args[0])
			}
			s.AllowanceFlush = caddy.Duration(every)
			if len(args) == 2 {
				n, err := strconv.Atoi(args[1])
				if err != nil || n <= 0 {
					return d.Errf("allowance_flush: units %q must be a positive number", args[1])
				}
				s.AllowanceFlushUnits = n
			}
		default:
			return d.Errf("unrecognized badger store option '%s'", d.Val())
		}
	}
	return nil
}

// guestModule parses `<option> <module name> [args] [{ ... }]` into the JSON
// of a module in namespace, with its name under "type".
func guestModule(d *caddyfile.Dispenser, namespace string) (json.RawMessage, error) {
	if !d.NextArg() {
		return nil, d.ArgErr()
	}
	name := d.Val()
	unm, err := caddyfile.UnmarshalModule(d, namespace+"."+name)
	if err != nil {
		return nil, err
	}
	return caddyconfig.JSONModuleObject(unm, "type", name, nil), nil
}

func oneArg(d *caddyfile.Dispenser, dst *string) error {
	if !d.NextArg() {
		return d.ArgErr()
	}
	*dst = d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}

// sizeArg reads the one size argument of the option d is on (64KiB, 10MB),
// for every size option: the one place a size is read, and refused past
// int64, which it used to wrap into a negative limit (a free_allowance
// max_body of 10EB made every request too large for the allowance).
func sizeArg(d *caddyfile.Dispenser, dst *int64) error {
	name := d.Val()
	var s string
	if err := oneArg(d, &s); err != nil {
		return err
	}
	n, err := humanize.ParseBytes(s)
	if err != nil {
		return d.Errf("%s: bad size %q: %v", name, s, err)
	}
	if n > math.MaxInt64 {
		return d.Errf("%s: %s is too large (at most %d bytes)", name, s, int64(math.MaxInt64))
	}
	// 0 is the JSON's "unset" for every size, read as the option's
	// default: written here it would mean that default without a word,
	// never "none".
	if n == 0 {
		return d.Errf("%s: %s is not a size: write a positive one, or leave %s out for its default", name, s, name)
	}
	*dst = int64(n)
	return nil
}

func parseDuration(s string) (caddy.Duration, error) {
	dur, err := caddy.ParseDuration(s)
	return caddy.Duration(dur), err
}

// Interface guards
var (
	_ caddyfile.Unmarshaler = (*Gate)(nil)
	_ caddyfile.Unmarshaler = (*Discovery)(nil)
	_ caddyfile.Unmarshaler = (*BadgerStore)(nil)
)
