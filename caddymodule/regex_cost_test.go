package caddymodule

import (
	"fmt"
	"io"
	"runtime"
	"strings"
	"testing"
)

// classHeavyBody is a verification request whose schema has n patterns of
// reps \pL each (659 rune ranges apiece), distinct per k.
func classHeavyBody(k, n, reps int) string {
	var props []string
	for i := range n {
		props = append(props, fmt.Sprintf(`"p%d":{"type":"string","pattern":"x%d_%d%s"}`, i, k, i, strings.Repeat(`\\pL`, reps)))
	}
	return `{"task_id":"t","expected_schema":{"type":"object","properties":{` + strings.Join(props, ",") + `}},"submitted_output":{}}`
}

// An unpaid POST whose schema holds 30 KB patterns of \pL is refused 422
// before any pattern is parsed: the gate used to parse each one twice
// (2.6 s of CPU and 2 GB allocated for a 312 KB body) before refusing it.
func TestUnpaidClassHeavyPatternsRefusedAtTheGate(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 5, ""))
	body := classHeavyBody(0, 8, 10_000)
	var status int
	var answer string
	c := measure(t, func() {
		resp := post(t, base+"/verify/schema", body, nil)
		status = resp.StatusCode
		b, _ := io.ReadAll(resp.Body)
		answer = string(b)
		resp.Body.Close()
	})
	if c.allocated > 64<<20 {
		t.Errorf("one unpaid %d KB request allocated %d MiB at the gate", len(body)>>10, c.allocated>>20)
	}
	if status != 422 || !strings.Contains(answer, `"invalid_request"`) || !strings.Contains(answer, "character classes are too large to evaluate") {
		t.Fatalf("status %d: %.300s; want 422 invalid_request naming the pattern's classes", status, answer)
	}
	if strings.Contains(answer, `\\pL\\pL`) {
		t.Errorf("the answer repeats the pattern: %.300s", answer)
	}
}

// Ten patterns of 4,990 \pL each were within every limit (a class counted
// as one instruction), so the gate compiled the schema unpaid and its
// schema cache kept about 250 MB of it under a 6.4 MB estimate. Their
// classes are now counted: refused, nothing kept.
func TestUnpaidClassHeavySchemaNotRetainedAtTheGate(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 5, ""))
	runtime.GC()
	before := heapObjects()
	for k := range 2 {
		resp := post(t, base+"/verify/schema", classHeavyBody(k, 10, 4_990), nil)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 422 || !strings.Contains(string(b), "character classes are too large to evaluate") {
			t.Fatalf("status %d: %.300s; want 422 naming the pattern's classes", resp.StatusCode, b)
		}
	}
	runtime.GC()
	if kept := int64(heapObjects()) - int64(before); kept > 32<<20 {
		t.Errorf("two refused unpaid requests left the gate %d MiB larger", kept>>20)
	}
}
