// Package server is verifierd's HTTP surface: the two verification routes
// (POST /verify/schema and POST /verify/deliverable, one check under two
// names), an agent's free history (GET /reputation/{agent_id}), its signed
// trust score (GET /score/{agent_id}), the MCP endpoint /mcp whose tools
// verify_schema and get_verification_record are the same code under
// another transport, GET /health, and the SPEC §6 error shape for
// everything else.
//
// Each verification is parsed and checked by package verify, signed by certd
// through package signer, recorded in the history (package store) and only
// then answered: a receipt leaves the process only when it is signed and
// recorded. The server never sees a payment header; how a call was paid is
// what the gateway reports in its X-Aov-* headers, trusted only with the
// gateway token (see gateway.go).
//
// It is not for: payment, allowances, TLS or rate limits (the gateway's,
// on /mcp too), keys (certd's), or the score formula (package score's).
package server

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/aovhq/aov/agentcard"
	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/receipt"
	"github.com/aovhq/aov/score"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/verify"
)

// Signer is certd's signing protocol as verifierd uses it; *signer.Client
// (over certd's socket) and *signer.Local (in process) implement it.
type Signer interface {
	CurrentKey(ctx context.Context) (string, error)
	Sign(ctx context.Context, signContext, keyVersion, attestedAt string, response []byte) (receipt.Attestation, error)
	// SignCanonical is Sign for a response already in RFC 8785 form.
	SignCanonical(ctx context.Context, signContext, keyVersion, attestedAt string, canonResponse []byte) (receipt.Attestation, error)
	Ping(ctx context.Context) error
}

// History is where verifications are recorded and read back for
// reputation; *store.DB implements it.
type History interface {
	// RecordVerification returns ctx's error only when nothing was
	// recorded: ctx carries the gateway's deadline, and a verification
	// refused for it must not count. A commit under way when it passes
	// is awaited.
	RecordVerification(ctx context.Context, v store.Verification) error
	Verifications(ctx context.Context, agentID, cursor string, limit int) ([]store.Verification, string, error)
	// AuthenticatedVerifications pages like Verifications through the
	// agent's authenticated records only (what a score of an owned agent
	// reads).
	AuthenticatedVerifications(ctx context.Context, agentID, cursor string, limit int) ([]store.Verification, string, error)
	AgentCounts(ctx context.Context, agentID string) (store.Counts, error)
	Ping(ctx context.Context) error
}

// DefaultServiceName is the "service" of every verify block unless
// configured otherwise: the name the agent card gives the service.
const DefaultServiceName = agentcard.DefaultName

// Config wires a Server. Verifier, Signer and History are required.
type Config struct {
	Verifier *verify.Verifier
	Signer   Signer
	History  History

	// PublicBaseURL is the service's public origin as callers see it
	// (through the gateway), e.g. https://verify.example.com. The verify
	// block of every receipt points at <base>/.well-known/agent-card.json
	// and <base>/mcp.
	PublicBaseURL string
	// ServiceName is the verify block's "service" (DefaultServiceName).
	ServiceName string

	// GatewayToken is the shared secret the gateway sends in
	// X-Aov-Gateway-Token. Empty: gateway headers are never trusted and
	// every call is recorded with payment "unknown".
	GatewayToken string

	// Owners records who owns an agent_id (see gateway.go). Nil: History's
	// own, when it keeps owners (*store.DB does); without any, only
	// account ids (wallet addresses, CAIP-10) can be authenticated.
	Owners store.Owners

	// UngatedPaidRoutes serves the paid routes (GET /score/{agent_id}, the
	// MCP tool get_verification_record) to callers without the gateway
	// token. Development only: those routes are paid at the gateway, and
	// without the token anyone who reaches verifierd gets them free.
	UngatedPaidRoutes bool

	// HealthTimeout bounds the health check's calls to certd and the store
	// (default 2 s).
	HealthTimeout time.Duration

	// Score is the trust score method (nil: score.Default()).
	Score *score.Method

	Logger  *slog.Logger // nil discards
	Metrics *Metrics     // nil: no metrics

	// NewID makes verification ids (default: random UUID v4).
	NewID func() (string, error)
	// Now is the verification clock (default time.Now).
	Now func() time.Time
}

// Server is verifierd's HTTP handler. It is safe for concurrent use.
type Server struct {
	v          *verify.Verifier
	signer     Signer
	history    History
	score      *score.Method
	mcp        http.Handler
	verify     receipt.VerifyBlock
	maxBody    int64
	gwToken    [32]byte
	gwEnabled  bool
	owners     store.Owners
	ungated    bool
	healthWait time.Duration
	log        *slog.Logger
	m          *Metrics
	newID      func() (string, error)
	now        func() time.Time
}

// New checks cfg and returns the handler.
func New(cfg Config) (*Server, error) {
	if cfg.Verifier == nil || cfg.Signer == nil || cfg.History == nil {
		return nil, errors.New("verifierd: a verifier, a signer and a history store are required")
	}
	base := strings.TrimRight(cfg.PublicBaseURL, "/")
	if !strings.HasPrefix(base, "http://") && !strings.HasPrefix(base, "https://") {
		return nil, fmt.Errorf("verifierd: public base URL %q must start with http:// or https://", cfg.PublicBaseURL)
	}
	s := &Server{
		v:       cfg.Verifier,
		signer:  cfg.Signer,
		history: cfg.History,
		score:   cfg.Score,
		verify: receipt.VerifyBlock{
			PublicKeyURL:     base + "/.well-known/agent-card.json",
			Canonicalization: receipt.Canonicalization,
			HashAlgorithm:    receipt.HashAlgorithm,
			Service:          cfg.ServiceName,
			MCP:              base + "/mcp",
		},
		maxBody:    cfg.Verifier.Config().MaxBodyBytes,
		healthWait: cfg.HealthTimeout,
		log:        cfg.Logger,
		m:          cfg.Metrics,
		newID:      cfg.NewID,
		now:        cfg.Now,
	}
	if s.verify.Service == "" {
		s.verify.Service = DefaultServiceName
	}
	if cfg.GatewayToken != "" {
		s.gwEnabled = true
		s.gwToken = sha256.Sum256([]byte(cfg.GatewayToken))
	}
	s.owners, s.ungated = cfg.Owners, cfg.UngatedPaidRoutes
	if s.owners == nil {
		s.owners, _ = cfg.History.(store.Owners)
	}
	if s.healthWait <= 0 {
		s.healthWait = 2 * time.Second
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.owners == nil {
		s.log.Warn("no agent owner store: only wallet-address and CAIP-10 agent ids can be authenticated")
	}
	if s.newID == nil {
		s.newID = newUUID
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.score == nil {
		s.score = score.Default()
	}
	s.mcp = s.newMCP(cfg.Verifier.Config().VerifierVersion)
	return s, nil
}

func newUUID() (string, error) {
	id, err := uuid.NewRandom()
	if err != nil {
		return "", fmt.Errorf("making verification id: %w", err)
	}
	return id.String(), nil
}

// route is one path the server answers, with the methods it accepts.
type route struct {
	name    string // metrics and log label
	methods []string
	serve   func(s *Server, w http.ResponseWriter, r *http.Request, rec *requestLog) error
}

// routes maps exact paths; reputationRoute takes /reputation/{agent_id}
// and scoreRoute /score/{agent_id}; anything else is 404.
var routes = map[string]route{
	"/verify/schema":      {name: "verify_schema", methods: []string{verify.Method}, serve: (*Server).serveVerify},
	"/verify/deliverable": {name: "verify_deliverable", methods: []string{verify.Method}, serve: (*Server).serveVerify},
	"/health":             {name: "health", methods: []string{http.MethodGet, http.MethodHead}, serve: (*Server).serveHealth},
	"/mcp":                {name: "mcp", methods: []string{http.MethodPost}, serve: (*Server).serveMCP},
	PathSettlement:        {name: "gateway_settlement", methods: []string{http.MethodPost}, serve: (*Server).serveSettlement},
}

var scoreRoute = route{name: "score", methods: []string{http.MethodGet, http.MethodHead}, serve: (*Server).serveScore}

var reputationRoute = route{name: "reputation", methods: []string{http.MethodGet, http.MethodHead}, serve: (*Server).serveReputation}

func lookupRoute(p string) (route, bool) {
	if rt, ok := routes[p]; ok {
		return rt, true
	}
	// A path with a "." or ".." segment, an empty one or a trailing slash
	// is no route (but a bare prefix, an empty agent id, gets its 422).
	// The gateway routes by the cleaned path (Caddy's matchers clean it)
	// but proxies the path as sent, so "/score/x/../../health" came
	// through its free /health route, with the gateway's token, and was
	// served here as a paid score.
	// score.PathNamesAgent is that rule, which the gateway's score_request
	// check shares, so it never sells a score path answered 404 here.
	if agent, ok := strings.CutPrefix(p, reputationPrefix); ok && score.PathNamesAgent(agent) {
		return reputationRoute, true
	}
	if agent, ok := strings.CutPrefix(p, scorePrefix); ok && score.PathNamesAgent(agent) {
		return scoreRoute, true
	}
	return route{}, false
}

// requestLog collects what the access log line and the metrics report about
// one request. It never holds request content.
type requestLog struct {
	route          string
	status         int
	verificationID string
	result         string
	payment        string
	tool           string // MCP tool called, if any
	toolError      string // code of the tool's isError result, if any
}

// exchange is the per-request state ServeHTTP keeps, in one allocation.
type exchange struct {
	sw  statusWriter
	rec requestLog
}

// ServeHTTP routes a request and answers every refusal in the SPEC §6 shape.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	x := &exchange{sw: statusWriter{ResponseWriter: w}, rec: requestLog{route: "unknown"}}
	rec, sw := &x.rec, &x.sw
	rt, ok := lookupRoute(r.URL.Path)
	var err error
	switch {
	case !ok:
		err = apierr.NotFound("endpoint")
	case !allowed(rt.methods, r.Method):
		rec.route = rt.name
		err = apierr.MethodNotAllowed(rt.methods...)
	default:
		rec.route = rt.name
		err = rt.serve(s, sw, r, rec)
	}
	if err != nil {
		e := apierr.From(err)
		apierr.Write(sw, e)
		switch {
		case e.Status >= 500 && r.Context().Err() != nil:
			// The caller went away (a client that gave up, the gateway
			// cancelling for its own client): nothing is wrong here, and
			// an operator's error alerts must not fire on it.
			s.log.Info("request abandoned by its caller", "route", rec.route, "status", e.Status, "code", e.Code, "error", errString(e.Cause), "verification_id", rec.verificationID)
		case e.Status >= 500:
			s.log.Error("request failed", "route", rec.route, "status", e.Status, "code", e.Code, "error", errString(e.Cause), "verification_id", rec.verificationID)
		}
	}
	rec.status = sw.status
	elapsed := time.Since(start)
	s.m.observeRequest(rec, elapsed)
	if s.log.Enabled(r.Context(), slog.LevelInfo) {
		s.logRequest(r, rec, elapsed)
	}
}

// logRequest writes the access log line of one request. It builds the
// record itself, with its attributes in a local array, rather than through
// Logger.LogAttrs, whose variadic slice escapes: one allocation less per
// request (the record still allocates for attributes beyond its first
// five). The line and its fields are those of Logger.LogAttrs.
func (s *Server) logRequest(r *http.Request, rec *requestLog, elapsed time.Duration) {
	var attrs [10]slog.Attr
	a := append(attrs[:0],
		slog.String("method", r.Method),
		slog.String("route", rec.route),
		slog.Int("status", rec.status),
		slog.Float64("duration_ms", float64(elapsed.Microseconds())/1000),
		slog.String("remote", r.RemoteAddr),
	)
	if rec.tool != "" {
		a = append(a, slog.String("tool", rec.tool))
		if rec.toolError != "" {
			a = append(a, slog.String("tool_error", rec.toolError))
		}
	}
	if rec.verificationID != "" {
		a = append(a, slog.String("verification_id", rec.verificationID),
			slog.String("result", rec.result), slog.String("payment", rec.payment))
	}
	// PC 0: no caller is recorded (the daemon's handler does not print a
	// source), which also saves Logger's runtime.Callers.
	lr := slog.NewRecord(time.Now(), slog.LevelInfo, "request", 0)
	lr.AddAttrs(a...)
	_ = s.log.Handler().Handle(r.Context(), lr) // as Logger.LogAttrs, a failing sink does not fail the request
}

func allowed(methods []string, m string) bool {
	for _, x := range methods {
		if x == m {
			return true
		}
	}
	return false
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// writeDoc answers 200 with a JSON document that no cache may keep (each
// is about this moment: a verification, a score, the service's health); a
// HEAD gets the headers only.
func writeDoc(w http.ResponseWriter, r *http.Request, doc []byte) {
	h := w.Header()
	// Shared, full slices instead of Header.Set's fresh one per value: an
	// Add by anyone after us appends to a copy, never to these.
	h["Content-Type"] = contentTypeJSON
	h["Cache-Control"] = cacheNoStore
	// The length, said before WriteHeader: net/http otherwise sends a
	// body over its 2 KiB buffer (a verification answer is about that)
	// chunked, which the gateway's proxy must then decode.
	h["Content-Length"] = []string{strconv.Itoa(len(doc))}
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		w.Write(doc)
	}
}

var (
	contentTypeJSON = []string{"application/json"}
	cacheNoStore    = []string{"no-store"}
)

// serveHealth answers 200 only when certd answers and the history store is
// open: a verifierd that cannot sign or record cannot serve a verification.
func (s *Server) serveHealth(w http.ResponseWriter, r *http.Request, _ *requestLog) error {
	ctx, cancel := context.WithTimeout(r.Context(), s.healthWait)
	defer cancel()
	if err := s.history.Ping(ctx); err != nil {
		return apierr.Unavailable("verification history store", 5, err)
	}
	if err := s.signer.Ping(ctx); err != nil {
		return apierr.Unavailable("signing service", 1, err)
	}
	writeDoc(w, r, []byte(`{"status":"ok"}`+"\n"))
	return nil
}

// statusWriter remembers the status code for logs and metrics.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Interface guards
var _ http.Handler = (*Server)(nil)
