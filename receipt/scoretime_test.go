package receipt

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// A trust score's own time is computed_at, not verified_at. A leaked
// retired key dates its signature inside its service life and writes today
// into computed_at (and into inputs.window.to): Verify refuses it as it
// refuses the same trick on a verification receipt's verified_at. (Before:
// only verified_at was tied to attestation.timestamp, and the score
// verified.)
func TestLeakedRetiredKeyCannotDateAScoreAfterItsRetirement(t *testing.T) {
	pub1, priv1 := seededKey(1)
	pub2, _ := seededKey(2)
	card := cardWith("k2",
		cardKey{version: "k1", status: "retired", createdAt: "2026-01-01T00:00:00Z", retiredAt: "2026-06-01T00:00:00Z", pub: pub1},
		cardKey{version: "k2", status: "current", createdAt: "2026-06-01T00:00:00Z", pub: pub2})
	keys, err := KeysFromCard(card)
	if err != nil {
		t.Fatal(err)
	}
	const inLife = "2026-05-01T00:00:00Z" // while k1 was in service
	// Control: the same trick on a verification receipt is refused.
	ver := fullResponse(t, "k1") // verified_at 2026-11-29, after k1 retired
	if err := VerifyReceipt(attach(t, priv1, ContextVerify, "k1", inLife, ver), keys, ""); err == nil {
		t.Fatal("control: verification receipt with verified_at after retirement verified")
	}
	// The score receipt: computed_at says 2026-11-29, six months after k1 retired.
	forged := attach(t, priv1, ContextScore, "k1", inLife, scoreResponse("k1"))
	for _, context := range []string{"", ContextScore} {
		v, err := Verify(forged, keys, context)
		if err == nil || !strings.Contains(err.Error(), "attestation.timestamp 2026-05-01T00:00:00Z is not the instant of computed_at "+fixtureTime) {
			t.Errorf("context %q: a score signed with retired key k1 (retired 2026-06-01), computed_at %s: %+v, %v", context, fixtureTime, v, err)
		}
	}
	// Dated honestly, inside k1's life, it verifies.
	honest := bytes.Replace(scoreResponse("k1"), []byte(fixtureTime), []byte(inLife), 1)
	if err := VerifyReceipt(attach(t, priv1, ContextScore, "k1", inLife, honest), keys, ""); err != nil {
		t.Errorf("a score computed and signed while k1 was in service: %v", err)
	}
}

// computed_at is held to verified_at's rule: a string naming the
// attestation's instant, in any offset; absent from a score, it is refused,
// since a score without it has no time of its own a reader could trust.
func TestScoreComputedAtIsTheSigningInstant(t *testing.T) {
	pub, priv := seededKey(2)
	keys := SingleKey("", pub)
	score := func(computedAt string) []byte {
		return bytes.Replace(scoreResponse("k2"), []byte(`"`+fixtureTime+`"`), []byte(computedAt), 1)
	}
	noComputedAt := bytes.Replace(scoreResponse("k2"), []byte(`"computed_at":"`+fixtureTime+`",`), nil, 1)
	if bytes.Contains(noComputedAt, []byte("computed_at")) {
		t.Fatal("fixture still has computed_at")
	}
	for _, tc := range []struct {
		desc    string
		receipt []byte
		want    string // "" verifies
	}{
		{"the same string verifies", score(`"` + fixtureTime + `"`), ""},
		{"the same instant in another offset verifies", score(`"2026-11-30T03:07:28.123456+05:45"`), ""},
		{"the same instant with a longer fraction verifies", score(`"2026-11-29T21:22:28.123456000Z"`), ""},
		{"a microsecond later is refused", score(`"2026-11-29T21:22:28.123457+00:00"`), "is not the instant of computed_at 2026-11-29T21:22:28.123457+00:00"},
		{"a time that is not RFC 3339 is refused", score(`"2026-11-29 21:22:28.123456Z"`), "is not the instant of computed_at"},
		{"null is refused", score(`null`), "is not the instant of computed_at"},
		{"a number is refused", score(`1796332948`), "is not the instant of computed_at"},
		{"a score without computed_at is refused", noComputedAt, "receipt has no computed_at"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			_, err := Verify(attach(t, priv, ContextScore, "k2", fixtureTime, tc.receipt), keys, "")
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("Verify: %v; want %q", err, tc.want)
			}
			if tc.want != "" && errors.Is(err, ErrSignature) {
				t.Fatalf("refused for its signature, not its time: %v", err)
			}
		})
	}
	// A verification receipt needs no computed_at: its time is verified_at.
	if err := VerifyReceipt(attach(t, priv, ContextVerify, "k2", fixtureTime, fullResponse(t, "k2")), keys, ""); err != nil {
		t.Fatalf("a verification receipt: %v", err)
	}
}

// A score's inputs.window.to, where it has one, is held to the signing
// instant as computed_at is: verifierd writes them equal, and a reader may
// take either as the score's time. (Before: a leaked retired key could date
// the signature and computed_at inside its service life and write a window
// ending today, and the score verified.)
func TestScoreWindowEndIsTheSigningInstant(t *testing.T) {
	pub, priv := seededKey(2)
	keys := SingleKey("", pub)
	score := func(to string) []byte {
		return bytes.Replace(scoreResponse("k2"), []byte(`"computed_at":`),
			[]byte(`"inputs":{"window":{"from":"2025-11-29T21:22:28.123456Z","to":`+to+`}},"computed_at":`), 1)
	}
	for _, tc := range []struct {
		desc    string
		receipt []byte
		want    string // "" verifies
	}{
		{"the same string verifies", score(`"` + fixtureTime + `"`), ""},
		{"the same instant in another offset verifies", score(`"2026-11-30T03:07:28.123456+05:45"`), ""},
		{"a year later is refused", score(`"2027-11-29T21:22:28.123456Z"`), "is not the instant of inputs.window.to 2027-11-29T21:22:28.123456Z"},
		{"null is refused", score(`null`), "is not the instant of inputs.window.to"},
		{"a score without inputs verifies", scoreResponse("k2"), ""},
		{"a window without to verifies", bytes.Replace(scoreResponse("k2"), []byte(`"computed_at":`), []byte(`"inputs":{"window":{"records":3}},"computed_at":`), 1), ""},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			_, err := Verify(attach(t, priv, ContextScore, "k2", fixtureTime, tc.receipt), keys, "")
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("Verify: %v; want %q", err, tc.want)
			}
		})
	}
}

// computed_at and inputs.window.to are held to the signing instant whatever
// the context: the key holder chooses the context, and a leaked retired key
// signs a score under ContextVerify with an output_hash member (so the
// inferred context is verify too). (Before: both were checked under
// ContextScore only, and this score, computed months after k1 left
// service, verified.)
func TestLeakedRetiredKeyCannotDateAScoreUnderTheVerifyContext(t *testing.T) {
	pub1, priv1 := seededKey(1)
	pub2, _ := seededKey(2)
	keys := mustKeys(t, cardWith("k2",
		cardKey{version: "k1", status: "retired", createdAt: "2026-01-01T00:00:00Z", retiredAt: "2026-06-01T00:00:00Z", pub: pub1},
		cardKey{version: "k2", status: "current", createdAt: "2026-06-01T00:00:00Z", pub: pub2}))
	const inLife = "2026-05-01T00:00:00Z"
	asVerification := func(score []byte) []byte {
		return bytes.Replace(score, []byte(`{"agent_id"`), []byte(`{"output_hash":"","agent_id"`), 1)
	}
	// computed_at says 2026-11-29, after k1's retirement.
	late := asVerification(scoreResponse("k1"))
	// computed_at in k1's life, the window ending after its retirement.
	lateWindow := asVerification(bytes.Replace(scoreResponse("k1"), []byte(`"computed_at":"`+fixtureTime+`"`),
		[]byte(`"computed_at":"`+inLife+`","inputs":{"window":{"to":"`+fixtureTime+`"}}`), 1))
	for name, tc := range map[string]struct {
		resp []byte
		want string
	}{
		"computed_at":      {late, "is not the instant of computed_at " + fixtureTime},
		"inputs.window.to": {lateWindow, "is not the instant of inputs.window.to " + fixtureTime},
	} {
		forged := attach(t, priv1, ContextVerify, "k1", inLife, tc.resp)
		for _, context := range []string{"", ContextVerify} {
			v, err := Verify(forged, keys, context)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s, context %q: score signed by k1 (retired 2026-06-01) dated %s: %+v, %v; want %q", name, context, inLife, v, err, tc.want)
			}
		}
	}
	// Dated honestly, the same shape verifies.
	honest := asVerification(bytes.Replace(scoreResponse("k1"), []byte(fixtureTime), []byte(inLife), 1))
	if err := VerifyReceipt(attach(t, priv1, ContextVerify, "k1", inLife, honest), keys, ""); err != nil {
		t.Errorf("computed_at at the signing instant: %v", err)
	}
}

// A score dates its evidence (inputs.window.from, oldest_evidence_at,
// newest_evidence_at) no later than MaxSigningSkew after computed_at and
// the window's end, which are the signing instant. A leaked retired key k1
// dates the signature, computed_at and window.to inside its service life
// and writes evidence from a year after k1 left service: Verify refuses
// it. (Before: the evidence dates were not read, and the score verified.)
// Evidence a moment after the score verifies: verifierd wrote such scores
// before it left out verifications recorded while a score was computed.
// (Before: refused from the first nanosecond, so genuine receipts issued
// earlier no longer verified.)
func TestScoreEvidenceIsNotDatedAfterTheScore(t *testing.T) {
	pub1, priv1 := seededKey(1)
	pub2, _ := seededKey(2)
	keys := mustKeys(t, cardWith("k2",
		cardKey{version: "k1", status: "retired", createdAt: "2026-01-01T00:00:00Z", retiredAt: "2026-06-01T00:00:00Z", pub: pub1},
		cardKey{version: "k2", status: "current", createdAt: "2026-06-01T00:00:00Z", pub: pub2}))
	const inLife = "2026-05-01T00:00:00Z"
	score := func(from, oldest, newest string) []byte {
		return []byte(`{"agent_id":"seller-7","score":0.97,"inputs":{"owned":true,"window":{"from":` + from + `,"to":"` + inLife + `",` +
			`"records":412,"not_counted":0,"truncated":false,"oldest_evidence_at":` + oldest + `,"newest_evidence_at":` + newest + `}},` +
			`"computed_at":"` + inLife + `","verify":{"public_key_url":"https://verifier.example/.well-known/agent-card.json","key_version":"k1","canonicalization":"RFC 8785 (JCS)","hash_algorithm":"SHA-256","service":"aov","mcp":"https://verifier.example/mcp"}}`)
	}
	const from, oldest, newest = `"2025-05-01T00:00:00Z"`, `"2026-01-30T00:00:00Z"`, `"2026-05-01T02:00:00+02:00"`
	for _, tc := range []struct {
		desc string
		resp []byte
		want string // "" verifies
	}{
		{"evidence up to the score's instant verifies", score(from, oldest, newest), ""},
		{"a score without evidence (null dates) verifies", score(from, "null", "null"), ""},
		{"newest evidence a year after the score is refused", score(from, oldest, `"2027-06-01T00:00:00Z"`), "inputs.window.newest_evidence_at 2027-06-01T00:00:00Z is more than 5m0s after attestation.timestamp " + inLife},
		{"newest evidence seconds after the score verifies (signed before the score left it out)", score(from, oldest, `"2026-05-01T00:00:02.5Z"`), ""},
		{"newest evidence 5 minutes after the score verifies", score(from, oldest, `"2026-05-01T00:05:00Z"`), ""},
		{"newest evidence 5 minutes and a nanosecond after the score is refused", score(from, oldest, `"2026-05-01T00:05:00.000000001Z"`), "inputs.window.newest_evidence_at"},
		{"oldest evidence after the score is refused", score(from, `"2027-05-30T00:00:00Z"`, newest), "inputs.window.oldest_evidence_at 2027-05-30T00:00:00Z is more than 5m0s after"},
		{"a window starting 5 minutes after it ends verifies", score(`"2026-05-01T02:05:00+02:00"`, oldest, newest), ""},
		{"a window starting a day after it ends is refused", score(`"2026-05-02T00:00:00Z"`, oldest, newest), "inputs.window.from 2026-05-02T00:00:00Z is more than 5m0s after"},
		{"an evidence date that is not a time is refused", score(from, `"yesterday"`, newest), "inputs.window.oldest_evidence_at yesterday is not an RFC 3339 time"},
		{"an evidence date that is a number is refused", score(from, oldest, `1`), "inputs.window.newest_evidence_at"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			for _, context := range []string{ContextScore, ContextVerify} {
				resp := tc.resp
				if context == ContextVerify {
					resp = bytes.Replace(resp, []byte(`{"agent_id"`), []byte(`{"output_hash":"","agent_id"`), 1)
				}
				v, err := Verify(attach(t, priv1, context, "k1", inLife, resp), keys, "")
				if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
					t.Errorf("%s: %+v, %v; want %q", context, v, err, tc.want)
				}
			}
		})
	}
}
