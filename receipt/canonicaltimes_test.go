package receipt

import (
	"strings"
	"testing"
)

// canonicalTimesSeeds are responses whose stated times a reader of
// canonical bytes could take from the wrong place: names with escapes,
// the members nested elsewhere, inputs or window of another type, strings
// with escapes, every JSON type, empty objects.
var canonicalTimesSeeds = []string{
	`{}`,
	`{"verified_at":"2026-11-29T21:00:00Z","computed_at":null,"output_hash":""}`,
	`{"computed\u005fat":"2026-11-29T21:00:00Z","verified_at":1}`,
	`{"x":{"computed_at":"2029-01-01T00:00:00Z"},"y":["computed_at",{"verified_at":"a"}],"computed_at":"2026-11-29T21:00:00+00:00"}`,
	`{"inputs":"window","computed_at":true}`,
	`{"inputs":{"window":[{"to":"x"}]}}`,
	`{"inputs":{"owned":true,"window":{"from":null,"to":"2026-11-29T21:00:00Z","newest_evidence_at":"2026-11-29T21:00:02Z","oldest_evidence_at":{}}}}`,
	`{"inputs":{"window":{"t\u006f":"2026\"-11","from":"a\\b","oldest_evidence_at":"\u00e9\n","newest_evidence_at":[]}},"a":{"inputs":{"window":{"to":"z"}}}}`,
	`{"inputs":{"w":{"window":{"to":"z"}},"window":{}},"verified_at":"2026-11-29T21:00:00.5Z","z":[1,2.5e300,-0,"}",{"}":"{"}]}`,
	`{"verified_at":"","computed_at":"\u0000","inputs":{"window":{"to":false,"from":0}}}`,
}

// The times a signer reads from the canonical bytes of a response are the
// ones Verify reads from the decoded response, member for member.
func TestCanonicalTimesAreTheDecodedOnes(t *testing.T) {
	for _, s := range canonicalTimesSeeds {
		checkCanonicalTimes(t, []byte(s))
	}
}

func FuzzCanonicalTimesAreTheDecodedOnes(f *testing.F) {
	for _, s := range canonicalTimesSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		canonicalTimes(b) // any bytes: no panic
		checkCanonicalTimes(t, b)
	})
}

func checkCanonicalTimes(t *testing.T, raw []byte) {
	t.Helper()
	canon, err := Canonicalize(raw)
	if err != nil || canon[0] != '{' {
		return
	}
	doc, err := decodeObject(canon)
	if err != nil {
		t.Fatalf("%s: %v", canon, err)
	}
	got, err := canonicalTimes(canon)
	if err != nil {
		t.Fatalf("%s: %v", canon, err)
	}
	if want := timesOf(doc); got != want {
		t.Errorf("%s:\n canonical bytes give %+v\n decoded gives       %+v", canon, got, want)
	}
}

// A response that is not a canonical object is refused, not misread, and
// never panics (a string with an escape canonical form never writes, such
// as a bare \u, once did).
func TestCanonicalTimesRefusesWhatIsNotACanonicalObject(t *testing.T) {
	for _, s := range []string{``, `[]`, `"x"`, `{`, `{"a":1`, `{"a":}`, `{"a" :1}`, `{"a":1,}`, `{,"a":1}`, `{"a":"b}`,
		`{"inputs":{"window":{"to":}}}`, `{"inputs":{"window":{"to""x"}}}`, `{"computed_at":"\u"}`, `{"computed_at":"\x41"}`} {
		if _, err := canonicalTimes([]byte(s)); err == nil {
			t.Errorf("%q: read as a canonical object", s)
		}
	}
}

// certd checks the times of every response it signs, and the in-process
// signer of every verification: reading them costs a few small strings,
// not a second decoding of the response. (Before: CheckTimes decoded the
// whole response into a map, 288 allocations for 2 KiB.)
func TestCheckTimesDoesNotDecodeTheResponse(t *testing.T) {
	const at = "2026-11-29T21:00:00.123456+00:00"
	resp := `{"computed_at":"` + at + `","flags":[` + strings.Repeat(`{"check":"consistency:unique","detail":"values repeat","field":"items[0].id","severity":"warning"},`, 20) +
		`{}],"inputs":{"window":{"from":"2025-11-29T21:00:00Z","newest_evidence_at":null,"oldest_evidence_at":null,"to":"` + at + `"}},"verified_at":"` + at + `"}`
	msg, err := SigningInput(ContextScore, "k1", at, []byte(resp))
	if err != nil {
		t.Fatal(err)
	}
	d, err := ParseSigningInput(msg)
	if err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(100, func() {
		if err := d.CheckTimes(); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 5 {
		t.Errorf("CheckTimes of a %d-byte response: %v allocations; want at most 5 (one per time read)", len(resp), allocs)
	}
}
