package verify

import (
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// parseBounded runs v.Parse(body) with a deadline of its own, so a request
// that sets the validator (which cannot be stopped) running for minutes
// fails its test instead of hanging the suite, and reports the bytes
// allocated meanwhile: a bound on the heap the request could hold.
func parseBounded(t *testing.T, v *Verifier, body []byte) (error, uint64) {
	t.Helper()
	const deadline = 15 * time.Second
	runtime.GC()
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	done := make(chan error, 1)
	go func() { _, err := v.Parse(body); done <- err }()
	var err error
	select {
	case err = <-done:
	case <-time.After(deadline):
		runtime.ReadMemStats(&b)
		t.Fatalf("a %d-byte request still ran after %v, %d MB allocated; want it refused by the step budget", len(body), deadline, (b.TotalAlloc-a.TotalAlloc)>>20)
	}
	runtime.ReadMemStats(&b)
	return err, b.TotalAlloc - a.TotalAlloc
}

// verdict parses and checks body, reporting whether it passed.
func verdict(v *Verifier, body []byte) (bool, error) {
	req, err := v.Parse(body)
	if err != nil {
		return false, err
	}
	return v.Check(req, "id", time.Now()).Result == ResultPass, nil
}

// freeTier checks that body is a request the gateway sells unpaid: at
// most 64 KiB, passing Precheck.
func freeTier(t *testing.T, v *Verifier, body []byte) {
	t.Helper()
	if len(body) > 64<<10 {
		t.Fatalf("body %d bytes, past the free tier's 64 KiB", len(body))
	}
	if err := v.Precheck(body); err != nil {
		t.Fatalf("Precheck: %v", err)
	}
}

// cycleUnderDeepScope nests levels arrays; at every level a chain of k
// $refs (c0 to c(k-1)) applies, so the dynamic scope grows by more than k
// schemas a level, and m anyOf branches reach "x", a schema that refers to
// itself: a reference cycle. For each cycle the validator renders two
// keyword locations by walking the whole dynamic scope to its root,
// concatenating as it goes, in time and garbage quadratic in its length.
func cycleUnderDeepScope(k, m, levels int) []byte {
	var b strings.Builder
	b.WriteString(`{"task_id":"t","expected_schema":{"$ref":"#/$defs/c0","$defs":{"x":{"$ref":"#/$defs/x"}`)
	for i := range k {
		b.WriteString(`,"c` + strconv.Itoa(i) + `":{`)
		if i+1 < k {
			b.WriteString(`"$ref":"#/$defs/c` + strconv.Itoa(i+1) + `"}`)
			continue
		}
		b.WriteString(`"items":{"$ref":"#/$defs/c0"},"anyOf":[`)
		for j := range m {
			if j > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`{"$ref":"#/$defs/x"}`)
		}
		b.WriteString(`]}`)
	}
	b.WriteString(`}},"submitted_output":` + strings.Repeat("[", levels) + strings.Repeat("]", levels) + `}`)
	return []byte(b.String())
}

// A reference cycle costs the validator the rendering of the whole
// dynamic scope, twice, and is charged by the scope's length times the
// length of its keyword location, so cycles deep in a long scope are
// refused by the step budget; the same cycles near the root are an
// ordinary failing verification. (Before: a cycle cost 3 steps plus one
// per two levels, and this 4 KB request allocated 24 GB in the validator
// and had not returned after 20 s.)
func TestRefCycleUnderDeepScopeIsCharged(t *testing.T) {
	v := New(Config{})
	body := cycleUnderDeepScope(120, 8, 60)
	freeTier(t, v, body)
	err, alloc := parseBounded(t, v, body)
	refusedBySteps(t, "cycles under a deep scope", err)
	if alloc > 256<<20 {
		t.Errorf("a %d-byte request allocated %d MB", len(body), alloc>>20)
	}
	if pass, err := verdict(v, cycleUnderDeepScope(20, 2, 3)); err != nil || pass {
		t.Errorf("cycles under a short scope: pass=%v, %v; want a failing verification", pass, err)
	}
}

// unevalFanOut is an object of n members (an array of n items when items)
// under "unevaluatedProperties": true ("unevaluatedItems") at the root,
// and a $ref tree applying a schema with no property keywords 4^levels
// times at the root. While the root's set of unevaluated members is not
// empty, every application copies the whole set and intersects it with
// its caller's, in the walk and in the validator.
func unevalFanOut(n, levels int, items bool) []byte {
	kw, typ := "unevaluatedProperties", "object"
	if items {
		kw, typ = "unevaluatedItems", "array"
	}
	var b strings.Builder
	b.WriteString(`{"task_id":"t","expected_schema":{"` + kw + `":true,"$ref":"#/$defs/a` + strconv.Itoa(levels) + `","$defs":{"a0":{"type":"` + typ + `"}`)
	for i := 1; i <= levels; i++ {
		r := `{"$ref":"#/$defs/a` + strconv.Itoa(i-1) + `"}`
		b.WriteString(`,"a` + strconv.Itoa(i) + `":{"allOf":[` + r + `,` + r + `,` + r + `,` + r + `]}`)
	}
	b.WriteString(`}},"submitted_output":`)
	if items {
		b.WriteString(`[` + strings.TrimSuffix(strings.Repeat("0,", n), ",") + `]}`)
		return []byte(b.String())
	}
	b.WriteString(`{`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"` + strconv.Itoa(i) + `":0`)
	}
	b.WriteString(`}}`)
	return []byte(b.String())
}

// The members an application of a schema under unevaluatedProperties or
// unevaluatedItems carries (copies, then intersects with its caller's)
// are charged by their number, so a large object or array under a wide
// fan-out is refused by the step budget, while the same fan-out over a
// few members is an ordinary verification. (Before: an application cost
// one step whatever it carried; 7,000 members under 2,730 applications
// took 11.5 s and 2.2 GB, the validator running on past the Timeout.)
func TestUnevaluatedBookkeepingIsCharged(t *testing.T) {
	v := New(Config{})
	for _, tc := range []struct {
		name  string
		n     int
		items bool
	}{{"unevaluatedProperties", 7000, false}, {"unevaluatedItems", 30000, true}} {
		body := unevalFanOut(tc.n, 5, tc.items)
		freeTier(t, v, body)
		err, alloc := parseBounded(t, v, body)
		refusedBySteps(t, tc.name, err)
		if alloc > 256<<20 {
			t.Errorf("%s: a %d-byte request allocated %d MB", tc.name, len(body), alloc>>20)
		}
		if pass, err := verdict(v, unevalFanOut(20, 5, tc.items)); err != nil || !pass {
			t.Errorf("%s over 20 members: %v; want it evaluated and passing", tc.name, err)
		}
	}
}

// depFanOut is a schema whose leaf holds keyword with n entries (arrays,
// or schemas when schemas) naming members the output lacks, applied
// 4^levels times by a $ref fan-out to an object of one member. Draft-07
// when draft7 (for "dependencies").
func depFanOut(keyword string, n, levels int, schemas, draft7 bool) []byte {
	var b strings.Builder
	b.WriteString(`{"task_id":"t","expected_schema":{`)
	defs := "$defs"
	if draft7 {
		b.WriteString(`"$schema":"http://json-schema.org/draft-07/schema#",`)
		defs = "definitions"
	}
	b.WriteString(`"$ref":"#/` + defs + `/a` + strconv.Itoa(levels) + `","` + defs + `":{"a0":{"` + keyword + `":{`)
	val := `[]`
	if schemas {
		val = `true`
	}
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"` + strconv.FormatInt(int64(i), 36) + `":` + val)
	}
	b.WriteString(`}}`)
	for i := 1; i <= levels; i++ {
		r := `{"$ref":"#/` + defs + `/a` + strconv.Itoa(i-1) + `"}`
		b.WriteString(`,"a` + strconv.Itoa(i) + `":{"allOf":[` + r + `,` + r + `,` + r + `,` + r + `]}`)
	}
	b.WriteString(`}},"submitted_output":{"zzzzz":1}}`)
	return []byte(b.String())
}

// Every application scans all the entries of dependentRequired,
// dependentSchemas and draft-07 dependencies, in the walk and in the
// validator, looking each name up in the object; the scan is charged by
// the number of entries, so thousands of entries under a wide fan-out are
// refused by the step budget, while a few entries under it are an
// ordinary verification. (Before: only entries naming a member present
// were charged; 5,500 entries under 16,384 applications ran past the
// Timeout.)
func TestDependentEntriesScanIsCharged(t *testing.T) {
	v := New(Config{})
	for _, tc := range []struct {
		keyword         string
		n               int // dependentSchemas: each entry is a subschema, MaxSchemas is 5,000
		schemas, draft7 bool
	}{
		{"dependentRequired", 5500, false, false},
		{"dependentSchemas", 4900, true, false},
		{"dependencies", 4900, false, true}, // in draft-07 every value of dependencies may be a subschema
		{"dependencies", 4900, true, true},
	} {
		name := tc.keyword + " of schemas=" + strconv.FormatBool(tc.schemas)
		body := depFanOut(tc.keyword, tc.n, 7, tc.schemas, tc.draft7)
		freeTier(t, v, body)
		err, alloc := parseBounded(t, v, body)
		refusedBySteps(t, name, err)
		if alloc > 256<<20 {
			t.Errorf("%s: a %d-byte request allocated %d MB", name, len(body), alloc>>20)
		}
		if pass, err := verdict(v, depFanOut(tc.keyword, 20, 7, tc.schemas, tc.draft7)); err != nil || !pass {
			t.Errorf("%s, 20 entries: %v; want it evaluated and passing", name, err)
		}
	}
}

// Every application to an object makes the validator range over all its
// members, whatever the schema says about them, and costs a step per 16
// members, so a large object under a wide fan-out of schemas without
// property keywords is refused by the step budget, while the same fan-out
// over a few members is an ordinary verification. (Before: only schemas
// with properties, patternProperties or additionalProperties were
// charged; 7,000 members under 10,922 applications of {"type": "object"},
// a 62 KB request, passed the budget at about 11,000 steps while the
// validator looked up 76 million members, and a fan-out a hundred times
// wider within the budget would have cost it minutes.)
func TestEveryApplicationToAnObjectIsChargedByItsMembers(t *testing.T) {
	v := New(Config{})
	plain := func(n int) []byte {
		return []byte(strings.Replace(string(unevalFanOut(n, 6, false)), `"unevaluatedProperties":true,`, "", 1))
	}
	body := plain(7000)
	freeTier(t, v, body)
	err, alloc := parseBounded(t, v, body)
	refusedBySteps(t, "7,000 members", err)
	if alloc > 256<<20 {
		t.Errorf("a %d-byte request allocated %d MB", len(body), alloc>>20)
	}
	if pass, err := verdict(v, plain(20)); err != nil || !pass {
		t.Errorf("20 members: %v; want it evaluated and passing", err)
	}
}

// Every member additionalProperties: false refuses is listed in the
// validator's error and described as a failure of its own, and costs a
// step, so many members refused under a wide fan-out are refused by the
// step budget. (Before: a failing application cost a few steps whatever
// it refused; 5,000 members refused by 1,024 applications, a 44 KB
// request, had 5 million failures described, 2.3 GB allocated after the
// validator.)
func TestRefusedAdditionalPropertiesAreChargedEach(t *testing.T) {
	v := New(Config{})
	strict := func(n int) []byte {
		return []byte(strings.Replace(strings.Replace(string(unevalFanOut(n, 5, false)), `"unevaluatedProperties":true,`, "", 1),
			`{"type":"object"}`, `{"additionalProperties":false}`, 1))
	}
	body := strict(5000)
	freeTier(t, v, body)
	err, alloc := parseBounded(t, v, body)
	refusedBySteps(t, "5,000 members refused", err)
	if alloc > 256<<20 {
		t.Errorf("a %d-byte request allocated %d MB", len(body), alloc>>20)
	}
	if pass, err := verdict(v, strict(20)); err != nil || pass {
		t.Errorf("20 members refused: pass=%v, %v; want a failing verification", pass, err)
	}
}

// Realistic requests near the 1 MiB body limit stay well within the step
// budget with the charges above: many formatted values, long URIs under
// several format checks, one long data: URI, and a 2020-12 tree extended
// through $dynamicRef with unevaluatedProperties at its root.
func TestOrdinaryRequestsWithinStepBudget(t *testing.T) {
	v := New(Config{})
	var cases []struct {
		name string
		body string
	}
	add := func(name, body string) {
		cases = append(cases, struct{ name, body string }{name, body})
	}
	{
		var b strings.Builder
		b.WriteString(`{"task_id":"t","expected_schema":{"type":"array","items":{"type":"object","required":["at","url","mail"],"properties":{"at":{"type":"string","format":"date-time"},"url":{"type":"string","format":"uri"},"mail":{"type":"string","format":"email"}}}},"submitted_output":[`)
		for i := range 5000 {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`{"at":"2026-12-06T21:25:16.123Z","url":"https://example.com/orders/` + strconv.Itoa(i) + `?ref=agent","mail":"buyer` + strconv.Itoa(i) + `@example.com"}`)
		}
		b.WriteString(`]}`)
		add("5,000 events", b.String())
	}
	{
		var b strings.Builder
		b.WriteString(`{"task_id":"t","expected_schema":{"type":"array","items":{"allOf":[{"format":"uri"},{"format":"uri-reference"},{"format":"iri"}],"maxLength":2048}},"submitted_output":[`)
		u := "https://cdn.example.com/assets/images/products/2026/12/" + strings.Repeat("x", 120) + ".png"
		for i := range 4500 {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`"` + u + strconv.Itoa(i) + `"`)
		}
		b.WriteString(`]}`)
		add("900 KB of URIs", b.String())
	}
	add("one 900 KB uri", `{"task_id":"t","expected_schema":{"type":"string","format":"uri"},"submitted_output":"data:text/plain;base64,`+strings.Repeat("QUJD", 225_000)+`"}`)
	{
		schema := `{"$id":"https://example.com/strict-tree","$dynamicAnchor":"node","$ref":"tree","unevaluatedProperties":false,` +
			`"$defs":{"tree":{"$id":"tree","$dynamicAnchor":"node","type":"object","properties":{"data":{"type":"string","format":"date"},"children":{"type":"array","items":{"$dynamicRef":"#node"}}}}}}`
		count := 0
		var node func(d int) string
		node = func(d int) string {
			count++
			s := `{"data":"2026-12-06","children":[`
			if d < 29 {
				s += node(d + 1)
				for j := 0; j < 99 && d%4 == 0 && count < 4000; j++ {
					count++
					s += `,{"data":"2026-12-06","children":[]}`
				}
			}
			return s + `]}`
		}
		add("dynamic tree", `{"task_id":"t","expected_schema":`+schema+`,"submitted_output":`+node(0)+`}`)
	}
	{
		// A 20,000-member object under unevaluatedProperties: false, its
		// members declared by a few allOf branches.
		var b strings.Builder
		b.WriteString(`{"task_id":"t","expected_schema":{"type":"object","allOf":[{"required":["0"]},{"minProperties":1},{"patternProperties":{"^[0-9]+$":{"type":"integer"}}}],"unevaluatedProperties":false},"submitted_output":{`)
		for i := range 20000 {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`"` + strconv.Itoa(i) + `":` + strconv.Itoa(i))
		}
		b.WriteString(`}}`)
		add("20,000 members under unevaluatedProperties", b.String())
	}
	for _, c := range cases {
		if len(c.body) > 1<<20 {
			t.Fatalf("%s: %d bytes, past the 1 MiB body limit", c.name, len(c.body))
		}
		if pass, err := verdict(v, []byte(c.body)); err != nil || !pass {
			t.Errorf("%s: %.300v; want it evaluated and passing", c.name, err)
		}
	}
}
