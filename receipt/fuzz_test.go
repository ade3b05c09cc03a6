package receipt

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gowebpki/jcs"

	"github.com/aovhq/aov/strictjson"
)

// FuzzCanonicalize checks the canonicalizer against the reference
// implementation (gowebpki/jcs, used by tests only): on every input both
// refuse, or both produce the same bytes. It also checks the two paths of
// this package against each other (whenever the raw reader and
// AppendCanonical over the encoding/json tree both succeed they produce the
// same bytes), that the canonical form is a fixed point of both, and that
// IsCanonical holds exactly for the fixed points.
func FuzzCanonicalize(f *testing.F) {
	for _, s := range []string{
		`{"b":1,"a":[true,false,null,"x"]}`,
		`{"\uffff":1,"\ud83d\ude00":2,"\u00e9":3}`,
		`[1e21,1e-7,0.000001,10.0,-0,123456789012345678901234567890]`,
		`"\u0000\u001f\b\t\n\f\r\"\\/\u007f"`,
		`{"a":{"b":{"c":[[],{}]}}}`,
		`1E+2`, `-0.0e0`, `"café ✓"`, `[5e-324,1.7976931348623157e308]`,
		`{"\u0022":1,"\\":2,"\n":3,"a\u0000b":4,"\u00e9":5,"é":6}`,
		`{"b":{"d":1,"c":2},"a":[{"z":0,"y":[1,{"q":1,"p":2}]}]}`,
		`{"a":1, "a" :2}`, `{"\u0061":1,"a":2}`, `"\ud800\u0041"`, `"\udc00"`,
		` [ 1 , 2 ] `, `[1,]`, `{"a":1,}`, `01`, `1.`, `-`, `1e`, `truex`, `[tru]`, "\"\x7f\"",
		`[1e-400,0e-400,5e-324,2.5e-324]`, `1e-100000`, `1e100000`, `[1.` + strings.Repeat("0", 398) + `]`,
		`0.` + strings.Repeat("0", 9999) + `5e100000`,
		invoiceRequest,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		raw, rawErr := Canonicalize(data)
		ref, refErr := jcs.Transform(data)
		if refErr == nil && (errors.Is(rawErr, strictjson.ErrNumberUnderflow) || errors.Is(rawErr, strictjson.ErrNumberTooLong)) {
			// The reference reads numbers with strconv alone: 1e-400 as 0,
			// and "0.<100000 zeros>5e100001" (5) as 0 too.
			return
		}
		switch {
		case (rawErr == nil) != (refErr == nil):
			t.Fatalf("reference disagrees on %q: ours %q (%v), reference %q (%v)", data, raw, rawErr, ref, refErr)
		case rawErr == nil && !bytes.Equal(raw, ref):
			t.Fatalf("reference disagrees on %q:\n ours      %q\n reference %q", data, raw, ref)
		}
		if IsCanonical(data) != (rawErr == nil && bytes.Equal(raw, data)) {
			t.Fatalf("IsCanonical(%q) = %v, but canonical form is %q (%v)", data, IsCanonical(data), raw, rawErr)
		}
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		var tree any
		decErr := dec.Decode(&tree)
		if decErr == nil && rawErr == nil {
			viaTree, err := AppendCanonical(nil, tree)
			if err == nil && !bytes.Equal(raw, viaTree) {
				t.Fatalf("paths disagree:\n raw  %q\n tree %q", raw, viaTree)
			}
		}
		if rawErr != nil {
			return
		}
		again, err := Canonicalize(raw)
		if err != nil || !bytes.Equal(again, raw) {
			t.Fatalf("canonical form is not a fixed point: %q -> %q (%v)", raw, again, err)
		}
		dec = json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		if err := dec.Decode(&tree); err != nil {
			t.Fatalf("canonical form does not decode: %v", err)
		}
		viaTree, err := AppendCanonical(nil, tree)
		if err != nil || !bytes.Equal(viaTree, raw) {
			t.Fatalf("tree of the canonical form: %q (%v), want %q", viaTree, err, raw)
		}
	})
}

// FuzzVerifyReceipt feeds arbitrary bytes to the receipt checks. None may
// panic, and no input other than a re-encoding of a genuine receipt may
// verify: whatever passes must rebuild exactly the signed document.
func FuzzVerifyReceipt(f *testing.F) {
	pub, priv := seededKey(7)
	resp := fullResponse(f, "k2")
	genuine := attach(f, priv, ContextVerify, "k2", fixtureTime, resp)
	// The only documents this key ever signed: whatever verifies must be
	// one of them.
	signed := map[string]bool{}
	for _, d := range []struct {
		context string
		resp    []byte
	}{{ContextVerify, resp}, {ContextScore, scoreResponse("k2")}} {
		in, err := SigningInput(d.context, "k2", fixtureTime, d.resp)
		if err != nil {
			f.Fatal(err)
		}
		signed[string(in)] = true
	}
	keys := SingleKey("", pub)
	card := cardWith("k2", cardKey{version: "k2", status: StatusCurrent, pub: pub})
	f.Add(genuine)
	f.Add(attach(f, priv, ContextScore, "k2", fixtureTime, scoreResponse("k2")))
	f.Add(card)
	f.Add([]byte(`{"attestation":{"algorithm":"Ed25519","key_version":"k","timestamp":"2026-01-01T00:00:00Z","signature":"` + string(bytes.Repeat([]byte("A"), 86)) + `=="}}`))
	f.Add([]byte(`{"attestation":null,"verify":[],"verified_at":1}`))
	// A hostile card: its key versions reach NoKeyError's message.
	f.Add(cardWith("k1", cardKey{version: `\u001b]0;owned\u0007\u009b2J`, status: StatusCurrent, pub: pub}, cardKey{version: "k1\u0085", status: StatusRetired, pub: pub}))
	// A card that lists k2 twice, once compromised: refused, whichever entry
	// comes first.
	f.Add(cardWith("k2", cardKey{version: "k2", status: StatusCompromised, compromisedSince: "2026-01-02T00:00:00Z", pub: pub}, cardKey{version: "k2", status: StatusCurrent, pub: pub}))
	// Member names equal to status and compromisedSince in another letter
	// case (ſ is U+017F, which folds to s): other members, which every
	// reader but encoding/json's struct matching keeps apart.
	compromised := cardWith("k2", cardKey{version: "k2", status: StatusCompromised, compromisedSince: "2026-01-02T00:00:00Z", pub: pub})
	for _, twin := range []string{`"Status":"current"`, `"ſtatus":"current"`, `"CompromisedSince":""`, `"compromisedsince":"2027-01-01T00:00:00Z"`, `"compromiſedSince":"2027-01-01T00:00:00Z"`, `"KeyVersion":"k1"`} {
		f.Add(bytes.Replace(compromised, []byte(`"status"`), []byte(twin+`,"status"`), 1))
		f.Add(bytes.Replace(compromised, []byte(`"compromisedSince":"2026-01-02T00:00:00Z"`), []byte(`"compromisedSince":"2026-01-02T00:00:00Z",`+twin), 1))
	}
	// Times, as ParseTime reads the receipt's and the card's: the forms
	// time.Parse takes and RFC 3339 does not, and impossible dates.
	for _, s := range []string{"2026-11-29T21:22:28.1234567891Z", "2026-11-29T1:22:28Z", "2026-11-29T21:22:28,5Z", "2026-01-01T00:00:00+24:00", "2026-02-30T00:00:00Z", "2026-11-29T24:00:00Z", "2026-11-29T21:22:28-00:00"} {
		f.Add([]byte(s))
	}
	// The receipt genuine is checked against whatever card data is: its
	// messages, built from the card's strings, must carry no control
	// character to the terminal of `aov receipt verify`.
	noControl := func(t *testing.T, what string, err error) {
		if err != nil && strings.ContainsFunc(err.Error(), func(r rune) bool { return r < ' ' || (r >= 0x7f && r <= 0x9f) }) {
			t.Fatalf("%s: a control character reaches the message: %q", what, err)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		// A time ParseTime takes prints back as written (the by-hand
		// steps of the README check dates that way).
		if tm, err := ParseTime(string(data)); err == nil && tm.Format("2006-01-02T15:04:05") != string(data[:19]) {
			t.Fatalf("ParseTime(%q) read the date and time as %s", data, tm)
		}
		_ = CheckHashes(data, Hashes{Output: "a", Schema: "b", Rules: "c", Request: "d"})
		_ = CheckRequest(data, Expected{Hashes: Hashes{Output: "a", Schema: "b", Rules: "c", Request: "d"}, TaskID: "t"})
		if cardKeys, err := KeysFromCard(data); err != nil {
			noControl(t, "KeysFromCard", err)
		} else {
			if v := versionListedTwice(data); v != "" {
				t.Fatalf("KeysFromCard accepted a card listing key version %q twice", v)
			}
			checkCompromiseMarks(t, data, cardKeys)
			_, err := Verify(genuine, cardKeys, "")
			noControl(t, "Verify against the card", err)
		}
		v, err := Verify(data, keys, "")
		if err != nil {
			return
		}
		doc, derr := decodeResponse(data)
		if derr != nil {
			t.Fatalf("verified but does not decode: %v", derr)
		}
		delete(doc, "attestation")
		canon, _ := AppendCanonical(nil, doc)
		got, _ := appendSigningInputCanonical(nil, v.Context, v.KeyVersion, v.Timestamp, canon)
		if !signed[string(got)] {
			t.Fatalf("a receipt other than the genuine one verified:\n%s", got)
		}
	})
}

// TestFuzzCorporaAreCheckedIn keeps the seed corpora from being lost: make
// test's short fuzz runs start from them.
func TestFuzzCorporaAreCheckedIn(t *testing.T) {
	for _, target := range []string{"FuzzCanonicalize", "FuzzVerifyReceipt"} {
		entries, err := os.ReadDir(filepath.Join("testdata", "fuzz", target))
		if err != nil || len(entries) == 0 {
			t.Errorf("no checked-in corpus for %s: %v", target, err)
		}
	}
}

// versionListedTwice returns a key version the card lists more than once
// among the Ed25519 keys of its attestation extensions ("" when none), read
// independently of KeysFromCard's loop.
func versionListedTwice(cardJSON []byte) string {
	seen := map[string]bool{}
	for _, pk := range ed25519Entries(cardJSON) {
		v, _ := pk["keyVersion"].(string)
		if seen[v] {
			return v
		}
		seen[v] = true
	}
	return ""
}

// ed25519Entries returns the Ed25519 entries of the card's attestation
// extensions, read by exact member names (as JavaScript reads them), for
// checking KeysFromCard against.
func ed25519Entries(cardJSON []byte) []map[string]any {
	var c map[string]any
	if json.Unmarshal(cardJSON, &c) != nil {
		return nil
	}
	caps, _ := c["capabilities"].(map[string]any)
	exts, _ := caps["extensions"].([]any)
	var out []map[string]any
	for _, e := range exts {
		ext, _ := e.(map[string]any)
		if uri, _ := ext["uri"].(string); !strings.HasPrefix(uri, ExtensionURIPrefix) {
			continue
		}
		params, _ := ext["params"].(map[string]any)
		pks, _ := params["publicKeys"].([]any)
		for _, p := range pks {
			if pk, _ := p.(map[string]any); pk["algorithm"] == Algorithm {
				out = append(out, pk)
			}
		}
	}
	return out
}

// checkCompromiseMarks fails when KeysFromCard marks a key compromised, or
// not, otherwise than its entry read by exact member names says: status
// "compromised" or a compromisedSince. A reader that matched "Status" or
// "compromiſedSince" (U+017F) to those would disagree with every other.
func checkCompromiseMarks(t *testing.T, cardJSON []byte, ks KeySet) {
	for _, pk := range ed25519Entries(cardJSON) {
		v, _ := pk["keyVersion"].(string)
		since, _ := pk["compromisedSince"].(string)
		want := pk["status"] == StatusCompromised || since != ""
		k := ks.keys[v]
		st, _ := ParseTime(since)
		if k.compromised != want || !k.since.Equal(st) {
			t.Fatalf("key %q: KeysFromCard read compromised=%v since=%v, its entry by exact names says %v since %q", v, k.compromised, k.since, want, since)
		}
	}
}
