package x402

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/verify/schema"
)

// The bazaar discovery list a facilitator serves at GET
// /discovery/resources: the resources it settled a payment for, as the
// official withBazaar(HTTPFacilitatorClient).listResources() reads them
// ({x402Version, items, pagination: {limit, offset, total}}). The list
// lives in a store.Discovery (Badger on one machine, Redis for several
// instances), which bounds it; this file decides what a settled payment
// puts there.
const (
	// DefaultDiscoveryLimit and MaxDiscoveryLimit are the page sizes of
	// GET /discovery/resources without, and at most with, ?limit.
	DefaultDiscoveryLimit = 100
	MaxDiscoveryLimit     = 1000
	// maxDiscoveryOffset bounds ?offset: past the largest list a store
	// keeps there is nothing to page to.
	maxDiscoveryOffset = 1 << 20
	// maxDiscoveryText bounds a listed description or mime type.
	maxDiscoveryText = 1024
	// maxToolName bounds an MCP tool's name (MCP suggests at most 128).
	maxToolName = 128
	// maxDiscoveryPageBytes bounds the items of one page of the list.
	maxDiscoveryPageBytes = 1 << 20
)

// DiscoveryResource is one item of the bazaar discovery list.
type DiscoveryResource struct {
	Resource    string                `json:"resource"`
	Type        string                `json:"type"`
	X402Version int                   `json:"x402Version"`
	Accepts     []PaymentRequirements `json:"accepts"`
	LastUpdated string                `json:"lastUpdated"`
	Description string                `json:"description,omitempty"`
	MimeType    string                `json:"mimeType,omitempty"`
	Extensions  map[string]any        `json:"extensions,omitempty"`
}

// DiscoveryResources is the GET /discovery/resources answer.
type DiscoveryResources struct {
	X402Version int                 `json:"x402Version"`
	Items       []DiscoveryResource `json:"items"`
	Pagination  DiscoveryPagination `json:"pagination"`
}

// DiscoveryPagination says which part of the list a page is.
type DiscoveryPagination struct {
	Limit  int `json:"limit"`
	Offset int `json:"offset"`
	Total  int `json:"total"`
}

// discoveryItem is what the store keeps of an item besides its resource,
// type and ways to pay.
type discoveryItem struct {
	Resource    string         `json:"resource"`
	Description string         `json:"description,omitempty"`
	MimeType    string         `json:"mimeType,omitempty"`
	Extensions  map[string]any `json:"extensions"`
}

// discoveryEntry is the list entry of a settled payment, or false when the
// payment lists nothing. The payer chose what the payment names (the
// resource and its bazaar extension are copied from the 402 by the
// client), so who describes the entry depends on whom the operator trusts:
//
//   - a resource one of the operator's own gates serves (Operator) is
//     listed as the gate describes it: its URL, description, bazaar
//     extension and every price it offers, whoever settled, and only for a
//     payment of one of those prices. Nothing of the payer's is listed: a
//     stranger paying min_price for a URL under the route cannot change how
//     the route is listed, nor list it at another price;
//   - any other resource is listed as the settle's caller describes it only
//     when the operator trusts the caller (Callers): a caller authenticated
//     by the facilitator's token, or anyone when the operator opted in.
//     What an authenticated caller or the operator wrote is never replaced
//     by a less trusted caller's record (store.DiscoveryEntry.Rank).
//
// A described entry is checked as untrusted:
//
//   - the resource is an absolute http(s) URL without user info, on one of
//     the configured origins when there are any, at most
//     store.MaxDiscoveryResourceBytes, listed as its origin and path (the
//     query and fragment dropped) or, with a valid routeTemplate, the origin
//     and the template, as the official facilitators catalog it; a template
//     that names a path the operator's gate serves is refused, as the URL
//     would be listed as the gate describes it;
//   - the bazaar extension is required (without it nothing is cataloged, as
//     the bazaar specification says), at most maxItem bytes, with info.input
//     of type http or mcp (an MCP tool with a name in MCP's tool-name
//     characters) and info valid against the extension's own schema
//     (compiled without fetching anything);
//   - the description and mime type are valid UTF-8 without control or
//     invisible characters and at most maxDiscoveryText bytes (dropped
//     otherwise);
//   - the way to pay is the requirements the payment was verified and
//     settled against, at most store.MaxDiscoveryAcceptBytes.
//
// An MCP tool is one entry per (URL, tool name), as the specification
// requires: many tools share one endpoint.
func (h *facilitatorHandler) discoveryEntry(p PaymentPayload, req PaymentRequirements) (store.DiscoveryEntry, bool) {
	e, why := h.catalogEntry(p, req)
	return e, why == ""
}

// rankOperator is the store.DiscoveryEntry.Rank of what the operator's own
// gates describe: above every CallerListing.
const rankOperator = uint8(CallersAuthenticated) + 1

// catalogEntry is discoveryEntry with the reason an entry is refused ("":
// listed), for the bazaar status of EXTENSION-RESPONSES.
func (h *facilitatorHandler) catalogEntry(p PaymentPayload, req PaymentRequirements) (store.DiscoveryEntry, string) {
	var e store.DiscoveryEntry
	if p.Resource == nil || len(p.Resource.URL) > store.MaxDiscoveryResourceBytes {
		return e, "the resource has no URL, or one over 2 KiB"
	}
	u, err := url.Parse(p.Resource.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.Opaque != "" {
		return e, "the resource is not an absolute http(s) URL without user info"
	}
	origin := u.Scheme + "://" + strings.ToLower(u.Host)
	if h.origins != nil && !h.origins[origin] {
		return e, "the resource is not on this facilitator's origins"
	}
	bz, ok := p.Extensions["bazaar"].(map[string]any)
	if !ok {
		return e, "the payment carries no bazaar extension"
	}
	if h.operator != nil {
		if l, ok := h.operator(origin, u.EscapedPath(), payerTool(bz)); ok {
			return h.operatorEntry(l, req)
		}
	}
	if h.callers == CallersNotListed {
		return e, "this facilitator lists the resources of its operator's gates only, and this is not one"
	}
	raw, err := json.Marshal(bz)
	if err != nil || len(raw) > h.maxItem {
		return e, "the bazaar extension is larger than this facilitator keeps"
	}
	typ, tool, ok := h.validBazaar(raw)
	if !ok {
		return e, "the bazaar extension's info is not valid against its schema (or is neither an http nor an mcp input, or names an MCP tool outside MCP's tool-name characters)"
	}
	resource := origin + u.EscapedPath()
	if tmpl, _ := bz["routeTemplate"].(string); typ == "http" && validRouteTemplate(tmpl) {
		// The entry is keyed by the template, so the operator's check must
		// see it too: a URL no gate serves must not list a key a gate's
		// route is (or answers for) under the caller's description.
		if h.operator != nil {
			if _, ok := h.operator(origin, tmpl, ""); ok {
				return e, "the routeTemplate names a route of the operator's gates, which only a payment for that route lists"
			}
		}
		resource = origin + tmpl
	}
	item := discoveryItem{Resource: resource, Extensions: map[string]any{"bazaar": json.RawMessage(raw)},
		Description: cleanText(p.Resource.Description), MimeType: cleanText(p.Resource.MimeType)}
	e.Item, err = json.Marshal(item)
	if err != nil {
		return e, "the entry cannot be encoded"
	}
	acc, err := json.Marshal(req)
	if err != nil || len(acc) > store.MaxDiscoveryAcceptBytes {
		return e, "the payment requirements are larger than this facilitator keeps"
	}
	e.Resource, e.Type, e.Extensions, e.Rank = resource, typ, []string{"bazaar"}, uint8(h.callers)
	if typ == "mcp" {
		e.Resource = resource + " " + tool
	}
	e.Accepts = []store.DiscoveryAccept{{Scheme: req.Scheme, Network: req.Network, Asset: req.Asset, PayTo: payToKey(req.PayTo), Raw: acc}}
	if store.CheckDiscoveryEntry(e, h.discovery.Limits()) != nil {
		return e, "the entry breaks a bound of the discovery list"
	}
	return e, ""
}

// payerTool is the MCP tool a payer's bazaar extension names ("" for
// none): only to tell apart the operator's tools on one endpoint, never
// listed as the payer wrote it.
func payerTool(bz map[string]any) string {
	info, _ := bz["info"].(map[string]any)
	input, _ := info["input"].(map[string]any)
	if t, _ := input["type"].(string); t != "mcp" {
		return ""
	}
	tool, _ := input["toolName"].(string)
	return tool
}

// operatorEntry is the entry of a resource the operator's gate serves, as
// the gate describes it, for a payment of one of its prices.
func (h *facilitatorHandler) operatorEntry(l OperatorListing, req PaymentRequirements) (store.DiscoveryEntry, string) {
	var e store.DiscoveryEntry
	if l.Ambiguous {
		return e, "gates of several sites serve this route with different listings, and its origin is no gate's public_base_url, so it is not listed"
	}
	paid := slices.ContainsFunc(l.Accepts, func(o PaymentRequirements) bool {
		return o.Scheme == req.Scheme && o.Network == req.Network && o.Asset == req.Asset &&
			payToKey(o.PayTo) == payToKey(req.PayTo) && o.Amount == req.Amount
	})
	if !paid {
		return e, "the payment is not one of the prices the operator's route offers, so it does not list the route"
	}
	if l.Bazaar == nil {
		return e, "the operator's route has no bazaar extension to list"
	}
	raw, err := json.Marshal(l.Bazaar)
	if err != nil || len(raw) > h.maxItem {
		return e, "the route's bazaar extension is larger than this facilitator keeps"
	}
	item := discoveryItem{Resource: l.Resource, Extensions: map[string]any{"bazaar": json.RawMessage(raw)},
		Description: cleanText(l.Description), MimeType: cleanText(l.MimeType)}
	if e.Item, err = json.Marshal(item); err != nil {
		return e, "the entry cannot be encoded"
	}
	// The gate's offers are every way to pay the route: they replace what
	// the entry listed (a retired pay_to, a dropped network, a stranger's
	// way to pay) rather than add to it.
	e.Resource, e.Type, e.Extensions, e.Rank, e.ReplaceAccepts = l.Resource, "http", []string{"bazaar"}, rankOperator, true
	if l.Tool != "" {
		e.Resource, e.Type = l.Resource+" "+l.Tool, "mcp"
	}
	for _, o := range l.Accepts[:min(len(l.Accepts), store.MaxDiscoveryAccepts)] {
		acc, err := json.Marshal(o)
		if err != nil || len(acc) > store.MaxDiscoveryAcceptBytes {
			return e, "the route's payment requirements are larger than this facilitator keeps"
		}
		e.Accepts = append(e.Accepts, store.DiscoveryAccept{Scheme: o.Scheme, Network: o.Network, Asset: o.Asset, PayTo: payToKey(o.PayTo), Raw: acc})
	}
	if store.CheckDiscoveryEntry(e, h.discovery.Limits()) != nil {
		return e, "the entry breaks a bound of the discovery list"
	}
	return e, ""
}

// validBazaar checks a bazaar extension as the official
// validateDiscoveryExtension and validateDiscoveryExtensionSpec do, and
// returns its input type and, for an MCP tool, the tool's name.
func (h *facilitatorHandler) validBazaar(raw []byte) (typ, tool string, ok bool) {
	var ext struct {
		Info   any `json:"info"`
		Schema any `json:"schema"`
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if dec.Decode(&ext) != nil {
		return "", "", false
	}
	info, _ := ext.Info.(map[string]any)
	input, _ := info["input"].(map[string]any)
	switch typ, _ = input["type"].(string); typ {
	case "http":
	case "mcp":
		tool, _ = input["toolName"].(string)
		if !validToolName(tool) {
			return "", "", false
		}
		if _, ok := input["inputSchema"].(map[string]any); !ok {
			return "", "", false
		}
	default:
		return "", "", false
	}
	if _, ok := ext.Schema.(map[string]any); !ok {
		return "", "", false
	}
	sum := sha256.Sum256(raw)
	sch, err := h.schemas.Compile(ext.Schema, hex.EncodeToString(sum[:]))
	if err != nil {
		return "", "", false
	}
	rep, err := sch.EvaluateWithin(ext.Info, schema.Options{MaxFailures: 1})
	if err != nil || rep.Passed != rep.Total {
		return "", "", false
	}
	return typ, tool, true
}

// routeTemplatePattern is the official isValidRouteTemplate's shape.
var routeTemplatePattern = regexp.MustCompile(`^/[a-zA-Z0-9_/:.\-~%]+$`)

// validRouteTemplate is the bazaar specification's rule for a
// routeTemplate (e.g. /score/:agent_id): the official pattern, and no ".."
// or "://" even once percent-decoded.
func validRouteTemplate(t string) bool {
	if len(t) > 512 || !routeTemplatePattern.MatchString(t) {
		return false
	}
	dec, err := url.PathUnescape(t)
	if err != nil {
		return false
	}
	return !strings.Contains(dec, "..") && !strings.Contains(dec, "://")
}

// validToolName is MCP's rule for a tool's name: 1 to 128 of A-Z, a-z,
// 0-9, '_', '-' and '.'. Anything else (a space, a slash, a letter that
// looks like an ASCII one, an invisible character) lets a listed tool pass
// for another.
func validToolName(t string) bool {
	if t == "" || len(t) > maxToolName {
		return false
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// cleanText is s when it is valid UTF-8 of at most maxDiscoveryText bytes
// with nothing invisible that changes how the rest reads, else "".
func cleanText(s string) string {
	if len(s) > maxDiscoveryText || !utf8.ValidString(s) || strings.ContainsFunc(s, invisible) {
		return ""
	}
	return s
}

// invisible reports a character a listing must not carry: a control
// character, a format character (Unicode Cf: the bidi overrides and
// isolates U+202A–202E and U+2066–2069, which render text reversed, the
// zero-width U+200B–200D and U+FEFF, the soft hyphen, ...) or a line or
// paragraph separator (U+2028, U+2029), which split a line where a reader
// does not expect it.
func invisible(r rune) bool {
	return unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp)
}

// payToKey is the form a payTo is filtered by: a 0x address in lower case
// (its case is only a checksum), anything else as written.
func payToKey(a string) string {
	if len(a) == 42 && strings.HasPrefix(a, "0x") {
		return strings.ToLower(a)
	}
	return a
}

// record puts a settled payment's resource on the list, within a deadline
// of its own: the settlement is done and answered whatever the store says.
// The entry names the settlement's transaction, so that one payment lists
// one resource: a facilitator answers every concurrent settle of one
// authorization with the same success, and each caller names its own
// resource, which the payer's signature does not cover. It returns the
// bazaar extension's response (the bazaar specification's
// EXTENSION-RESPONSES entry), nil when the payment carried no bazaar
// extension.
func (h *facilitatorHandler) record(ctx context.Context, p PaymentPayload, req PaymentRequirements, settled SettleResponse) map[string]any {
	e, why := h.catalogEntry(p, req)
	if why == "" && settled.Transaction == "" {
		why = "the settlement names no transaction"
	}
	if why == "" {
		e.Payment = settled.Network + " " + settled.Transaction
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), discoveryRecordTimeout)
		defer cancel()
		switch err := h.discovery.Record(ctx, e); {
		case err == nil:
		case errors.Is(err, store.ErrDiscoveryPaymentUsed):
			why = "this payment already listed another resource; one payment lists one"
		case errors.Is(err, store.ErrDiscoveryOutranked):
			why = "the resource is listed as its operator describes it; this payment does not rewrite it"
		case errors.Is(err, store.ErrDiscoveryEntry):
			why = "the entry breaks a bound of the discovery list"
		default:
			if h.onDiscoveryError != nil {
				h.onDiscoveryError(fmt.Errorf("not updated after a settlement: %w", err))
			}
			why = "the discovery list could not be updated"
		}
	}
	if _, ok := p.Extensions["bazaar"]; !ok {
		return nil
	}
	if why != "" {
		return map[string]any{"status": "rejected", "rejectedReason": why}
	}
	return map[string]any{"status": "success"}
}

// HeaderExtensionResponses carries a facilitator's per-extension outcomes
// of a verify or settle (base64 JSON keyed by extension name).
const HeaderExtensionResponses = "EXTENSION-RESPONSES"

// discoveryRecordTimeout bounds the store write after a settlement.
const discoveryRecordTimeout = 2 * time.Second

// list answers one page of the list, filtered by the official client's
// query parameters (type, payTo, scheme, network, extensions, limit,
// offset). The endpoint is public and an entry holds up to max_entry_bytes
// of extension and 8 ways to pay, so a page is bounded by bytes as well as
// by count: the store reads at most maxDiscoveryPageBytes of entries (at
// least one), the items are written as the store keeps them (JSON checked
// when recorded, never decoded and encoded again), and the reader's turn
// (listSlots) is held until the answer is written, so at most
// discoveryListers pages are in memory at once. A page cut by size says
// so in its pagination: limit is the number of items it holds, and
// offset + limit is where the next page starts, as for any page.
func (h *facilitatorHandler) list(w http.ResponseWriter, r *http.Request) error {
	qs := r.URL.Query()
	limit, err := pageParam(qs, "limit", DefaultDiscoveryLimit, 1, MaxDiscoveryLimit)
	if err != nil {
		return err
	}
	offset, err := pageParam(qs, "offset", 0, 0, maxDiscoveryOffset)
	if err != nil {
		return err
	}
	q := store.DiscoveryQuery{Type: qs.Get("type"), Extension: qs.Get("extensions"), Scheme: qs.Get("scheme"),
		Network: qs.Get("network"), PayTo: payToKey(qs.Get("payTo")), Offset: offset, Limit: limit, MaxBytes: maxDiscoveryPageBytes}
	wait := time.NewTimer(h.listWait)
	defer wait.Stop()
	select {
	case h.listSlots <- struct{}{}:
		defer func() { <-h.listSlots }()
	case <-wait.C:
		return apierr.RateLimited(1)
	case <-r.Context().Done():
		return apierr.RateLimited(1)
	}
	page, serr := h.discovery.List(r.Context(), q)
	if serr != nil {
		return apierr.Unavailable("discovery list", 1, serr)
	}
	if n := len(page.Entries); n > 0 && n < limit && offset+n < page.Total {
		limit = n // cut by size
	}
	writeHeader(w, http.StatusOK)
	w.Write(h.appendPage(page, limit, offset))
	return nil
}

// appendPage is the JSON of a page (DiscoveryResources), its items spliced
// from what the store keeps: each item is the stored discoveryItem object,
// with the type, version, ways to pay and time put before its members.
//
// Record stores only what CheckDiscoveryEntry and catalogEntry let
// through, but what comes back is checked again before it is spliced
// (splicedItem), as a corrupt entry (a store edited by hand, a Redis hash
// missing a field) would otherwise make the whole page invalid JSON: such
// an entry is skipped and reported to OnDiscoveryError. It keeps its place
// in the list, so a page may hold fewer items than its pagination.limit,
// and offset + limit is still where the next page starts.
func (h *facilitatorHandler) appendPage(page store.DiscoveryPage, limit, offset int) []byte {
	size := 128
	for _, e := range page.Entries {
		size += len(e.Item) + 128
		for _, a := range e.Accepts {
			size += len(a.Raw) + 1
		}
	}
	b := make([]byte, 0, size)
	b = append(b, `{"x402Version":`...)
	b = strconv.AppendInt(b, Version, 10)
	b = append(b, `,"items":[`...)
	first := true
	for _, e := range page.Entries {
		members, ok := splicedItem(e)
		if !ok {
			if h.onDiscoveryError != nil {
				h.onDiscoveryError(fmt.Errorf("a listing skipped a corrupt entry of the list (%q)", e.Resource))
			}
			continue
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		typ, _ := json.Marshal(e.Type)
		b = append(append(b, `{"type":`...), typ...)
		b = append(b, `,"x402Version":`...)
		b = strconv.AppendInt(b, Version, 10)
		b = append(b, `,"accepts":[`...)
		for i, a := range e.Accepts {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, a.Raw...)
		}
		b = append(b, `],"lastUpdated":"`...)
		b = e.LastSeen.UTC().AppendFormat(b, time.RFC3339)
		b = append(append(b, `",`...), members...)
	}
	b = append(b, `],"pagination":{"limit":`...)
	b = strconv.AppendInt(b, int64(limit), 10)
	b = append(b, `,"offset":`...)
	b = strconv.AppendInt(b, int64(offset), 10)
	b = append(b, `,"total":`...)
	b = strconv.AppendInt(b, int64(page.Total), 10)
	return append(b, "}}\n"...)
}

// splicedItem is what appendPage splices of e's item: its members and
// closing brace, after the opening one. ok is false unless the item is one
// JSON object with at least one member and e has ways to pay, each one
// JSON object.
func splicedItem(e store.DiscoveryEntry) (members []byte, ok bool) {
	item := bytes.TrimSpace(e.Item)
	if len(item) < 2 || item[0] != '{' || !json.Valid(item) || len(e.Accepts) == 0 {
		return nil, false
	}
	if members = bytes.TrimLeft(item[1:], " \t\r\n"); members[0] == '}' {
		return nil, false // {}: nothing to put after the spliced members
	}
	for _, a := range e.Accepts {
		if raw := bytes.TrimSpace(a.Raw); len(raw) == 0 || raw[0] != '{' || !json.Valid(raw) {
			return nil, false
		}
	}
	return members, true
}

func pageParam(q url.Values, name string, def, lo, hi int) (int, *apierr.Error) {
	vs, ok := q[name]
	if !ok {
		return def, nil
	}
	n, err := strconv.Atoi(vs[0])
	if len(vs) != 1 || err != nil || n < lo || n > hi {
		return 0, &apierr.Error{
			Code:        apierr.CodeInvalidRequest,
			Message:     "The discovery query is invalid; fix the listed parameter and send it again.",
			Status:      http.StatusBadRequest,
			NextActions: []apierr.Action{{Action: "fix_request_fields", Fields: []string{name}}},
			Fields:      []apierr.Field{{Field: name, Problem: "is not one whole number from " + strconv.Itoa(lo) + " to " + strconv.Itoa(hi), Fix: "Send ?" + name + "=<n> once, or leave it out."}},
		}
	}
	return n, nil
}
