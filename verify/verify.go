// Package verify turns a verification request (SPEC §3) into a verification
// result (SPEC §4): it parses and validates the request, computes the four
// receipt hashes (SPEC §5), runs the schema, bounds, rule and strict-content
// checks, counts them, and writes the unsigned result document in the exact
// key order of the contract.
//
// One parser serves every entry point (verifierd's REST routes, its MCP
// tool, the gateway's seller mode), so a request means the same thing and
// is refused for the same reasons wherever it arrives. A refusal is an
// *apierr.Error naming every bad field with a fix; the submitted content is
// never echoed back, in refusals or in results.
//
// It is not for: signing (the caller sets Result.Verify and
// Result.Attestation with certd's answer), HTTP, history or payment. JSON
// Schema compilation and evaluation live in verify/schema; canonical JSON
// and hashing in receipt.
package verify

import (
	"github.com/aovhq/aov/verify/schema"
)

// Default limits. Each bounds the work one request can cause; all are far
// above what a real invoice, report or deliverable needs.
const (
	DefaultMaxBodyBytes    = 1 << 20 // 1 MiB
	DefaultMaxDepth        = 64
	DefaultMaxRules        = 100
	DefaultMaxBounds       = 100
	DefaultListCap         = 50
	DefaultSchemaCacheSize = 256
)

// Config sets the limits of a Verifier. A zero field takes its default.
type Config struct {
	// MaxBodyBytes is the absolute size limit of a request body; a larger
	// body is refused with 413 payload_too_large.
	MaxBodyBytes int64
	// MaxDepth is the deepest nesting of arrays and objects in the whole
	// request body (the request object itself is level 1).
	MaxDepth int
	// MaxRules and MaxBounds bound the rules array and the bounds object.
	MaxRules, MaxBounds int
	// ListCap is how many entries errors, errors_detail, flags and hints
	// each show at most; the rest are counted in their _omitted field.
	ListCap int
	// SchemaCacheSize is how many compiled schemas are kept, by schema hash.
	SchemaCacheSize int
	// MaxSchemaSteps bounds the work of evaluating the schema on the
	// output, in schema applications (see verify/schema); a request over it
	// is refused with 422. Zero means the verify/schema default.
	MaxSchemaSteps int
	// VerifierVersion is reported as verifier_version in every result.
	VerifierVersion string
}

// withDefaults fills every zero limit.
func (c Config) withDefaults() Config {
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.MaxDepth <= 0 {
		c.MaxDepth = DefaultMaxDepth
	}
	if c.MaxRules <= 0 {
		c.MaxRules = DefaultMaxRules
	}
	if c.MaxBounds <= 0 {
		c.MaxBounds = DefaultMaxBounds
	}
	if c.ListCap <= 0 {
		c.ListCap = DefaultListCap
	}
	if c.SchemaCacheSize <= 0 {
		c.SchemaCacheSize = DefaultSchemaCacheSize
	}
	return c
}

// Verifier parses requests and checks them. It is safe for concurrent use;
// its only state is the compiled-schema cache, which is why one Verifier
// should serve the whole process.
type Verifier struct {
	cfg   Config
	cache *schema.Cache
}

// New returns a Verifier with cfg's limits (zero fields take defaults).
func New(cfg Config) *Verifier {
	cfg = cfg.withDefaults()
	return &Verifier{cfg: cfg, cache: schema.NewCache(cfg.SchemaCacheSize)}
}

// Config returns the effective configuration, defaults filled in.
func (v *Verifier) Config() Config { return v.cfg }
