package caddymodule

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/intercept"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/ethereum/go-ethereum/common"
	sjson "github.com/segmentio/encoding/json"
	"go.uber.org/zap"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/plugins/svmfacilitator"
	"github.com/aovhq/aov/receipt"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// Settlements whose outcome is unknown.
//
// When the facilitator cannot say whether a settlement went through (it
// timed out after sending), the gate keeps the payment's claim and, with it
// in the store (store.HeldClaims), a record of the payment, the offer and
// the answer it held back. The outcome is then resolved, never guessed, by
// asking a facilitator that can tell (x402.SettlementChecker: for EIP-3009
// the token's authorizationState and the transaction that used the nonce,
// read on chain by the embedded evm facilitator or, for a remote one,
// through the gate's own `rpc` endpoint;
// the embedded Solana facilitator polls the signature it sent; see
// remotestatus.go), on the buyer's retry with the same payment and by a
// background pass over the held records, which also reports what it
// resolves to the upstream at once (reportResolved):
//
//   - the transfer happened: the claim is marked settled and the held
//     answer is served to the retry with PAYMENT-RESPONSE. When no answer
//     was kept (it was too large, or in settle before mode) the upstream
//     runs again, once: the record is first moved to delivered (a
//     compare-and-swap in the store, so of concurrent retries, or
//     gateways, exactly one runs it), and only for the request the
//     payment was made for, as far as the gate knew it (heldRequest);
//     every later retry is payment_already_used;
//   - it provably never will (expired unused, or its nonce spent without
//     paying): the claim is released, and
//     the retry is told to sign a new payment; nothing was charged;
//   - still undecided: the retry gets 503 settlement_pending again.
//
// Nothing here ever settles: the one settlement attempt was made, so a
// payment is never settled twice, and content is released only for a
// transfer the chain shows.
//
// The records live and lapse with their claims (bounded in time by the
// claim's expiry: the authorization's validBefore plus a minute, or the
// window of the payment identifier the call carried if that ends later, at
// most maxClaimHold) and each held answer is bounded by maxHeldAnswer
// bytes. A retry after its record lapsed is claimed anew, and refused by
// the facilitator; when the chain shows the payment settled
// (settledEarlier), it is told so, never to sign a new one, and a payment
// this gate could not read the chain for is still told settlement_pending
// (markUnresolvable).

// heldRecord is what the gate keeps with an unsettled claim whose
// settlement outcome is unknown, as the claim's note (JSON, so it is told
// apart from a settled claim's transaction hash; encodeHeld writes it,
// decodeHeld reads it).
//
// Every paid call writes one with its claim (claimPaid), so it carries the
// payment and the offer as bytes the gate already has: the payment's JSON
// as received (x402.Payment.JSON), the offer's as encoded once at
// provision (offerJSON). Re-encoding both structs on each call, and
// decoding them back, was the larger part of the paid path's cost; they
// are decoded only when a record is resolved.
type heldRecord struct {
	Keys  []string  `json:"keys"`
	Token string    `json:"token"`
	Until time.Time `json:"until"`
	// Payment is the payment's JSON, read again with x402.ParsePayment.
	// A record written before it has LegacyPayload instead: the
	// x402.PaymentPayload as encoding/json wrote it, read as it was.
	Payment       json.RawMessage `json:"payment,omitempty"`
	LegacyPayload json.RawMessage `json:"payload,omitempty"`
	// Offer is the x402.PaymentRequirements matched, as JSON.
	Offer json.RawMessage `json:"offer"`
	// payload and offer are Payment (or LegacyPayload) and Offer as
	// decodeHeld read them.
	payload x402.PaymentPayload
	offer   x402.PaymentRequirements
	// Held says an answer is kept (Status, Header, Body); false in settle
	// before mode or when the answer was over maxHeldAnswer.
	Held   bool `json:"held"`
	Status int  `json:"status,omitempty"`
	// Header is the header the answer was released with (keptHeader). A
	// record written before records kept it has ContentType alone, and
	// its answer goes out with that; ContentType is still written, for
	// such a gateway sharing the store.
	Header      http.Header `json:"header,omitempty"`
	ContentType string      `json:"content_type,omitempty"`
	Body        []byte      `json:"body,omitempty"`
	// ReceiptHeader is the name a verify_response gave the receipt in
	// Header (its receipt_header, receiptNameVar), "" when none did. The
	// retry that delivers the held answer handles no verify_response: it
	// names the receipt again (heldReceiptName), so the answer saved from
	// it under a payment identifier keeps a receipt_header of the
	// operator's own (keptHeader), not only the default name.
	ReceiptHeader string `json:"receipt_header,omitempty"`
	// Transaction is set once the transfer is known to have happened.
	Transaction string `json:"transaction,omitempty"`
	// Sent is the transaction the facilitator named when it reported the
	// outcome unknown, if it did (on Solana, the quickest way to find it);
	// a checker proves it is the payment's own before judging by it.
	Sent string `json:"sent,omitempty"`
	// SentAfter is a time before which the settlement was not asked for
	// (paidCharge.sentAfter: when its Settle was asked for): a checker
	// that searches the chain for the transaction looks no further back.
	SentAfter time.Time `json:"sent_after,omitzero"`
	// Signers are the addresses the gate's facilitator sent its EVM
	// settlements from when the attempt was made (heldSigners), hex: those
	// known when the payment was claimed, and those asked for when the
	// attempt ended unknown; none on Solana, or on a record written before
	// records kept them. Kept from the claim on, so that a gateway killed
	// mid-settlement and restarted with another relayer_key still knows
	// its own transfer. The transfer one of them sent is the payment's
	// even when the facilitator signs with others by the time the record
	// is resolved (x402.SentSettlement.Signers).
	Signers []string `json:"signers,omitempty"`
	// Request names the request the payment paid for (heldRequest), ""
	// when the gate could not name it, or the record was written before
	// every record named it; RequestBody says its body is part of the
	// name. The answer held, or the one run again, is the buyer's answer
	// to that request: only a retry of that name gets it (paidFor).
	Request     string `json:"request,omitempty"`
	RequestBody bool   `json:"request_body,omitempty"`
	// Resource is the resource URL of the 402 the payment answered (the
	// gate's resource: its origin and path), "" on a record written before
	// records named it. Gates sharing one store find each other's records
	// by the claim keys, which name no resource and, on EVM, no price:
	// only a gate of this resource resolves the record (pricedHere).
	Resource string `json:"resource,omitempty"`
	// Delivered is set, with the claim settled, once the upstream has been
	// run again for an answer that was not kept and has begun writing its
	// answer (its header): the payment bought that run, and no other.
	Delivered bool `json:"delivered,omitempty"`
	// Running is set while a retry runs the upstream again (takeRun): the
	// end of its span (attemptSpan, by the clock of the gateway that took
	// it), before which no other retry runs it. An upstream that fails
	// before writing gives the run back (the note it was taken from); a
	// mark whose request never came back (the gateway died) lapses at
	// that end, and a retry after it runs the upstream.
	Running time.Time `json:"running,omitzero"`
	// PaymentID names the payment identifier the call carried
	// (paymentIDName), "" when it carried none. Once settled, the payment is
	// public on chain, and the request may be one anyone can guess (a
	// verifier request names a public schema); the id is neither: the buyer
	// sends it to the gate alone, outside what it signs. So a record that
	// names one serves its answer, or its one run again, only to a retry
	// carrying that id (resolveOnRetry).
	PaymentID string `json:"payment_id,omitempty"`
	// ReportPath and VerificationID: the upstream asked for the outcome.
	ReportPath     string `json:"report_path,omitempty"`
	VerificationID string `json:"verification_id,omitempty"`
	// ReportRoute is what the route after the gate could choose the
	// upstream by in the request that asked for the outcome (routeOf):
	// the outcome is reported by a request built from it (reporter.as),
	// the way that upstream was reached. nil on a record written before
	// records kept it: such an outcome goes only through the request's
	// own way, or waits for the buyer's retry.
	ReportRoute *requestRoute `json:"report_route,omitempty"`
	// Gate names the gate that held it (gateID), so that after a restart
	// its outcome is reported through the same gate's upstream.
	Gate string `json:"gate,omitempty"`
	// Attempt is set on the record written with the claim (claimPaid),
	// before anything was asked of the facilitator: the end of the span
	// (attemptSpan) in which the request that claimed the payment may
	// still be verifying, running the upstream or settling. While that
	// request lives, the record is not the gate's to resolve (attempting:
	// in this process it knows, elsewhere it goes by the span, which a
	// store several gateways share judges by its own clock: this stamp is
	// the writer's clock, and another gateway's may be minutes off). A
	// record still so when its request is gone (past the span, or of this
	// process's Session and no longer live, or of another Session of a
	// store only one process can open) was left by a request that ended
	// mid-attempt (the gateway died, or the store failed the write that
	// records the settlement), maybe after the transfer was sent: its
	// outcome is unknown, and resolved as any other. Zero once the attempt
	// ended unknown (holdUnknown).
	Attempt time.Time `json:"attempt,omitzero"`
	Session string    `json:"session,omitempty"`
}

// attemptMargin is added to the sum of the timeouts that bound a paid
// call's attempt (attemptSpan), for what they do not bound: the store's
// writes, scheduling, a clock step.
const attemptMargin = time.Minute

// attemptSpan bounds how long the request that claimed a payment works on
// it, as the sum of every wait on its way, each bounded by its timeout:
// the verify and the settle (each as long as the facilitator lets it run,
// facilitatorTimeouts, not only the gate's shorter wait: a facilitator
// still settling after the gate stopped waiting may yet move the money),
// the upstream (upstream_timeout), a
// verify_response later in the route (its call to the verifier ends by the
// upstream's deadline, answerBy, and is still counted at its longest,
// maxVerifierTimeout, as a margin), the embedded EVM facilitator's reads after a
// failed send (facilitatorResolveTimeout, on a context of their own), and
// the tries to record the settlement (settleWriteWaits). It is the only
// place the span is computed: a timeout added on the way belongs here.
//
// On one gateway the span decides nothing while the request lives (its
// claim is in liveClaims); it is what another gateway sharing the store
// goes by, and what is left once the request is gone.
func (g *Gate) attemptSpan() time.Duration {
	verify, settle := facilitatorTimeouts(g.facilitator)
	d := verify + time.Duration(g.UpstreamTimeout) + maxVerifierTimeout +
		settle + facilitatorResolveTimeout + attemptMargin
	for _, w := range settleWriteWaits {
		d += w
	}
	return d
}

// facilitatorResolveTimeout is how long the embedded EVM facilitator may
// read the chain after its settle's deadline, to tell a failed send from a
// sent one (evmfacilitator's resolveTimeout).
const facilitatorResolveTimeout = 10 * time.Second

// claimPaid claims a payment's keys and, with a store that holds records,
// writes its record in the same write (store.HeldClaims.ClaimHeld): the
// payment, the offer, the request it pays for, the facilitator's signers
// and when its attempt began. Should the gateway die after the facilitator
// sent the transfer and before its reply, the next one finds what it needs
// to resolve the payment from the chain, as it does an unknown outcome,
// and knows the transfer for its own even with another relayer_key. note is the
// record as written ("" with a store that holds none): the request's
// settlement is a compare-and-swap from it (paidCharge.recordSettled).
//
// The claim is live (liveClaims) from before its write until the caller
// calls endLive: no retry or background pass of this process resolves it
// meanwhile, however long the request takes.
func (g *Gate) claimPaid(r *http.Request, keys []string, until time.Time, pay x402.Payment, offer json.RawMessage, pid *paymentIDCall) (c store.Claim, note string, err error) {
	hc, ok := g.state.Claims().(store.HeldClaims)
	if !ok {
		c, err = g.state.Claims().Claim(r.Context(), keys, until)
		return c, "", err
	}
	var token string
	span := g.attemptSpan()
	signers := heldSigners(r.Context(), g.facilitator, pay.PaymentPayload.Accepted.Network, false)
	c, err = hc.ClaimHeld(r.Context(), keys, until, span, func(c store.Claim) (string, error) {
		t := now()
		h := g.newHeldRecord(r, c, pay.JSON, offer, t, pid)
		h.Attempt, h.Session = t.Add(span), hc.Session()
		h.Request, h.RequestBody = g.heldRequest(r)
		h.Signers = signers
		n, err := encodeHeld(&h)
		if err == nil {
			token, note = c.Token, n
			beginLive(token)
		}
		return n, err
	})
	if err != nil {
		if token != "" {
			endLive(token)
		}
		return store.Claim{}, "", err
	}
	return c, note, nil
}

// liveClaims holds the tokens of the paid claims this process's requests
// are working on right now (claimPaid to endLive). Such a claim's record
// is never resolved here, whatever the clock says: the request may still
// deliver, and a second resolver would deliver too. It is process-wide,
// not per gate or store, so it holds across a reload that reopens the
// store while the old configuration's requests still run.
var liveClaims = struct {
	sync.Mutex
	tokens map[string]struct{}
}{tokens: map[string]struct{}{}}

func beginLive(token string) {
	liveClaims.Lock()
	liveClaims.tokens[token] = struct{}{}
	liveClaims.Unlock()
}

// endLive ends what beginLive began, once the request made its last move
// on the claim (settled, released, or held as unknown).
func endLive(token string) {
	liveClaims.Lock()
	delete(liveClaims.tokens, token)
	liveClaims.Unlock()
}

func isLive(token string) bool {
	liveClaims.Lock()
	_, ok := liveClaims.tokens[token]
	liveClaims.Unlock()
	return ok
}

// attempting reports whether the request that claimed h's payment may
// still be at work on it (see heldRecord.Attempt): it is live in this
// process; or, for a record of a store several gateways share (no
// Session), its attempt span has not passed, as another gateway's request
// may be. A record written in this process's session whose claim is not
// live was left by a request that ended without moving it on (its last
// write failed); one of another session, by a process that is gone.
//
// The span is judged by the shared store's clock (st.Attempt, as the store
// read h's claim), one for every gateway, as the store judges every
// expiry: by this gateway's clock against another's stamp, a clock running
// ahead took a live request's record for abandoned, resolved it and ran
// the upstream a second time for one payment. Only a claim the store keeps
// no span for (written by a gateway from before it kept them) is judged by
// the stamp.
func attempting(h *heldRecord, st store.ClaimState) bool {
	switch {
	case h.Attempt.IsZero():
		return false
	case isLive(h.Token):
		return true
	case h.Session != "":
		return false
	case st.Attempt != store.AttemptUnknown:
		return st.Attempt == store.AttemptRunning
	}
	return now().Before(h.Attempt)
}

// gateID names a gate across reloads and restarts, for its held records
// (heldRecord.Gate): its route and its MCP tool, what its requests go on
// to in which server (upstream), and the other servers of its Caddy, which
// they may go on to (others). An outcome whose own way to its
// upstream is gone is reported only through a gate of the same name
// (reportResolved): one whose requests reach the upstream that recorded
// the verification, never another route's or site's, which would learn a
// verification id and its outcome while verifierd's record stayed pending.
func (g *Gate) gateID() string {
	return g.Route + "\x00" + g.MCPTool + "\x00" + g.upstream + "\x00" + g.others.name()
}

// otherServers names the servers of a gate's http app but its own
// (othersOf), once the config has started: while it is provisioned, the
// servers after the gate's in Caddy's order (Go map order) still have
// their handlers' raw configuration and those before it have dropped it,
// so only then is every server's configuration in one form, the same for
// every load of the same config. nil for a gate built without Provision.
type otherServers struct {
	once sync.Once
	done chan struct{}
	set  atomic.Pointer[string]
}

// watchOthers names the other servers of the http app the gate is
// provisioned in, for srv's gates (othersFor), once the config has
// started (the events app's "started", which every config with an http
// app has: the app loads it). A gate outside an http app is named at
// once, as none.
func watchOthers(ctx caddy.Context, srv *caddyhttp.Server) *otherServers {
	o := &otherServers{done: make(chan struct{})}
	var app *caddyhttp.App
	for _, m := range ctx.Modules() {
		if a, ok := m.(*caddyhttp.App); ok {
			app = a
		}
	}
	named := func() { o.store(othersOf(app, srv)) }
	if app == nil {
		named()
		return o
	}
	ev, err := ctx.App("events")
	if events, ok := ev.(*caddyevents.App); err != nil || !ok || events.On("started", onStarted(named)) != nil {
		named()
	}
	return o
}

// onStarted is a handler of the events app's "started" event.
type onStarted func()

func (f onStarted) Handle(context.Context, caddy.Event) error {
	f()
	return nil
}

// store sets o's name, once: the first of the config's start and its
// Cleanup (a config that never started: a name no other gate shares).
func (o *otherServers) store(name string) {
	o.once.Do(func() {
		o.set.Store(&name)
		close(o.done)
	})
}

// name is o's name, "" until it is set.
func (o *otherServers) name() string {
	if o == nil {
		return ""
	}
	if n := o.set.Load(); n != nil {
		return *n
	}
	return ""
}

// wait waits until o is named, or ctx is done (false).
func (o *otherServers) wait(ctx context.Context) bool {
	if o == nil {
		return true
	}
	select {
	case <-o.done:
		return true
	case <-ctx.Done():
		return false
	}
}

// othersOf names the servers of app but own, the gate's: each one's name
// and listeners, and its routes, error routes and named routes
// (routesText), as loaded. A gate's requests may go on to another server
// of the same Caddy (its proxy dials one of this Caddy's own listeners),
// whose routes then choose the upstream: a reload that moves that
// upstream is a move of the gate's. A named route is part of it as the
// routes are: an `invoke` is loaded as the name it calls alone, so a
// reload pointing `&(backend)` elsewhere changed none of the routes.
// Named is left out of a server without named routes, so a config
// without them keeps, across an upgrade, the name its held records carry.
// Their placeholders fixed for the life of the process are read, as the
// gate's own server's are (withFixedPlaceholders).
func othersOf(app *caddyhttp.App, own *caddyhttp.Server) string {
	if app == nil {
		return "none"
	}
	type server struct {
		Name           string
		Listen         []string
		Routes, Errors []string
		Named          map[string]string `json:",omitempty"` // encoded in key order
		// How the server reads its requests' client address, which its
		// client_ip matchers route by: a gate's proxy to it comes from
		// this Caddy, and a header it sets may be read as the client.
		// (Its trusted_proxies ranges are not in the loaded server.)
		ClientIPHeaders []string `json:",omitempty"`
		Strict          int      `json:",omitempty"`
		Unix            bool     `json:",omitempty"`
	}
	serversWritten.Add(1)
	var servers []server
	for _, name := range slices.Sorted(maps.Keys(app.Servers)) {
		srv := app.Servers[name]
		if srv == own {
			continue // named by upstreamOf, from its configuration
		}
		// Sorted: the addresses of the server automatic HTTPS makes for
		// its redirects are listed in Go map order.
		s := server{Name: name, Listen: slices.Sorted(slices.Values(srv.Listen)), Routes: routesText(srv.Routes),
			ClientIPHeaders: srv.ClientIPHeaders, Strict: srv.TrustedProxiesStrict, Unix: srv.TrustedProxiesUnix}
		if srv.Errors != nil {
			s.Errors = routesText(srv.Errors.Routes)
		}
		for name, r := range srv.NamedRoutes {
			if s.Named == nil {
				s.Named = make(map[string]string, len(srv.NamedRoutes))
			}
			s.Named[name] = routeText(*r)
		}
		servers = append(servers, s)
	}
	b, err := json.Marshal(servers)
	if err != nil {
		return "unnamed " + rand.Text()
	}
	sum := sha256.Sum256(withFixedPlaceholders(b))
	return hex.EncodeToString(sum[:])
}

// routesText writes loaded routes out (routeText), in order but for a
// row of automatic HTTPS redirects (autoRedirect), taken as a set.
func routesText(routes caddyhttp.RouteList) []string {
	out := make([]string, 0, len(routes))
	run := 0
	for _, r := range routes {
		out = append(out, routeText(r))
		if run = run + 1; !autoRedirect(r) {
			run = 0
		}
		slices.Sort(out[len(out)-run:])
	}
	return out
}

// routeText writes a loaded route out: its group, its matchers
// (matcherText), and its handlers (handlerText). A route whose matchers
// cannot be written out is named by what can be.
func routeText(r caddyhttp.Route) string {
	sets, err := matcherText(r.MatcherSets)
	if err != nil {
		sets = [][]string{{"unwritable"}}
	}
	var handlers []any // null for none: the text a held record's name was made of
	for _, h := range r.Handlers {
		handlers = append(handlers, handlerText(h))
	}
	b, _ := json.Marshal([]any{r.Group, r.Terminal, sets, handlers})
	return string(b)
}

// handlerText writes a loaded handler out: a subroute as its routes, any
// other as its JSON, which holds its configuration but what it loaded as
// modules (a proxy's upstreams are in it, its transport is not; its
// dynamic upstreams and selection policy follow it: proxyChoice), and so
// none of the routes a handler holds, which are loaded (their handlers'
// configuration dropped): those of a proxy's or an intercept's
// `handle_response` follow its JSON, as routesText writes them, and
// choose where the response's request goes on to (a `reverse_proxy` in
// them). A handler without such routes is its JSON alone, so its gates
// keep, across an upgrade, the name their held records carry. One that
// cannot be written out is named by its type.
func handlerText(h caddyhttp.MiddlewareHandler) any {
	var responses []caddyhttp.ResponseHandler
	var choice string
	switch h := h.(type) {
	case *caddyhttp.Subroute:
		sub := []any{routesText(h.Routes)}
		if h.Errors != nil {
			sub = append(sub, routesText(h.Errors.Routes))
		}
		return sub
	case *reverseproxy.Handler:
		responses, choice = h.HandleResponse, proxyChoice(h)
	case *intercept.Intercept:
		responses = h.HandleResponse
	case *Gate:
		return fmt.Sprintf("%T", h) // its settings route nothing (withoutGateSettings)
	}
	b, err := json.Marshal(h)
	if err != nil {
		b = []byte(`"unwritable"`)
	}
	text := fmt.Sprintf("%T %s", h, b)
	if choice != "" {
		text += " " + choice
	}
	if len(responses) == 0 {
		return text
	}
	nested := make([][]string, 0, len(responses))
	for _, rh := range responses {
		nested = append(nested, routesText(rh.Routes))
	}
	return []any{text, nested}
}

// proxyChoice writes out what a loaded proxy chooses its upstream by
// that its JSON lost when Caddy loaded it (a module's raw configuration is
// dropped once loaded): its dynamic upstream source and its selection
// policy, each as its module ID and JSON (loadedModuleText). "" for a
// proxy with neither (its upstreams static, its policy random, which has
// no settings), so its gates keep, across an upgrade, the name their held
// records carry. A policy's fallback is not kept once loaded, and is no
// part of it.
func proxyChoice(h *reverseproxy.Handler) string {
	var parts []string
	if h.DynamicUpstreams != nil {
		parts = append(parts, "dynamic "+loadedModuleText(h.DynamicUpstreams))
	}
	if lb := h.LoadBalancing; lb != nil && lb.SelectionPolicy != nil {
		switch lb.SelectionPolicy.(type) {
		case reverseproxy.RandomSelection, *reverseproxy.RandomSelection:
		default:
			parts = append(parts, "policy "+loadedModuleText(lb.SelectionPolicy))
		}
	}
	return strings.Join(parts, " ")
}

// loadedModuleText writes a loaded module out as its ID and its JSON.
// `dynamic multi` keeps its sources unexported once loaded: it is written
// as unwritable, a text no load shares, so a server that uses one renames
// its gates at every load (an outcome then waits for the buyer's retry)
// rather than keeping a name across a change of its sources.
func loadedModuleText(m any) string {
	unwritable := "unwritable " + rand.Text()
	if _, ok := m.(*reverseproxy.MultiUpstreams); ok {
		return unwritable
	}
	id := fmt.Sprintf("%T", m)
	if cm, ok := m.(caddy.Module); ok {
		id = string(cm.CaddyModule().ID)
	}
	b, err := json.Marshal(m)
	if err != nil {
		return unwritable
	}
	return id + " " + string(b)
}

// upstreamOf names what the requests of the gate provisioned with ctx go
// on to: a hash of the gate's place in its server (its route's index in
// the server's list and in each subroute's on the way down) and of what
// its server's gates share (serverNaming): the server's name and
// listeners, every route's matchers (a row of automatic HTTPS redirects
// as a set: autoRedirect) and group, its named routes, and the routes
// (with the error routes) from the gate's on, whole, as they stand when
// the gate is provisioned.
// Everything after the gate that decides where its request goes is in it,
// whether the gate shares its `route` block with its upstream or not; the
// gate's own subroute alone was alike for a gate alone in its `route` on
// two sites, and across a reload that moved only its upstream, and an
// outcome went to another upstream. Any change to those parts of the
// server counts as a move: the outcome waits, kept with a Warning.
//
// Caddy provisions a list's routes in order and drops each one's raw
// configuration once its handlers are loaded (its matchers first, all of
// them), so the gate's route is the first in each list that still has its
// handlers, and the matchers are read loaded (matcherText). The handlers
// of the server's routes before the gate's are gone by then and are no
// part of the name. A gate whose place cannot be found so (a named
// route), or whose server or matchers cannot be written out, gets a name
// no other gate shares: its outcomes are reported only through its own
// requests' chains.
func upstreamOf(ctx caddy.Context, srv *caddyhttp.Server) string {
	unnamed := "unnamed " + rand.Text()
	if srv == nil {
		return unnamed
	}
	shared := namingOf(ctx, srv)
	if shared.base == "" {
		return unnamed
	}
	at, from := routeIndex(srv.Routes, srv.Errors)
	if at == "" {
		return unnamed
	}
	place := struct {
		Server string // serverNaming.base
		Path   []string
		Routes string // serverNaming.tails[from]
	}{Server: shared.base, Path: []string{at}, Routes: shared.tails[from]}
	for _, m := range ctx.Modules() {
		if sr, ok := m.(*caddyhttp.Subroute); ok {
			if at, _ = routeIndex(sr.Routes, sr.Errors); at == "" {
				return unnamed
			}
			place.Path = append(place.Path, at)
		}
	}
	b, err := json.Marshal(place)
	if err != nil {
		return unnamed
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// serversWritten counts the servers written out to name gates (a
// serverNaming's, othersOf's): once per server and load, whatever the
// number of its gates, which a test holds it to (naming each gate by
// writing its whole server out again cost n gates O(n^2) at every load).
var serversWritten atomic.Int64

// serverNaming is what the names of one server's gates (upstreamOf) share
// in one load, written out once, at the server's first gate's Provision,
// for the rest to read: the same parts, written out per gate, cost a
// config of 800 gated routes seconds of every load.
type serverNaming struct {
	// base is a hash of the server's name (from its app) and listeners,
	// the number of its routes (the rest are its error routes), each
	// route's group (a later route of a group runs only if no earlier one
	// matched) and matchers (as loaded, matcherText), and its named
	// routes (as configured, withoutGateSettings); "" when the server
	// cannot be written out: each of its gates is then unnamed.
	base string
	// tails[i] is a hash of the configuration (withoutGateSettings) of the
	// routes, then error routes, from the i-th on, chained from the last,
	// so a gate's name holds every route from its own on, as configured
	// when its server's first gate was provisioned: the routes from that
	// gate's on are all still as configured then, and a later gate's are
	// still so when it is provisioned (Caddy drops a route's
	// configuration only once its handlers are loaded).
	tails []string
	// others names the other servers, for all of the server's gates.
	others *otherServers
}

// serverNamings holds each server's serverNaming while its config is
// loaded, keyed by the server (a new one every load); each is dropped when
// its config's context ends, so nothing stays from one load to the next.
var serverNamings = struct {
	sync.Mutex
	m map[*caddyhttp.Server]*serverNaming
}{m: make(map[*caddyhttp.Server]*serverNaming)}

// namingOf is srv's serverNaming for the load of ctx, written out at its
// first gate (newServerNaming).
func namingOf(ctx caddy.Context, srv *caddyhttp.Server) *serverNaming {
	serverNamings.Lock()
	defer serverNamings.Unlock()
	if n := serverNamings.m[srv]; n != nil {
		return n
	}
	n := newServerNaming(ctx, srv)
	serverNamings.m[srv] = n
	context.AfterFunc(ctx, func() {
		serverNamings.Lock()
		delete(serverNamings.m, srv)
		serverNamings.Unlock()
	})
	return n
}

// othersFor names the other servers of srv's Caddy for a gate of srv:
// shared by the server's gates in one load (serverNaming), so they are
// written out once, not once per gate.
func othersFor(ctx caddy.Context, srv *caddyhttp.Server) *otherServers {
	if srv == nil {
		return watchOthers(ctx, nil)
	}
	return namingOf(ctx, srv).others
}

// newServerNaming writes srv out for its gates' names (serverNaming). Of
// its configuration only what routes is written: its listeners, which
// take the requests; its routes, which choose a request's handlers and so
// its upstream; its error routes (`handle_errors`), where a failed
// request goes on to; and its named routes, which an `invoke` in either
// reaches by name alone. Its server-wide settings (timeouts, logs,
// log_credentials, metrics, TLS connection policies, protocols, listener
// wrappers, trusted proxies and client IP headers) send no request
// anywhere else (a report keeps the call's client address rather than
// reading it anew through trusted_proxies), so a reload or restart
// changing only those (an access log, AOV_READ_BODY_TIMEOUT's read_body)
// keeps the gates' names and their held outcomes' reports.
func newServerNaming(ctx caddy.Context, srv *caddyhttp.Server) *serverNaming {
	serversWritten.Add(1)
	n := &serverNaming{others: watchOthers(ctx, srv)}
	base := struct {
		Server   string
		Listen   []string
		Routes   int
		Groups   []string
		Matchers [][][]string
		Named    any `json:",omitempty"`
	}{Listen: srv.Listen, Routes: len(srv.Routes)}
	for _, m := range ctx.Modules() {
		if app, ok := m.(*caddyhttp.App); ok {
			for name, s := range app.Servers {
				if s == srv {
					base.Server = name
				}
			}
		}
	}
	routes := slices.Clone(srv.Routes)
	if srv.Errors != nil {
		routes = append(routes, srv.Errors.Routes...)
	}
	run := 0 // automatic HTTPS redirects in a row, up to this route
	for _, r := range routes {
		sets, err := matcherText(r.MatcherSets)
		if err != nil {
			return n
		}
		base.Groups = append(base.Groups, r.Group)
		base.Matchers = append(base.Matchers, sets)
		if run = run + 1; !autoRedirect(r) {
			run = 0
		}
		slices.SortFunc(base.Matchers[len(base.Matchers)-run:], func(a, b [][]string) int {
			return slices.CompareFunc(a, b, slices.Compare[[]string])
		})
	}
	if len(srv.NamedRoutes) > 0 {
		named, err := withoutGateSettings(srv.NamedRoutes)
		if err != nil {
			return n
		}
		base.Named = named
	}
	tails := make([]string, len(routes)+1)
	for i := len(routes) - 1; i >= 0; i-- {
		config, err := withoutGateSettings(routes[i])
		if err != nil {
			return n
		}
		b, err := json.Marshal(config)
		if err != nil {
			return n
		}
		// The next one's hash first, of fixed length: the text after it
		// is this route's alone.
		sum := sha256.Sum256(append([]byte(tails[i+1]), withFixedPlaceholders(b)...))
		tails[i] = hex.EncodeToString(sum[:])
	}
	b, err := json.Marshal(base)
	if err != nil {
		return n
	}
	sum := sha256.Sum256(withFixedPlaceholders(b))
	n.base, n.tails = hex.EncodeToString(sum[:]), tails
	return n
}

// fixedPlaceholders are the prefixes of the placeholders whose value is
// fixed for the life of the process: the environment ({env.*}), a file's
// contents ({file.*}) and the host's ({system.*}).
var fixedPlaceholders = []string{"env.", "file.", "system."}

// withFixedPlaceholders is a gate's name's text with its fixed
// placeholders (fixedPlaceholders) replaced by their values, read as
// Caddy reads them (caddy.NewReplacer) when the config loads. Caddy
// replaces them when a request is made, so the same text leads elsewhere
// once the variable (or the file) does: `reverse_proxy {env.BACKEND}`
// restarted with BACKEND at another verifierd goes there, and by the
// text alone that verifierd was reported the outcomes the first one
// recorded. The placeholders of a request ({http.*}, a request's own) and
// of the clock ({time.*}) are left as text: they are no part of the
// configuration, and read at load they would rename a gate at every
// reload. (`{$VAR}` is replaced by the Caddyfile adapter, before any of
// this.)
func withFixedPlaceholders(text []byte) []byte {
	global := caddy.NewReplacer()
	fixed := caddy.NewEmptyReplacer()
	fixed.Map(func(key string) (any, bool) {
		for _, prefix := range fixedPlaceholders {
			if strings.HasPrefix(key, prefix) {
				return global.Get(key)
			}
		}
		return nil, false
	})
	return []byte(fixed.ReplaceKnown(string(text), ""))
}

// withoutGateSettings is v's configuration (a route's, a server's named
// routes') as JSON, each gate's (handler x402) written as its handler name
// alone: a gate's settings (prices, facilitator, store, free allowance)
// decide whether a call is served, never where it goes on to, so an
// operator who changes them (a facilitator's rpc_url, say) keeps the
// gates' names and their held outcomes' reports; the route and MCP tool a
// gate prices are in gateID.
func withoutGateSettings(v any) (any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var tree any
	if err := dec.Decode(&tree); err != nil {
		return nil, err
	}
	var strip func(v any) any
	strip = func(v any) any {
		switch v := v.(type) {
		case map[string]any:
			if v["handler"] == "x402" {
				return map[string]any{"handler": "x402"}
			}
			for k, e := range v {
				v[k] = strip(e)
			}
		case []any:
			for i, e := range v {
				v[i] = strip(e)
			}
		}
		return v
	}
	return strip(tree), nil
}

// autoRedirect reports whether r is a route automatic HTTPS made: a
// redirect of plain HTTP requests (of some hosts) to HTTPS. Caddy puts one
// per HTTPS port into the server on the HTTP port, in a row, ordered by the
// first host of each one's host list, a list it builds in Go map order; so
// upstreamOf names such a row as a set: a reload of the same config
// orders it anew, and decides nothing anew but where two of them redirect
// one host (served on two HTTPS ports), which Caddy itself then picks by
// that order.
func autoRedirect(r caddyhttp.Route) bool {
	if len(r.HandlersRaw) != 0 || len(r.Handlers) != 1 || len(r.MatcherSets) != 1 {
		return false
	}
	sr, ok := r.Handlers[0].(caddyhttp.StaticResponse)
	if !ok || !strings.HasPrefix(sr.Headers.Get("Location"), "https://{http.request.host}") {
		return false
	}
	return slices.ContainsFunc(r.MatcherSets[0], func(m any) bool {
		p, ok := m.(caddyhttp.MatchProtocol)
		return ok && p == "http"
	})
}

// matcherText writes loaded matcher sets out: each matcher's type and
// JSON, its lists of alternatives sorted (alternativesSorted), a set's
// matchers sorted (it is loaded from a map, whose order is no part of
// it), and a `not`'s own sets within it (its JSON has none).
func matcherText(sets []caddyhttp.MatcherSet) ([][]string, error) {
	out := make([][]string, 0, len(sets))
	for _, set := range sets {
		var ms []string
		for _, m := range set {
			b, err := json.Marshal(alternativesSorted(m))
			if err != nil {
				return nil, err
			}
			if not, ok := m.(*caddyhttp.MatchNot); ok {
				inner, err := matcherText(not.MatcherSets)
				if err != nil {
					return nil, err
				}
				if b, err = json.Marshal(inner); err != nil {
					return nil, err
				}
			}
			ms = append(ms, fmt.Sprintf("%T %s", m, b))
		}
		slices.Sort(ms)
		out = append(out, ms)
	}
	return out, nil
}

// alternativesSorted is matcher m with each of its lists of alternatives
// (a request matches when it matches any one) sorted: hosts, paths,
// methods, a header's or a query key's values, IP ranges. Their order
// decides nothing, and Caddy writes one in Go map order: the host list of
// its automatic HTTP-to-HTTPS redirect route, put into the server on the
// HTTP port, so a gate there was renamed by a reload of the same config.
// Lists whose order counts (a file matcher's try_files) are left as they
// are; m itself is not changed.
func alternativesSorted(m any) any {
	switch m := m.(type) {
	case caddyhttp.MatchHost:
		return sortedList(m)
	case *caddyhttp.MatchHost:
		return sortedList(*m)
	case caddyhttp.MatchPath:
		return sortedList(m)
	case *caddyhttp.MatchPath:
		return sortedList(*m)
	case caddyhttp.MatchMethod:
		return sortedList(m)
	case *caddyhttp.MatchMethod:
		return sortedList(*m)
	case caddyhttp.MatchHeader:
		return sortedLists(m)
	case *caddyhttp.MatchHeader:
		return sortedLists(*m)
	case caddyhttp.MatchQuery:
		return sortedLists(m)
	case *caddyhttp.MatchQuery:
		return sortedLists(*m)
	case *caddyhttp.MatchRemoteIP:
		return caddyhttp.MatchRemoteIP{Ranges: sortedList(m.Ranges)}
	case *caddyhttp.MatchClientIP:
		return caddyhttp.MatchClientIP{Ranges: sortedList(m.Ranges)}
	}
	return m
}

// sortedList is a sorted copy of s, nil for nil.
func sortedList[S ~[]string](s S) S {
	c := slices.Clone(s)
	slices.Sort(c)
	return c
}

// sortedLists is a copy of m with each list sorted; a nil list (a header
// that must be absent) stays nil, an empty one empty.
func sortedLists[M ~map[string][]string](m M) M {
	c := make(M, len(m))
	for k, v := range m {
		c[k] = sortedList(v)
	}
	return c
}

// routeIndex is the place, in a list of routes and its error routes, of
// the route being provisioned: the first whose handlers are not loaded
// yet; "" when there is none. from is its index in the two lists one
// after the other.
func routeIndex(routes caddyhttp.RouteList, errs *caddyhttp.HTTPErrorConfig) (at string, from int) {
	for i := range routes {
		if routes[i].HandlersRaw != nil {
			return strconv.Itoa(i), i
		}
	}
	if errs != nil {
		for i := range errs.Routes {
			if errs.Routes[i].HandlersRaw != nil {
				return "errors " + strconv.Itoa(i), len(routes) + i
			}
		}
	}
	return "", 0
}

// maxHeldAnswer bounds an answer kept for an unknown settlement.
const maxHeldAnswer = 1 << 20

// resolveInterval is how often the background pass looks at held records;
// resolveTimeout bounds one facilitator check. Tests shorten them.
var (
	resolveInterval = 30 * time.Second
	resolveTimeout  = 10 * time.Second
)

func (h *heldRecord) claim() store.Claim {
	return store.Claim{Keys: h.Keys, Token: h.Token, Until: h.Until}
}

// decodeHeld reads a note as a held record: false when it is none (a
// settled claim's transaction hash, or a note no gate wrote). A record
// written before the payment was kept as received (LegacyPayload) is read
// as it was written, so an upgrade resolves the records it finds.
func decodeHeld(note string) (*heldRecord, bool) {
	if len(note) == 0 || note[0] != '{' {
		return nil, false
	}
	var h heldRecord
	if err := json.Unmarshal([]byte(note), &h); err != nil || len(h.Keys) == 0 || h.Token == "" {
		return nil, false
	}
	if err := json.Unmarshal(h.Offer, &h.offer); err != nil {
		return nil, false
	}
	switch {
	case len(h.Payment) > 0:
		p, err := x402.ParsePayment(h.Payment)
		if err != nil {
			return nil, false
		}
		h.payload = p.PaymentPayload
	case len(h.LegacyPayload) > 0:
		if err := json.Unmarshal(h.LegacyPayload, &h.payload); err != nil {
			return nil, false
		}
	default:
		return nil, false
	}
	return &h, true
}

// encodeHeld is the note of h: JSON, with HTML left unescaped so that the
// payment's JSON is kept as received (escaped, it could grow past what
// x402.ParsePayment reads back). Every record is written by it, so a note
// read back compares equal to the one written (HeldClaims.Swap).
func encodeHeld(h *heldRecord) (string, error) {
	buf := getBuffer()
	defer putBuffer(buf)
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(h); err != nil {
		return "", err
	}
	return string(bytes.TrimSuffix(buf.Bytes(), []byte{'\n'})), nil
}

// newHeldRecord starts the record of a payment claimed by c: what every
// record carries, whoever writes it (claimPaid with the claim, holdUnknown
// when the outcome is unknown). payment is the payment's JSON
// (x402.Payment.JSON), offer the offer's (Gate.offerJSON); sentAfter is a
// time before which the settlement was not asked for; r is the request
// that claimed it, whose resource the record names; pid its payment
// identifier (nil: none), which the record names too.
func (g *Gate) newHeldRecord(r *http.Request, c store.Claim, payment []byte, offer json.RawMessage, sentAfter time.Time, pid *paymentIDCall) heldRecord {
	g.others.wait(r.Context()) // named: the config has started before it serves
	return heldRecord{Keys: c.Keys, Token: c.Token, Until: c.Until, Payment: payment, Offer: offer, Gate: g.gateID(), SentAfter: sentAfter, Resource: g.resource(r).URL, PaymentID: pid.name()}
}

// markDelivered records, by a compare-and-swap from old (the note c
// carries now), that the one delivery h's payment bought is made:
// store.ErrNoteChanged when something else made or took it first.
func markDelivered(ctx context.Context, hc store.HeldClaims, c store.Claim, h *heldRecord, old string) error {
	d := *h
	d.Delivered = true
	note, err := encodeHeld(&d)
	if err != nil {
		return err
	}
	return hc.Swap(ctx, c, old, note)
}

// holdUnknown keeps the record of a settlement whose outcome is unknown
// with its claim. offer is the payment's offer (offerJS as written),
// whose network names the signers kept and decides whether the gate can
// read the outcome at all (readsSettlements); sentAfter is a time before
// which it was not asked for (paidCharge.sentAfter); bw is the held
// answer (nil in settle before mode). Without a store that can hold, the
// claim simply stays pending until it lapses, as before.
func (g *Gate) holdUnknown(r *http.Request, c store.Claim, payment []byte, offerJS json.RawMessage, offer x402.PaymentRequirements, pid *paymentIDCall, sentAfter time.Time, bw *bufferedWriter, unknown *x402.UnknownOutcomeError) {
	ctx := r.Context()
	hc, ok := g.state.Claims().(store.HeldClaims)
	if !ok {
		return
	}
	h := g.newHeldRecord(r, c, payment, offerJS, sentAfter, pid)
	h.offer = offer
	if unknown != nil && unknown.Reply != nil {
		h.Sent = unknown.Reply.Transaction
	}
	h.Signers = heldSigners(ctx, g.facilitator, offer.Network, true)
	if failedUnnamed(unknown) {
		bw = nil // no answer kept: see failedUnnamed
	}
	g.holdAnswer(&h, r, bw)
	note, err := encodeHeld(&h)
	if err == nil {
		err = hc.Hold(context.WithoutCancel(ctx), c, note)
	}
	if err != nil {
		g.logger.Error("keeping the record of an unknown settlement", zap.Error(err))
	}
	if !g.readsSettlements(ctx, h.offer) {
		g.markUnresolvable(ctx, c)
	}
}

// Payments this gateway can never resolve.
//
// A record is resolved by reading the chain (checkHeld); a remote
// facilitator without `rpc` for the payment's network leaves nothing to
// read it with. Its claim still lapses (at validBefore plus a minute), and
// a retry after that is claimed anew and refused by the facilitator as the
// spent or expired authorization it is: a 402 asking for a new payment,
// nothing charged, told to a buyer who may have been charged. So such a
// payment also gets a mark of its own, a settled claim under
// unresolvablePrefix and the payment's last claim key (payer and nonce on
// EVM, the message on Solana, the header otherwise: what any copy of the
// payment claims), written with Claims.Record and kept maxClaimHold, the
// longest any claim is held. A refusal of the payment while the mark
// lasts, and the gate still cannot read the chain, is answered
// errSettlementUnresolvable instead (unresolvable). The mark is a few
// bytes, whatever the held answer; the record keeps its own lifetime.
const unresolvablePrefix = "x402/unresolvable/"

// unresolvableKey is the mark's key for a payment claimed under keys.
func unresolvableKey(keys []string) string {
	return unresolvablePrefix + keys[len(keys)-1]
}

// markUnresolvable writes the mark of claim c's payment, an unknown
// outcome this gate cannot read from the chain, and tells the operator.
// Whoever first finds the outcome unreadable writes it: the settling
// request on the facilitator's reply (holdUnknown), or, when that request
// never saw the reply (the gateway was killed mid-settlement, and only the
// record written with the claim is left), the first retry after the
// restart (resolveOnRetry) or the background pass (resolvePass), whichever
// comes first. Without that the claim would lapse unmarked and the
// charged buyer's retry be asked for a new payment. A mark already
// written is left as it is, so its 7 days run from the first finding and
// the Warning is logged once per payment, not on every retry or pass.
func (g *Gate) markUnresolvable(ctx context.Context, c store.Claim) {
	ctx = context.WithoutCancel(ctx)
	key := unresolvableKey(c.Keys)
	if _, err := g.state.Claims().Lookup(ctx, key); err == nil {
		return
	}
	err := g.state.Claims().Record(ctx, key, "unresolvable", now().Add(maxClaimHold))
	if err != nil {
		g.logger.Error("marking an unknown settlement this gateway cannot read from the chain; once its claim lapses, its retry is told the facilitator's refusal", zap.Error(err))
		return
	}
	g.logger.Warn("a settlement's outcome is unknown and this gateway cannot read it from the chain: configure rpc for the network on the http facilitator; the payment is answered settlement_pending for 7 days",
		zap.Strings("claim", c.Keys))
}

// unresolvable reports whether the payment claimed under keys, which the
// facilitator just refused, carries the mark of an unknown outcome this
// gate still cannot read (markUnresolvable). Asked only on a refusal, so a
// paid call pays no read for it. A gate that can read the chain now (rpc
// configured since) judges the payment by the chain instead
// (settledEarlier).
func (g *Gate) unresolvable(ctx context.Context, keys []string, offer x402.PaymentRequirements) bool {
	if g.readsSettlements(ctx, offer) {
		return false
	}
	_, err := g.state.Claims().Lookup(ctx, unresolvableKey(keys))
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		// Fail closed: the buyer may have been charged.
		g.logger.Warn("reading the mark of an unresolvable settlement", zap.Error(err))
		return true
	}
	return err == nil
}

// settlementReader is implemented by facilitators that may or may not be
// able to read a network's settlements (a remote one reads only the
// networks it has an rpc endpoint for), and tell which without asking the
// chain.
type settlementReader interface {
	readsSettlements(ctx context.Context, offer x402.PaymentRequirements) bool
}

// readsSettlements reports whether g's facilitator can learn the outcome
// of a settlement of offer at all: a settlementReader says; any other
// SettlementChecker can (the embedded facilitators read their own chain).
func (g *Gate) readsSettlements(ctx context.Context, offer x402.PaymentRequirements) bool {
	if sr, ok := g.facilitator.(settlementReader); ok {
		return sr.readsSettlements(ctx, offer)
	}
	_, ok := g.facilitator.(x402.SettlementChecker)
	return ok
}

// failedUnnamed reports whether an unknown outcome is a facilitator's
// failure that names no transaction. The official facilitators answer
// invalid_exact_evm_transaction_failed so both for a send whose RPC call
// failed after the node may have taken it and for a gas estimate that
// reverted for a reason they do not recognise, which sent nothing: a
// payer can cause the latter at will (a blacklisted payer, a contract
// wallet whose isValidSignature reverts at settle), and no chain read
// tells the two apart (a transaction in a mempool has not used its nonce
// yet), so the payment is held as any unknown outcome until its
// authorization can no longer settle, up to maxClaimHold. Such a hold
// keeps no answer, only the record (a few KiB): were the answer kept, a
// payer could park up to maxHeldAnswer in the store per authorization it
// signs, for as long as it made the authorization valid. Should the
// transfer turn out to have happened, the retry runs the upstream again,
// once, as for an answer too large to keep. And the call counts against
// the client's rate limit (settleOnce), as a paid call the upstream
// worked for that settled nothing does.
func failedUnnamed(unknown *x402.UnknownOutcomeError) bool {
	return unknown != nil && unknown.Reply != nil && unknown.Reply.Transaction == "" && unknown.Reply.ErrorReason != x402.ReasonSettlementPending
}

// holdAnswer puts in h what the payment's retry is served from: the answer
// held back (bw; nil in settle before mode), with the header it was
// released with (keptHeader), when it is at most maxHeldAnswer bytes,
// else a run of the upstream, once; and, either way,
// the name of the request paid for. The name is what keeps the answer the
// buyer's: the payment's claim keys name it by what the chain publishes
// once it settles (payer and nonce, and the signature itself in the
// transfer's calldata), so anyone could present it again (paidFor).
func (g *Gate) holdAnswer(h *heldRecord, r *http.Request, bw *bufferedWriter) {
	if bw != nil {
		if hdr, ok := keptHeader(bw, maxHeldAnswer, receiptNameOf(r.Context())); ok {
			h.Held, h.Status, h.Header, h.ContentType, h.Body = true, bw.status(), hdr, bw.header.Get("Content-Type"), bytes.Clone(bw.buf.Bytes())
			h.ReceiptHeader = receiptNameOf(r.Context())
		}
	}
	h.Request, h.RequestBody = g.heldRequest(r)
}

// heldRequest names the request a payment paid for, for its held record:
// the request as payment identifiers name it (requestParts), its body
// included. The gate reads every paid call's body before it claims the
// payment (Gate.ServeHTTP), so the body is known here, the empty one when there
// is none; a body it has not read (no paid call leaves one) is left out
// (body false), the retry then matched by method, path and query. "" when
// the request cannot be named.
func (g *Gate) heldRequest(r *http.Request) (name string, body bool) {
	var read func(*http.Request) ([]byte, error)
	switch b := r.Body.(type) {
	case *gateBody:
		read = func(*http.Request) ([]byte, error) { return b.b, nil }
	default:
		if r.Body == nil || r.Body == http.NoBody {
			read = g.readBody // nothing to read: the empty body is named
		}
	}
	name, err := g.requestName(r, read)
	if err != nil {
		g.logger.Warn("naming the request of an unknown settlement", zap.Error(err))
		return "", false
	}
	return name, read != nil
}

// requestName hashes requestParts, with body read by read (nil: left out).
func (g *Gate) requestName(r *http.Request, read func(*http.Request) ([]byte, error)) (string, error) {
	h := sha256.New()
	if err := g.requestParts(r, partWriter(h), read); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// checkHeld asks the facilitator whether h's transfer happened. ok is false
// when the facilitator cannot tell (it is no SettlementChecker, or the
// check failed): the outcome stays unknown.
func (g *Gate) checkHeld(ctx context.Context, h *heldRecord) (x402.SettlementStatus, bool) {
	return g.checkSettlement(ctx, h.payload, h.offer, x402.SentSettlement{Transaction: h.Sent, After: h.SentAfter, Signers: h.Signers})
}

// checkSettlement asks the facilitator whether payment p for offer
// settled, with what the gate knows of the attempt (sent), as checkHeld
// says.
func (g *Gate) checkSettlement(ctx context.Context, p x402.PaymentPayload, offer x402.PaymentRequirements, sent x402.SentSettlement) (x402.SettlementStatus, bool) {
	st, err := g.settlementStatus(ctx, p, offer, sent)
	switch {
	case errors.Is(err, errNoSettlementChecker):
		return st, false
	case err != nil:
		g.logger.Warn("checking an unknown settlement", zap.Error(err))
		return st, false
	}
	return st, true
}

// errNoSettlementChecker is settlementStatus's answer when the gate's
// facilitator cannot tell a settlement's outcome at all.
var errNoSettlementChecker = errors.New("the facilitator cannot tell a settlement's outcome")

// settlementStatus is checkSettlement's question, its error returned, and
// bounded by resolveTimeout whatever ctx's deadline.
func (g *Gate) settlementStatus(ctx context.Context, p x402.PaymentPayload, offer x402.PaymentRequirements, sent x402.SentSettlement) (x402.SettlementStatus, error) {
	sc, ok := g.facilitator.(x402.SettlementChecker)
	if !ok {
		return x402.SettlementStatus{}, errNoSettlementChecker
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resolveTimeout)
	defer cancel()
	if ssc, ok := g.facilitator.(x402.SentSettlementChecker); ok {
		return ssc.SentSettlementStatus(ctx, p, offer, sent)
	}
	return sc.SettlementStatus(ctx, p, offer)
}

// settledEarlier reports whether payment p, which the facilitator refused
// with reason on a claim the gate just made, settled earlier, and its
// settlement (as toldSettlement tells it); or, unknown, that whether it did
// cannot be told now. Such a payment's claim, and the held record with it,
// have lapsed (an unknown settlement resolved after it, or never retried
// before it), so the gate keeps nothing of it: told the facilitator's
// reason, the buyer would read that nothing was charged and sign a new
// payment for a call already paid. Only the refusals a spent EIP-3009
// authorization gets (expired, or its nonce used) send the gate to the
// chain, and only for an authorization its payer signed (signedByPayer):
// the facilitator refuses an expired one before it checks the signature,
// and the payer, payTo, amount and nonce of every settlement are public on
// chain, so anyone could otherwise name a settled payment, unsigned, and
// be told it is theirs, each time at the cost of a search of the chain's
// logs. A signed payment costs one read (authorizationState) when its
// nonce is unused, as it is for every payment refused expired that never
// settled (x402.SentSettlement's SettledOnly); the transaction that used
// the nonce is searched for only when it is used, and judged, as a held
// record's is (checkHeld), to carry this authorization's own Transfer of
// its amount to payTo; a nonce used outside the authorization's validity
// window (searched whole) is a nonce spent without paying. The transaction
// found is remembered by the facilitator's status reader per token, payer
// and nonce for a minute, since the settled payment is public and its
// payer can sign others of the nonce: a repeat costs the one read.
//
// unknown is true when the check failed where the payment may have
// settled (*x402.UnknownOutcomeError: the chain did not answer in time, or
// the nonce is used by a transaction that cannot be found or judged): the
// buyer may have been charged, so the answer is settlement_pending, as a
// held record's is, never the refusal that asks for a new payment. A
// facilitator that cannot check at all (no rpc endpoint for the network)
// leaves the refusal, as a nonce known unused or spent without paying
// does.
func (g *Gate) settledEarlier(ctx context.Context, p x402.PaymentPayload, offer x402.PaymentRequirements, reason string) (sr x402.SettleResponse, settled, unknown bool) {
	if reason != x402.ReasonExactEVMValidBefore && reason != x402.ReasonExactEVMNonceAlreadyUsed {
		return sr, false, false
	}
	if !signedByPayer(p, offer) {
		return sr, false, false
	}
	st, err := g.settlementStatus(ctx, p, offer, x402.SentSettlement{SettledOnly: true})
	var ue *x402.UnknownOutcomeError
	switch {
	case errors.As(err, &ue):
		g.logger.Warn("checking whether a refused payment settled earlier", zap.Error(err))
		return sr, false, true
	case err != nil:
		if !errors.Is(err, errNoSettlementChecker) {
			g.logger.Warn("checking whether a refused payment settled earlier", zap.Error(err))
		}
		return sr, false, false
	case st.State != x402.SettlementDone:
		return sr, false, false
	}
	return toldSettlement(x402.SettleResponse{Success: true, Transaction: st.Transaction}, payerOf(p, offer.Network), offer.Network), true, false
}

// signedByPayer reports whether p is an EIP-3009 authorization of offer's
// amount whose 65-byte signature, over offer's EIP-712 domain, its payer
// (from) made: checked locally, as the facilitator checks it
// (x402.RecoverExactEVM). A longer signature (a smart wallet's) only the
// chain can check, so it is not taken for signed: such a payment refused
// after its expiry is told the facilitator's refusal.
func signedByPayer(p x402.PaymentPayload, offer x402.PaymentRequirements) bool {
	pl, err := x402.ParseExactEVMPayload(p.Payload) // the gate's one reading of it
	if err != nil {
		return false
	}
	v, err := pl.Authorization.Values()
	if err != nil || v.Value.String() != offer.Amount {
		return false
	}
	signer, err := x402.RecoverExactEVM(offer, pl)
	return err == nil && signer == v.From
}

// settleHeld applies a resolved outcome to the store: the claim marked
// settled (keeping the record, so a retry still gets the answer) or
// released. old is the record's note as read: the claim is settled only if
// it still carries it (HeldClaims.Swap), so a record another request has
// moved on since (settled, and delivered) is never set back. It reports
// false when the store refused (the claim lapsed, changed hands, or was
// moved on), and the settled record's note.
func (g *Gate) settleHeld(ctx context.Context, h *heldRecord, old string, st x402.SettlementStatus) (string, bool) {
	ctx = context.WithoutCancel(ctx)
	var err error
	var note string
	switch st.State {
	case x402.SettlementDone:
		h.Transaction = st.Transaction
		if note, err = encodeHeld(h); err != nil {
			break
		}
		if hc, ok := g.state.Claims().(store.HeldClaims); ok { // always: only such a store holds records
			err = hc.Swap(ctx, h.claim(), old, note)
		}
		metrics.outcomes.WithLabelValues("unknown_resolved_settled").Inc()
	case x402.SettlementNever:
		err = g.state.Claims().Release(ctx, h.claim())
		metrics.outcomes.WithLabelValues("unknown_resolved_released").Inc()
	default:
		return old, true
	}
	if err != nil {
		g.logger.Warn("resolving an unknown settlement", zap.Error(err))
		return "", false
	}
	return note, true
}

// resolveOnRetry answers a request carrying pay whose payment is already
// claimed, when the claim carries the record of an unknown settlement
// (handled false: it does not, and the caller answers as before).
func (g *Gate) resolveOnRetry(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, ex exchange, cs store.ClaimState, pay x402.PaymentPayload) (bool, error) {
	h, ok := decodeHeld(cs.Note)
	if !ok {
		return false, nil
	}
	if !cs.Settled && attempting(h, cs) {
		return false, nil // in flight: the caller answers as it does
	}
	if !samePayment(h.payload, pay) {
		// The claim keys matched, the signed payload did not: not the
		// buyer's payment (see paidFor). Asked before the chain is.
		return true, alreadyUsed(w, r, ex)
	}
	if !h.carriedBy(pay) {
		// The buyer's payment, copied from the chain without the buyer's
		// payment identifier: its answer and its run are the buyer's.
		return true, ex.demand(w, r, http.StatusPaymentRequired,
			"This payment belongs to a call made with a payment identifier: only a retry carrying that identifier gets its answer. Sign a new payment for another call.",
			x402.ReasonPaymentAlreadyUsed, nil)
	}
	if !g.pricedHere(h, r, pay) {
		// Another gate's payment: neither its outcome nor its report is
		// this gate's to move, and its call is not this gate's upstream.
		return true, paidForAnother(w, r, ex)
	}
	note := cs.Note
	// learned: this request found the payment settled, so the settlement
	// is news for wallet_auth (noteSettled); a held answer served again
	// to a later retry is not, and renews no sign-in-with-x access.
	learned := false
	if !cs.Settled {
		st, known := g.checkHeld(r.Context(), h)
		if !known && !g.readsSettlements(r.Context(), h.offer) {
			g.markUnresolvable(r.Context(), h.claim()) // its settling request may have been killed first
			return true, ex.refuse(w, r, errSettlementUnresolvable())
		}
		if !known || st.State == x402.SettlementUndecided {
			return true, ex.refuse(w, r, errSettlementPending(nil))
		}
		if note, ok = g.settleHeld(r.Context(), h, cs.Note, st); !ok {
			return true, ex.refuse(w, r, errSettlementPending(nil))
		}
		learned = st.State == x402.SettlementDone
		if st.State == x402.SettlementNever {
			g.reportHeldOutcome(r, next, h, st.State, false)
			reason := x402.ReasonExactEVMValidBefore
			if x402.IsSolana(h.offer.Network) {
				// Failed on chain or its blockhash expired unsent.
				reason = svmfacilitator.ReasonTransactionFailed
			}
			if st.Reason != "" { // e.g. the nonce cancelled or spent without paying
				reason = st.Reason
			}
			msg := "This payment can no longer settle and nothing was charged; sign a new one."
			if reason == x402.ReasonDuplicateSettlement {
				// Its transfer landed, and another settlement answered
				// success for it (a Solana send another instance, or a
				// /settle elsewhere, marked first): the buyer's tokens
				// moved, so "nothing was charged" would be false.
				msg = "This payment was settled by another settlement, which answers for it; this request is not served, and nothing more is charged."
			}
			return true, ex.demand(w, r, http.StatusPaymentRequired, msg, reason, nil)
		}
	}
	// The transfer happened: deliver what was paid for.
	if h.Delivered {
		return true, alreadyUsed(w, r, ex)
	}
	if now().Before(h.Running) {
		return true, runUnderWay(w, r, ex, h) // another retry runs it
	}
	sr := toldSettlement(x402.SettleResponse{Success: true, Transaction: h.Transaction}, payerOf(h.payload, h.offer.Network), h.offer.Network)
	// Asked before anything is reported: the payment is public once
	// settled, and a request it did not pay for must neither wait for a
	// report nor make the gate send one.
	ok, err := g.paidFor(h, r)
	switch {
	case err == nil && ok:
		// The buyer's retry: reported before its answer, also after a
		// background resolution (reported then too, when the gate had a
		// way to: reportResolved); a repeated report changes nothing
		// upstream.
		g.reportHeldOutcome(r, next, h, x402.SettlementDone, true)
	case learned:
		// Another request found the transfer: news to report, once (only
		// the request whose write settled the record learns it), in the
		// background, as its answer delivers nothing.
		g.reportHeldOutcome(r, next, h, x402.SettlementDone, false)
	}
	switch {
	case err != nil:
		return true, ex.refuse(w, r, apierr.From(err))
	case !ok:
		return true, paidForAnother(w, r, ex)
	}
	if h.Held {
		body := ex.retold(h.Body)
		buf := getBuffer()
		defer putBuffer(buf)
		buf.Write(body)
		bw := &bufferedWriter{header: h.Header, buf: buf, code: h.Status, limit: int64(len(body))}
		if bw.header == nil {
			bw.header = http.Header{}
			if h.ContentType != "" {
				bw.header.Set("Content-Type", h.ContentType)
			}
		}
		if learned {
			g.noteSettled(r, sr)
		}
		if h.ReceiptHeader != "" {
			// This request's answer is the held one, with its receipt
			// under that name: an id's saved copy of it keeps it.
			caddyhttp.SetVar(r.Context(), receiptNameVar, h.ReceiptHeader)
		}
		ex.deliver(w, bw, sr)
		return true, nil
	}
	// No answer was kept: the upstream runs again, once, for the request
	// that was paid for (paidFor, above).
	hc, ok := g.state.Claims().(store.HeldClaims)
	if !ok { // never: only such a store keeps records
		return true, alreadyUsed(w, r, ex)
	}
	ctx := context.WithoutCancel(r.Context())
	taken, err := g.takeRun(ctx, hc, h, note)
	switch {
	case errors.Is(err, store.ErrNoteChanged):
		return true, runUnderWay(w, r, ex, h) // another retry took the run
	case err != nil:
		return true, ex.refuse(w, r, apierr.Unavailable("payment state store", 1, err))
	}
	metrics.outcomes.WithLabelValues("unknown_resolved_run_again").Inc()
	r.Header.Set(HeaderUpstreamPayment, "paid")
	if sr.Payer != "" {
		r.Header.Set(HeaderUpstreamPayer, sr.Payer)
	}
	r.Header.Set(HeaderUpstreamNetwork, h.offer.Network)
	g.noteSettled(r, sr)
	// The run is delivered once the upstream's answer is under way (its
	// first write: its header, or a protocol switch's 101), not once it
	// ends: a stream (SSE) or a tunnel may outlast the run's span, and a
	// retry after the span would run the upstream again for the same
	// payment; so would one after a gateway that dies mid-stream. The
	// mark is written before the answer's header goes out; should the
	// store fail it, the answer still goes out.
	failed, err := g.runSettled(w, r, next, sr, func() {
		if err := markDelivered(ctx, hc, h.claim(), h, taken); err != nil {
			g.logger.Error("a run again is being delivered but was not marked so; a retry after its span may run it again", zap.Error(err))
		}
		streamed(ex, sr)
	})
	if failed != nil {
		// Nothing was delivered: the run is given back for the buyer's
		// retry. Should the store fail this write, the mark lapses
		// with its span instead.
		if err := hc.Swap(ctx, h.claim(), taken, note); err != nil {
			g.logger.Warn("a run again that failed could not be given back; a retry runs it once its span ends", zap.Error(err))
		}
		return true, ex.refuse(w, r, runAgainFailed(failed))
	}
	return true, err
}

// runUnderWay answers a retry of h's payment while another request runs
// its one run again. A retry of a call made with a payment identifier
// carries it (carriedBy, checked before): it is told the call is still
// being served, 409 payment_identifier_in_progress, retryable, as while
// the call itself runs, since a 402 is what an x402 client answers with a
// new payment, charged a second time for the one call. A retry of a call
// made without one gets payment_in_flight: the answer goes to the request
// that runs it, and nothing tells this retry apart from a copy of the
// payment.
func runUnderWay(w http.ResponseWriter, r *http.Request, ex exchange, h *heldRecord) error {
	if h.PaymentID != "" {
		return ex.refuse(w, r, fresh(errPaymentIDInProgress))
	}
	return paymentInFlight(w, r, ex)
}

// takeRun takes the one run again h's payment bought, by a compare-and-swap
// from old (the note its claim carries now) to the note it returns, which
// marks the run taken until the end of its span (Running): of concurrent
// retries, one runs it (store.ErrNoteChanged for the others).
func (g *Gate) takeRun(ctx context.Context, hc store.HeldClaims, h *heldRecord, old string) (string, error) {
	t := *h
	t.Running = now().Add(g.attemptSpan())
	note, err := encodeHeld(&t)
	if err != nil {
		return "", err
	}
	return note, hc.Swap(ctx, h.claim(), old, note)
}

// runAgainRetryAfter is the wait runAgainFailed asks for.
const runAgainRetryAfter = 2

// runAgainFailed is the answer to a run again whose upstream wrote nothing
// (failed: serveSettled's answer for it). The payment settled, so the
// answer says charged; the run was given back, so unlike serveSettled's it
// asks for a retry with the same payment, never a new one.
func runAgainFailed(failed *apierr.Error) *apierr.Error {
	c := *failed
	c.Charged, c.Retryable, c.RetryAfter = true, true, runAgainRetryAfter
	c.Message = "The call was not answered; its payment is settled and still pays for it: retry with the same payment after " +
		apierr.Seconds(runAgainRetryAfter) + ", never sign a new one."
	acts := slices.DeleteFunc(slices.Clone(c.NextActions), func(a apierr.Action) bool { return a.Action == "retry" })
	c.NextActions = append(acts, apierr.Action{Action: "retry", After: runAgainRetryAfter})
	return &c
}

// paidFor reports whether r is the request h's payment paid for, by the
// name its record keeps (heldRequest: the rule payment identifiers bind a
// call by, requestParts). A held answer is the buyer's answer to the
// buyer's request, and the payment cannot prove the retry is the buyer's:
// once settled, everything it carries is public on chain (EVM: payer,
// nonce and the signature, in transferWithAuthorization's calldata; a
// Solana transaction once landed). The request is not. A record written
// before records were named (Request "") is served as it was.
func (g *Gate) paidFor(h *heldRecord, r *http.Request) (bool, error) {
	if h.Request == "" {
		return true, nil
	}
	var read func(*http.Request) ([]byte, error)
	if h.RequestBody {
		read = g.readBody
	}
	name, err := g.requestName(r, read)
	if err != nil {
		return false, err
	}
	return name == h.Request, nil
}

// carriedBy reports whether retry p carries the payment identifier h's
// call carried (PaymentID), or h names none.
func (h *heldRecord) carriedBy(p x402.PaymentPayload) bool {
	if h.PaymentID == "" {
		return true
	}
	id, err := x402.PaymentID(p)
	return err == nil && id != "" && paymentIDName(id) == h.PaymentID
}

// paidForAnother refuses a retry whose payment paid for another call
// (paidFor, pricedHere): the buyer's retry of that call gets its answer.
func paidForAnother(w http.ResponseWriter, r *http.Request, ex exchange) error {
	return ex.demand(w, r, http.StatusPaymentRequired,
		"This payment paid for another request, whose answer is still owed: retry that request with it, or sign a new payment for this one.",
		x402.ReasonPaymentAlreadyUsed, nil)
}

// pricedHere reports whether h's payment was priced by this gate, so that
// its retry p here may be resolved: the record names this gate's resource
// (Resource; a record written before records named it is taken as this
// gate's), and when this gate makes an offer matching p's accepted, that
// offer is the record's (amount, asset, network, pay_to). Gates sharing a
// store find each other's records by the claim keys, which on EVM name no
// price, and accepted is not signed: a payment for a cheap route, retried
// on a dear one, with accepted rewritten to the dear offer or left as the
// cheap one (the old-offer path, serveHeldUnderOldOffer), would otherwise
// run the dear route's upstream. Only the resource tells gates apart whose
// offers a reload may have changed (no current offer matches p): two
// gates of one resource told apart by other matchers are one resource to
// this check (README: they must not share a store).
func (g *Gate) pricedHere(h *heldRecord, r *http.Request, p x402.PaymentPayload) bool {
	if h.Resource != "" && !sameResource(h.Resource, g.resource(r).URL) {
		return false
	}
	offers := g.liveOffers().offers
	i := x402.MatchIndex(p.Accepted, offers)
	// The record's offer is compared as a payment's accepted is (addresses
	// in any letter case): a reload that only respells pay_to leaves the
	// offer the buyer paid.
	return i < 0 || x402.Mismatch(h.offer, offers[i]) == ""
}

// sameResource reports whether two resource URLs name one resource as
// origins compare: the scheme and host in any letter case, a default port
// written or not (Caddy's host matcher serves Basic.Test and
// basic.test:80 alike), the rest (the canonical escaped path) exactly.
func sameResource(a, b string) bool {
	if a == b {
		return true
	}
	ua, err1 := url.Parse(a)
	ub, err2 := url.Parse(b)
	if err1 != nil || err2 != nil || !strings.EqualFold(ua.Scheme, ub.Scheme) ||
		!strings.EqualFold(ua.Hostname(), ub.Hostname()) || ua.Opaque != ub.Opaque ||
		ua.EscapedPath() != ub.EscapedPath() || ua.RawQuery != ub.RawQuery {
		return false
	}
	return originPort(ua) == originPort(ub)
}

// originPort is u's port, its scheme's default when none is written.
func originPort(u *url.URL) string {
	if p := u.Port(); p != "" {
		return p
	}
	switch strings.ToLower(u.Scheme) {
	case "https":
		return "443"
	case "http":
		return "80"
	}
	return ""
}

// samePayment reports whether a retry's payment p carries the signed
// payload of the record's payment held (its scheme payload, compared in
// canonical form, so a client that encodes it anew still matches). The
// claim keys match a payment by its authorization alone; a payload that
// differs (a forged signature over the same authorization) is not the
// buyer's payment. A chain observer can copy the real one (paidFor is
// what stops it); this stops everyone else before the chain is read.
func samePayment(held, p x402.PaymentPayload) bool {
	if bytes.Equal(held.Payload, p.Payload) {
		return true
	}
	a, err := receipt.AppendCanonicalJSON(nil, held.Payload)
	if err != nil {
		return false
	}
	b, err := receipt.AppendCanonicalJSON(nil, p.Payload)
	return err == nil && bytes.Equal(a, b)
}

// payerOf is the payer of payment p on network, as its signed payload
// names it ("" if it does not): the authorization's from (checksummed) on
// EVM, the transfer's owner on Solana, read as servePaid read the payment
// before claiming it (a Solana payment the gate cannot read is refused
// then, so a served one always names its payer). It is the one source of a payment's
// payer for everything the gate tells or records (X-Aov-Payer,
// PAYMENT-RESPONSE, sign-in-with-x access, the logs): only that wallet's
// funds can move under the payment, whatever a facilitator's reply says
// (settledAs).
//
// servePaid, which has read the payment, takes its payer from what it read
// (paymentPayer) rather than decoding the payload again.
func payerOf(p x402.PaymentPayload, network string) string {
	if x402.IsSolana(network) {
		return svmfacilitator.PayerOf(p)
	}
	if !x402.IsEVM(network) {
		return "" // a network the gate cannot read (warnUnreadOffers)
	}
	var ev x402.ExactEVMPayload
	if len(p.Payload) > 0 && json.Unmarshal(p.Payload, &ev) == nil && common.IsHexAddress(ev.Authorization.From) {
		return common.HexToAddress(ev.Authorization.From).Hex()
	}
	return ""
}

// paymentPayer is payerOf a payment servePaid read (readPayment): auth on
// EVM, svmTx on Solana, neither on a network the gate cannot read.
func paymentPayer(auth *x402.AuthorizationValues, svmTx *svmfacilitator.Transaction) string {
	switch {
	case auth != nil:
		return auth.From.Hex()
	case svmTx != nil:
		return svmTx.Payer()
	}
	return ""
}

// alreadyUsed refuses a retry of a payment whose one delivery was made.
func alreadyUsed(w http.ResponseWriter, r *http.Request, ex exchange) error {
	return ex.demand(w, r, http.StatusPaymentRequired,
		"This payment was already used: its call was answered once its settlement was confirmed; sign a new one.",
		x402.ReasonPaymentAlreadyUsed, nil)
}

// codeSettlementPending is the code of every answer about a settlement
// whose outcome, or whose record, is not known yet.
const codeSettlementPending = "settlement_pending"

// errSettlementPending is the answer while a settlement's outcome is
// unknown: retry the same payment later, never sign a new one.
func errSettlementPending(cause error) *apierr.Error {
	return &apierr.Error{
		Code:        codeSettlementPending,
		Message:     "The payment's settlement outcome is not known yet and no content was released; do not sign a new payment, retry later.",
		Status:      http.StatusServiceUnavailable,
		Retryable:   true,
		RetryAfter:  30,
		NextActions: []apierr.Action{{Action: "retry", After: 30}},
		Cause:       cause,
	}
}

// errSettlementUnresolvable is the answer to a payment whose settlement
// outcome is unknown and that this gateway cannot read from the chain
// (readsSettlements false): the same code and shape as
// errSettlementPending, and a message that says why it will not resolve
// by itself.
func errSettlementUnresolvable() *apierr.Error {
	e := errSettlementPending(nil)
	e.Message = "The payment's settlement outcome is not known and no content was released; this gateway cannot read the chain to learn it (its operator has configured no rpc endpoint for this network). Do not sign a new payment for this call: ask the operator, or retry later."
	return e
}

// resolvePass resolves every held record this gate's facilitator can
// judge (its offer is one of ours) and that has a decided outcome.
func (g *Gate) resolvePass(ctx context.Context) {
	// A pass uses the store and the facilitator like a request: a reload
	// closes them only after it (and stops the next, stopResolver).
	if !g.uses.Enter() {
		return
	}
	defer g.uses.Leave()
	hc, ok := g.state.Claims().(store.HeldClaims)
	if !ok {
		return
	}
	if _, ok := g.facilitator.(x402.SettlementChecker); !ok {
		return
	}
	type held struct {
		h    *heldRecord
		note string
	}
	var todo []held
	offers := g.liveOffers().offers
	err := hc.Held(ctx, func(_ string, st store.ClaimState) bool {
		if h, ok := decodeHeld(st.Note); ok && !attempting(h, st) {
			if _, ours := x402.Match(h.offer, offers); ours {
				todo = append(todo, held{h, st.Note})
			}
		}
		return ctx.Err() == nil
	})
	if err != nil {
		g.logger.Warn("listing unknown settlements", zap.Error(err))
	}
	for _, t := range todo {
		if ctx.Err() != nil {
			return
		}
		st, known := g.checkHeld(ctx, t.h)
		switch {
		case !known && !g.readsSettlements(ctx, t.h.offer):
			g.markUnresolvable(ctx, t.h.claim()) // its settling request may have been killed first
		case known && st.State != x402.SettlementUndecided:
			if _, ok := g.settleHeld(ctx, t.h, t.note, st); ok {
				g.reportResolved(t.h, st.State)
			}
		}
	}
}

// reporter is how the background pass reaches the upstream that asked
// for a held record's outcome: the handler chain of the request that
// produced the record (another gate's pass may resolve it, and its own
// chain may lead elsewhere) and a copy of that request detached from it,
// carrying what the chain reads (the server, the client's address, the
// variables). Kept in memory by the record's first claim key, at most
// maxReporters of them; without one (the gateway restarted, the config
// of the request was unloaded by a reload that changed its route, or too
// many are pending) the outcome waits for the first request a gate of the
// same name (gateID: route and upstream) serves (learnRoute), made the
// record's request again (heldRecord.ReportRoute), or the buyer's retry,
// whichever is first.
type reporter struct {
	next caddyhttp.Handler
	base *http.Request
	// gate is the gate whose request it came from: its config's chain,
	// dropped with it (stopResolver) unless a loaded gate of the same
	// name leads to the same upstream, since a reload may have moved the
	// upstream the chain leads to.
	gate *Gate
}

const maxReporters = 4096

// rememberReporter keeps the way to report h's outcome, through g's chain.
func (g *Gate) rememberReporter(h *heldRecord, r *http.Request, next caddyhttp.Handler) {
	resolvers.Lock()
	defer resolvers.Unlock()
	if len(resolvers.via) < maxReporters {
		resolvers.via[h.Keys[0]] = &reporter{next: next, base: detached(r), gate: g}
	}
}

// takeReporter returns and forgets the way to report h's outcome.
func takeReporter(h *heldRecord) *reporter {
	resolvers.Lock()
	defer resolvers.Unlock()
	rep := resolvers.via[h.Keys[0]]
	delete(resolvers.via, h.Keys[0])
	return rep
}

// reportResolved reports an outcome the background pass resolved to the
// upstream that asked for it, at once, so history turns from pending
// without the buyer's retry; a later report by the retry changes nothing.
// It goes in the background (reportInBackground), so a stalled upstream
// does not hold the pass a report's wait per record it resolves; past
// maxReportsInBackground the pass sends it itself (report): back-pressure.
//
// It goes only to the upstream that recorded the verification, by the one
// rule for every held outcome (reportHeldOutcome).
func (g *Gate) reportResolved(h *heldRecord, state x402.SettlementState) {
	g.reportHeldOutcome(nil, nil, h, state, false)
}

// reportHeldOutcome reports held record h's decided outcome (state) to
// the upstream that recorded its verification, and to no other: the one
// rule for every path that reports one (the background pass, the buyer's
// retry, a request that found the outcome). The settled payment is public
// on chain, so the request that finds the outcome may come with another
// Host or from another address, and its own way leads to whatever upstream
// the route after the gate chooses for it: another tenant's, which would
// learn the verification id and its outcome while the recording upstream
// stayed pending. So the outcome goes, in this order, through:
//   - r (nil for the pass) when it is a request of the gate that held the
//     record (gateID) made as the asking one was (routeOf equals
//     ReportRoute): retry says it is the buyer's, whose answer waits for a
//     paid report (reportHeld); any other request's report goes in the
//     background. A record from before records named their route goes
//     through the buyer's retry alone, as it did then;
//   - the asking call's own way (rememberReporter), while its gate is
//     loaded;
//   - r's way made the asking request again (reporter.as);
//   - a loaded gate of the same name: the request it learned its way from
//     made the asking one again, or the call's own chain (routeFor);
//   - and otherwise it waits for one, kept with a Warning (keepOrphan).
func (g *Gate) reportHeldOutcome(r *http.Request, next caddyhttp.Handler, h *heldRecord, state x402.SettlementState, retry bool) {
	if h.ReportPath == "" {
		return
	}
	payment := heldPayment(h, state)
	rep := takeReporter(h)
	own := r != nil && h.Gate == g.gateID()
	switch {
	case r != nil && h.ReportRoute == nil && retry,
		own && h.ReportRoute != nil && routeOf(r) == *h.ReportRoute:
		if retry {
			g.reportHeld(r, next, h, h.ReportPath, h.VerificationID, state)
		} else {
			g.sendResolved(&reporter{next: next, base: r, gate: g}, h.ReportPath, h.VerificationID, payment)
		}
		return
	case rep != nil && rep.gate.loaded():
		rep.gate.sendResolved(rep, h.ReportPath, h.VerificationID, payment)
		return
	case own:
		if way := (&reporter{next: next, base: r, gate: g}).as(h.ReportRoute); way != nil {
			g.sendResolved(way, h.ReportPath, h.VerificationID, payment)
			return
		}
	}
	o := orphanReport{gate: h.Gate, offer: h.offer, path: h.ReportPath, id: h.VerificationID, payment: payment, route: h.ReportRoute}
	switch lg, route, learned := routeFor(o); {
	case route != nil:
		lg.sendResolved(route, o.path, o.id, o.payment)
	case lg != nil && rep != nil:
		lg.sendResolved(rep, o.path, o.id, o.payment) // counted, and stopped, by the loaded gate
	default:
		g.keepOrphan(o, lg != nil && !learned)
	}
}

// loaded reports whether g's config is loaded (its Cleanup has not run).
func (g *Gate) loaded() bool {
	resolvers.Lock()
	defer resolvers.Unlock()
	_, ok := resolvers.stop[g]
	return ok
}

// keepOrphan keeps resolved outcome o until a loaded gate that can deliver
// it serves a request (learnRoute): one is loaded (waiting true: it has
// served none since it was provisioned), or none is, and o waits for a
// reload or a restart that brings one back, logged, since it may never
// come. Past maxReporters kept, o is given up, logged: its verification
// stays pending (the buyer's retry may still report it). g is the gate
// whose pass resolved it, which logs.
func (g *Gate) keepOrphan(o orphanReport, waiting bool) {
	resolvers.Lock()
	kept := len(resolvers.orphans) < maxReporters
	if kept {
		resolvers.orphans = append(resolvers.orphans, o)
	}
	resolvers.Unlock()
	fields := []zap.Field{zap.String("verification_id", o.id), zap.String("payment", o.payment)}
	switch {
	case !kept:
		g.logger.Error("settlement outcome not reported (too many are waiting for a way to their upstream); the verification stays pending", fields...)
	case !waiting:
		g.logger.Warn(orphanKept, fields...)
	}
}

// orphanKept is the Warning for a resolved outcome no loaded gate can
// deliver (keepOrphan, learnRoute).
const orphanKept = "settlement outcome kept unreported: no loaded gate's route leads to the upstream that recorded it (a reload changed that route or moved its upstream, or no request the gate served since can be made the asking request again: another scheme or protocol, or a record that does not say which host asked); the verification stays pending until one does, or the buyer's retry reports it"

// sendResolved sends a resolved outcome through rep, a way to its
// upstream, in the background of g (reportResolved).
func (g *Gate) sendResolved(rep *reporter, path, id, payment string) {
	if !g.reportInBackground(rep.base, rep.next, path, id, payment) {
		g.report(rep.base, rep.next, path, id, payment)
	}
}

// orphanReport is a resolved outcome waiting for a gate that can deliver
// it: one like the gate that held the payment (the same gateID: its route
// and upstream, and its offers include the payment's).
type orphanReport struct {
	gate              string
	offer             x402.PaymentRequirements
	path, id, payment string
	route             *requestRoute // the asking request's (heldRecord.ReportRoute)
}

func (o orphanReport) deliverableBy(g *Gate) bool {
	_, ok := x402.Match(o.offer, g.liveOffers().offers)
	return ok && o.gate == g.gateID()
}

// routeFor is a loaded gate that can deliver o (nil if none), and its way
// to o's upstream: the request it learned its way from (learnRoute) made
// o's asking request again (reporter.as), nil when it has served no
// request since it was provisioned (learned false), or o cannot be made
// from it.
func routeFor(o orphanReport) (*Gate, *reporter, bool) {
	resolvers.Lock()
	defer resolvers.Unlock()
	var found *Gate
	learned := false
	for g := range resolvers.stop {
		if o.deliverableBy(g) {
			if rep := g.route.Load(); rep != nil {
				if rep = rep.as(o.route); rep != nil {
					return g, rep, true
				}
				learned = true
			}
			found = g
		}
	}
	return found, nil, learned
}

// learnRoute keeps the way to the gate's upstream from its first request,
// and sends the outcomes that were waiting for it.
func (g *Gate) learnRoute(r *http.Request, next caddyhttp.Handler) {
	rep := &reporter{next: next, base: detached(r), gate: g}
	if !g.route.CompareAndSwap(nil, rep) {
		return
	}
	resolvers.Lock()
	var mine []orphanReport
	var ways []*reporter
	var unmade []orphanReport
	kept := resolvers.orphans[:0]
	for _, o := range resolvers.orphans {
		switch way := rep.as(o.route); {
		case !o.deliverableBy(g):
			kept = append(kept, o)
		case way == nil:
			kept = append(kept, o)
			unmade = append(unmade, o)
		default:
			mine, ways = append(mine, o), append(ways, way)
		}
	}
	resolvers.orphans = kept
	resolvers.Unlock()
	for _, o := range unmade {
		g.logger.Warn(orphanKept, zap.String("verification_id", o.id), zap.String("payment", o.payment))
	}
	if len(mine) > 0 {
		go func() {
			for i, o := range mine {
				g.sendResolved(ways[i], o.path, o.id, o.payment)
			}
		}()
	}
}

// resolvers holds the stop function of each provisioned gate's background
// pass.
var resolvers = struct {
	sync.Mutex
	stop    map[*Gate]context.CancelFunc
	via     map[string]*reporter // by a held record's first claim key
	orphans []orphanReport       // resolved outcomes whose way was lost, at most maxReporters
}{stop: map[*Gate]context.CancelFunc{}, via: map[string]*reporter{}}

// startResolver starts the gate's background pass over held records: once
// its config has started and the gate is named (otherServers: records from
// before a restart) and then every resolveInterval.
func (g *Gate) startResolver() {
	ctx, cancel := context.WithCancel(context.Background())
	resolvers.Lock()
	resolvers.stop[g] = cancel
	resolvers.Unlock()
	go func() {
		if !g.others.wait(ctx) {
			return // its gate is named once its config has started
		}
		t := time.NewTicker(resolveInterval)
		defer t.Stop()
		for {
			g.resolvePass(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
}

// stopResolver ends the gate's background pass and drops its report
// queues. The gate's requests still in flight (on a reload Caddy cleans up
// the old config while they run) still report: their reports go unbatched
// (reportBatched), since a queue they made now would never be dropped.
func (g *Gate) stopResolver() {
	if g.stopped != nil {
		g.stopped.Store(true) // before the queues are dropped: see reportBatched
	}
	if g.others != nil {
		g.others.store("unstarted " + rand.Text()) // a config that never started
	}
	resolvers.Lock()
	cancel := resolvers.stop[g]
	delete(resolvers.stop, g)
	// Its requests' ways to their upstream go with its config, unless a
	// loaded gate of the same name (the reload's, provisioned before this
	// Cleanup) leads to the same upstream: a record resolved later is
	// reported through it (reportResolved).
	id, same := g.gateID(), false
	for lg := range resolvers.stop {
		same = same || lg.gateID() == id
	}
	if !same {
		for k, rep := range resolvers.via {
			if rep.gate == g {
				delete(resolvers.via, k)
			}
		}
	}
	resolvers.Unlock()
	if cancel != nil {
		cancel()
	}
	reportQueues.Range(func(k, _ any) bool {
		if k.(reportQueueKey).g == g {
			reportQueues.Delete(k)
		}
		return true
	})
}

// SettlementStatus lets the gate resolve unknown settlements through the
// evm facilitator module (x402.SettlementChecker).
func (m *EVMFacilitator) SettlementStatus(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements) (x402.SettlementStatus, error) {
	return m.f.SettlementStatus(ctx, p, req)
}

var _ x402.SettlementChecker = (*EVMFacilitator)(nil)

// Settlement reports to the upstream (verifierd's history).
//
// A paid call (REST, or an MCP tool call) is forwarded with
// X-Aov-Settlement: pending, telling the upstream the payment settles after
// its answer. An upstream that wants the outcome (verifierd, to record the
// call as paid only once it is) answers with X-Aov-Settlement-Report naming
// a path, on the HTTP answer in both cases (the gate holds the whole HTTP
// answer of an MCP call too); after settling, the gate POSTs
// {"verification_id", "payment": "paid"|"unpaid"} to that path through the
// same handler chain (so the reverse proxy adds the gateway token: the
// authenticated channel). An unknown outcome is reported when it is
// resolved: by the background pass at once, or by the buyer's retry.
const (
	HeaderUpstreamSettlement = "X-Aov-Settlement"
	headerSettlementReport   = "X-Aov-Settlement-Report"
	// The results, in a batch's per report answer, of a report recorded
	// now, of one whose verification had an outcome already (nothing
	// changed), and of one whose verification the upstream does not have.
	reportRecorded = "recorded"
	reportFinal    = "final"
	reportNotFound = "not_found"
)

// markSettlementPending tells the upstream of a paid call settled after
// its answer that the outcome will be reported.
func (g *Gate) markSettlementPending(r *http.Request) {
	if g.Settle != "before" { // a client's copy is gone (clearUpstreamHeaders)
		r.Header.Set(HeaderUpstreamSettlement, "pending")
	}
}

// settlementReportVar holds the report request (settlementReport) a
// verify_response took from the upstream's answer it held
// (takeReportRequest), for the gate in front (reportRequest): the answer
// the gate then holds is verify_response's, which may no longer carry the
// upstream's (an on_fail block refusal, an outage's, an envelope around
// the answer, which hides its verification_id), and the gate must report
// how the call ended all the same.
const settlementReportVar = "aov.x402.settlement_report"

// settlementReport is a report request: where, and about which
// verification.
type settlementReport struct{ path, id string }

// reportRequest is what the upstream asked to be told about the call of r:
// where, and about which verification. A verify_response between took it
// from the answer it held (settlementReportVar; taken once); otherwise it
// is read from bw, the answer the gate holds (answerReportRequest).
func reportRequest(r *http.Request, bw *bufferedWriter) (path, id string) {
	if rep, ok := caddyhttp.GetVar(r.Context(), settlementReportVar).(settlementReport); ok {
		caddyhttp.SetVar(r.Context(), settlementReportVar, nil)
		bw.header.Del(headerSettlementReport) // never shown to the client
		return rep.path, rep.id
	}
	return answerReportRequest(bw)
}

// takeReportRequest takes the report request from hw, the upstream's
// answer a verify_response holds, for the gate in front
// (settlementReportVar). The header never goes out with what
// verify_response releases.
func takeReportRequest(r *http.Request, hw *bufferedWriter) {
	if path, id := answerReportRequest(hw); path != "" {
		caddyhttp.SetVar(r.Context(), settlementReportVar, settlementReport{path, id})
	}
}

// answerReportRequest is the report request an answer carries, read from
// its header and body (answerVerificationID), the header removed.
func answerReportRequest(bw *bufferedWriter) (path, id string) {
	path = bw.header.Get(headerSettlementReport)
	bw.header.Del(headerSettlementReport) // never shown to the client
	if path == "" || path[0] != '/' || strings.HasPrefix(path, "//") || strings.ContainsAny(path, "?#") {
		return "", ""
	}
	if id = answerVerificationID(bw.buf.Bytes()); id == "" {
		return "", ""
	}
	return path, id
}

// answerVerificationID is the verification an answer names, as a REST
// document does (verification_id at the top) or as an MCP tool result
// carries that document (result.structuredContent.verification_id); ""
// when the answer is not JSON or names none as a non-empty string.
//
// It reads the answer as judgeAnswer does: exact names, the last of
// duplicates (as JSON.parse keeps them), found by a walk and the answer
// checked to be JSON once, without decoding it. FuzzAnswerVerificationID
// holds it to encoding/json's reading into maps of raw members. Every paid
// call reads its 1.7 KB signed answer this way, and encoding/json's
// decoding of it was 4 % of the gateway's CPU per paid call.
func answerVerificationID(body []byte) string {
	i := skipSpace(body, 0)
	if i == len(body) || body[i] != '{' {
		return ""
	}
	obj := body[i:]
	v, _, depth := lastMember(obj, "verification_id")
	if depth > maxAnswerDepth || !sjson.Valid(body) {
		return ""
	}
	if id := jsonString(v); id != "" {
		return id
	}
	if res, _, _ := lastMember(obj, "result"); len(res) > 0 && res[0] == '{' {
		if doc, _, _ := lastMember(res, "structuredContent"); len(doc) > 0 && doc[0] == '{' {
			v, _, _ = lastMember(doc, "verification_id")
			return jsonString(v)
		}
	}
	return ""
}

// jsonString is the string a valid JSON value holds, "" when it is not a
// string. Invalid UTF-8 reads as encoding/json reads it (U+FFFD).
func jsonString(v []byte) string {
	if len(v) < 2 || v[0] != '"' {
		return ""
	}
	if s := v[1 : len(v)-1]; bytes.IndexByte(s, '\\') < 0 && utf8.Valid(s) {
		return string(s)
	}
	var s string
	if json.Unmarshal(v, &s) != nil {
		return ""
	}
	return s
}

// settleEnd is how servePaid's settle ended, as reportOutcome needs it.
type settleEnd uint8

const (
	// settleDone: settled and recorded; the answer is delivered.
	settleDone settleEnd = iota
	// settleRefused: the facilitator settled nothing (it said so), or
	// the call was never settled (Gate.unsettled: its answer was not one
	// to settle, or its client left first), and the claim was released:
	// nothing was charged.
	settleRefused
	// settleUnknown: anything else. The transfer may have happened (its
	// outcome is unknown, or the claim was resolved elsewhere meanwhile),
	// or did (paidCharge.unrecorded).
	settleUnknown
)

// reportOutcome reports a settlement's outcome after servePaid's settle
// (end), or a call never settled (settleRefused, Gate.unsettled): paid
// when it succeeded, before the answer is delivered; when it went through
// unrecorded, as a held record is (heldPayment: paid only if its answer
// was kept for the retry; otherwise the retry runs the upstream again, a
// paid verification of its own), in the background, its answer an error;
// unpaid when the facilitator refused it or nothing was
// settled, in the background (reportUnpaid), as nothing is delivered that
// history could be behind; and otherwise as the payment's claim tells:
// paid when it is settled by now (the background pass found the transfer
// in between, or another gateway did); nothing while the outcome is
// unknown (the claim is held: the report comes with the resolution).
//
// An outcome that cannot be told is not reported at all: a failed lookup
// (the store blipped), or a claim kept without our held record (its hold
// failed, or the store keeps none). The record then stays pending, which
// counts for nothing; unpaid would be final, and wrong if the transfer
// happened. A claim gone from the store says nothing either (the store
// may have lost it: a Redis restart without its data): the chain is
// asked instead, in the background (reportFromChain).
func (p *paidCharge) reportOutcome(r *http.Request, bw *bufferedWriter, end settleEnd) {
	g, next := p.g, p.next
	path, id := reportRequest(r, bw)
	switch {
	case path == "":
		return
	case end == settleDone:
		g.report(r, next, path, id, store.PaymentPaid)
		return
	case p.unrecorded != nil:
		// The transfer happened; its answer is delivered only if it was
		// kept for the retry (heldPayment). Its record's Held is set
		// before keepUnrecorded returns, and never changes. Nothing is
		// delivered now (503), that history could be behind: the report
		// goes in the background, as an unpaid one does, so a stalled
		// upstream does not hold the charged buyer's answer.
		payment := heldPayment(&p.unrecorded.rec, x402.SettlementDone)
		if !g.reportInBackground(r, next, path, id, payment) {
			g.report(r, next, path, id, payment) // back-pressure
		}
		return
	case end == settleRefused:
		g.reportUnpaid(r, next, path, id)
		return
	}
	st, err := g.state.Claims().Lookup(context.WithoutCancel(r.Context()), p.claim.Keys[0])
	switch {
	case errors.Is(err, store.ErrNotFound):
		// Read from the attempt's start as its hold reads it
		// (paidCharge.sentAfter): the settle wait alone reaches back
		// far enough to take a replay's original for this attempt.
		h := g.newHeldRecord(r, p.claim, p.pay.JSON, p.offerJS, p.sentAfter(), p.pid)
		h.payload, h.offer = p.pay.PaymentPayload, p.offer
		g.reportFromChain(r, next, &h, path, id)
		return
	case err != nil:
		g.logger.Warn("the settlement's outcome is unknown and its claim could not be read; its verification stays pending", zap.Error(err))
		return
	case st.Settled:
		// The background pass found the transfer in between: reported
		// as its record tells (a bare transaction, another gateway's
		// resolution, keeps the answer nowhere to run again: paid).
		if h, ok := decodeHeld(st.Note); ok {
			g.reportHeld(r, next, h, path, id, x402.SettlementDone)
		} else {
			g.report(r, next, path, id, store.PaymentPaid)
		}
		return
	}
	h, ok := decodeHeld(st.Note)
	if !ok || h.Token != p.claim.Token {
		g.logger.Warn("the settlement's outcome is unknown and no record of it is held; its verification stays pending")
		return
	}
	switch err := g.keepReport(r, h, path, id); {
	case err == nil:
		g.rememberReporter(h, r, next)
	case errors.Is(err, store.ErrClaimSettled):
		// The background pass found the transfer in between.
		g.reportHeld(r, next, h, path, id, x402.SettlementDone)
	case errors.Is(err, store.ErrClaimLost):
		// The background pass found it can never happen and released
		// the claim, or the store lost it: the chain tells which.
		g.reportFromChain(r, next, h, path, id)
	}
}

// reportFromChain reports the outcome of h, whose claim is gone from the
// store, as the chain tells it: paid once the transfer happened, unpaid
// once it never can; nothing while it still may, or the chain cannot be
// read (the verification stays pending). A missing claim is no proof of
// an unpaid call: a claim released because the transfer can never happen
// looks the same as one the store lost, with the transfer made.
//
// It runs in the background, on a copy of r detached from it, as report's
// retries do: the chain is read for up to resolveTimeout, and the buyer's
// answer (settlement_pending, already written) must not wait for it. The
// config's store and facilitator stay open until it ends (g.uses).
func (g *Gate) reportFromChain(r *http.Request, next caddyhttp.Handler, h *heldRecord, path, id string) {
	base := detached(r)
	entered := g.uses.Enter() // the request holds a use: never refused
	go func() {
		defer func() {
			if entered {
				g.uses.Leave()
			}
			if rec := recover(); rec != nil {
				g.logger.Error("reporting a settlement outcome from the chain panicked", zap.Any("panic", rec))
			}
		}()
		st, known := g.checkHeld(base.Context(), h)
		switch {
		case known && st.State == x402.SettlementDone:
			g.report(base, next, path, id, store.PaymentPaid)
		case known && st.State == x402.SettlementNever:
			g.report(base, next, path, id, store.PaymentUnpaid)
		default:
			g.logger.Warn("the settlement's outcome is unknown and the store no longer has its claim; its verification stays pending")
		}
	}()
}

// heldPayment is how the verification of held record h is reported once
// its settlement is decided (state), the one rule for it: paid only when
// the transfer happened and h keeps the answer that verification produced,
// the answer the buyer's retry is served. A record that keeps none (an
// answer over maxHeldAnswer, a protocol switch, a settlement failed
// naming no transaction) never delivers that answer: the retry runs the
// upstream again, which records the run as a verification of its own,
// paid (X-Aov-Payment), so the first one is unpaid and one payment counts
// once in history.
func heldPayment(h *heldRecord, state x402.SettlementState) string {
	if state == x402.SettlementDone && h.Held {
		return store.PaymentPaid
	}
	return store.PaymentUnpaid
}

// reportHeld reports the verification id at path, held record h's, as
// heldPayment tells: paid before the answer (report), unpaid in the
// background (reportUnpaid), as every outcome of those kinds is.
func (g *Gate) reportHeld(r *http.Request, next caddyhttp.Handler, h *heldRecord, path, id string, state x402.SettlementState) {
	if payment := heldPayment(h, state); payment == store.PaymentPaid {
		g.report(r, next, path, id, payment)
		return
	}
	g.reportUnpaid(r, next, path, id)
}

// keepReport adds the report request to a held record, for whatever
// resolves it. ErrClaimSettled or ErrClaimLost: the background pass
// resolved the record in between (settled, or released).
func (g *Gate) keepReport(r *http.Request, h *heldRecord, path, id string) error {
	ctx := r.Context()
	hc, ok := g.state.Claims().(store.HeldClaims)
	if !ok {
		return errors.New("the store keeps no held records")
	}
	route := routeOf(r)
	h.ReportPath, h.VerificationID, h.ReportRoute = path, id, &route
	note, err := encodeHeld(h)
	if err == nil {
		err = hc.Hold(context.WithoutCancel(ctx), h.claim(), note)
	}
	if err != nil && !errors.Is(err, store.ErrClaimSettled) && !errors.Is(err, store.ErrClaimLost) {
		g.logger.Warn("keeping a settlement report for later", zap.Error(err))
	}
	return err
}

// reportTimeout bounds each attempt of a report, and a report's wait for
// its batch (reportBatched); tests shorten it.
var reportTimeout = 5 * time.Second

// reportRetries are the waits before each further attempt of a report the
// upstream did not take (it was down or stalled); tests shorten them.
var reportRetries = []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second}

// report sends one outcome through next, bounded by reportTimeout per
// attempt, in a batch with the outcomes other requests are reporting to the
// same path at the same time (reportBatched); when the upstream does not
// take it, it is retried alone in the background (retryInBackground). A
// report lost for good leaves the record pending (not counted), never
// wrongly paid.
func (g *Gate) report(r *http.Request, next caddyhttp.Handler, path, id, payment string) {
	if g.reportBatched(r, next, path, outcomeReport{VerificationID: id, Payment: payment}) {
		return
	}
	g.retryInBackground(r, next, path, id, payment)
}

// retryReport sends one outcome the upstream did not take again alone,
// after each of reportRetries, until it is taken. A closed stop gives the
// retries left up (the gate's Cleanup, which logs how many it gave up).
func (g *Gate) retryReport(r *http.Request, next caddyhttp.Handler, path, id, payment string, stop <-chan struct{}) {
	for _, wait := range reportRetries {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-stop:
			t.Stop()
			return
		}
		if g.reportOnce(r, next, path, []outcomeReport{{VerificationID: id, Payment: payment}}) {
			return
		}
	}
	g.logger.Error("settlement outcome not reported; the verification stays pending", zap.String("verification_id", id), zap.String("payment", payment))
}

// maxReportsInBackground bounds the reports in the background at once,
// across gates: unpaid reports (reportUnpaid), outcomes the background
// pass resolved (reportResolved), and the retries of every report, paid or
// unpaid (retryInBackground). Each holds a goroutine for its batch's wait
// and one attempt (reportTimeout each) and then its retries
// (reportRetries, each attempt reportTimeout: about 35 s when the upstream
// stalls), so a stalled upstream under a flood of calls holds no more
// than this many.
const maxReportsInBackground = 4096

// reportsInBackground counts the reports in the background.
var reportsInBackground atomic.Int64

// backgroundReports are one gate's reports in the background, for its
// Cleanup (waitBackground). Set in Provision, a pointer like route.
type backgroundReports struct {
	first sync.WaitGroup // reports whose first attempt has not finished
	n     atomic.Int64   // reports not finished, retries included
	stop  chan struct{}  // closed by Cleanup: the retries left are given up
	once  sync.Once
}

// goBackground runs work on a copy of r detached from it in a goroutine
// counted under maxReportsInBackground and in g's reports in the
// background until it returns, while the config stays open for it
// (g.uses); work is handed the gate's stop (closed by its Cleanup) and
// firstDone, to call once its first attempt is over (a retry has had it
// before: it calls none). false, and nothing run, when the bound is
// reached.
//
// Work that starts once the gate's Cleanup has given up the reports in
// the background (a call in flight across a reload reports after it) is
// handed no stop: nothing waits for it or gives it up, so it keeps its
// retries, through its call's chain as its first attempt went, bounded by
// their schedule (reportRetries), and retryReport logs one none of them
// delivered. Given up at once, it would be lost without a word.
func (g *Gate) goBackground(r *http.Request, first bool, work func(base *http.Request, stop <-chan struct{}, firstDone func())) bool {
	if reportsInBackground.Add(1) > maxReportsInBackground {
		reportsInBackground.Add(-1)
		return false
	}
	base := detached(r)
	entered := g.uses.Enter() // a request or the pass holds a use: never refused then
	bg := g.background
	if bg == nil { // a gate built without Provision (tests)
		bg = &backgroundReports{stop: make(chan struct{})}
	}
	// Counted before stop is read: a Cleanup that closes it after this
	// read counts this one among those it gives up (waitBackground).
	bg.n.Add(1)
	stop := bg.stop
	select {
	case <-stop:
		stop, first = nil, false // after the Cleanup: see above
	default:
	}
	if first {
		bg.first.Add(1)
	}
	firstDone := func() {}
	if first {
		firstDone = sync.OnceFunc(bg.first.Done)
	}
	go func() {
		defer func() {
			firstDone()
			bg.n.Add(-1)
			reportsInBackground.Add(-1)
			if entered {
				g.uses.Leave()
			}
			if rec := recover(); rec != nil {
				g.logger.Error("reporting a settlement outcome panicked", zap.Any("panic", rec))
			}
		}()
		work(base, stop, firstDone)
	}()
	return true
}

// retryInBackground retries one outcome the upstream did not take
// (retryReport) in the background, counted under maxReportsInBackground
// and given up by the gate's Cleanup. Past the bound it is given up at
// once, logged: the record stays pending (counting for nothing), never
// wrongly paid, and no goroutine is left uncounted or unstoppable.
func (g *Gate) retryInBackground(r *http.Request, next caddyhttp.Handler, path, id, payment string) {
	if !g.goBackground(r, false, func(base *http.Request, stop <-chan struct{}, _ func()) {
		g.retryReport(base, next, path, id, payment, stop)
	}) {
		g.logger.Error("settlement outcome not reported (too many reports in the background to retry it); the verification stays pending",
			zap.String("verification_id", id), zap.String("payment", payment), zap.Int("max_reports_in_background", maxReportsInBackground))
	}
}

// reportInBackground reports one outcome (report) in the background: its
// batch, and then its retries, in one goroutine counted until the last
// retry (goBackground). false, and nothing sent, past
// maxReportsInBackground. The gate's Cleanup waits for its first attempt
// (waitBackground).
func (g *Gate) reportInBackground(r *http.Request, next caddyhttp.Handler, path, id, payment string) bool {
	return g.goBackground(r, true, func(base *http.Request, stop <-chan struct{}, firstDone func()) {
		taken := g.reportBatched(base, next, path, outcomeReport{VerificationID: id, Payment: payment})
		firstDone()
		if !taken {
			g.retryReport(base, next, path, id, payment, stop)
		}
	})
}

// reportUnpaid reports a call that settled nothing unpaid, in the
// background (reportInBackground): the buyer's answer is an error or an
// uncharged answer that no history can be behind, and must not wait for
// a report to an upstream that may be the one that just failed it (a
// stalled verifierd would hold its 504 reportTimeout past
// upstream_timeout). Past maxReportsInBackground it is sent before the
// answer, as a paid report is (report): back-pressure; its retry then
// needs a place in the background as any other (retryInBackground).
func (g *Gate) reportUnpaid(r *http.Request, next caddyhttp.Handler, path, id string) {
	if !g.reportInBackground(r, next, path, id, store.PaymentUnpaid) {
		g.report(r, next, path, id, store.PaymentUnpaid)
	}
}

// waitBackground is the gate's Cleanup waiting for its reports in the
// background: Caddy's stop (SIGTERM, admin /stop) runs Cleanup and the
// process exits right after, so a report still on its way would be lost
// and its verification stay pending. It waits for their first attempt
// only, at most reportTimeout: a reload's cleanup (Caddy runs it
// synchronously) may then take up to that long while the upstream stalls.
// The retries left after that, of every report (paid ones too), are given
// up, and logged by number: the config is gone, its handler chain with it
// (a reload may have moved the upstream), and a process about to exit
// cannot wait 35 s for them.
func (g *Gate) waitBackground() {
	bg := g.background
	if bg == nil {
		return
	}
	done := make(chan struct{})
	go func() {
		bg.first.Wait()
		close(done)
	}()
	t := time.NewTimer(reportTimeout)
	select {
	case <-done:
		t.Stop()
	case <-t.C:
	}
	bg.once.Do(func() { close(bg.stop) })
	if n := bg.n.Load(); n > 0 {
		g.logger.Warn("the config is unloaded: settlement reports the upstream has not taken are given up (no retry); their verifications stay pending",
			zap.Int64("reports", n))
	}
}

// outcomeReport is one settlement outcome, as the upstream reads it.
type outcomeReport struct {
	VerificationID string `json:"verification_id"`
	Payment        string `json:"payment"`
}

// Batched reports. Every paid call reports its outcome before its answer
// is delivered (so history is never behind what a buyer was given), and
// each report was a request of its own to the upstream, which records it
// with a synced write: under load, as much work for verifierd as the
// verification, and a tenth of the gateway's CPU per paid call. The
// reports to one path are sent the way a group commit writes: one request
// at a time; the report that finds none in flight sends at once, the
// reports that arrive meanwhile wait and go together in the next request,
// {"reports": [{"verification_id", "payment"}, ...]} (a lone report keeps
// the single form). Nothing is sent on a timer.
//
// A paid answer waits for its report, holding its rate slot, so no report
// waits longer than the request in flight when it came plus its own
// attempt (each bounded by reportTimeout), however long the queue: a
// report still waiting reportTimeout after it came (more are queued than
// a batch takes, or the upstream is slow) leaves the queue, and when the
// upstream does not take a batch, every report waiting behind it fails at
// once rather than wait on another request to an upstream that just
// failed. Both go to the retries alone, as a failed batch's reports do.
//
// A report of a batch the upstream did not take is retried alone, as
// before; the upstream answers a batch with 204 only when it recorded
// every outcome in it, and a repeated report changes nothing. When some
// name a verification it does not have, it records the others and says
// per report what happened (200 {"results": [...]}, reportOnce): the
// others are taken, and an unknown one is logged, not sent again, since
// no resend can record it. Any other success answer to a batch says
// nothing about which reports were recorded: the batch is not taken
// (batchResults).
const maxReportBatch = 128

// reportQueue is the reports waiting for one (gate, path, route). expiry is one
// timer per queue, not one per report (the batched path allocates none),
// set for the first deadline of those waiting (expire) while armed.
type reportQueue struct {
	mu      sync.Mutex
	sending bool
	// gone is set, under mu, when the queue fell idle and was dropped
	// from reportQueues (reportBatched): a report that found it there
	// before then makes a queue of its own.
	gone    bool
	waiting []*queuedReport
	expiry  *time.Timer
	armed   bool
}

// queuedReport is one waiting report; done gets its fate: reportSent,
// reportFailed, or reportLead (the waiter now sends the next batch; lead
// says it was handed the lead, which it keeps past its deadline: its own
// attempt is then the last wait). deadline is when it leaves the queue.
type queuedReport struct {
	outcomeReport
	done     chan int
	deadline time.Time
	lead     bool
}

const (
	reportFailed = iota
	reportSent
	reportLead
)

// reportQueueKey is what the reports of one batch share: a batch goes
// through its leader's request, so only reports of requests the route
// after the gate cannot tell apart (routeOf) ride it together.
type reportQueueKey struct {
	g     *Gate
	path  string
	route requestRoute
}

// reportQueues holds the queues by gate, path and route (dropped with the
// gate, stopResolver).
var reportQueues sync.Map

// reportBatched sends rep in the next batch to path and reports whether
// the upstream took it. The request that sends a batch is the one whose
// report found the queue idle, or the first of those waiting when the
// previous batch returned: each request sends at most one batch.
//
// A gate already cleaned up (stopped) keeps no queue: the report of a
// request that outlived its config goes alone. A queue created as the gate
// stopped is dropped again here: stopped is set before stopResolver looks
// for queues, and checked after the queue is stored, so one of the two
// sees it.
func (g *Gate) reportBatched(r *http.Request, next caddyhttp.Handler, path string, rep outcomeReport) bool {
	if g.stopped != nil && g.stopped.Load() {
		return g.reportSafely(r, next, path, []outcomeReport{rep})
	}
	key := reportQueueKey{g, path, routeOf(r)}
	var q *reportQueue
	for {
		v, _ := reportQueues.LoadOrStore(key, &reportQueue{})
		if g.stopped != nil && g.stopped.Load() {
			reportQueues.CompareAndDelete(key, v) // the queue still serves the reports in it
		}
		q = v.(*reportQueue)
		q.mu.Lock()
		if !q.gone {
			break
		}
		q.mu.Unlock()
	}
	me := &queuedReport{outcomeReport: rep, done: make(chan int, 1)}
	q.waiting = append(q.waiting, me)
	if q.sending {
		me.deadline = time.Now().Add(reportTimeout)
		q.arm(reportTimeout)
		q.mu.Unlock()
		if fate := <-me.done; fate != reportLead {
			return fate == reportSent
		}
		q.mu.Lock()
	}
	q.sending = true
	n := min(len(q.waiting), maxReportBatch)
	batch := q.waiting[:n:n]
	q.waiting = q.waiting[n:]
	q.mu.Unlock()

	reps := make([]outcomeReport, len(batch))
	for i, b := range batch {
		reps[i] = b.outcomeReport
	}
	fate := reportFailed
	if g.reportSafely(r, next, path, reps) {
		fate = reportSent
	}
	mine := reportFailed
	for _, b := range batch {
		if b == me {
			mine = fate
		} else {
			b.done <- fate
		}
	}
	q.mu.Lock()
	switch {
	case len(q.waiting) > 0 && fate == reportSent:
		q.waiting[0].lead = true
		q.waiting[0].done <- reportLead // q.sending stays true
	default:
		for _, w := range q.waiting {
			w.done <- reportFailed
		}
		clear(q.waiting)
		q.waiting = q.waiting[:0]
		q.sending = false
		// Idle: dropped, as there is one queue per route the gate's
		// requests came by (each client's address among them), which
		// would otherwise be kept as long as the gate.
		q.gone = true
		reportQueues.CompareAndDelete(key, q)
	}
	q.mu.Unlock()
	return mine == reportSent
}

// arm makes sure q's timer fires within d. Under q.mu.
func (q *reportQueue) arm(d time.Duration) {
	switch {
	case q.armed:
		// set for an earlier deadline: expire sets it again for the next
	case q.expiry == nil:
		q.expiry = time.AfterFunc(d, q.expire)
	default:
		q.expiry.Reset(d)
	}
	q.armed = true
}

// expire fails the reports waiting past their deadline, which leave the
// queue for the retries (reportBatched), except one handed the lead, and
// sets the timer for the next deadline. The waiting are in the order they
// came, so the first deadline left is the first waiting report's that
// leads no batch.
func (q *reportQueue) expire() {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := time.Now()
	q.waiting = slices.DeleteFunc(q.waiting, func(w *queuedReport) bool {
		if w.lead || w.deadline.After(now) {
			return false
		}
		w.done <- reportFailed
		return true
	})
	q.armed = false
	for _, w := range q.waiting {
		if !w.lead {
			q.arm(w.deadline.Sub(now))
			break
		}
	}
}

// detached is a copy of r for work that outlives it (report retries, the
// background pass): not cancelled with r, with a fresh replacer and a copy
// of the variables (the proxy reads the client IP from them; copyReportVars),
// so nothing set on it races r's access log.
func detached(r *http.Request) *http.Request {
	vars := map[string]any{}
	if v, ok := r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any); ok {
		copyReportVars(vars, v)
	}
	return r.Clone(context.WithValue(context.WithValue(context.WithoutCancel(r.Context()),
		caddy.ReplacerCtxKey, caddy.NewReplacer()), caddyhttp.VarsCtxKey, vars))
}

// copyReportVars copies the variables of src, a paid call's request, into
// dst, a report's made from it (detached, prepareReport), but the buyer's
// credentials (buyerVars).
func copyReportVars(dst, src map[string]any) {
	maps.Copy(dst, src)
	for _, k := range buyerVars {
		delete(dst, k)
	}
}

// buyerVars hold the state of the buyer's credentials on its request: the
// proofs and payment set aside, with the nonce claims held for them
// (varClientCredentials), what wallet_auth proved (varWalletProven), and
// the settlement its sign-in-with-x waits for (varSettled). A report is the
// gateway's own request and carries no proof: a wallet_auth after the gate
// would judge the buyer's proofs, signed for the call, against the report
// and refuse it; the report may run on another goroutine while the call
// writes that state, or long after it, and would keep its bearer proofs in
// memory that long.
var buyerVars = []string{varClientCredentials, varWalletProven, varSettled}

// requestRoute is what a report request carries on from the request it
// is made from (reportOnce keeps its Host, its connection and its
// variables, and sets its own method, path, query and header): what a
// route after the gate may choose the upstream by, with a host matcher,
// a remote_ip, client_ip or protocol matcher, a vars matcher, or a
// placeholder of any of them (`map {host} {backend}`). A report goes
// through the request that asked for it, or one of the same route: a
// batch only with reports of the same route (reportQueueKey), a resolved
// outcome through a request made the same (reporter.as). The remote port
// is left out: no route chooses by it, and every connection has its own.
type requestRoute struct {
	Host     string `json:"host"`
	RemoteIP string `json:"remote_ip,omitempty"`
	// ClientIP is the client_ip variable (behind a trusted proxy, the
	// address it forwarded for).
	ClientIP string `json:"client_ip,omitempty"`
	// Conn is a digest of the rest: the protocol, TLS and its server
	// name, and the other variables as they were at the gate but those no
	// route reads (routeVars, routeVarsVar);
	// a request made again from another (reporter.as) takes them from
	// it, so they must agree.
	Conn string `json:"conn,omitempty"`
}

func routeOf(r *http.Request) requestRoute {
	rt := requestRoute{Host: r.Host, RemoteIP: r.RemoteAddr}
	if h, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		rt.RemoteIP = h
	}
	vars, _ := r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)
	rt.ClientIP, _ = vars[caddyhttp.ClientIPVarKey].(string)
	rest, ok := vars[routeVarsVar].(map[string]any)
	if !ok { // a request that has been through no gate
		rest = routeVars(vars)
	}
	serverName := ""
	if r.TLS != nil {
		serverName = r.TLS.ServerName
	}
	// fmt writes a map's keys sorted; a value it cannot write the same
	// twice (a pointer) makes a digest no other request shares: fail closed.
	sum := sha256.Sum256(fmt.Appendf(nil, "%s\x00%t\x00%s\x00%v", r.Proto, r.TLS != nil, serverName, rest))
	rt.Conn = hex.EncodeToString(sum[:16])
	return rt
}

// startTimeVar is the variable Caddy sets to when a request came.
const startTimeVar = "start_time"

// routeVarsVar holds the variables a route after the gate may choose the
// upstream by (routeVars), as they were when the request came to the gate
// (noteRouteVars): routeOf reads them, not the variables as they are when
// the outcome is asked for, which the handlers after the gate have added
// to (the proxy's {http.request.uuid} in a header_up, verify_response's
// task id, a `vars` after the gate). A request a gate learns its way from
// has been through none of those, and a request made again as the asking
// one (reporter.as) could never be, nor could two reports share a batch.
const routeVarsVar = "aov.x402.route_vars"

// noteRouteVars keeps r's variables as it comes to the gate (routeVarsVar),
// and returns what puts back those kept by a gate before it, for when it
// returns: that gate's calls are its routes, not the ones after it.
func noteRouteVars(r *http.Request) (restore func()) {
	before := caddyhttp.GetVar(r.Context(), routeVarsVar)
	vars, _ := r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)
	caddyhttp.SetVar(r.Context(), routeVarsVar, routeVars(vars))
	return func() { caddyhttp.SetVar(r.Context(), routeVarsVar, before) }
}

// routeVars is vars but those no route chooses an upstream by. The
// gateway's own (aov.*) say where the request is in its handlers (gated,
// verified, its report), the proxy's (reverse_proxy.*) what it did with
// it, both set as it goes; start_time is when it came, and Caddy's request
// id (uuid, set once a placeholder reads it) and tracing's trace_id and
// span_id are the request's own, so a route cannot choose by them and no
// other request could ever be made as one that has them. client_ip is
// kept apart (requestRoute.ClientIP); trusted_proxy says whether the
// request's peer is one of the server's trusted_proxies, a server-wide
// setting a restart may add (the client address it led to is the one
// kept), and a report made after it would otherwise never match.
func routeVars(vars map[string]any) map[string]any {
	rest := map[string]any{}
	for k, v := range vars {
		switch {
		case k == caddyhttp.ClientIPVarKey, k == caddyhttp.TrustedProxyVarKey, k == startTimeVar, perRequestVars[k],
			strings.HasPrefix(k, "aov."), strings.HasPrefix(k, "reverse_proxy."):
		default:
			rest[k] = v
		}
	}
	return rest
}

// perRequestVars are the variables Caddy sets that name one request alone
// (routeVars).
var perRequestVars = map[string]bool{"uuid": true, "trace_id": true, "span_id": true}

// as is rep's request made the request rt names (its Host, remote and
// client address), nil when rt is nil (a record from before records named
// it) or rep's request differs from it in anything else routeOf reads.
func (rep *reporter) as(rt *requestRoute) *reporter {
	if rt == nil {
		return nil
	}
	base := detached(rep.base)
	base.Host = rt.Host
	base.RemoteAddr = net.JoinHostPort(rt.RemoteIP, "0")
	if vars, ok := base.Context().Value(caddyhttp.VarsCtxKey).(map[string]any); ok {
		if rt.ClientIP == "" {
			delete(vars, caddyhttp.ClientIPVarKey)
		} else {
			vars[caddyhttp.ClientIPVarKey] = rt.ClientIP
		}
	}
	if routeOf(base) != *rt {
		return nil
	}
	return &reporter{next: rep.next, base: base, gate: rep.gate}
}

// prepareReport is the report request rr made from r ready for the
// handler chain, as Caddy's server makes a request ready: a fresh
// replacer whose request placeholders read rr ({host} is r's Host, the
// path the report's; a detached copy of r has a replacer with none, and
// an upstream chosen by a placeholder was dialed as ":0"), and a copy of
// r's variables (the client's address as the server found it, and what
// handlers before the gate set; copyReportVars), so nothing set on it
// races r's.
func prepareReport(rr, r *http.Request, w http.ResponseWriter) *http.Request {
	srv, _ := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	rr = caddyhttp.PrepareRequest(rr, caddy.NewReplacer(), w, srv)
	if v, ok := r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any); ok {
		if vars, ok := rr.Context().Value(caddyhttp.VarsCtxKey).(map[string]any); ok {
			start := vars[startTimeVar]
			copyReportVars(vars, v)
			vars[startTimeVar] = start // the report's own, for its duration
		}
	}
	return rr
}

// reportSafely is reportOnce, with a panic in the handler chain counted
// as a failed attempt: the requests waiting on the batch must hear of it.
func (g *Gate) reportSafely(r *http.Request, next caddyhttp.Handler, path string, reps []outcomeReport) (ok bool) {
	defer func() {
		if rec := recover(); rec != nil {
			g.logger.Error("reporting a settlement outcome panicked", zap.Any("panic", rec))
			ok = false
		}
	}()
	return g.reportOnce(r, next, path, reps)
}

// reportOnce makes one attempt with reps (one report, or a batch) and
// reports whether the upstream took them. A batch the upstream answers
// per report (200 {"results": [...]}: verifierd does when some ids are
// unknown to it) is taken: the others are recorded, and each unknown one
// is logged as an error, never sent again (no resend can record it), and
// not counted as reported. A batch answered with any other success
// (batchResults) is logged once and not taken.
func (g *Gate) reportOnce(r *http.Request, next caddyhttp.Handler, path string, reps []outcomeReport) bool {
	var body []byte
	if len(reps) == 1 {
		body, _ = json.Marshal(reps[0])
	} else {
		body, _ = json.Marshal(struct {
			Reports []outcomeReport `json:"reports"`
		}{reps})
	}
	// Not cancelled with r: a report is the outcome of a settled payment,
	// whoever is still waiting for the answer, and a batch holds other
	// buyers' reports, which its sender's leaving must not fail.
	ctx, cancel := context.WithTimeout(context.WithValue(context.WithoutCancel(r.Context()), reportKey{}, true), reportTimeout)
	defer cancel()
	rr := r.Clone(ctx)
	rr.Method = http.MethodPost
	u := *r.URL
	u.Path, u.RawPath, u.RawQuery, u.Fragment = path, "", "", ""
	rr.URL = &u
	rr.RequestURI = path
	rr.Header = http.Header{"Content-Type": {"application/json"}}
	rr.Body = io.NopCloser(bytes.NewReader(body))
	rr.ContentLength = int64(len(body))
	rr.GetBody = nil
	buf := getBuffer()
	defer putBuffer(buf)
	out := &bufferedWriter{header: http.Header{}, buf: buf, limit: 4096}
	rr = prepareReport(rr, r, out)
	err := runUpstream(next, out, rr, neverReached)
	if err == nil && out.status() >= 300 {
		err = fmt.Errorf("status %d", out.status())
	}
	if err != nil {
		for _, rep := range reps {
			g.logger.Warn("reporting a settlement outcome", zap.String("verification_id", rep.VerificationID), zap.String("payment", rep.Payment), zap.Int("batch", len(reps)), zap.Error(err))
		}
		return false
	}
	var notFound []bool
	if len(reps) > 1 {
		var ok bool
		if notFound, ok = batchResults(out.status(), out.buf.Bytes(), len(reps)); !ok {
			g.logger.Warn("the upstream's answer to a batch of settlement outcomes is not one result per report; sending each again alone",
				zap.Int("batch", len(reps)), zap.Int("status", out.status()), zap.Int("body_bytes", out.buf.Len()))
			return false
		}
	}
	for i, rep := range reps {
		if notFound != nil && notFound[i] {
			g.logger.Error("the upstream has no such verification: its settlement outcome is not recorded", zap.String("verification_id", rep.VerificationID), zap.String("payment", rep.Payment), zap.Int("batch", len(reps)))
			continue
		}
		metrics.outcomes.WithLabelValues("reported_" + rep.Payment).Inc()
	}
	return true
}

// reportKey marks the context of a report reportOnce sends through the
// gate's handler chain (isReport). The report shares the call's variables
// (a later gate of the route, one per MCP tool, reads them to pass it on).
type reportKey struct{}

// isReport reports whether r is a report of a call's outcome the gate
// sends to its upstream (reportOnce), not a call: a verify_response passes
// it on untouched, for the upstream's answer to it is no output of the
// agent's to check, and checking it would overwrite the outcome of the
// call it reports (VerificationVar), which the gate still reads.
func isReport(r *http.Request) bool {
	v, _ := r.Context().Value(reportKey{}).(bool)
	return v
}

// batchResults reads the upstream's success answer to a batch of n
// reports: 204, every report recorded (or final already), or 200
// {"results": [...]} with one result per report in the batch's order,
// each recorded, final or not_found; notFound says which reports the
// upstream has no verification for. Any other success answer (another
// status, a list of another length, another result or member, a truncated
// body, a proxy's page) does not say which reports were recorded, so ok is
// false and the batch is handled as one the upstream did not take: its
// reports are sent again alone, which records each once (a repeated report
// changes nothing). Taking it as every report recorded would count
// outcomes as reported that may never have been.
func batchResults(status int, body []byte, n int) (notFound []bool, ok bool) {
	switch status {
	case http.StatusNoContent:
		return nil, true
	case http.StatusOK:
	default:
		return nil, false
	}
	var ans struct {
		Results []string `json:"results"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if dec.Decode(&ans) != nil || len(ans.Results) != n {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF { // one document, nothing after it
		return nil, false
	}
	for i, res := range ans.Results {
		switch res {
		case reportRecorded, reportFinal:
		case reportNotFound:
			if notFound == nil {
				notFound = make([]bool, n)
			}
			notFound[i] = true
		default:
			return nil, false
		}
	}
	return notFound, true
}

// encodeOffers encodes the gate's offers once, as the records of its paid
// calls carry them (heldRecord.Offer): encoding an offer's extra on each
// call cost allocations every paid call paid for.
func (g *Gate) encodeOffers() error {
	g.offersJSON = make([]json.RawMessage, len(g.offers))
	for i, o := range g.offers {
		b, err := json.Marshal(o)
		if err != nil {
			return fmt.Errorf("accept %d: %v", i, err)
		}
		g.offersJSON[i] = b
	}
	return nil
}

// offerSet is the offers a gate shows and takes payment for now, and
// each one's JSON (encodeOffers) and its asset's decimals (Gate.decimals),
// read together: an offer, its JSON and its decimals always come from one
// set, so a waiting offer left out does not shift another's decimals onto
// it.
type offerSet struct {
	offers   []x402.PaymentRequirements
	json     []json.RawMessage
	decimals []int
}

// newOfferSet is the set of offers, encoded as encoded, with their assets'
// decimals, less those at the indexes in skip.
func newOfferSet(offers []x402.PaymentRequirements, encoded []json.RawMessage, decimals []int, skip []int) *offerSet {
	s := &offerSet{}
	for i, o := range offers {
		if !slices.Contains(skip, i) {
			s.offers, s.json, s.decimals = append(s.offers, o), append(s.json, encoded[i]), append(s.decimals, decimals[i])
		}
	}
	return s
}

// liveOffers is the gate's offers as a buyer is shown them and may pay
// them now (Gate.live); a gate never provisioned has all of its offers,
// encoded on demand.
func (g *Gate) liveOffers() *offerSet {
	if g.live != nil {
		if s := g.live.Load(); s != nil {
			return s
		}
	}
	return &offerSet{offers: g.offers, decimals: g.decimals}
}

// offerJSON is offer i of the set as JSON: as encodeOffers encoded it, or
// encoded now for a gate that was never provisioned.
func (s *offerSet) offerJSON(i int) json.RawMessage {
	if len(s.json) == len(s.offers) {
		return s.json[i]
	}
	b, _ := json.Marshal(s.offers[i])
	return b
}
