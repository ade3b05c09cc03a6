package schema

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// heapInUse is the live heap after two collections.
func heapInUse() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// The cache's byte bound holds only if Schema.bytes counts what a compiled
// schema keeps. A schema within MaxBodyBytes whose default, examples, const
// or enum is a long array decodes to about 17 bytes of heap per byte of
// JSON. (Before: the values were kept and not counted: eight schemas of
// 960 KB held 133 MB while the cache counted 9 KB.)
func TestCacheBytesCoverValuesCompiledSchemasKeep(t *testing.T) {
	arr := "[" + strings.Repeat("1,", 480_000) + "1]" // ~960 KB
	for _, tc := range []struct{ name, tmpl string }{
		{"default", `{"$comment":"%d","default":%s}`},
		{"examples", `{"$comment":"%d","examples":[%s]}`},
		{"const", `{"$comment":"%d","const":%s}`},
		{"enum", `{"$comment":"%d","enum":[%s]}`},
		{"const of objects", `{"$comment":"%d","const":[` + strings.Repeat(`{"a":"xy","b":[1,"z"]},`, 4000) + `{}],"enum":[%s]}`},
		{"title and description", `{"$comment":"%d","title":"` + strings.Repeat("t", 400_000) + `","description":"` + strings.Repeat("d", 400_000) + `","x":%s}`},
		{"unknown keyword", `{"$comment":"%d","x-data":%s}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewCacheConfig(CacheConfig{})
			before := heapInUse()
			const n = 8
			for i := 0; i < n; i++ {
				sc := fmt.Sprintf(tc.tmpl, i, arr)
				if _, err := c.Compile(decode(t, sc), hashOf(sc)); err != nil {
					t.Fatal(err)
				}
			}
			held := heapInUse() - before
			runtime.KeepAlive(c)
			t.Logf("%d schemas: cache counts %d bytes, heap holds %d", c.Len(), c.Bytes(), held)
			if held > c.Bytes()+(1<<20) {
				t.Errorf("cache counts %d bytes for %d schemas, heap holds %d: its %d MiB bound does not bound what it keeps",
					c.Bytes(), c.Len(), held, DefaultCacheBytes>>20)
			}
		})
	}
}
