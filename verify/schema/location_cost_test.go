package schema

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// underName is a schema of n subschemas sub (with %d for their index)
// under one property named name.
func underName(name string, n int, sub string) string {
	props := make([]string, n)
	for i := range props {
		props[i] = fmt.Sprintf(`"p%d":`+sub, i, i)
	}
	return `{"properties":{"` + name + `":{"properties":{` + strings.Join(props, ",") + `}}}}`
}

// compileCost compiles schema in a fresh cache and reports what that
// allocated and what the compiled schema keeps.
func compileCost(t *testing.T, schema string) (s *Schema, err error, alloc, kept uint64) {
	t.Helper()
	tree := decode(t, schema)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s, err = NewCache(4).Compile(tree, hashOf(schema))
	runtime.ReadMemStats(&after)
	alloc = after.TotalAlloc - before.TotalAlloc
	runtime.GC()
	runtime.ReadMemStats(&after)
	if after.HeapAlloc > before.HeapAlloc {
		kept = after.HeapAlloc - before.HeapAlloc
	}
	runtime.KeepAlive(s)
	runtime.KeepAlive(tree)
	return s, err, alloc, kept
}

// The compiler writes the location of every subschema (the schema's URL
// and a JSON pointer) with every property name above it, and keeps several
// copies: 2,000 empty subschemas under one 400 KB name cost it 107 s,
// 9.2 GB of allocation and 1.5 GB kept, and the gateway compiles before it
// answers 402. Each object now counts one more toward MaxSchemas for every
// 256 bytes of its location, before the compiler runs: such a schema is
// refused for a few MB, valid or not, and one at the limit costs about
// what 5,000 ordinary subschemas cost, and the cache counts what it keeps.
func TestLongPropertyNamesAreChargedBeforeCompiling(t *testing.T) {
	long := strings.Repeat("k", 400_000)
	for _, sub := range []string{`{"title":"%[2]d"}`, `{"type":"nope%[2]d"}`} {
		_, err, alloc, _ := compileCost(t, underName(long, 2000, sub))
		var ce *CompileError
		if !errors.As(err, &ce) || !strings.Contains(ce.Fields[0].Problem, "bytes of its location") {
			t.Fatalf("2,000 subschemas %s under a 400 KB name: %v, want the locations refused", sub, err)
		}
		t.Logf("2,000 subschemas %s under a 400 KB name: refused, %d KB allocated", sub, alloc>>10)
		if alloc > 4<<20 {
			t.Errorf("refusing them allocated %d MB", alloc>>20)
		}
	}

	// The most the limit lets through, in two shapes: one name over many
	// subschemas, and names nested so that each location repeats all of
	// those above it. An ordinary schema of 4,990 subschemas to compare.
	nested := `{"title":"leaf"}`
	for i := 0; i < 12; i++ { // as deep as MaxLocationWork lets them
		nested = `{"properties":{"` + strings.Repeat("n", 1200) + `":` + nested + `,"a":{},"b":{}}}`
	}
	for _, c := range []struct {
		name, schema string
	}{
		{"ordinary", underName("k", 4990, `{"title":"%[2]d"}`)},
		{"one long name", underName(strings.Repeat("k", 5000), 240, `{"title":"%[2]d"}`)},
		{"nested names", nested},
	} {
		s, err, alloc, kept := compileCost(t, c.schema)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		t.Logf("%s (%d bytes): %d MB allocated, %d MB kept, the cache counts %d MB", c.name, len(c.schema), alloc>>20, kept>>20, s.bytes>>20)
		if alloc > 40<<20 {
			t.Errorf("%s: compiling allocated %d MB", c.name, alloc>>20)
		}
		if kept > uint64(s.bytes) {
			t.Errorf("%s: the compiled schema keeps %d bytes, the cache counts %d", c.name, kept, s.bytes)
		}
	}
}

// A refusal names the schema's fields by JSON pointer, and the names in
// them are shortened as in every path a client is shown: 20 invalid
// subschemas under one 40 KB name (within the limit above) made an 800 KB
// refusal, each field repeating the name.
func TestRefusalsShortenLongNames(t *testing.T) {
	schema := underName(strings.Repeat("k", 40_000), 20, `{"type":"nope%[2]d"}`)
	var err error
	alloc := allocated(func() { _, err = NewCache(4).Compile(decode(t, schema), hashOf(schema)) })
	var ce *CompileError
	if !errors.As(err, &ce) || len(ce.Fields) != 20 {
		t.Fatalf("%v, want a refusal of the 20 subschemas", err)
	}
	size := 0
	for _, f := range ce.Fields {
		size += len(f.Field) + len(f.Problem) + len(f.Fix)
		if !strings.HasPrefix(f.Field, "expected_schema/properties/"+strings.Repeat("k", 64)+"…/properties/p") {
			t.Fatalf("field %.120q does not show the name shortened", f.Field)
		}
	}
	t.Logf("refusal of %d bytes, %d KB allocated", size, alloc>>10)
	if size > 8<<10 {
		t.Errorf("a refusal of %d bytes", size)
	}
	if alloc > 16<<20 {
		t.Errorf("refusing the schema allocated %d MB", alloc>>20)
	}
}

// A reference that cannot be resolved is named by the pointer of the
// member that holds it, found by walking the schema: that walk wrote the
// pointer of every member it passed, so 2,000 members beside it under a
// 300 KB name allocated 600 MB. It now writes the pointer of the
// references only.
func TestUnresolvedReferenceUnderLongNameIsNamedCheaply(t *testing.T) {
	members := make([]string, 2000)
	for i := range members {
		members[i] = fmt.Sprintf(`"x-%d":%d`, i, i)
	}
	schema := `{"properties":{"` + strings.Repeat("k", 300_000) + `":{"$ref":"https://elsewhere.example/s.json",` + strings.Join(members, ",") + `}}}`
	var err error
	alloc := allocated(func() { _, err = NewCache(4).Compile(decode(t, schema), hashOf(schema)) })
	var ce *CompileError
	if !errors.As(err, &ce) || len(ce.Fields) != 1 || ce.Fields[0].Field != "expected_schema/properties/"+strings.Repeat("k", 64)+"…/$ref" {
		t.Fatalf("%v, want the reference named", err)
	}
	t.Logf("%d KB allocated", alloc>>10)
	if alloc > 16<<20 {
		t.Errorf("naming the reference allocated %d MB", alloc>>20)
	}
}
