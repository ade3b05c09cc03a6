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
// Result.Attestation with certd's answer), HTTP (but for the request's
// method and media type, Method and CheckMediaType, which verifierd and the
// gateway's check must read alike), history or payment. JSON
// Schema compilation and evaluation live in verify/schema; canonical JSON
// and hashing in receipt.
package verify

import (
	"runtime"
	"time"

	"github.com/aovhq/aov/internal/buildinfo"
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
	// DefaultTimeout is the wall-clock limit of one verification. The
	// deterministic budgets below keep every request far under it on an
	// idle machine; it is the backstop for a loaded one.
	DefaultTimeout = 5 * time.Second
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
	// SchemaCacheBytes bounds the estimated memory of the compiled schemas
	// kept (schema.DefaultCacheBytes when zero).
	SchemaCacheBytes int64
	// MaxSchemaSteps bounds the work of evaluating the schema on the
	// output, in schema applications (see verify/schema); a request over it
	// is refused with 422. Zero means the verify/schema default.
	MaxSchemaSteps int
	// MaxRegexWork bounds the regular-expression work of one evaluation,
	// pattern size × string length summed over every match
	// (schema.DefaultMaxRegexWork when zero); a request over it is refused
	// with 422 before the match that would pass it runs.
	MaxRegexWork int64
	// MaxIntegrityWork bounds the work of the bounds and rules of one
	// request on its output (DefaultMaxIntegrityWork when zero; see
	// work.go for the units). It is counted before any check runs, and a
	// request over it is refused with 422.
	MaxIntegrityWork int64
	// MaxPatternSize bounds one pattern of a schema, in compiled program
	// instructions with two character-class ranges counting one
	// (schema.DefaultMaxPatternSize when zero); a larger one is a 422, and
	// so is one whose classes hold more than twice as many ranges, refused
	// before it is parsed.
	MaxPatternSize int
	// MaxSchemas bounds the values of one expected_schema, every value
	// where a subschema belongs and every object, data included
	// (schema.DefaultMaxSchemas when zero); a larger schema is a 422.
	MaxSchemas int
	// MaxConcurrent bounds how many verifications (schema compile,
	// evaluation and integrity checks) run at once (DefaultMaxConcurrent
	// when zero); the others wait for a slot within their Timeout.
	// Verification is CPU-bound, so more would not finish sooner, and the
	// bound is what caps the memory of many hostile requests together:
	// each holds at most one compile's and evaluation's worth.
	MaxConcurrent int
	// Timeout is the wall-clock limit of one verification (DefaultTimeout
	// when zero). Past it, or when the caller's context ends, the work
	// stops and the caller gets 503 verification_timeout. The schema
	// validator alone cannot be stopped: a validation already running
	// finishes first, within the work MaxSchemaSteps charged for it.
	Timeout time.Duration
	// VerifierVersion is reported as verifier_version in every result;
	// empty means the build's own version (internal/buildinfo).
	VerifierVersion string
}

// DefaultMaxConcurrent is MaxConcurrent when zero: twice GOMAXPROCS. The
// gateway bounds its own schema compiles (the precheck before a 402) by it
// too, so that it holds no more of them at once than verifierd would.
func DefaultMaxConcurrent() int { return 2 * runtime.GOMAXPROCS(0) }

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
	if c.SchemaCacheBytes <= 0 {
		c.SchemaCacheBytes = schema.DefaultCacheBytes
	}
	if c.MaxSchemaSteps <= 0 {
		c.MaxSchemaSteps = schema.DefaultMaxSteps
	}
	if c.MaxRegexWork <= 0 {
		c.MaxRegexWork = schema.DefaultMaxRegexWork
	}
	if c.MaxIntegrityWork <= 0 {
		c.MaxIntegrityWork = DefaultMaxIntegrityWork
	}
	if c.MaxPatternSize <= 0 {
		c.MaxPatternSize = schema.DefaultMaxPatternSize
	}
	if c.MaxSchemas <= 0 {
		c.MaxSchemas = schema.DefaultMaxSchemas
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.MaxConcurrent <= 0 {
		c.MaxConcurrent = DefaultMaxConcurrent()
	}
	if c.VerifierVersion == "" {
		c.VerifierVersion = buildinfo.Version("")
	}
	return c
}

// Verifier parses requests and checks them. It is safe for concurrent use;
// its only state is the compiled-schema cache, which is why one Verifier
// should serve the whole process.
type Verifier struct {
	cfg   Config
	cache *schema.Cache
	slots chan struct{} // one per running evaluation
}

// New returns a Verifier with cfg's limits (zero fields take defaults).
func New(cfg Config) *Verifier {
	cfg = cfg.withDefaults()
	return &Verifier{cfg: cfg, slots: make(chan struct{}, cfg.MaxConcurrent), cache: schema.NewCacheConfig(schema.CacheConfig{
		Entries: cfg.SchemaCacheSize, MaxBytes: cfg.SchemaCacheBytes, MaxPatternSize: cfg.MaxPatternSize, MaxSchemas: cfg.MaxSchemas,
	})}
}

// Config returns the effective configuration, defaults filled in.
func (v *Verifier) Config() Config { return v.cfg }
