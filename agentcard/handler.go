package agentcard

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/keystore"
)

// DefaultMaxAge is how long clients may cache the card. It is short so that
// a rotation reaches verifiers within a minute: a receipt signed by a key
// newer than a cached card sends its verifier back for a fresh copy anyway.
const DefaultMaxAge = 60 * time.Second

// Handler serves the agent card. It re-reads the key directory on every
// request (one stat when nothing changed), so a rotation or compromise mark
// made by `certd rotate` or `certd compromise` shows without a restart, and
// rebuilds the card only when the key history changed.
//
// When the key directory cannot be fully loaded, the card shows the newest
// key history that could be read (keystore.Store.List), not a 503: if the
// index loaded and only a private key file failed, that is the new index,
// so a compromise mark is published at once although certd cannot sign
// with the new key yet (it answers 503 meanwhile); if the index itself
// cannot be read, it is the history loaded before, which nothing readable
// contradicts. A 503 would leave verifiers with no card at all, unable to
// check even old receipts, for as long as the directory is broken.
type Handler struct {
	cfg    Config
	keys   *keystore.Store
	maxAge time.Duration
	log    *slog.Logger

	mu    sync.Mutex
	print string // key history the cached card was built from
	body  []byte
	etag  string
}

// NewHandler returns the card handler. It builds the card once to fail at
// start-up on a bad configuration rather than on the first request.
func NewHandler(cfg Config, keys *keystore.Store, maxAge time.Duration, logger *slog.Logger) (*Handler, error) {
	if maxAge <= 0 {
		maxAge = DefaultMaxAge
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	h := &Handler{cfg: cfg, keys: keys, maxAge: maxAge, log: logger}
	if _, _, err := h.card(); err != nil {
		return nil, err
	}
	return h, nil
}

// card returns the current card bytes and ETag, rebuilding them when the key
// history changed.
func (h *Handler) card() ([]byte, string, error) {
	if _, err := h.keys.Refresh(); err != nil {
		h.log.Error("reloading keys failed; the card shows the newest key history that could be read", "error", err)
	}
	list := h.keys.List()
	fp := fingerprint(list)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.body != nil && fp == h.print {
		return h.body, h.etag, nil
	}
	c, err := Build(h.cfg, list)
	if err != nil {
		return nil, "", err
	}
	body, err := c.Marshal()
	if err != nil {
		return nil, "", err
	}
	sum := sha256.Sum256(body)
	h.print, h.body, h.etag = fp, body, `"`+hex.EncodeToString(sum[:16])+`"`
	h.log.Info("agent card built", "current_key_version", c.Capabilities.Extensions[0].Params.CurrentKeyVersion, "key_versions", len(list))
	return h.body, h.etag, nil
}

func fingerprint(keys []keystore.Key) string {
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k.Version)
		b.WriteByte('|')
		b.WriteString(k.Status())
		for _, t := range []time.Time{k.CreatedAt, k.RetiredAt, k.CompromisedSince} {
			b.WriteByte('|')
			b.WriteString(strconv.FormatInt(t.UnixNano(), 10))
		}
		b.WriteByte(';')
	}
	return b.String()
}

// ServeHTTP answers GET and HEAD with the card, an ETag and a short
// Cache-Control; If-None-Match gets 304.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		apierr.Write(w, apierr.MethodNotAllowed(http.MethodGet, http.MethodHead))
		return
	}
	body, etag, err := h.card()
	if err != nil {
		h.log.Error("building agent card failed", "error", err)
		apierr.Write(w, apierr.Unavailable("agent card", 5, err))
		return
	}
	hd := w.Header()
	hd.Set("Content-Type", "application/json")
	hd.Set("Cache-Control", "public, max-age="+strconv.Itoa(int(h.maxAge/time.Second)))
	hd.Set("ETag", etag)
	// The card is public data that browser-based verifiers fetch.
	hd.Set("Access-Control-Allow-Origin", "*")
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(body))
}

// Interface guards
var _ http.Handler = (*Handler)(nil)
