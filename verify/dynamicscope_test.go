package verify

import (
	"strconv"
	"strings"
	"testing"
)

// refChain is a request whose output is an array of items zeros, each
// under a chain of k $ref'd subschemas; each link also holds ref, a
// reference that searches the whole dynamic scope ("$dynamicRef":"#a"
// with a "$dynamicAnchor":"a" target, or "$recursiveRef":"#" in 2019-09
// with "$recursiveAnchor": true at the root).
func refChain(k, items int, recursive bool) []byte {
	var b strings.Builder
	b.WriteString(`{"task_id":"t","expected_schema":{`)
	ref := `"$dynamicRef":"#a"`
	if recursive {
		ref = `"$recursiveRef":"#"`
		b.WriteString(`"$schema":"https://json-schema.org/draft/2019-09/schema","$recursiveAnchor":true,`)
	}
	b.WriteString(`"items":{"$ref":"#/$defs/c0"},"$defs":{"d":{"$dynamicAnchor":"a"}`)
	for i := range k {
		b.WriteString(`,"c` + strconv.Itoa(i) + `":{` + ref)
		if i+1 < k {
			b.WriteString(`,"$ref":"#/$defs/c` + strconv.Itoa(i+1) + `"`)
		}
		b.WriteString(`}`)
	}
	b.WriteString(`}},"submitted_output":[` + strings.TrimSuffix(strings.Repeat("0,", items), ",") + `]}`)
	return []byte(b.String())
}

// Every $dynamicRef whose target holds its anchor, and every $recursiveRef
// to a $recursiveAnchor, searches the whole dynamic scope, in the walk and
// in the validator: a chain of k such references costs k²/2 lookups per
// item. The search is charged by the scope's length, so a free-tier
// request of such chains is refused by the step budget. (Before: 1,200
// links over a few hundred items passed the budget, and the validator,
// which cannot be stopped, ran on past the 5 s Timeout to 7.85 s.)
func TestDynamicScopeSearchIsCharged(t *testing.T) {
	v := New(Config{})
	for _, recursive := range []bool{false, true} {
		body := refChain(1200, 50, recursive)
		if len(body) > 64<<10 {
			t.Fatalf("body %d bytes, past the free tier's 64 KiB", len(body))
		}
		if err := v.Precheck(body); err != nil {
			t.Fatalf("Precheck: %v", err)
		}
		_, err := v.Parse(body)
		refusedBySteps(t, "recursive="+strconv.FormatBool(recursive), err)
		// A short chain over the same items is an ordinary request.
		if _, err := v.Parse(refChain(20, 50, recursive)); err != nil {
			t.Errorf("recursive=%v, 20 links: %v; want it evaluated", recursive, err)
		}
	}
}

// Every schema applied looks for a reference cycle among those applied at
// the same location before it, in the walk and in the validator: a chain
// of k $refs costs k²/2 comparisons per item. They are charged, so a
// free-tier request of a long chain over many items is refused by the
// step budget. (Before: 1,200 links over 833 items, 39 KB, passed the
// budget and took 2.9 s; 4,900 over 204, 160 KB, 9 s, the validator
// running past the Timeout.)
func TestCycleCheckIsCharged(t *testing.T) {
	v := New(Config{})
	chain := func(k, items int) []byte {
		return []byte(strings.ReplaceAll(string(refChain(k, items, false)), `"$dynamicRef":"#a"`, `"type":"number"`))
	}
	body := chain(1200, 250)
	if err := v.Precheck(body); err != nil {
		t.Fatalf("Precheck: %v", err)
	}
	_, err := v.Parse(body)
	refusedBySteps(t, "1,200 links", err)
	if _, err := v.Parse(chain(20, 250)); err != nil {
		t.Errorf("20 links: %v; want it evaluated", err)
	}
}
