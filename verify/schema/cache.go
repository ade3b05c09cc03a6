package schema

import (
	"container/list"
	"sync"
	"sync/atomic"

	"golang.org/x/sync/singleflight"
)

// DefaultCacheSize is the number of compiled schemas kept when NewCache is
// given a size below one.
const DefaultCacheSize = 256

// DefaultCacheBytes bounds the memory the compiled schemas of a cache hold
// (as Schema estimates it) when CacheConfig.MaxBytes is 0. An invoice
// schema holds about 15 KB, a 1 MB schema of 25,000 properties about 28 MB:
// counting entries alone would let 256 unique large schemas hold gigabytes.
const DefaultCacheBytes = 64 << 20

// CacheConfig sets the limits of a Cache; a zero field takes its default.
type CacheConfig struct {
	// Entries is how many compiled schemas are kept (DefaultCacheSize).
	Entries int
	// MaxBytes bounds their estimated memory (DefaultCacheBytes). A schema
	// larger than this on its own is compiled and used, but not kept.
	MaxBytes int64
	// MaxPatternSize bounds one regular expression of a schema, in program
	// instructions with two character-class ranges counting one
	// (DefaultMaxPatternSize); a larger one does not compile, and one whose
	// classes hold more than twice as many ranges is not even parsed.
	MaxPatternSize int
	// MaxSchemas bounds the values of one schema: every value where a
	// subschema belongs and every object, data included, each counting
	// one more per 256 bytes of its location (DefaultMaxSchemas,
	// countObjects); a larger schema does not compile.
	MaxSchemas int
}

// Cache keeps the most recently used compiled schemas, keyed by the schema
// hash the caller computed (SPEC §5: the SHA-256 of the schema's canonical
// JSON). Agents re-verify against the same few schemas, and compiling is
// far more expensive than evaluating, so the cache carries most of the load.
// It is safe for concurrent use; concurrent calls for the same uncached
// hash share one compilation.
type Cache struct {
	size     int
	maxBytes int64

	mu    sync.Mutex
	bytes int64      // estimated memory of the schemas held
	order *list.List // front = most recently used; values are *entry
	byKey map[string]*list.Element

	flight   singleflight.Group
	compiles atomic.Int64 // compilations run, for tests and metrics

	// opts is the zero value except in tests.
	opts compileOptions
	// compile is the package's compile; tests wrap it to hold a compilation
	// open while other callers arrive.
	compile func(any, compileOptions) (*Schema, error)
}

type entry struct {
	key string
	sch *Schema
}

// NewCache returns a cache holding at most size compiled schemas
// (DefaultCacheSize when size < 1) and the default limits otherwise.
func NewCache(size int) *Cache {
	return NewCacheConfig(CacheConfig{Entries: size})
}

// NewCacheConfig returns a cache with cfg's limits.
func NewCacheConfig(cfg CacheConfig) *Cache {
	if cfg.Entries < 1 {
		cfg.Entries = DefaultCacheSize
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultCacheBytes
	}
	return &Cache{size: cfg.Entries, maxBytes: cfg.MaxBytes, order: list.New(),
		byKey: make(map[string]*list.Element, cfg.Entries), compile: compile,
		opts: compileOptions{maxPatternSize: cfg.MaxPatternSize, maxSchemas: cfg.MaxSchemas}}
}

// Compile returns the compiled form of schemaTree, a decoded JSON value
// (map[string]any, []any, string, json.Number, bool, nil), cached under
// hash. The hash must identify the tree's content (equal hashes, equal
// schemas): the cache trusts it and does not compare trees. Compile never
// fetches anything; a failure is a *CompileError. Failures are not cached.
func (c *Cache) Compile(schemaTree any, hash string) (*Schema, error) {
	if s := c.get(hash); s != nil {
		return s, nil
	}
	v, err, _ := c.flight.Do(hash, func() (any, error) {
		if s := c.get(hash); s != nil { // compiled while we waited for the flight
			return s, nil
		}
		c.compiles.Add(1)
		s, err := c.compile(schemaTree, c.opts)
		if err != nil {
			return nil, err
		}
		c.put(hash, s)
		return s, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*Schema), nil
}

// Bytes reports the estimated memory of the compiled schemas held.
func (c *Cache) Bytes() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bytes
}

// Len reports how many compiled schemas the cache holds.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}

func (c *Cache) get(key string) *Schema {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.byKey[key]
	if !ok {
		return nil
	}
	c.order.MoveToFront(el)
	return el.Value.(*entry).sch
}

func (c *Cache) put(key string, s *Schema) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.byKey[key]; ok {
		c.order.MoveToFront(el)
		return
	}
	if s.bytes > c.maxBytes {
		return
	}
	c.byKey[key] = c.order.PushFront(&entry{key: key, sch: s})
	c.bytes += s.bytes
	for c.order.Len() > c.size || c.bytes > c.maxBytes {
		last := c.order.Back()
		c.order.Remove(last)
		e := last.Value.(*entry)
		delete(c.byKey, e.key)
		c.bytes -= e.sch.bytes
	}
}
