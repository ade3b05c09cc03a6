package agentcard

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/keystore"
	"github.com/aovhq/aov/receipt"
)

// DefaultMaxAge is how long clients may cache the card. It is short so that
// a rotation reaches verifiers within a minute: a receipt signed by a key
// newer than a cached card sends its verifier back for a fresh copy anyway.
const DefaultMaxAge = 60 * time.Second

// Handler serves the agent card. It re-reads the key directory on every
// request (one stat when nothing changed; at most once per
// keystore.RetryEvery while it does not load, see refresh), so a rotation
// or compromise mark made by `certd rotate` or `certd compromise` shows
// without a restart, and rebuilds the card only when what it publishes of
// the key history changed: a new index, or the instant certd's clock
// passes a key's created_at or retired_at and another key is in service
// (the statuses and currentKeyVersion follow the key certd signs with).
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

	mu   sync.Mutex
	pubs []receipt.PublicKey // the key entries the cached card publishes
	body []byte
	etag string
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
	h.refresh()
	// The card is rebuilt exactly when what it publishes of the keys
	// changes: those entries are the comparison, not a digest of some of
	// the fields they come from.
	keys := h.keys.List()
	pubs, err := published(keys, h.keys.Statuses(keys))
	if err != nil {
		return nil, "", err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.body != nil && slices.Equal(pubs, h.pubs) {
		return h.body, h.etag, nil
	}
	c, err := build(h.cfg, pubs)
	if err != nil {
		return nil, "", err
	}
	body, err := c.Marshal()
	if err != nil {
		return nil, "", err
	}
	sum := sha256.Sum256(body)
	h.pubs, h.body, h.etag = pubs, body, `"`+hex.EncodeToString(sum[:16])+`"`
	h.log.Info("agent card built", "current_key_version", c.Capabilities.Extensions[0].Params.CurrentKeyVersion, "key_versions", len(pubs))
	return h.body, h.etag, nil
}

// refresh re-reads the key directory for a card request, which anyone may
// send: a directory that fails to load is retried at most once per
// keystore.RetryEvery (keystore.Store.RefreshLimited), the card meanwhile
// being the last history read, and the state is logged once per change of
// its cause and once when signing resumes (keystore.Store.StateChanged,
// shared with the signing path), not once per request.
func (h *Handler) refresh() {
	h.keys.RefreshLimited() // a failure is Current's error
	_, err := h.keys.Current()
	if h.keys.StateChanged(err) {
		if err != nil {
			h.log.Error("not signing until a key is in service; the card shows the newest key history that could be read", "error", err)
		} else {
			h.log.Info("signing again")
		}
	}
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
