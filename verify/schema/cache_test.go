package schema

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

func TestCacheKeepsTheMostRecentlyUsed(t *testing.T) {
	c := NewCache(2)
	schemas := map[string]string{"a": `{"type": "string"}`, "b": `{"type": "integer"}`, "c": `{"type": "boolean"}`}
	get := func(k string) *Schema {
		t.Helper()
		s, err := c.Compile(decode(t, schemas[k]), k)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a := get("a")
	get("b")
	if get("a") != a {
		t.Fatal("a cached schema was compiled again")
	}
	get("c") // evicts b, the least recently used
	if c.Len() != 2 {
		t.Fatalf("Len() = %d; want the bound, 2", c.Len())
	}
	before := c.compiles.Load()
	if get("a") != a {
		t.Error("a, used recently, was evicted")
	}
	if c.compiles.Load() != before {
		t.Error("a was compiled again")
	}
	get("b")
	if c.compiles.Load() != before+1 {
		t.Error("b should have been evicted and compiled again")
	}
}

func TestCacheDoesNotKeepFailures(t *testing.T) {
	c := NewCache(4)
	bad := `{"type": "strin"}`
	for i := 0; i < 2; i++ {
		if _, err := c.Compile(decode(t, bad), "h"); err == nil {
			t.Fatal("a bad schema compiled")
		}
	}
	if c.Len() != 0 || c.compiles.Load() != 2 {
		t.Fatalf("Len() = %d, compiles = %d; want 0 and 2", c.Len(), c.compiles.Load())
	}
}

func TestCacheDefaultSize(t *testing.T) {
	if c := NewCache(0); c.size != DefaultCacheSize {
		t.Fatalf("NewCache(0) holds %d; want %d", c.size, DefaultCacheSize)
	}
}

// TestConcurrentCompilesOfOneHashCompileOnce holds the first compilation
// open while the other callers arrive; they must wait for it rather than
// compile the same schema again.
func TestConcurrentCompilesOfOneHashCompileOnce(t *testing.T) {
	c := NewCache(8)
	release := make(chan struct{})
	c.compile = func(tree any, o compileOptions) (*Schema, error) {
		<-release
		return compile(tree, o)
	}
	const n = 16
	var wg sync.WaitGroup
	got := make([]*Schema, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := c.Compile(decode(t, invoiceSchema), "invoice")
			if err != nil {
				t.Error(err)
			}
			got[i] = s
		}()
	}
	time.Sleep(50 * time.Millisecond) // let the callers queue behind the first
	close(release)
	wg.Wait()
	if k := c.compiles.Load(); k != 1 {
		t.Fatalf("%d compilations for one hash; want 1", k)
	}
	for i := range got {
		if got[i] != got[0] {
			t.Fatal("callers received different compiled schemas")
		}
	}
}

// TestCacheUnderConcurrentLoad mixes many hashes and evaluations; run with
// -race it checks the cache and compiled schemas are safe to share.
func TestCacheUnderConcurrentLoad(t *testing.T) {
	c := NewCache(4)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				schema := fmt.Sprintf(`{"type": "object", "properties": {"n": {"minimum": %d}}}`, (g+i)%7)
				s, err := c.Compile(decode(t, schema), hashOf(schema))
				if err != nil {
					t.Error(err)
					return
				}
				if rep := s.Evaluate(decode(t, `{"n": 100}`), Options{Undeclared: true}); rep.Passed != 2 || rep.Total != 2 {
					t.Errorf("got %d/%d; want 2/2", rep.Passed, rep.Total)
				}
			}
		}()
	}
	wg.Wait()
	if c.Len() > 4 {
		t.Fatalf("Len() = %d exceeds the bound 4", c.Len())
	}
}
