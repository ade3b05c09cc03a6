package caddymodule

import (
	"fmt"
	"io"
	"runtime"
	"strings"
	"testing"
)

// onePassBody is a verification request whose schema has n anchored
// patterns repeating \p{L} 990 times, distinct per k: each is within every
// limit (a size of about 1,330 of 10,000).
func onePassBody(k, n int) string {
	var props []string
	for i := range n {
		props = append(props, fmt.Sprintf(`"p%d":{"type":"string","pattern":"^x%d_%d[\\p{L}]{990}$"}`, i, k, i))
	}
	return `{"task_id":"t","expected_schema":{"type":"object","properties":{` + strings.Join(props, ",") + `}},"submitted_output":{}}`
}

// Go's one-pass matcher copied the 659-range table of each such pattern
// into its 990 instructions, 8 MB a pattern under an 85 KB estimate: two
// unpaid 2.3 KB requests of 40 patterns left the gate's schema cache about
// 617 MiB larger. Such a pattern is now compiled without that matcher.
func TestUnpaidOnePassClassSchemaAtTheGate(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 5, ""))
	runtime.GC()
	before := heapObjects()
	for k := range 2 {
		body := onePassBody(k, 40)
		var status int
		c := measure(t, func() {
			resp := post(t, base+"/verify/schema", body, nil)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			status = resp.StatusCode
		})
		if status != 402 {
			t.Fatalf("status %d; want the schema accepted and the request asked to pay", status)
		}
		if c.allocated > 64<<20 {
			t.Errorf("one unpaid %d-byte request allocated %d MiB at the gate", len(body), c.allocated>>20)
		}
	}
	runtime.GC()
	if kept := int64(heapObjects()) - int64(before); kept > 32<<20 {
		t.Errorf("two unpaid requests of %d bytes left the gate %d MiB larger", len(onePassBody(0, 40)), kept>>20)
	}
}

// One unpaid request of 650 KB whose patternProperties keys are
// distinct patterns of 30 \pL each (just within the class limit): every
// key was parsed by the metaschema's format "regex" check before the 422,
// 3 GB allocated. The schema's patterns now share a parsing budget, so the
// request costs what one of keys as long that fail at once does (the
// body's decoding and the metaschema's errors: about 60 MiB) and at most
// the budget's parsing more.
func TestUnpaidPatternPropertiesKeysAtTheGate(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 5, ""))
	send := func(key string) (int, string, uint64) {
		keys := make([]string, 4990) // each key's subschema, true, counts toward MaxSchemas
		for i := range keys {
			keys[i] = fmt.Sprintf(`"x%d%s":true`, i, key)
		}
		body := `{"task_id":"t","expected_schema":{"type":"object","patternProperties":{` + strings.Join(keys, ",") + `}},"submitted_output":{}}`
		var status int
		var answer string
		c := measure(t, func() {
			resp := post(t, base+"/verify/schema", body, nil)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			status, answer = resp.StatusCode, string(b)
		})
		t.Logf("unpaid %d KB request: status %d, allocated %d MiB", len(body)>>10, status, c.allocated>>20)
		return status, answer, c.allocated
	}
	heavy := strings.Repeat(`\\pL`, 30)
	_, _, control := send("(" + strings.Repeat("a", len(heavy)-1)) // as long, no classes, fails at once
	status, answer, n := send(heavy)
	if status != 422 || !strings.Contains(answer, `"invalid_request"`) || !strings.Contains(answer, "expected_schema/patternProperties/x") {
		t.Fatalf("status %d: %.300s; want 422 invalid_request naming a key", status, answer)
	}
	if n > control+32<<20 {
		t.Errorf("one unpaid request of class-heavy keys allocated %d MiB at the gate, %d MiB with keys that parse at once", n>>20, control>>20)
	}
}
