package signer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/receipt"
	"github.com/aovhq/aov/strictjson"
)

// Defaults of ClientConfig.
const (
	DefaultTimeout     = 5 * time.Second
	DefaultDialTimeout = 2 * time.Second
	DefaultKeyCacheTTL = 5 * time.Second
)

// ClientConfig says where certd's signing endpoint is. Exactly one of Socket
// and URL is set.
type ClientConfig struct {
	// Socket is the path of certd's unix socket.
	Socket string
	// URL is the base URL of certd's loopback TCP endpoint, e.g.
	// http://127.0.0.1:8091; Secret is its bearer secret.
	URL    string
	Secret string
	// Timeout bounds each call (default 5 s), and with it the wait for the
	// answer's headers: a certd that is stopped or stalled (its socket
	// still accepts) makes the call a retryable 503, never a hang.
	Timeout time.Duration
	// DialTimeout bounds connecting to certd (default 2 s).
	DialTimeout time.Duration
	// KeyCacheTTL is how long CurrentKey trusts its last answer (default
	// 5 s). A rotation is noticed sooner: a stale sign refreshes it.
	KeyCacheTTL time.Duration
}

// Client calls certd's signing protocol. It is safe for concurrent use.
type Client struct {
	base   string
	secret string
	http   *http.Client
	ttl    time.Duration

	mu      sync.Mutex
	key     string
	keyTime time.Time
}

// StaleKeyError reports that certd's current key is not the one the caller
// signed for (a rotation happened). Current is the key version to rebuild
// the response with.
type StaleKeyError struct {
	Current string
}

func (e *StaleKeyError) Error() string {
	return fmt.Sprintf("signing key version is stale: the current key is %s", e.Current)
}

// NewClient returns a client for the endpoint cfg names.
func NewClient(cfg ClientConfig) *Client {
	c := &Client{secret: cfg.Secret, ttl: cfg.KeyCacheTTL}
	if c.ttl <= 0 {
		c.ttl = DefaultKeyCacheTTL
	}
	timeout := cfg.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	dial := cfg.DialTimeout
	if dial <= 0 {
		dial = DefaultDialTimeout
	}
	d := net.Dialer{Timeout: dial}
	tr := &http.Transport{
		DialContext:           d.DialContext,
		MaxIdleConns:          64,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: timeout,
		DisableCompression:    true,
	}
	if cfg.Socket != "" {
		socket := cfg.Socket
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", socket)
		}
		c.base = "http://certd"
	} else {
		tr.Proxy = nil // a signing request never goes through a proxy
		c.base = strings.TrimRight(cfg.URL, "/")
	}
	c.http = &http.Client{Transport: tr, Timeout: timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return c
}

// CurrentKey reports certd's current key version, cached for a few seconds
// so a busy verifier does not ask before every signature.
func (c *Client) CurrentKey(ctx context.Context) (string, error) {
	c.mu.Lock()
	if c.key != "" && time.Since(c.keyTime) < c.ttl {
		k := c.key
		c.mu.Unlock()
		return k, nil
	}
	c.mu.Unlock()
	var info KeyInfo
	if err := c.call(ctx, http.MethodGet, PathKey, nil, &info); err != nil {
		return "", err
	}
	if info.KeyVersion == "" || info.Algorithm != receipt.Algorithm {
		return "", apierr.Internal(fmt.Errorf("signing service sent an unusable key answer (version %q, algorithm %q)", info.KeyVersion, info.Algorithm))
	}
	c.setKey(info.KeyVersion)
	return info.KeyVersion, nil
}

func (c *Client) setKey(k string) {
	c.mu.Lock()
	c.key, c.keyTime = k, time.Now()
	c.mu.Unlock()
}

// Sign has response (a JSON object without "attestation", whose verify block
// names keyVersion) signed under signContext (receipt.ContextVerify or
// receipt.ContextScore) at attestedAt.
//
// Errors: *StaleKeyError when keyVersion is no longer current (the cache is
// updated; rebuild the response with e.Current and sign again); an
// *apierr.Error 503 (retryable) when certd cannot be reached; an
// *apierr.Error 500 for a refusal, which means a bug on the calling side.
func (c *Client) Sign(ctx context.Context, signContext, keyVersion, attestedAt string, response []byte) (receipt.Attestation, error) {
	return c.sign(ctx, appendSigningInput, signContext, keyVersion, attestedAt, response)
}

// SignCanonical is Sign for a response already in RFC 8785 form (see
// receipt.SigningInputCanonical): the signing input is assembled around it
// without canonicalizing it again. certd checks the input's form as it
// checks every input.
func (c *Client) SignCanonical(ctx context.Context, signContext, keyVersion, attestedAt string, canonResponse []byte) (receipt.Attestation, error) {
	return c.sign(ctx, receipt.AppendSigningInputCanonical, signContext, keyVersion, attestedAt, canonResponse)
}

// signingInput is receipt.AppendSigningInputCanonical or
// appendSigningInput.
type signingInput func(dst []byte, context, keyVersion, attestedAt string, response []byte) ([]byte, error)

// appendSigningInput is receipt.SigningInput as a signingInput; it
// canonicalizes into a buffer of its own.
func appendSigningInput(_ []byte, context, keyVersion, attestedAt string, response []byte) ([]byte, error) {
	return receipt.SigningInput(context, keyVersion, attestedAt, response)
}

func (c *Client) sign(ctx context.Context, input signingInput, signContext, keyVersion, attestedAt string, response []byte) (receipt.Attestation, error) {
	body, err := input(nil, signContext, keyVersion, attestedAt, response)
	if err != nil {
		return receipt.Attestation{}, apierr.Internal(fmt.Errorf("building the signing input: %w", err))
	}
	var answer json.RawMessage
	if err := c.call(ctx, http.MethodPost, PathSign, body, &answer); err != nil {
		return receipt.Attestation{}, err
	}
	att, err := readAttestation(answer)
	if err != nil {
		return receipt.Attestation{}, apierr.Internal(fmt.Errorf("signing service sent an unusable attestation: %w", err))
	}
	if att.Algorithm != receipt.Algorithm || att.KeyVersion != keyVersion || att.Timestamp != attestedAt {
		return receipt.Attestation{}, apierr.Internal(errors.New("signing service sent an attestation that does not match the request"))
	}
	return att, nil
}

// readAttestation reads certd's sign answer as every verifier reads the
// attestation it becomes (receipt.ReadAttestation): what passes here
// verifies wherever the receipt is checked; anything else is refused
// before verifierd attaches it to a response or charges for it.
func readAttestation(answer []byte) (receipt.Attestation, error) {
	v, err := strictjson.Decode(answer, strictjson.Limits{})
	if err != nil {
		return receipt.Attestation{}, err
	}
	att, _, err := receipt.ReadAttestation(v)
	if err != nil {
		return receipt.Attestation{}, fmt.Errorf("the answer%w", err)
	}
	return att, nil
}

// Ping reports whether certd answers and has a signing key.
func (c *Client) Ping(ctx context.Context) error {
	return c.call(ctx, http.MethodGet, PathHealth, nil, nil)
}

// call does one request and decodes a 200 answer into out.
func (c *Client) call(ctx context.Context, method, path string, body []byte, out any) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return apierr.Internal(fmt.Errorf("building signing request: %w", err))
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.secret != "" {
		req.Header.Set("Authorization", "Bearer "+c.secret)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return apierr.Unavailable("signing service", 1, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return apierr.Unavailable("signing service", 1, fmt.Errorf("reading signing answer: %w", err))
	}
	if resp.StatusCode == http.StatusOK {
		if out == nil {
			return nil
		}
		if err := json.Unmarshal(data, out); err != nil {
			return apierr.Internal(fmt.Errorf("decoding signing answer: %w", err))
		}
		return nil
	}
	var e struct {
		Code              string `json:"code"`
		CurrentKeyVersion string `json:"current_key_version"`
		Fields            []apierr.Field
	}
	json.Unmarshal(data, &e) // best effort: the status alone decides below
	switch {
	case resp.StatusCode == http.StatusConflict && e.Code == CodeStaleKeyVersion && e.CurrentKeyVersion != "":
		c.setKey(e.CurrentKeyVersion)
		return &StaleKeyError{Current: e.CurrentKeyVersion}
	case resp.StatusCode >= 500:
		return apierr.Unavailable("signing service", 1, fmt.Errorf("signing service answered %d %s", resp.StatusCode, e.Code))
	default:
		detail := ""
		if len(e.Fields) > 0 {
			detail = fmt.Sprintf(" (%s %s)", e.Fields[0].Field, e.Fields[0].Problem)
		}
		return apierr.Internal(fmt.Errorf("signing service refused %s %s: %d %s%s", method, path, resp.StatusCode, e.Code, detail))
	}
}
