// Package signer is certd's signing protocol: the HTTP handler certd serves
// on its private socket, and the client verifierd uses to have responses
// signed. Local is the same signing in verifierd's own process, with the
// keys of certd's key directory, for one-machine installs (see its doc for
// what that gives up).
//
// The protocol is small JSON over HTTP, on a unix socket (mode 0600: file
// permissions are the authentication) or on a loopback TCP address with a
// shared bearer secret:
//
//	GET  /v1/key   → {"key_version":"k2","algorithm":"Ed25519"}
//	POST /v1/sign  <the signing input> → receipt.Attestation
//	GET  /health   → 200 while a signing key is loaded
//
// The body of a sign request is the document to be signed itself, as
// receipt.SigningInput builds it: the RFC 8785 bytes of {"algorithm",
// "attested_at", "context", "key_version", "response"}. certd signs those
// bytes as they are after checking that they are exactly that: canonical
// (parsed once, written canonically, compared), the five members with an
// allowed context, attested_at near its clock, the response's own times
// (verified_at, computed_at, inputs.window.to) that instant and its
// evidence dates not after it, and its current key version. No envelope
// is encoded or decoded and nothing is canonicalized twice.
//
// The caller names the key version it put into the response's verify block;
// certd signs only with its current key, the one whose published window
// holds now by certd's clock (keystore.Store.Current), so a response can
// never carry one key version in "verify" and a signature by another, nor
// a date outside its key's window. After a rotation takes effect the
// caller gets 409 stale_key_version with the current version and rebuilds.
//
// This package is not the public face of certd (that is the agent card) and
// must never be reachable through the gateway: anyone who can reach it can
// have arbitrary documents signed with the service's key.
package signer

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/keystore"
	"github.com/aovhq/aov/receipt"
)

// Protocol paths.
const (
	PathKey    = "/v1/key"
	PathSign   = "/v1/sign"
	PathHealth = "/health"
)

// CodeStaleKeyVersion is the error code of a sign request naming a key
// version that is not certd's current key (409).
const CodeStaleKeyVersion = "stale_key_version"

// Defaults of ServerConfig.
const (
	DefaultMaxSkew      = 60 * time.Second
	DefaultMaxBodyBytes = 4 << 20
)

// KeyInfo is the answer of GET /v1/key.
type KeyInfo struct {
	KeyVersion string `json:"key_version"`
	Algorithm  string `json:"algorithm"`
}

// StaleKeyBody is the 409 answer: the SPEC §6 error shape plus the current
// key version, so the caller can rebuild its response without another call.
type StaleKeyBody struct {
	*apierr.Error
	CurrentKeyVersion string `json:"current_key_version"`
}

// ServerConfig configures the signing handler.
type ServerConfig struct {
	// Keys is the key directory; its current key signs.
	Keys *keystore.Store
	// MaxSkew is how far attested_at may be from certd's clock (default
	// 60 s, at most receipt.MaxSigningSkew). It stops a caller from back-
	// or forward-dating receipts.
	MaxSkew time.Duration
	// MaxBodyBytes caps a sign request (default 4 MiB).
	MaxBodyBytes int64
	// Secret, when set, is the bearer token every /v1/ request must carry
	// (loopback TCP mode). On a unix socket the file mode authenticates.
	Secret string
	// Now is the clock attested_at is checked against, and the one
	// refusals for want of the secret are counted by; tests move it.
	Now func() time.Time
	// Logger receives one line per refusal (those for want of the secret,
	// which anyone may cause, at most once a minute with their count) and
	// per change of the signing state; nil is silent.
	Logger *slog.Logger
}

// Server is the signing handler. It is safe for concurrent use.
type Server struct {
	keys    *keystore.Store
	maxSkew time.Duration
	maxBody int64
	secret  [32]byte
	auth    bool
	now     func() time.Time
	log     *slog.Logger
	// unauthorized limits the log lines of requests refused for want of
	// the secret (see authorized).
	unauthorized logLimiter
}

// NewServer returns the signing handler.
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.Keys == nil {
		return nil, errors.New("signing server: no key store")
	}
	s := &Server{
		keys:    cfg.Keys,
		maxSkew: cfg.MaxSkew,
		maxBody: cfg.MaxBodyBytes,
		now:     cfg.Now,
		log:     cfg.Logger,
	}
	if s.maxSkew <= 0 {
		s.maxSkew = DefaultMaxSkew
	}
	if s.maxSkew > receipt.MaxSigningSkew {
		// Verifiers refuse a receipt dated further than this outside its
		// key's service life; signing further from the clock could make
		// genuine receipts of a key rotated just after fail.
		return nil, fmt.Errorf("signing server: max skew %v is above %v, the most receipt verifiers allow around a key's retirement", s.maxSkew, receipt.MaxSigningSkew)
	}
	if s.maxBody <= 0 {
		s.maxBody = DefaultMaxBodyBytes
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if cfg.Secret != "" {
		s.auth = true
		s.secret = sha256.Sum256([]byte(cfg.Secret))
	}
	return s, nil
}

// ServeHTTP routes the three protocol endpoints; every refusal is in the
// SPEC §6 error shape.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case PathHealth:
		s.ServeHealth(w, r)
	case PathKey:
		if s.authorized(w, r) && allowMethod(w, r, http.MethodGet) {
			s.key(w)
		}
	case PathSign:
		if s.authorized(w, r) && allowMethod(w, r, http.MethodPost) {
			s.sign(w, r)
		}
	default:
		apierr.Write(w, apierr.NotFound("signing endpoint"))
	}
}

// allowMethod answers 405 unless the request uses method. The key and sign
// endpoints check the secret first, so an unauthenticated caller learns
// nothing about them.
func allowMethod(w http.ResponseWriter, r *http.Request, method string) bool {
	if r.Method == method {
		return true
	}
	apierr.Write(w, apierr.MethodNotAllowed(method))
	return false
}

// authorized checks the bearer secret when one is configured. Both sides
// are hashed first so the comparison is constant-time in the length too.
func (s *Server) authorized(w http.ResponseWriter, r *http.Request) bool {
	if !s.auth {
		return true
	}
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	got := sha256.Sum256([]byte(token))
	if ok && subtle.ConstantTimeCompare(got[:], s.secret[:]) == 1 {
		return true
	}
	// Any local process can send these, so they must not fill the log:
	// the first is logged, then one line per refusalLogEvery at most.
	if n, ok := s.unauthorized.allow(s.now); ok {
		s.log.Warn("signing request refused: missing or wrong bearer secret", "remote", r.RemoteAddr, "path", r.URL.Path, "refused", n)
	}
	apierr.Write(w, apierr.Unauthorized("missing or wrong signing secret"))
	return false
}

// ServeHealth answers GET and HEAD /health: 200 naming the key in service
// while a key signs, 503 with the cause otherwise. It needs no secret, and
// it is also certd's public /health, so the two can never disagree; as
// anyone may ask it, it refreshes the key directory with the bound of
// keystore.Store.RefreshLimited (see currentKey in local.go).
func (s *Server) ServeHealth(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		apierr.Write(w, apierr.MethodNotAllowed(http.MethodGet, http.MethodHead))
		return
	}
	k, err := currentKey(s.keys, s.log, true, "", time.Time{})
	if err != nil {
		apierr.Write(w, apierr.Unavailable("signing key", 5, err))
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "key_version": k.Version})
}

func (s *Server) key(w http.ResponseWriter) {
	k, err := currentKey(s.keys, s.log, false, "", time.Time{})
	if err != nil {
		apierr.Write(w, apierr.Unavailable("signing key", 5, err))
		return
	}
	writeJSON(w, http.StatusOK, KeyInfo{KeyVersion: k.Version, Algorithm: receipt.Algorithm})
}

func (s *Server) sign(w http.ResponseWriter, r *http.Request) {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		apierr.Write(w, apierr.UnsupportedMediaType())
		return
	}
	body, err := readBody(w, r, s.maxBody)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			apierr.Write(w, apierr.TooLarge(s.maxBody))
			return
		}
		e := apierr.Invalid(apierr.Field{Field: "body", Problem: "could not be read to the end", Fix: "Send the whole request body again."})
		e.Cause = err
		apierr.Write(w, e)
		return
	}
	doc, err := receipt.ParseSigningInput(body)
	if err != nil {
		f := apierr.Field{Field: "body", Problem: err.Error(), Fix: "Send the bytes receipt.SigningInput builds: the canonical five-member signing document."}
		if se, ok := errors.AsType[*receipt.SigningInputError](err); ok {
			f.Problem = se.Problem
			if se.Field != "" {
				f.Field = se.Field
			}
		}
		s.log.Warn("sign request refused", "problems", f.Field+" "+f.Problem)
		apierr.Write(w, apierr.Invalid(f))
		return
	}
	at, f, ok := s.checkTime(doc.AttestedAt)
	if !ok {
		s.log.Warn("sign request refused", "problems", f.Field+" "+f.Problem)
		apierr.Write(w, apierr.Invalid(f))
		return
	}
	if err := doc.CheckTimes(); err != nil {
		f := apierr.Field{Field: "response", Problem: err.Error(),
			Fix: "Write verified_at, computed_at and inputs.window.to as the attested_at instant, and no evidence dated after it."}
		if se, ok := errors.AsType[*receipt.SigningInputError](err); ok {
			f.Field, f.Problem = se.Field, se.Problem
		}
		s.log.Warn("sign request refused", "problems", f.Field+" "+f.Problem)
		apierr.Write(w, apierr.Invalid(f))
		return
	}
	k, err := currentKey(s.keys, s.log, false, doc.KeyVersion, at)
	if err != nil {
		apierr.Write(w, apierr.Unavailable("signing key", 5, err))
		return
	}
	if doc.KeyVersion != k.Version {
		writeJSON(w, http.StatusConflict, StaleKeyBody{
			Error: &apierr.Error{
				Code:        CodeStaleKeyVersion,
				Message:     fmt.Sprintf("The key version in the request is not the current signing key %s; rebuild the response with key_version %s and sign again.", k.Version, k.Version),
				Status:      http.StatusConflict,
				NextActions: []apierr.Action{{Action: "use_current_key_version"}},
				Fields: []apierr.Field{{Field: "key_version", Problem: "is not the current signing key",
					Fix: fmt.Sprintf("Use %s in the response's verify block and in the sign request.", k.Version)}},
			},
			CurrentKeyVersion: k.Version,
		})
		return
	}
	sig := ed25519.Sign(k.Private, body)
	s.log.Debug("signed", "context", doc.Context, "key_version", k.Version, "attested_at", doc.AttestedAt)
	att := receipt.Attestation{Algorithm: receipt.Algorithm, KeyVersion: k.Version, Timestamp: doc.AttestedAt,
		Signature: base64.StdEncoding.EncodeToString(sig)}
	out := append(att.AppendJSON(make([]byte, 0, 160+len(k.Version)+len(doc.AttestedAt))), '\n')
	h := w.Header()
	h["Content-Type"] = jsonType
	h["Cache-Control"] = noStore
	w.WriteHeader(http.StatusOK)
	w.Write(out)
}

// refusalLogEvery is how often, at most, a kind of refusal anyone may
// cause is logged.
const refusalLogEvery = time.Minute

// logLimiter lets through the first of a kind of event, then at most one
// per refusalLogEvery, each with the number of events it stands for (the
// ones held back since the last let through, and itself).
type logLimiter struct {
	mu     sync.Mutex
	last   time.Time
	held   int
	logged bool
}

// allow records an event at the time clock reads and reports whether to
// log it, and how many events the line stands for. A clock that went back
// lets the next event through. The clock is read under the limiter's lock:
// a reading taken before it could be older than the one of an event let
// through meanwhile (its goroutine preempted in between), and would pass
// for a clock that went back, logging a second line at once.
func (l *logLimiter) allow(clock func() time.Time) (int, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := clock()
	l.held++
	if d := now.Sub(l.last); l.logged && d >= 0 && d < refusalLogEvery {
		return 0, false
	}
	n := l.held
	l.last, l.held, l.logged = now, 0, true
	return n, true
}

// Header values set without allocating on every signature.
var (
	jsonType = []string{"application/json"}
	noStore  = []string{"no-store"}
)

// readBody reads the whole body up to limit, into one buffer sized from the
// announced length (a signing input is read once, not grown in steps).
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	size := 512
	if r.ContentLength > 0 && r.ContentLength <= limit {
		size = int(r.ContentLength) + 1 // +1 so the read sees EOF without growing
	}
	buf := bytes.NewBuffer(make([]byte, 0, size))
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, limit))
	return buf.Bytes(), err
}

// checkTime accepts attested_at only as RFC 3339 within the allowed skew of
// certd's clock, so nobody can obtain a receipt dated far from when it was
// signed. It reads the time as verifiers do (receipt.ParseTime): one they
// refuse would make a receipt that never verifies. With the key chosen by
// the same clock (keystore.Store.Current: its window holds now), and the
// skew at most receipt.MaxSigningSkew, attested_at then lies in the key's
// window as verifiers widen it.
func (s *Server) checkTime(at string) (time.Time, apierr.Field, bool) {
	t, err := receipt.ParseTime(at)
	if err != nil {
		return t, apierr.Field{Field: "attested_at", Problem: "is not an RFC 3339 time",
			Fix: "Send a time such as 2026-11-29T21:22:28.123456+00:00."}, false
	}
	if d := s.now().Sub(t); d > s.maxSkew || d < -s.maxSkew {
		return t, apierr.Field{Field: "attested_at", Problem: fmt.Sprintf("is more than %s away from the signing service's clock", s.maxSkew),
			Fix: "Sign right after verifying, and keep both hosts' clocks synchronised (NTP)."}, false
	}
	return t, apierr.Field{}, true
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		apierr.Write(w, apierr.Internal(err))
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write(append(body, '\n'))
}

// Interface guards
var _ http.Handler = (*Server)(nil)
