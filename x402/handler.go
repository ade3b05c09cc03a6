package x402

import (
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/verify/schema"
)

// MaxFacilitatorRequestBytes caps a /verify or /settle request body. A
// request carries one payment (a few KiB); 1 MiB leaves room for
// extensions.
const MaxFacilitatorRequestBytes = 1 << 20

// NewFacilitatorHandler serves f over the x402 facilitator HTTP API:
// POST /verify, POST /settle and GET /supported, at paths relative to where
// it is mounted (use http.StripPrefix to serve it under a prefix). With
// FacilitatorHandlerConfig.Discovery it also serves GET
// /discovery/resources (NewFacilitatorHandlerWith).
//
// Request bodies must be JSON (Content-Type application/json), at most
// MaxFacilitatorRequestBytes, and exactly {x402Version: 2, paymentPayload,
// paymentRequirements}: another member, a missing one, a version other than
// 2, duplicate member names, or a payload or requirements that
// DecodePaymentSignature's rules refuse is a 400 naming the field. Verdicts,
// isValid:false and success:false included, are 200 with the VerifyResponse
// or SettleResponse body, as the reference TypeScript facilitator answers.
// An unknown settlement outcome is such a 200 too, success:false with
// errorReason settlement_pending and the transaction when known
// (pendingSettlement), which HTTPFacilitator and the official clients take
// for "not known yet, do not pay again". Another Settle error means
// nothing was sent (Facilitator), and is a 200 too, success:false with
// errorReason facilitator_unavailable (notSettled), which HTTPFacilitator
// returns as that same "nothing settled" error: a 503 would read to a
// remote gate's client as an unknown outcome (any proxy in between may
// answer one) and hold a payment never sent. Its Retry-After is the one a
// facilitator behind this one refused with (a *FacilitatorError's), when
// it sent one. Another Verify or Supported error is a 503: nothing was
// verified.
//
// Errors use the service's error shape (code, message, status, retryable,
// fields, ...) plus an "error" member with the code, which is what x402
// facilitator clients print.
func NewFacilitatorHandler(f Facilitator) http.Handler {
	return NewFacilitatorHandlerWith(f, FacilitatorHandlerConfig{})
}

// FacilitatorHandlerConfig adds the discovery list to a facilitator
// handler.
type FacilitatorHandlerConfig struct {
	// Discovery keeps the bazaar list of GET /discovery/resources: a
	// settled payment whose payer echoed a bazaar extension puts its
	// resource there (see discoveryEntry), within the store's Limits, as
	// Operator or, for other resources, Callers allow. Nil: the endpoint is
	// 404.
	Discovery store.Discovery
	// Operator, when set, answers how the operator's own gate serving the
	// resource at origin (scheme://host[:port], in lower case) and path (as
	// escaped in the URL) lists it, false when no gate serves it; tool is
	// the MCP tool the payer named ("" for none), to tell the tools of one
	// endpoint apart. Such a resource is listed as the gate describes it,
	// whoever settled, and only for a payment of one of its prices.
	Operator func(origin, path, tool string) (OperatorListing, bool)
	// Callers says whether a settle's caller may list, as it describes it,
	// a resource Operator does not answer for. The caller names the URL,
	// the description and the bazaar extension, and the guard in front of
	// the facilitator checks only where the money goes: without trust in
	// the caller, anyone paying min_price could list anything on the
	// operator's origins. Default CallersNotListed.
	Callers CallerListing
	// Origins, when set, are the only origins (scheme://host[:port]) whose
	// resources are listed: the resource URL is the payer's choice, so
	// without it anyone paying for one route may list a URL of their own
	// under that route's description. Compared without regard to case.
	Origins []string
	// OnDiscoveryError hears a failed store write (the settlement itself
	// is answered regardless) or a corrupt entry a listing skipped, e.g. to
	// log it.
	OnDiscoveryError func(error)
}

// CallerListing says how far a facilitator trusts the callers of /settle
// to describe what the discovery list says (FacilitatorHandlerConfig).
type CallerListing uint8

// The CallerListings, in increasing trust: an entry a more trusted caller
// (or the operator's gate) wrote is never replaced by a less trusted one.
const (
	// CallersNotListed lists the resources of the operator's gates only.
	CallersNotListed CallerListing = iota
	// CallersPublic lists what any caller describes: a public bazaar, the
	// operator's explicit choice.
	CallersPublic
	// CallersAuthenticated lists what callers describe when every caller
	// is the operator's (the facilitator requires a token).
	CallersAuthenticated
)

// OperatorListing is how a gate of the operator lists the resource it
// serves: all from the operator's configuration.
type OperatorListing struct {
	// Resource is the listed URL: the origin and the route's path, its
	// parameters written as a routeTemplate's :name.
	Resource string
	// Tool is the MCP tool the gate prices ("" for an HTTP route).
	Tool                  string
	Description, MimeType string
	// Bazaar is the bazaar extension of the gate's 402 (nil: the route is
	// not listed).
	Bazaar map[string]any
	// Accepts are the gate's offers: the listed ways to pay, and the only
	// payments that list the resource.
	Accepts []PaymentRequirements
	// Ambiguous says gates of several sites serve the resource, describing
	// it differently, and its origin does not tell which one answered (no
	// public_base_url names it): the resource is the operator's, so no
	// caller describes it, but the payment lists nothing, as no one
	// listing is the resource's. The other fields are unset.
	Ambiguous bool
}

// NewFacilitatorHandlerWith is NewFacilitatorHandler with a discovery
// list.
func NewFacilitatorHandlerWith(f Facilitator, c FacilitatorHandlerConfig) http.Handler {
	h := &facilitatorHandler{f: f, discovery: c.Discovery, onDiscoveryError: c.OnDiscoveryError, operator: c.Operator, callers: c.Callers}
	for _, o := range c.Origins {
		if h.origins == nil {
			h.origins = map[string]bool{}
		}
		h.origins[strings.ToLower(strings.TrimSuffix(o, "/"))] = true
	}
	if h.discovery != nil {
		h.maxItem = h.discovery.Limits().MaxItemBytes
		h.schemas = schema.NewCache(discoverySchemaCache)
		h.listSlots, h.listWait = make(chan struct{}, discoveryListers), discoveryListWait
	}
	return h
}

// discoverySchemaCache is the number of compiled bazaar schemas kept: a
// facilitator sees one per route it settles for.
const discoverySchemaCache = 64

type facilitatorHandler struct {
	f                Facilitator
	discovery        store.Discovery // nil: no GET /discovery/resources
	maxItem          int             // the store's bound on an entry's item
	origins          map[string]bool // nil: any origin is listed
	operator         func(origin, path, tool string) (OperatorListing, bool)
	callers          CallerListing
	schemas          *schema.Cache
	onDiscoveryError func(error)
	listSlots        chan struct{} // one per list being read from the store
	listWait         time.Duration // how long a list waits for a slot
}

// A filtered list reads every entry (a few ms for 1000 on a loaded
// machine, on Redis holding the server for that long), and the endpoint is
// public: at most discoveryListers lists are read at once, and one that
// waits longer than discoveryListWait for its turn is 429.
const (
	discoveryListers  = 2
	discoveryListWait = 2 * time.Second
)

func (h *facilitatorHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/verify", "/settle":
		if r.Method != http.MethodPost {
			writeError(w, apierr.MethodNotAllowed(http.MethodPost))
			return
		}
		req, err := readFacilitatorRequest(w, r)
		if err != nil {
			writeError(w, err)
			return
		}
		if r.URL.Path == "/verify" {
			resp, err := h.f.Verify(r.Context(), req.PaymentPayload, req.PaymentRequirements)
			if err != nil {
				writeError(w, apierr.Unavailable("facilitator", 1, err))
				return
			}
			// A verification costs its sender nothing, so it lists nothing:
			// only a settled payment (money moved to the operator) may put
			// a resource, which its sender named, on the discovery list.
			writeJSON(w, http.StatusOK, resp)
			return
		}
		resp, err := h.f.Settle(r.Context(), req.PaymentPayload, req.PaymentRequirements)
		if unknown, ok := errors.AsType[*UnknownOutcomeError](err); ok {
			writeJSON(w, http.StatusOK, pendingSettlement(unknown, req))
			return
		}
		if err != nil {
			// Any other error means nothing was settled (Facilitator). It
			// is said as a settle answer, success false: a remote gate's
			// client reads a 5xx without a verdict as an unknown outcome
			// (any proxy in between may answer one), and would hold a
			// payment never sent, its buyer told not to pay again.
			if fe, ok := errors.AsType[*FacilitatorError](err); ok && fe.RetryAfter > 0 {
				w.Header().Set("Retry-After", strconv.Itoa(RetryAfterSeconds(fe.RetryAfter)))
			}
			writeJSON(w, http.StatusOK, notSettled(req))
			return
		}
		if resp.Network == "" {
			resp.Network = req.PaymentRequirements.Network
		}
		if resp.Success && h.discovery != nil {
			if bz := h.record(r.Context(), req.PaymentPayload, req.PaymentRequirements, resp); bz != nil {
				if v, err := EncodeHeader(map[string]any{"bazaar": bz}); err == nil {
					w.Header().Set(HeaderExtensionResponses, v)
				}
			}
		}
		writeJSON(w, http.StatusOK, resp)
	case "/supported":
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			writeError(w, apierr.MethodNotAllowed(http.MethodGet))
			return
		}
		resp, err := h.f.Supported(r.Context())
		if err != nil {
			writeError(w, apierr.Unavailable("facilitator", 1, err))
			return
		}
		resp.Kinds = withAssetExtra(resp.Kinds)
		if resp.Extensions == nil {
			resp.Extensions = []string{}
		}
		if resp.Signers == nil {
			resp.Signers = map[string][]string{}
		}
		writeJSON(w, http.StatusOK, resp)
	case "/discovery/resources":
		if h.discovery == nil {
			writeError(w, apierr.NotFound("facilitator endpoint"))
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			writeError(w, apierr.MethodNotAllowed(http.MethodGet))
			return
		}
		if err := h.list(w, r); err != nil {
			writeError(w, err)
		}
	default:
		writeError(w, apierr.NotFound("facilitator endpoint"))
	}
}

// pendingSettlement answers a settlement whose outcome is unknown in the
// x402 settle shape the official @x402/core client parses and its
// settleWithPendingRetry retries /settle for once: success false,
// errorReason settlement_pending, the transaction the facilitator sent
// when it named one, the network and the payer; 200, as the official
// facilitator answers it. An error shape instead ("upstream_unavailable",
// charged false) would lose the transaction, which a gate in front polls to
// resolve the payment (HTTPFacilitator keeps it as
// UnknownOutcomeError.Reply), and would tell a payer who may have paid that
// nothing was charged. The cause stays out of it: it is the facilitator's
// own (its RPC endpoint, say).
func pendingSettlement(unknown *UnknownOutcomeError, req FacilitatorRequest) SettleResponse {
	sr := SettleResponse{
		ErrorReason:  ReasonSettlementPending,
		ErrorMessage: "The settlement outcome is not known yet and the payment may have settled; do not pay again, retry the same request later.",
		Network:      req.PaymentRequirements.Network,
	}
	if rp := unknown.Reply; rp != nil {
		sr.Transaction, sr.Payer = rp.Transaction, rp.Payer
		if rp.Network != "" {
			sr.Network = rp.Network
		}
	}
	if sr.Payer == "" {
		sr.Payer = evmPayer(req)
	}
	return sr
}

// notSettled answers a settlement the facilitator could not make, having
// sent nothing, in the x402 settle shape: success false,
// facilitator_unavailable, the network and the payer. The cause stays out
// of it, as pendingSettlement's does. The payer is named for an exact EVM
// payment only: a Solana payment's is its transfer's authority, which only
// a decode of the whole transaction tells (the svm facilitator's), too
// much for an answer that settled nothing, which HTTPFacilitator returns
// as an error without reading its payer.
func notSettled(req FacilitatorRequest) SettleResponse {
	return SettleResponse{
		ErrorReason:  ReasonFacilitatorUnavailable,
		ErrorMessage: "The facilitator could not settle the payment now and nothing was settled; send it again.",
		Network:      req.PaymentRequirements.Network,
		Payer:        evmPayer(req),
	}
}

// evmPayer is the payer of an exact EVM payment, "" for any other.
func evmPayer(req FacilitatorRequest) string {
	if pl, err := ParseExactEVMPayload(req.PaymentPayload.Payload); err == nil {
		if v, err := pl.Authorization.Values(); err == nil {
			return v.From.Hex()
		}
	}
	return ""
}

// readFacilitatorRequest reads and checks a /verify or /settle body.
func readFacilitatorRequest(w http.ResponseWriter, r *http.Request) (FacilitatorRequest, error) {
	var req FacilitatorRequest
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return req, apierr.UnsupportedMediaType()
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxFacilitatorRequestBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return req, apierr.TooLarge(MaxFacilitatorRequestBytes)
		}
		return req, badRequest("", "could not be read")
	}
	top, members, err := checkJSONObject(body)
	if err != nil {
		return req, badRequest("", "must be one JSON object with distinct member names")
	}
	for name := range top {
		if name != "x402Version" && name != "paymentPayload" && name != "paymentRequirements" {
			return req, badRequest("", "has a member other than x402Version, paymentPayload and paymentRequirements")
		}
	}
	if raw, ok := members["x402Version"]; !ok || string(raw) != "2" {
		return req, badRequest("x402Version", "must be 2")
	}
	req.X402Version = Version
	raw, ok := members["paymentPayload"]
	if !ok {
		return req, badRequest("paymentPayload", "is required")
	}
	// The payload's bytes, exactly as sent (none when the payment is not an
	// object, which parsePaymentPayload refuses).
	if req.PaymentPayload, err = parsePaymentPayload(top["paymentPayload"], payloadBytes(raw), "paymentPayload"); err != nil {
		return req, fromPaymentError(err)
	}
	pr, ok := top["paymentRequirements"]
	if !ok {
		return req, badRequest("paymentRequirements", "is required")
	}
	if req.PaymentRequirements, err = parseRequirements(pr, "paymentRequirements"); err != nil {
		return req, fromPaymentError(err)
	}
	return req, nil
}

func fromPaymentError(err error) *apierr.Error {
	var pe *PaymentError
	if errors.As(err, &pe) {
		return badRequest(pe.Field, pe.Problem)
	}
	return badRequest("", "is invalid")
}

// badRequest is a 400 in the service's error shape for one field.
func badRequest(field, problem string) *apierr.Error {
	if field == "" {
		field = "(body)"
	}
	return &apierr.Error{
		Code:        apierr.CodeInvalidRequest,
		Message:     "The facilitator request is invalid and nothing was verified or settled; fix the listed field and send it again.",
		Status:      http.StatusBadRequest,
		NextActions: []apierr.Action{{Action: "fix_request_fields", Fields: []string{field}}},
		Fields:      []apierr.Field{{Field: field, Problem: problem, Fix: "Send {x402Version: 2, paymentPayload, paymentRequirements} as the x402 facilitator API defines them."}},
	}
}

// errorBody is the service's error shape plus the "error" member that x402
// facilitator clients read.
type errorBody struct {
	*apierr.Error
	ErrorCode string `json:"error"`
}

func writeError(w http.ResponseWriter, err error) {
	e := apierr.From(err)
	h := w.Header()
	if e.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	if len(e.Allow) > 0 {
		h.Set("Allow", strings.Join(e.Allow, ", "))
	}
	writeJSON(w, e.Status, errorBody{Error: e, ErrorCode: e.Code})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		status, body = http.StatusInternalServerError, []byte(`{"error":"internal_error"}`)
	}
	writeHeader(w, status)
	w.Write(append(body, '\n'))
}

// writeHeader starts a JSON answer.
func writeHeader(w http.ResponseWriter, status int) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
}
