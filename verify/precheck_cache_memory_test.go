package verify

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/aovhq/aov/verify/schema"
)

// Precheck runs unpaid (the gateway answers 402 after it) and caches the
// request's schema. What the cache keeps must stay within
// SchemaCacheBytes whatever the schemas hold. (Before: a default or const
// of a long array within MaxBodyBytes kept about 16 MB per schema while the
// cache counted about 1 KB, so eight prechecks pinned 133 MB.)
func TestPrecheckedSchemasStayWithinTheCacheByteBound(t *testing.T) {
	arr := "[" + strings.Repeat("1,", 480_000) + "1]"
	for _, kw := range []string{"default", "const"} {
		t.Run(kw, func(t *testing.T) {
			v := New(Config{})
			before := heapAfterGC()
			for i := 0; i < 8; i++ {
				body := fmt.Sprintf(`{"task_id":"t","expected_schema":{"$comment":"%d","%s":%s},"submitted_output":1}`, i, kw, arr)
				if int64(len(body)) > v.cfg.MaxBodyBytes {
					t.Fatalf("body of %d bytes is over MaxBodyBytes", len(body))
				}
				if err := v.Precheck([]byte(body)); err != nil {
					t.Fatalf("precheck: %v", err)
				}
			}
			held := heapAfterGC() - before
			runtime.KeepAlive(v)
			if held > schema.DefaultCacheBytes {
				t.Errorf("8 prechecked schemas stay cached holding %d MiB, over SchemaCacheBytes (%d MiB)", held>>20, schema.DefaultCacheBytes>>20)
			}
		})
	}
}

func heapAfterGC() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}
