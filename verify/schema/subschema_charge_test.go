package schema

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

// repeated is n copies of v as a JSON array's members.
func repeated(n int, v string) string {
	return strings.TrimSuffix(strings.Repeat(v+",", n), ",")
}

// refusedCheaply compiles schema, wants it refused, and bounds what that
// cost.
func refusedCheaply(t *testing.T, name, schema string, bound uint64) {
	t.Helper()
	_, err, alloc, _ := compileCost(t, schema)
	var ce *CompileError
	if !errors.As(err, &ce) {
		t.Errorf("%s (%d bytes): %v, want it refused", name, len(schema), err)
		return
	}
	t.Logf("%s (%d bytes): %.160s; %d KB allocated", name, len(schema), ce.Fields[0].Problem, alloc>>10)
	if alloc > bound {
		t.Errorf("%s: refusing a %d-byte schema allocated %d MB", name, len(schema), alloc>>20)
	}
}

// The metaschema check applies the dialect's metaschema to every value
// where a subschema belongs, whatever it is, and writes that value's JSON
// pointer each time, every member name above it included. Numbers,
// strings and nulls there were not charged: 500 of them under one 50 KB
// name (a 51 KB request) allocated 165 MB before the gateway's 402, 102 KB
// 730 MB. They are charged as subschemas are.
func TestValuesWhereSchemasBelongAreCharged(t *testing.T) {
	long := strings.Repeat("k", 50_000)
	for _, c := range []struct{ name, schema string }{
		{"numbers in prefixItems", `{"properties":{"` + long + `":{"prefixItems":[` + repeated(500, "1") + `]}}}`},
		{"strings in allOf", `{"$defs":{"` + long + `":{"allOf":[` + repeated(500, `"s"`) + `]}}}`},
		{"nulls in properties", `{"properties":{"` + long + `":{"properties":{` + subs(500, `null`) + `}}}}`},
		{"numbers in $defs", `{"properties":{"` + long + `":{"$defs":{` + subs(500, `%[2]d`) + `}}}}`},
	} {
		refusedCheaply(t, c.name, c.schema, 16<<20)
	}
}

// subs is n members "p<i>": sub (%[2]d for i).
func subs(n int, sub string) string {
	props := make([]string, n)
	for i := range props {
		n := strconv.Itoa(i)
		props[i] = `"p` + n + `":` + strings.ReplaceAll(sub, "%[2]d", n)
	}
	return strings.Join(props, ",")
}

// A boolean subschema is a subschema: it counts toward MaxSchemas as an
// object does. 20,000 of them, four times the limit, compiled for 112 MB
// and 1.8 s before payment.
func TestBooleanSubschemasCountTowardMaxSchemas(t *testing.T) {
	refusedCheaply(t, "20,000 true in prefixItems", `{"prefixItems":[`+repeated(20_000, "true")+`]}`, 16<<20)
	refusedCheaply(t, "10,000 false properties", `{"properties":{`+subs(10_000, "false")+`}}`, 16<<20)
	// Booleans that are data or keyword values count nothing.
	if _, err, _, _ := compileCost(t, `{"enum":[`+repeated(2, "true")[:4]+`,false],"uniqueItems":true,"const":[`+repeated(6000, "true")+`]}`); err != nil {
		t.Errorf("booleans outside subschema positions were charged: %v", err)
	}
	// MaxSchemas itself is a count: 4,999 booleans and the root compile.
	if _, err, _, _ := compileCost(t, `{"prefixItems":[`+repeated(DefaultMaxSchemas-1, "true")+`]}`); err != nil {
		t.Errorf("%d boolean subschemas: %v", DefaultMaxSchemas-1, err)
	}
}

// The metaschema check writes a value's location anew for every value,
// by concatenation, token after token: its cost is the length of every
// location on the way down, about the depth times the length. 28 levels
// of 60-byte names over 500 subschemas (31.6 KB) compiled within
// MaxSchemas (each location about 2 KB, under 8 units) and allocated
// 73 MB. The walk now charges that work against MaxLocationWork, so such
// a schema is refused, and the most it lets through, in each shape, stays
// within what the README states: about 50 MB.
func TestDeepLocationsAreChargedByTheirWork(t *testing.T) {
	deep := func(name string, depth, leaves int) string {
		leaf := strings.ReplaceAll(subs(leaves, `{}`), `"p`, `"`+name[:min(50, len(name))])
		s := `{"properties":{` + leaf + `}}`
		for i := 0; i < depth; i++ {
			s = `{"properties":{"` + name + `":` + s + `}}`
		}
		return s
	}
	medium := strings.Repeat("n", 60)
	refusedCheaply(t, "28 levels of 60-byte names over 500 subschemas", deep(medium, 28, 500), 16<<20)
	refusedCheaply(t, "60 levels of 8-byte names over 200 subschemas", deep("abcdefgh", 60, 200), 16<<20)

	for _, c := range []struct{ name, schema string }{
		{"28 levels of 60-byte names over 50 subschemas", deep(medium, 28, 50)},
		{"5 levels of 9-byte names over 4,900 subschemas", deep("abcdefghi", 5, 4900)},
		{"one 5 KB name over 240 subschemas", underName(strings.Repeat("k", 5000), 240, `{"title":"%[2]d"}`)},
	} {
		tree := decode(t, c.schema)
		cost := countObjects(tree, DefaultMaxSchemas+1)
		if cost.work < MaxLocationWork*3/4 && cost.units < DefaultMaxSchemas*9/10 {
			t.Fatalf("%s is not at a limit: %d units, %d bytes of work", c.name, cost.units, cost.work)
		}
		_, err, alloc, _ := compileCost(t, c.schema)
		if err != nil {
			t.Fatalf("%s (%d bytes): %v", c.name, len(c.schema), err)
		}
		t.Logf("%s (%d bytes, %d units, %d KB of work): %d MB allocated", c.name, len(c.schema), cost.units, cost.work>>10, alloc>>20)
		if alloc > 50<<20 {
			t.Errorf("%s: compiling a %d-byte schema allocated %d MB", c.name, len(c.schema), alloc>>20)
		}
	}
}
