package caddymodule

import (
	"encoding/json"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/aovhq/aov/internal/caddyopt"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("verify_response", parseVerifyResponse)
	// After encode: inside the x402 gate (registered before encode), so the
	// gate settles on the verified answer, and inside encode, so the check
	// reads the upstream's plain JSON and compression applies to the final
	// answer (receipt envelope included).
	httpcaddyfile.RegisterDirectiveOrder("verify_response", httpcaddyfile.After, "encode")
}

func parseVerifyResponse(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	v := new(VerifyResponse)
	err := v.UnmarshalCaddyfile(h.Dispenser)
	return v, err
}

// UnmarshalCaddyfile sets up verify_response from Caddyfile tokens:
//
//	verify_response [<matcher>] {
//	    schema               <file>|<inline JSON>
//	    bounds               <file>|<inline JSON>
//	    rules                <file>|<inline JSON>
//	    enforce_rules        [true|false]
//	    strict_content_check [true|false]
//	    task_id              <template>
//	    agent_id             <template>
//	    status               <code>...
//	    content_types        <media type>...
//	    max_response         <size>
//	    verifier_url         <url>
//	    verifier_token       <token|{env.VAR}>
//	    card_url             <url>
//	    verifier_timeout     <duration>
//	    receipt_header       <name>
//	    envelope             [on|off]
//	    detail               compact|full
//	    on_fail              pass|block
//	    on_error             fail_closed|fail_open
//	}
//
// Inline JSON is one token: write it in backticks, e.g.
// rules `[{"type":"unique","field":"items[].id"}]`.
func (v *VerifyResponse) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := caddyopt.Once{}
	for d.NextBlock(0) {
		if opt := d.Val(); opt != "status" && opt != "content_types" {
			if err := seen.Check(d); err != nil {
				return err
			}
		}
		var err error
		switch opt := d.Val(); opt {
		case "schema":
			v.Schema, err = jsonOrPathArg(d, opt)
		case "bounds":
			v.Bounds, err = jsonOrPathArg(d, opt)
		case "rules":
			v.Rules, err = jsonOrPathArg(d, opt)
		case "enforce_rules":
			v.EnforceRules, err = flagArg(d)
		case "strict_content_check":
			v.StrictContentCheck, err = flagArg(d)
		case "envelope":
			v.Envelope, err = flagArg(d)
		case "task_id":
			err = oneArg(d, &v.TaskID)
		case "agent_id":
			err = oneArg(d, &v.AgentID)
		case "status":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			for _, a := range args {
				n, perr := strconv.Atoi(a)
				if perr != nil {
					return d.Errf("status %q is not a number", a)
				}
				v.Statuses = append(v.Statuses, n)
			}
		case "content_types":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			v.ContentTypes = append(v.ContentTypes, args...)
		case "max_response":
			err = sizeArg(d, &v.MaxResponse)
		case "verifier_url":
			err = oneArg(d, &v.VerifierURL)
		case "verifier_token":
			err = oneArg(d, &v.VerifierToken)
		case "card_url":
			err = oneArg(d, &v.CardURL)
		case "verifier_timeout":
			var s string
			if err = oneArg(d, &s); err == nil {
				v.VerifierTimeout, err = parseDuration(s)
			}
		case "receipt_header":
			err = oneArg(d, &v.ReceiptHeader)
		case "detail":
			err = oneArg(d, &v.Detail)
		case "on_fail":
			err = oneArg(d, &v.OnFail)
		case "on_error":
			err = oneArg(d, &v.OnError)
		default:
			return d.Errf("unrecognized verify_response option '%s'", opt)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// jsonOrPathArg reads one token: inline JSON (starting with { or [) kept
// as JSON, anything else a file path, kept as a JSON string.
func jsonOrPathArg(d *caddyfile.Dispenser, opt string) (json.RawMessage, error) {
	var s string
	if err := oneArg(d, &s); err != nil {
		return nil, err
	}
	if t := strings.TrimSpace(s); strings.HasPrefix(t, "{") || strings.HasPrefix(t, "[") {
		if !json.Valid([]byte(t)) {
			return nil, d.Errf("%s: inline JSON does not parse (write it as one token, in backticks)", opt)
		}
		return json.RawMessage(t), nil
	}
	b, _ := json.Marshal(s)
	return b, nil
}

// flagArg reads an optional on/off argument; the bare option means on.
func flagArg(d *caddyfile.Dispenser) (bool, error) {
	if !d.NextArg() {
		return true, nil
	}
	val := d.Val()
	if d.NextArg() {
		return false, d.ArgErr()
	}
	switch strings.ToLower(val) {
	case "on", "true", "yes":
		return true, nil
	case "off", "false", "no":
		return false, nil
	}
	return false, d.Errf("want on or off, not %q", val)
}

// Interface guards
var _ caddyfile.Unmarshaler = (*VerifyResponse)(nil)
