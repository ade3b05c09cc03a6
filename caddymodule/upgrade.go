package caddymodule

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"golang.org/x/net/http/httpguts"

	"github.com/aovhq/aov/apierr"
)

// A request that asks to switch protocols (Connection: Upgrade, a
// WebSocket) is answered, when the upstream accepts, by a 101 after which
// the connection is the upstream's: reverse_proxy hijacks the client's
// connection and copies bytes both ways for as long as the tunnel is open.
// Nothing of that can be held, judged or replayed, so a 101 is the
// upstream accepting the call, and where the call is charged (paid or
// free) the charge must be decided at the 101, before the tunnel exists:
//
//   - settle before: settled before the upstream runs; the 101 is the
//     answer's start (startsAnswer), past which upstream_timeout no longer
//     applies (runSettled).
//   - settle after: the held answer's start is the 101 (protocolSwitch):
//     the payment is settled there, by the one settle path, and only a
//     settled 101 goes to the buyer, with PAYMENT-RESPONSE, and the tunnel
//     through. When the settlement fails no 101 is written and the hijack is
//     refused (reverse_proxy then closes the upstream's connection): the
//     buyer gets the answer of any failed settlement, uncharged.
//   - a route with verify_response: every answer it checks is held until
//     checked, and a tunnel is no answer it can hold or check, however
//     settle_on is set. The request is refused (errUpgradeUnsupported)
//     before anything is offered, claimed, verified, counted or run, by
//     the gate once it knows its route checks answers (sellsSwitch), and
//     by verify_response itself, before its upstream runs, when the gate
//     cannot know yet.
//
// A call served from the free allowance is the same rule with the free
// unit for its charge: the unit is committed at the 101 (the free charge's
// settle), which goes out with the Free-Allowance headers, and the tunnel
// opens. A free tunnel thus spends the allowance (per_day) and the free
// budget (rate_limit) as any free answer, and past them the request gets
// the demand for payment before anything runs.
//
// An MCP call is not sold as a tunnel: its held writer takes no 101
// (bufferedWriter), and an upgrade request on an mcp_tool gate, a tool
// call or any other, is refused as on a route with verify_response,
// before anything else.

// An Upgrade is read as reverse_proxy reads it: only when Connection
// names Upgrade, and then its first value, whole, is the protocol the
// upstream is asked for and the only Upgrade of a 101 it relays (any other
// 101 it drops, after the upstream switched). Without Connection: Upgrade
// it drops Upgrade as a hop-by-hop header and the upstream sees an
// ordinary request. An extended CONNECT (RFC 8441, 9220: a WebSocket over
// HTTP/2 or HTTP/3) carries no Upgrade, but reverse_proxy turns one for a
// WebSocket into an HTTP/1.1 upgrade request to the upstream.
type upgradeOffer int

const (
	upgradeNone      upgradeOffer = iota // no Upgrade reaches the upstream
	upgradeSwitch                        // one protocol, relayed when accepted
	upgradeH2C                           // h2c alone: answered without it (screenUpgrade)
	upgradeAmbiguous                     // not one protocol token: refused (screenUpgrade)
	upgradeExtended                      // an extended CONNECT: refused (screenUpgrade)
)

// readUpgrade classifies r's Upgrade. Only one protocol named alone, as a
// token (RFC 9110 §7.8: a name and an optional /version), is a switch the
// gate can sell. Anything else is ambiguous: a list (a comma, or Upgrade
// sent twice), where an upstream may accept any protocol in it
// (gorilla/websocket takes "foo, websocket"), or a value an upstream reads
// otherwise than reverse_proxy, which compares it whole (trailing
// non-ASCII space, which an upstream trimming with strings.TrimSpace
// drops). Such an upstream answers a 101 that reverse_proxy drops, so it
// runs its switched handler while the gate sees no answer and charges
// nothing.
func readUpgrade(r *http.Request) upgradeOffer {
	if isExtendedConnect(r) {
		return upgradeExtended
	}
	h := r.Header
	vs := h.Values("Upgrade")
	all := strings.Join(vs, ",")
	switch {
	case all == "" || !headerHasToken(h, "Connection", "Upgrade"):
		return upgradeNone
	case len(vs) > 1 || !isProtocol(all):
		return upgradeAmbiguous
	case strings.EqualFold(all, "h2c"):
		return upgradeH2C
	}
	return upgradeSwitch
}

// isProtocol reports whether v is one protocol of an Upgrade: a token,
// optionally a slash and a version token.
func isProtocol(v string) bool {
	name, version, hasVersion := strings.Cut(v, "/")
	return httpguts.ValidHeaderFieldName(name) && (!hasVersion || httpguts.ValidHeaderFieldName(version))
}

// isExtendedConnect reports whether r is an extended CONNECT: the
// :protocol pseudo-header on HTTP/2, which net/http keeps in the header
// map, or on HTTP/3, where quic-go puts it in r.Proto.
func isExtendedConnect(r *http.Request) bool {
	return r.Method == http.MethodConnect &&
		(r.Header.Get(":protocol") != "" || r.ProtoMajor == 3 && r.Proto != "" && r.Proto != "HTTP/3.0")
}

// upgradeRequest reports whether r asks to switch protocols: to one
// protocol reverse_proxy relays (a request screenUpgrade let through), or
// by an extended CONNECT, which only verify_response without a gate sees.
func upgradeRequest(r *http.Request) bool {
	o := readUpgrade(r)
	return o == upgradeSwitch || o == upgradeExtended
}

// screenUpgrade applies readUpgrade's rule to every request at the gate,
// before anything is offered for sale, claimed, verified or counted: the
// gate charges for a switch only at a 101 it sees, so no upstream may
// switch on a request the gate takes for an ordinary one.
//
// An offer of h2c alone (curl --http2 sends Upgrade: h2c, Connection:
// Upgrade, HTTP2-Settings with every request to an http:// URL) is
// answered as the same request without it: Upgrade, HTTP2-Settings and
// their tokens in Connection are removed, so the upstream cannot switch
// (an upstream that takes h2c, or any Upgrade, would otherwise run its
// switched handler for a 101 the gate's held writer refuses, uncharged).
// An ambiguous Upgrade is refused with errUpgradeAmbiguous, and an
// extended CONNECT with errExtendedConnect: reverse_proxy answers its
// tunnel with a 200, not the 101 the gate settles a switch at.
func screenUpgrade(r *http.Request) *apierr.Error {
	switch readUpgrade(r) {
	case upgradeH2C:
		dropH2COffer(r.Header)
	case upgradeAmbiguous:
		return errUpgradeAmbiguous()
	case upgradeExtended:
		return errExtendedConnect()
	}
	return nil
}

// dropH2COffer removes an h2c offer's headers from h, and their tokens
// from Connection (Connection itself when nothing else is left in it).
func dropH2COffer(h http.Header) {
	h.Del("Upgrade")
	h.Del("HTTP2-Settings")
	var keep []string
	for _, v := range h.Values("Connection") {
		for _, tok := range strings.Split(v, ",") {
			tok = strings.TrimSpace(tok)
			if tok != "" && !strings.EqualFold(tok, "Upgrade") && !strings.EqualFold(tok, "HTTP2-Settings") {
				keep = append(keep, tok)
			}
		}
	}
	h.Del("Connection")
	if len(keep) > 0 {
		h.Set("Connection", strings.Join(keep, ", "))
	}
}

// codeUpgradeUnsupported refuses a protocol switch on a route that cannot
// sell one, or an Upgrade no switch of which can be sold (a list).
const codeUpgradeUnsupported = "upgrade_unsupported"

// errUpgradeUnsupported is the refusal of an upgrade request where no
// tunnel can be sold (see above). It comes before the request is offered
// for sale, free or paid: a demand for payment would invite a payment the
// call could never be served for.
func errUpgradeUnsupported() *apierr.Error {
	return &apierr.Error{
		Code:        codeUpgradeUnsupported,
		Message:     "This route checks its answers before it releases them, or sells MCP tool calls, and a protocol switch (Connection: Upgrade) opens a connection that can be neither; nothing was charged. Send the request without Upgrade.",
		Status:      http.StatusBadRequest,
		NextActions: []apierr.Action{{Action: "drop_upgrade"}},
		Cause:       errors.New("an upgrade request cannot be sold on a route with verify_response or an mcp_tool gate"),
	}
}

// sellsSwitch reports whether the gate can sell a protocol switch: not
// for an MCP tool, and not on a route whose answers verify_response
// checks. A gate cannot see verify_response when it is provisioned (they
// are siblings in a route): settle_on pass names it, and otherwise the
// gate knows it from the first request verify_response handled behind it
// (noteVerified); until then verify_response refuses the request itself.
func (g *Gate) sellsSwitch() bool {
	return g.MCPTool == "" && g.SettleOn != settleOnPass && (g.verified == nil || !g.verified.Load())
}

// noteVerified records that verify_response handled r behind the gate
// (verificationRouteVar), for sellsSwitch.
func (g *Gate) noteVerified(r *http.Request) {
	if g.verified != nil && !g.verified.Load() && caddyhttp.GetVar(r.Context(), verificationRouteVar) != nil {
		g.verified.Store(true)
	}
}

// errUpgradeAmbiguous refuses an Upgrade that names more than one
// protocol (readUpgrade): which one the upstream switches to is its
// choice, and reverse_proxy relays only a 101 naming the request's whole
// Upgrade value.
func errUpgradeAmbiguous() *apierr.Error {
	return &apierr.Error{
		Code:        codeUpgradeUnsupported,
		Message:     "Upgrade does not name one protocol alone (a token such as websocket); a protocol switch is served for one protocol named alone. Nothing was charged. Send one protocol in Upgrade, or none.",
		Status:      http.StatusBadRequest,
		NextActions: []apierr.Action{{Action: "drop_upgrade"}},
		Cause:       errors.New("an Upgrade list or malformed protocol: no switch reverse_proxy relays"),
	}
}

// errExtendedConnect refuses a WebSocket over HTTP/2 or HTTP/3 at a gate
// (screenUpgrade); the same WebSocket over HTTP/1.1 is sold at its 101.
func errExtendedConnect() *apierr.Error {
	return &apierr.Error{
		Code:        codeUpgradeUnsupported,
		Message:     "A protocol switch over HTTP/2 or HTTP/3 (an extended CONNECT) is not served here; nothing was charged. Open it over HTTP/1.1 with Connection: Upgrade.",
		Status:      http.StatusBadRequest,
		NextActions: []apierr.Action{{Action: "drop_upgrade"}},
	}
}

// protocolSwitch is the gate's held writer (bw) for a REST call, paid or
// free, in settle after mode whose request asks to switch protocols: it
// takes the upstream's 101 as the answer's start, settles the call's
// charge there (c, by its settle path) and, once settled, writes the 101
// with the charge's headers to w (switchWriter: paidStream, or the
// Free-Allowance headers) and lets reverse_proxy hijack w's connection. Any other answer is held by bw and judged as every
// answer is (serveCharged).
//
// upstream_timeout bounds the wait for the answer, up to its 101: the
// upstream call's context is cancelled at the deadline unless the 101
// came first, after which the tunnel runs as long as it is open (as
// after a settle before). A 101 after the deadline settles nothing.
type protocolSwitch struct {
	*bufferedWriter
	w     http.ResponseWriter // the client's
	r     *http.Request       // the gate's: settling outlives the upstream's context
	g     *Gate
	ex    exchange
	c     charge
	state atomic.Int32 // headerDue, headerBegun (the 101 came in time) or headerLate
	timer *time.Timer
	// answered: the 101 was settled and went out (switched), or its
	// settlement failed and the client has its answer.
	answered bool
	switched atomic.Bool
}

// newProtocolSwitch returns the held writer for c's call, or nil when the
// call cannot be answered by a tunnel: not an upgrade request, or not over
// REST.
func newProtocolSwitch(w http.ResponseWriter, r *http.Request, ex exchange, c charge, bw *bufferedWriter) *protocolSwitch {
	rex, rest := ex.(*restExchange)
	if !rest || !upgradeRequest(r) {
		return nil
	}
	return &protocolSwitch{bufferedWriter: bw, w: w, r: r, g: rex.g, ex: ex, c: c}
}

// bound is the upstream call's context: cancelled at wait, unless the
// 101 came first (see protocolSwitch).
func (s *protocolSwitch) bound(parent context.Context, wait time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(parent)
	s.timer = time.AfterFunc(wait, func() {
		if s.state.CompareAndSwap(headerDue, headerLate) {
			cancel()
		}
	})
	return ctx, func() { s.timer.Stop(); cancel() }
}

// late returns the upstream call's error when upstream_timeout came before
// a 101, nil otherwise: what a deadline on the whole call (serveCharged's
// other calls) makes reverse_proxy return, a 504. A cancelled context
// would otherwise read as a client gone away (reverse_proxy's 499).
func (s *protocolSwitch) late() error {
	if s.state.Load() != headerLate {
		return nil
	}
	return caddyhttp.Error(http.StatusGatewayTimeout, fmt.Errorf("upstream_timeout: %w", context.DeadlineExceeded))
}

// WriteHeader settles at a 101 that came in time (see protocolSwitch);
// any other status goes to the hold.
func (s *protocolSwitch) WriteHeader(code int) {
	if code != http.StatusSwitchingProtocols || s.code != 0 || s.answered {
		s.bufferedWriter.WriteHeader(code)
		return
	}
	if !s.state.CompareAndSwap(headerDue, headerBegun) {
		return // past upstream_timeout: no switch, the call failed (late)
	}
	s.timer.Stop()
	r := s.r
	if !s.g.settleAllowed(r) {
		return // never settled: the hijack is refused and nothing answered
	}
	s.answered = true
	// The upstream ran and took the request, as before any settlement
	// (serveCharged): a failed settlement is answered as after any answer,
	// not by the request check (validate) the upstream's run replaced.
	s.ex.upstreamRan()
	// Nothing is held for an unknown outcome: the retry that finds the
	// transfer runs the upstream again, once (pending.go), as after a
	// settle before.
	if !s.c.settle(s.w, r, nil) {
		return
	}
	sw := s.c.switchWriter(s.w, r)
	copyHeader(sw.Header(), s.header)
	s.switched.Store(true)
	sw.WriteHeader(code)
}

// errSwitchUnpaid is what a hijack of a call whose 101 was not settled
// gets: reverse_proxy then closes the upstream's connection.
var errSwitchUnpaid = errors.New("x402: the protocol switch was not settled; the tunnel is not opened")

// Hijack hands the client's connection over once the 101 went out.
func (s *protocolSwitch) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if !s.switched.Load() {
		return nil, nil, errSwitchUnpaid
	}
	return http.NewResponseController(s.w).Hijack()
}

// reached reports whether the 101 went to the client (runUpstream).
func (s *protocolSwitch) reached() bool { return s.switched.Load() }

// switchWriter: the settled 101 goes out as a settled stream, with
// PAYMENT-RESPONSE (paidStream); nothing of a tunnel is kept for a retry
// with the same payment identifier.
func (p *paidCharge) switchWriter(w http.ResponseWriter, r *http.Request) http.ResponseWriter {
	p.pid.save(nil, p.sr)
	return p.g.paidStream(w, r, p.sr, nil)
}

// switchWriter: the 101 of a committed free unit goes out with the
// Free-Allowance headers, and none of the upstream's own (replay's rule).
func (f *freeCharge) switchWriter(w http.ResponseWriter, _ *http.Request) http.ResponseWriter {
	return &statusWriter{ResponseWriter: w, onHeader: func(h http.Header, _ int) {
		dropGateHeaders(h)
		f.setHeaders(h)
	}}
}
