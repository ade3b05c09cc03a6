package caddymodule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/ethereum/go-ethereum/ethclient"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/internal/caddyopt"
	"github.com/aovhq/aov/internal/inflight"
	"github.com/aovhq/aov/internal/secretopt"
	"github.com/aovhq/aov/walletauth"
	"github.com/aovhq/aov/x402"
)

func init() {
	caddy.RegisterModule(WalletAuth{})
	httpcaddyfile.RegisterHandlerDirective("wallet_auth", parseWalletAuth)
	// After request_header (so header cleanup happens first) and before
	// x402 (which is before encode), so the gate's per-wallet allowance
	// sees the verified wallet.
	httpcaddyfile.RegisterDirectiveOrder("wallet_auth", httpcaddyfile.After, "request_header")
}

// Headers wallet_auth sets for the upstream, after removing client copies.
const (
	// HeaderUpstreamWallet is the verified wallet address (EIP-55).
	HeaderUpstreamWallet = "X-Aov-Wallet"
	// HeaderUpstreamWalletAgent is the agent_id the wallet's proof names:
	// a bind request. verifierd binds an unowned name to the wallet, refuses
	// with 403 a proof naming an id another wallet owns, and counts the
	// verification as authenticated when the request's agent_id is that id.
	HeaderUpstreamWalletAgent = "X-Aov-Wallet-Agent"
)

// Placeholders wallet_auth sets (WalletPlaceholder, in free.go, is the
// address).
const (
	WalletAgentPlaceholder      = "http.auth.wallet.agent_id"
	WalletChainPlaceholder      = "http.auth.wallet.chain_id"
	WalletPaidAccessPlaceholder = "http.auth.wallet.paid_access"
	userIDPlaceholder           = "http.auth.user.id"
)

// WalletAuth verifies that the caller controls a wallet (Caddyfile
// directive `wallet_auth`): the X-Wallet-Auth header (SPEC §9), a signed,
// single-use EIP-4361 statement bound to one of the configured site names
// (Domains), the request's method
// and path and a short expiry, and optionally the x402 sign-in-with-x proof
// (SIGN-IN-WITH-X). The verified address goes to the placeholders
// {http.auth.wallet.address}, {http.auth.wallet.agent_id},
// {http.auth.wallet.chain_id} and {http.auth.user.id}, and to the upstream
// in X-Aov-Wallet (and X-Aov-Wallet-Agent); client copies of those headers
// are always removed, and the proofs themselves are not forwarded.
//
// A malformed, expired, replayed or wrongly signed proof is always refused
// with 401 in the service's error shape, in either mode; a missing one is
// refused only in mode required.
//
// Several wallet_auth on one request (a site-wide one and a route's own)
// each judge the request's proofs by their own settings, as if each were
// alone, except that a proof an earlier one verified has its nonce spent
// already: a later one checks it again (its domains, max_lifetime,
// chain_rpc, siwx) without claiming the nonce, so it accepts no proof it
// would refuse alone, and refuses none for being sent once. A later one
// that finds no proof it reads keeps what an earlier one proved (the
// upstream headers, the placeholders), and one without siwx keeps the
// paid access an earlier one found.
type WalletAuth struct {
	// Mode is "required" (default: a request without a valid proof is
	// refused) or "optional" (a request without any proof passes without a
	// wallet; the free allowance's `key wallet` then grants it nothing).
	Mode string `json:"mode,omitempty"`

	// MaxLifetime bounds how long a proof may be valid
	// (expiration_time − issued_at). Default 5m.
	MaxLifetime caddy.Duration `json:"max_lifetime,omitempty"`

	// Domains are the site names proofs must be for (required): each a
	// host, with the port when clients address one ("localhost:8080"),
	// compared without regard to case. A proof's domain must be one of
	// them; the request's Host header is never used, since a client
	// chooses it and could present a proof signed for another site under
	// that site's name. {env.*} placeholders are expanded once. The first
	// name also names the site in sign-in-with-x payment records, so a
	// payment under any of the names grants access under all of them.
	Domains []string `json:"domains,omitempty"`

	// ChainRPC is a JSON-RPC URL of the EVM chain on which contract
	// wallets (EIP-1271) may sign. Without it only ordinary accounts can
	// sign. Placeholders such as {env.RPC_URL} are expanded once.
	ChainRPC string `json:"chain_rpc,omitempty"`

	// ChainTimeout bounds how long a contract-wallet check waits on
	// chain_rpc (anyone can cause one with a signature that does not
	// recover); past it the request gets 503 upstream_unavailable,
	// retryable. Default 5s.
	ChainTimeout caddy.Duration `json:"chain_timeout,omitempty"`

	// StoreRaw keeps the single-use nonce claims (and sign-in-with-x
	// payment records): a module in the x402.stores namespace. Default:
	// the same Badger database the x402 gate uses by default.
	StoreRaw json.RawMessage `json:"store,omitempty" caddy:"namespace=x402.stores inline_key=type"`

	// SIWX accepts the x402 sign-in-with-x proof (SIGN-IN-WITH-X) as well,
	// and remembers who paid for what: a paid answer (PAYMENT-RESPONSE with
	// success) to a request that carried a payment records its payer for
	// this host and path, and a later sign-in-with-x proof by that wallet
	// sets {http.auth.wallet.paid_access} to "true" (match on it to skip
	// the x402 gate; see the documentation).
	SIWX bool `json:"siwx,omitempty"`

	// SIWXAccessTTL is how long a payment grants sign-in-with-x access,
	// from the latest payment by the wallet for the resource (a wallet
	// charged again is recorded anew; walletauth.PaidAccess). Default 720h
	// (30 days); at most 366 days (walletauth.MaxPaidAccessTTL).
	SIWXAccessTTL caddy.Duration `json:"siwx_access_ttl,omitempty"`

	domains  []string // Domains with placeholders expanded
	verifier *walletauth.Verifier
	paid     walletauth.PaidAccess
	rpc      *ethclient.Client
	logger   *zap.Logger
	uses     *inflight.Config // internal/inflight
}

// maxProofLifetime caps max_lifetime. An X-Wallet-Auth proof is a
// short-lived bearer credential: whoever captures it (a log, a proxy) can
// send it until it expires unless its nonce was used first, and its nonce
// claim is kept until then. An hour is twelve times the 5m default, room
// enough for a slow signer or a skewed clock, and still short.
const maxProofLifetime = time.Hour

// CaddyModule returns the Caddy module information.
func (WalletAuth) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.wallet_auth",
		New: func() caddy.Module { return new(WalletAuth) },
	}
}

// Provision loads the store and connects the chain client.
func (wa *WalletAuth) Provision(ctx caddy.Context) error {
	wa.logger = ctx.Logger()
	wa.uses = inflight.For(ctx)
	if wa.Mode == "" {
		wa.Mode = "required"
	}
	if wa.ChainTimeout == 0 {
		wa.ChainTimeout = caddy.Duration(walletauth.DefaultChainTimeout)
	}
	if wa.StoreRaw == nil {
		wa.StoreRaw = json.RawMessage(`{"type":"badger"}`)
	}
	mod, err := ctx.LoadModule(wa, "StoreRaw")
	if err != nil {
		return fmt.Errorf("loading store module: %v", err)
	}
	st, ok := mod.(gateStore)
	if !ok {
		return fmt.Errorf("store module %T does not keep claims", mod)
	}
	noteStore(ctx, "wallet_auth", mod)
	repl := caddy.NewReplacer()
	for _, d := range wa.Domains {
		d = repl.ReplaceKnown(d, "")
		if !walletauth.ValidDomain(d) {
			return fmt.Errorf("wallet_auth: domains: %q is not a host name with an optional port", d)
		}
		wa.domains = append(wa.domains, d)
		// Browsers and wallets sign the host without a default port
		// (location.host); a client that addressed the port, as
		// `aov wallet-auth --url https://host:443/…` does, signs it with
		// it. A name given with :443 or :80 matches both.
		if host, dropped := withoutDefaultPort(d, "443", "80"); dropped && !slices.Contains(wa.domains, host) {
			wa.domains = append(wa.domains, host)
		}
	}
	if len(wa.domains) == 0 {
		return errors.New("wallet_auth: domains is required: the site names clients sign proofs for (e.g. verify.example.com, or localhost:8080 in development); the request's Host is never trusted for it")
	}
	wa.verifier = &walletauth.Verifier{
		MaxLifetime:  time.Duration(wa.MaxLifetime),
		ChainTimeout: time.Duration(wa.ChainTimeout),
		Nonces:       st.Claims(),
		Domains:      wa.domains,
		Now:          func() time.Time { return now() },
	}
	wa.paid = walletauth.PaidAccess{Claims: st.Claims(), TTL: time.Duration(wa.SIWXAccessTTL)}
	if wa.ChainRPC != "" {
		url := caddy.NewReplacer().ReplaceKnown(wa.ChainRPC, "")
		secretopt.WarnIfURLCredentials(ctx.Logger(), "chain_rpc", wa.ChainRPC, url)
		// A ws:// endpoint connects here: bounded like every chain call.
		c, err := dialChain(ctx, url, time.Duration(wa.ChainTimeout), maxChainReply)
		if err != nil {
			return fmt.Errorf("wallet_auth: chain_rpc: %v", secretopt.Scrub(err, url))
		}
		wa.rpc = c
		wa.verifier.Chain = c
	}
	return nil
}

// Validate checks the configuration.
func (wa *WalletAuth) Validate() error {
	if wa.Mode != "required" && wa.Mode != "optional" {
		return fmt.Errorf("wallet_auth: mode must be required or optional, not %q", wa.Mode)
	}
	if wa.MaxLifetime < 0 || wa.SIWXAccessTTL < 0 || wa.ChainTimeout < 0 {
		return errors.New("wallet_auth: durations must be positive")
	}
	if d := time.Duration(wa.MaxLifetime); d > maxProofLifetime {
		return fmt.Errorf("wallet_auth: max_lifetime %s is over %s: a proof is meant to be short-lived (default %s); a captured one can be replayed until it expires, unless its nonce was used, and every nonce claim is kept that long", d, maxProofLifetime, walletauth.DefaultMaxLifetime)
	}
	if d := time.Duration(wa.SIWXAccessTTL); d > walletauth.MaxPaidAccessTTL {
		return fmt.Errorf("wallet_auth: siwx_access_ttl %s is over %s: a payment's sign-in access is meant to lapse, and a record must end within what the store keeps", d, walletauth.MaxPaidAccessTTL)
	}
	if wa.SIWXAccessTTL != 0 && !wa.SIWX {
		return errors.New("wallet_auth: siwx_access_ttl needs siwx: without it no sign-in-with-x access is recorded or granted; add siwx, or remove siwx_access_ttl")
	}
	return nil
}

// Cleanup closes the chain client once the config's requests in flight
// are done (one may be checking a proof through it).
func (wa *WalletAuth) Cleanup() error {
	if wa.rpc == nil {
		return nil
	}
	rpc := wa.rpc
	return wa.uses.AfterRequests(func() error {
		rpc.Close()
		return nil
	})
}

// ServeHTTP verifies the request's wallet proofs and passes it on with the
// wallet exposed, or refuses it with 401.
func (wa *WalletAuth) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	// Before anything reads the store or the chain: see Gate.ServeHTTP.
	if !wa.uses.Enter() {
		return wa.refuse(w, r, apierr.Unavailable("wallet proof check", 1, errUnloaded))
	}
	defer wa.uses.Leave()
	h := r.Header
	// A wallet an earlier wallet_auth proved on this request stands, its
	// headers and placeholders with it, unless this one proves it again.
	earlier := caddyhttp.GetVar(r.Context(), varWalletProven) != nil
	if !earlier {
		clearWalletHeaders(h)
	}
	creds := setAsideClientCredentials(r)
	defer creds.keepClaims()
	auth, siwx := creds.proofs(wa.SIWX)
	if isPreflight(r) {
		// A CORS preflight cannot carry a proof. Where one is required,
		// it is answered here: anyone can make an OPTIONS look like a
		// preflight, and the upstream must not serve it unproven.
		if wa.Mode == "required" {
			return answerPreflight(w, nil)
		}
		return next.ServeHTTP(w, r)
	}
	if len(auth)+len(siwx) > 0 || wa.Mode == "required" {
		// A client the gates of this server would answer 429 gets it before
		// any proof is checked (serverZones); a refused proof is counted
		// once checked, even past an empty budget (refuse). Its check
		// (a contract wallet's at the chain) holds a proof's slot of each
		// budget until it is known, so at most events of a client's checks
		// run at once (rateZone.enter), its paid calls in flight aside;
		// given back before the request goes on, where a gate takes its own.
		// Only a PAYMENT-SIGNATURE counts as a payment here: one in an MCP
		// call's _meta is read by the gate alone (one parser of the
		// message), so such a call is held to the rule without one.
		// A request whose every proof an earlier wallet_auth verified
		// passed the budgets there: checked again, its proofs hold a slot
		// only, and are answered 429 only while its client's are all held,
		// the nonces claimed given back (refuse).
		slots, wait := enterServerRate(r, creds.hasPayment(), creds.verified(auth, siwx))
		if wait > 0 {
			return wa.refuse(w, r, apierr.RateLimited(wait))
		}
		if len(slots) > 0 {
			defer slots.leave()
			next = leavingFirst{next, slots}
		}
	}
	if len(auth) > 1 || len(siwx) > 1 {
		// Named as sent, so the client mends the header it repeated.
		header := walletauth.HeaderName
		if len(auth) < 2 {
			header = walletauth.SIWXHeaderName
		}
		return wa.refuse(w, r, &walletauth.Error{Kind: walletauth.ErrMalformed, Header: header,
			Problem: "was sent more than once", Fix: "Send one proof per request."})
	}
	repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	// The site as sign-in-with-x payment records name it: configured, never
	// the client's Host.
	site := wa.domains[0]
	ctx := r.Context()
	// The client signed the request as it sent it: before any rewrite or
	// handle_path prefix stripping.
	method, u := sentRequest(r)
	// Both proofs and paid access go by the path as sent, escaped
	// (walletauth.CanonicalPath), as the 402 names the resource: the
	// decoded path would make /a%2Fb and /a/b one resource, and a proof
	// signed for one good on the other.
	escaped := u.EscapedPath()

	var proof *walletauth.Proof
	if len(auth) == 1 {
		p, err := wa.verifier.Verify(ctx, auth[0], walletauth.Expect{Method: method, Path: escaped, NonceSpent: creds.authSpent})
		if err != nil {
			return wa.refuse(w, r, err)
		}
		creds.hold(r, wa.verifier, p, false)
		proof = &p
	}
	paidAccess := false
	if wa.SIWX && len(siwx) == 1 {
		p, err := wa.verifier.VerifySIWX(ctx, siwx[0], walletauth.SIWXExpect{Path: escaped, NonceSpent: creds.siwxSpent})
		if err != nil {
			return wa.refuse(w, r, err)
		}
		creds.hold(r, wa.verifier, p, true)
		if proof != nil && proof.Wallet() != p.Wallet() {
			return wa.refuse(w, r, &walletauth.Error{Kind: walletauth.ErrWrongRequest, Header: walletauth.SIWXHeaderName, Field: "address",
				Problem: "is not the wallet of X-Wallet-Auth", Fix: "Prove one wallet per request."})
		}
		if proof == nil {
			proof = &p
		}
		paidAccess, err = wa.paid.Has(ctx, p.Wallet(), walletauth.PaidResource(site, escaped))
		if err != nil {
			return wa.refuse(w, r, apierr.Unavailable("wallet proof store", 1, err))
		}
	}
	if proof == nil && wa.Mode == "required" {
		return wa.refuse(w, r, &walletauth.Error{Kind: walletauth.ErrMissing, Header: walletauth.HeaderName,
			Problem: "is missing", Fix: "Sign an X-Wallet-Auth proof for this request (for example with `aov wallet-auth`)."})
	}
	if proof == nil && !earlier && repl != nil {
		// Known but empty, so configs and logs read "" rather than the
		// placeholder's name.
		for _, k := range []string{WalletPlaceholder, WalletAgentPlaceholder, WalletChainPlaceholder, WalletPaidAccessPlaceholder} {
			repl.Set(k, "")
		}
	}
	if proof != nil {
		addr := proof.Wallet()
		if repl != nil {
			repl.Set(WalletPlaceholder, addr)
			repl.Set(WalletAgentPlaceholder, proof.AgentID)
			repl.Set(WalletChainPlaceholder, proof.ChainID)
			repl.Set(userIDPlaceholder, addr)
			if wa.SIWX || !earlier {
				paid := ""
				if paidAccess {
					paid = "true"
				}
				repl.Set(WalletPaidAccessPlaceholder, paid)
			}
		}
		h.Set(HeaderUpstreamWallet, addr)
		if proof.AgentID != "" {
			h.Set(HeaderUpstreamWalletAgent, proof.AgentID)
		}
		caddyhttp.SetVar(ctx, varWalletProven, true)
		if ce := wa.logger.Check(zapcore.DebugLevel, "wallet verified"); ce != nil {
			ce.Write(zap.String("address", addr), zap.Bool("contract", proof.Contract), zap.Bool("paid_access", paidAccess))
		}
	}
	if paidAccess {
		// Let through on an earlier payment: the upstream must not believe
		// a client's own claim to have paid now.
		clearUpstreamHeaders(h)
	}
	if wa.SIWX && creds.hasPayment() {
		return next.ServeHTTP(wa.recordPayments(w, r, walletauth.PaidResource(site, escaped)), r)
	}
	return next.ServeHTTP(w, r)
}

// leavingFirst is the handler after wallet_auth for a request whose proof
// check held rate slots (enterServerRate): it gives them back before the
// handler runs, whichever way ServeHTTP passes the request on.
type leavingFirst struct {
	next  caddyhttp.Handler
	slots rateSlots
}

func (l leavingFirst) ServeHTTP(w http.ResponseWriter, r *http.Request) error {
	l.slots.leave()
	return l.next.ServeHTTP(w, r)
}

// clientCredentials are a client's credentials the gateway reads and the
// upstream must never see: its wallet proofs (X-Wallet-Auth,
// SIGN-IN-WITH-X) and its PAYMENT-SIGNATURE. Each is a bearer credential
// until it expires: whoever reads one upstream (or in its logs) could
// replay a proof elsewhere, unless its nonce is used first, or present an
// unsettled payment and be served on the buyer's money.
type clientCredentials struct {
	auth, siwx []string
	payment    string // the first PAYMENT-SIGNATURE, as the gate reads it
	// authSpent and siwxSpent record that a wallet_auth verified the proof
	// and claimed its nonce, so that a later one on the request checks it
	// without claiming it again (walletauth.Expect.NonceSpent). Only
	// wallet_auth sets them, once its own check passed (hold); they live
	// in a request variable, which no client can set.
	authSpent, siwxSpent bool
	// held are the nonce claims wallet_auth made on the request that a
	// retryable refusal gives back (releaseClaims), until the request may
	// have been served (keepClaims).
	held []heldNonce
	// heldAfter is the upstream reverse_proxy had chosen for the request
	// (proxiedTo) when the first of held was claimed: a proxy that ran
	// before wallet_auth, an auth check (forward_auth, which Caddy orders
	// first), served nothing of what the claims are for.
	heldAfter string
}

// heldNonce is a proof whose nonce a wallet_auth claimed, with its
// verifier: the claim is in that wallet_auth's store, which a later one
// on the request need not share.
type heldNonce struct {
	v    *walletauth.Verifier
	p    walletauth.Proof
	siwx bool // SIGN-IN-WITH-X's, else X-Wallet-Auth's
}

// hold records that v verified p, r's SIGN-IN-WITH-X proof when siwx, else
// its X-Wallet-Auth, and holds the nonce claim it made: the first check's
// (a later one claims nothing).
func (c *clientCredentials) hold(r *http.Request, v *walletauth.Verifier, p walletauth.Proof, siwx bool) {
	spent := &c.authSpent
	if siwx {
		spent = &c.siwxSpent
	}
	if !*spent {
		*spent = true
		if len(c.held) == 0 {
			c.heldAfter = proxiedTo(r)
		}
		c.held = append(c.held, heldNonce{v, p, siwx})
	}
}

// verified reports whether an earlier wallet_auth on the request verified
// every proof among auth and siwx, there being one at least.
func (c *clientCredentials) verified(auth, siwx []string) bool {
	return len(auth)+len(siwx) > 0 && (len(auth) == 0 || c.authSpent) && (len(siwx) == 0 || c.siwxSpent)
}

// keepClaims makes the nonce claims held so far final: a wallet_auth
// calls it when it returns, once the request went past it and may have
// been served (handle_errors runs after that), and a gate as its upstream
// starts (runCallUpstream). A proof whose request was served must never be
// sendable again.
func (c *clientCredentials) keepClaims() {
	if c != nil {
		c.held = nil
	}
}

// releaseClaims gives back the nonce claims wallet_auth holds on the
// request, which is being refused with an answer its client is told to
// retry (a 503, a 429): the retry may send the same proofs, as when one
// wallet_auth alone cannot check a proof, since one that checks a proof a
// second time (a route's behind a site-wide one) can fail after the first
// claimed its nonce.
func (c *clientCredentials) releaseClaims(r *http.Request, logger *zap.Logger) {
	if c == nil || len(c.held) == 0 {
		return
	}
	held := c.held
	c.held = nil
	ctx := context.WithoutCancel(r.Context())
	for _, h := range held {
		if err := h.v.ReleaseNonce(ctx, h.p); err != nil {
			logger.Warn("releasing a wallet proof's nonce", zap.Error(err))
		} else if h.siwx {
			c.siwxSpent = false
		} else {
			c.authSpent = false
		}
	}
}

// refusedForNow gives the request's wallet proofs back (releaseClaims)
// when e, the answer it is refused with, tells its client to retry (a 503,
// a 429), so that the client's retry of the same request is not refused as
// a replay: the refusals of a handler without an upstream of its own
// (wallet_auth, aov_rate_limit). None once reverse_proxy chose another
// upstream for the request than when the claims were made (heldAfter):
// such a handler in its handle_response runs after the upstream answered.
// A forward_auth after wallet_auth and before the handler looks the same,
// and keeps them too; one before wallet_auth does not.
func refusedForNow(r *http.Request, e *apierr.Error, logger *zap.Logger) {
	if c := credentialsOf(r); c != nil && proxiedTo(r) != c.heldAfter {
		c.keepClaims()
		return
	}
	refusedBeforeUpstream(r, e, logger)
}

// proxiedTo is the upstream the last reverse_proxy to run on r chose
// (http.reverse_proxy.upstream.hostport), "" before any.
func proxiedTo(r *http.Request) string {
	repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if repl == nil {
		return ""
	}
	s, _ := repl.GetString("http.reverse_proxy.upstream.hostport")
	return s
}

// refusedBeforeUpstream is refusedForNow for a gate's refusals, which need
// no sign of a proxy: the gate keeps the claims itself as its upstream
// starts (runCallUpstream), and a proxy that ran before it was no upstream
// of the request but an auth check (forward_auth), which serves nothing.
func refusedBeforeUpstream(r *http.Request, e *apierr.Error, logger *zap.Logger) {
	if e.Retryable {
		credentialsOf(r).releaseClaims(r, logger)
	}
}

// credentialsOf returns the client's credentials set aside for the request
// (setAsideClientCredentials), nil when it sent none.
func credentialsOf(r *http.Request) *clientCredentials {
	c, _ := caddyhttp.GetVar(r.Context(), varClientCredentials).(*clientCredentials)
	return c
}

// varClientCredentials holds the *clientCredentials set aside for the
// request (setAsideClientCredentials).
const varClientCredentials = "aov.client_credentials"

// setAsideClientCredentials takes the client's credentials off the
// request's headers into a request variable and returns them. It is the
// one rule that keeps them from the upstream: wallet_auth and every gate
// call it before anything else reads the request, so no path past either
// (a gate a matcher skips, such as one skipped for a sign-in's paid
// access; a preflight passed on; handle_errors; a later reverse_proxy)
// carries them, whichever of the two runs first. Each reads them from
// here: every wallet_auth the proofs it reads (proofs), a gate the payment
// (takePayment). Once some are set aside, a copy that reappears on the
// request is removed unread. Nil when the client sent none: the free path
// allocates nothing.
func setAsideClientCredentials(r *http.Request) *clientCredentials {
	c, _ := caddyhttp.GetVar(r.Context(), varClientCredentials).(*clientCredentials)
	h := r.Header
	auth, siwx, payment := h[keyWalletAuth], h[keySIWX], h[keyPaymentSignature]
	if len(auth)+len(siwx)+len(payment) == 0 {
		return c
	}
	delete(h, keyWalletAuth)
	delete(h, keySIWX)
	delete(h, keyPaymentSignature)
	if c != nil {
		return c
	}
	c = &clientCredentials{auth: auth, siwx: siwx}
	if len(payment) > 0 {
		c.payment = payment[0]
	}
	caddyhttp.SetVar(r.Context(), varClientCredentials, c)
	return c
}

// proofs returns the client's wallet proofs a wallet_auth reads: its
// X-Wallet-Auth, and its SIGN-IN-WITH-X when withSIWX. They stay for every
// later wallet_auth on the request, which judges them by its own settings
// (a SIGN-IN-WITH-X that one without siwx ignored is there for one with
// it); a nonce already claimed is marked (authSpent, siwxSpent).
func (c *clientCredentials) proofs(withSIWX bool) (auth, siwx []string) {
	if c == nil {
		return nil, nil
	}
	if withSIWX {
		siwx = c.siwx
	}
	return c.auth, siwx
}

// takePayment returns the client's PAYMENT-SIGNATURE for a gate, once: a
// later gate on the request never claims one payment again. An mcp_tool
// gate does not take it (it reads a tool call's payment in its _meta), so
// a gate pricing the endpoint finds it, before or after such a gate.
func (c *clientCredentials) takePayment() string {
	if c == nil {
		return ""
	}
	p := c.payment
	c.payment = ""
	return p
}

// hasPayment reports whether a PAYMENT-SIGNATURE is set aside for a gate
// to settle.
func (c *clientCredentials) hasPayment() bool { return c != nil && c.payment != "" }

// varWalletProven marks a request whose X-Aov-Wallet (and
// X-Aov-Wallet-Agent) wallet_auth set from a proof it verified: the gate
// keeps those, and removes them from any other request
// (clearClientHeaders). Only wallet_auth sets it.
const varWalletProven = "aov.wallet_auth.proven"

// varSettled holds the []*settledSlot of the wallet_auth on the request
// that wait to hear of its payment (recordPayments): one each, since
// each records paid access in its own store.
const varSettled = "aov.x402.settled"

// settledSlot is where the gate that settled the request's payment puts
// its settlement (noteSettled): how sign-in-with-x learns of a payment,
// from the gate itself and never from a PAYMENT-RESPONSE header, which an
// upstream can set as well as the gate can.
type settledSlot struct {
	sr x402.SettleResponse
	ok bool
}

// noteSettled tells every waiting wallet_auth (if any) that the request's
// payment, which g settled, settled as sr and its answer is being
// delivered. Only news of a settlement is told, once: a replay of one
// already told (a saved or held answer served again) is not, since
// wallet_auth records paid access from now and would renew it without a
// new payment.
//
// Nor is a payment an mcp_tool gate settled, which it read from the tool
// call's _meta: it paid for one call of one tool, while paid access is
// recorded for the path, the MCP endpoint every tool of it shares, and
// neither x402's sign-in-with-x nor its clients name a tool. Told, one
// payment for the cheapest tool would sign its payer in to all of them.
// The settling gate decides, not the request: wallet_auth waits on a
// request that carries PAYMENT-SIGNATURE, which the MCP gate drops unread,
// so the header alone must never decide; and a REST gate's settlement of
// that header on a request an MCP gate also read (one that prices the
// whole endpoint, beside one pricing a tool) paid for the path, and is
// told.
func (g *Gate) noteSettled(r *http.Request, sr x402.SettleResponse) {
	if g.MCPTool != "" {
		return
	}
	slots, _ := caddyhttp.GetVar(r.Context(), varSettled).([]*settledSlot)
	for _, s := range slots {
		s.sr, s.ok = sr, true
	}
}

// recordPayments wraps w so that a successful settlement of this request's
// payment, as its gate reports it (noteSettled), is recorded for
// sign-in-with-x before the answer goes out.
func (wa *WalletAuth) recordPayments(w http.ResponseWriter, r *http.Request, resource string) http.ResponseWriter {
	ctx := context.WithoutCancel(r.Context())
	slot := &settledSlot{}
	waiting, _ := caddyhttp.GetVar(r.Context(), varSettled).([]*settledSlot)
	caddyhttp.SetVar(r.Context(), varSettled, append(waiting, slot))
	return &statusWriter{ResponseWriter: w, onHeader: func(_ http.Header, status int) {
		sr := slot.sr
		if status >= 400 || !slot.ok || !sr.Success || sr.Payer == "" {
			return
		}
		if err := wa.paid.Record(ctx, sr.Payer, resource); err != nil {
			wa.logger.Warn("recording paid access for sign-in-with-x", zap.Error(err))
		}
	}}
}

// refuse answers a refused proof with 401 (or the store's 503, or the rate
// limit's 429) in the service's error shape.
func (wa *WalletAuth) refuse(w http.ResponseWriter, r *http.Request, err error) error {
	var we *walletauth.Error
	var e *apierr.Error
	if errors.As(err, &we) {
		e = we.APIError()
		if ce := wa.logger.Check(zapcore.DebugLevel, "wallet proof refused"); ce != nil {
			ce.Write(zap.String("reason", we.Error()))
		}
	} else if !errors.As(err, &e) {
		// The proof could not be checked: the nonce store or the chain is
		// unavailable. Never a silent pass.
		e = apierr.Unavailable("wallet proof check", 1, err)
	}
	if e.Status >= 500 {
		wa.logger.Error("wallet proof could not be checked", zap.Error(err))
	}
	refusedForNow(r, e, wa.logger)
	if e.Status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", walletauth.HeaderName)
	}
	// A refused proof counts like a gate's refusal, in every zone of its
	// server's gates, even past an empty budget: its check was the work.
	// So does a contract wallet's check that failed at the chain, although
	// it is no refusal: the client chose the contract wallet and each check
	// costs the operator's chain calls, so one proof resent would otherwise
	// cost RPC calls without bound.
	if errors.Is(err, walletauth.ErrChainCheck) || countsAgainstRate(e) {
		noteServerEvent(r)
	}
	apierr.Write(w, e)
	return nil
}

func parseWalletAuth(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	wa := new(WalletAuth)
	err := wa.UnmarshalCaddyfile(h.Dispenser)
	return wa, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens:
//
//	wallet_auth [<matcher>] [required|optional] {
//	    mode            required|optional
//	    max_lifetime    5m
//	    domains         <host[:port]> ...
//	    chain_rpc       <url>
//	    chain_timeout   5s
//	    store           <module> { ... }
//	    siwx
//	    siwx_access_ttl 720h
//	}
func (wa *WalletAuth) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	seen := caddyopt.Once{}
	if d.NextArg() {
		wa.Mode = d.Val()
		seen["mode"] = true
		if d.NextArg() {
			return d.ArgErr()
		}
	}
	for d.NextBlock(0) {
		if d.Val() != "domains" {
			if err := seen.Check(d); err != nil {
				return err
			}
		}
		var err error
		switch d.Val() {
		case "mode":
			err = oneArg(d, &wa.Mode)
		case "max_lifetime":
			err = durationArg(d, &wa.MaxLifetime)
		case "domains":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			wa.Domains = append(wa.Domains, args...)
		case "chain_rpc":
			err = oneArg(d, &wa.ChainRPC)
		case "chain_timeout":
			err = durationArg(d, &wa.ChainTimeout)
		case "store":
			wa.StoreRaw, err = guestModule(d, "x402.stores")
		case "siwx":
			if d.NextArg() {
				return d.ArgErr()
			}
			wa.SIWX = true
		case "siwx_access_ttl":
			err = durationArg(d, &wa.SIWXAccessTTL)
		default:
			return d.Errf("unrecognized wallet_auth option '%s'", d.Val())
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func durationArg(d *caddyfile.Dispenser, dst *caddy.Duration) error {
	var s string
	if err := oneArg(d, &s); err != nil {
		return err
	}
	dur, err := parseDuration(s)
	if err != nil {
		return d.Errf("bad duration %q: %v", s, err)
	}
	*dst = dur
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner           = (*WalletAuth)(nil)
	_ caddy.Validator             = (*WalletAuth)(nil)
	_ caddy.CleanerUpper          = (*WalletAuth)(nil)
	_ caddyhttp.MiddlewareHandler = (*WalletAuth)(nil)
	_ caddyfile.Unmarshaler       = (*WalletAuth)(nil)
)
