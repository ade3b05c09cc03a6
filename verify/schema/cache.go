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

// Cache keeps the most recently used compiled schemas, keyed by the schema
// hash the caller computed (SPEC §5: the SHA-256 of the schema's canonical
// JSON). Agents re-verify against the same few schemas, and compiling is
// far more expensive than evaluating, so the cache carries most of the load.
// It is safe for concurrent use; concurrent calls for the same uncached
// hash share one compilation.
type Cache struct {
	size int

	mu    sync.Mutex
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
// (DefaultCacheSize when size < 1).
func NewCache(size int) *Cache {
	if size < 1 {
		size = DefaultCacheSize
	}
	return &Cache{size: size, order: list.New(), byKey: make(map[string]*list.Element, size), compile: compile}
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
	c.byKey[key] = c.order.PushFront(&entry{key: key, sch: s})
	for c.order.Len() > c.size {
		last := c.order.Back()
		c.order.Remove(last)
		delete(c.byKey, last.Value.(*entry).key)
	}
}
