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

// upgradeRequest reports whether r asks to switch protocols, as
// reverse_proxy reads it (Connection names Upgrade, and the first Upgrade
// value names the protocol), to one other than h2c. An Upgrade of h2c
// (curl --http2 offers it with every request to an http:// URL) is an
// ordinary request: reverse_proxy forwards it with Connection: Upgrade
// alone, dropping the HTTP2-Settings header the client's Connection named,
// and no upstream upgrades to h2c without it (RFC 7540 §3.2; x/net's h2c
// takes only an Upgrade whose Connection names HTTP2-Settings), while
// net/http's server ignores the offer. The upstream answers it as any
// call, held and judged as any; an upstream that answered it 101 anyway
// would find the held writer refusing the hijack, and no tunnel opens.
func upgradeRequest(r *http.Request) bool {
	up := r.Header.Get("Upgrade")
	return up != "" && !strings.EqualFold(up, "h2c") && headerHasToken(r.Header, "Connection", "Upgrade")
}

// codeUpgradeUnsupported refuses a protocol switch on a route that cannot
// sell one.
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
