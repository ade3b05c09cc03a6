package receipt

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// edit decodes a receipt, lets f change it, and encodes it again (with
// encoding/json's own key order, which canonicalization must not care about).
func edit(t *testing.T, receipt []byte, f func(m map[string]any)) []byte {
	t.Helper()
	m := decodeTree(t, receipt).(map[string]any)
	f(m)
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sub(m map[string]any, key string) map[string]any { return m[key].(map[string]any) }

func TestVerifyReceipt(t *testing.T) {
	pub1, priv1 := seededKey(1)
	pub2, priv2 := seededKey(2)
	pubX, _ := seededKey(9)

	full2 := attach(t, priv2, ContextVerify, "k2", fixtureTime, fullResponse(t, "k2"))
	full1 := attach(t, priv1, ContextVerify, "k1", fixtureTime, fullResponse(t, "k1"))
	score2 := attach(t, priv2, ContextScore, "k2", fixtureTime, scoreResponse("k2"))
	compact := func() []byte {
		m := decodeTree(t, fullResponse(t, "k2")).(map[string]any)
		for _, k := range []string{"request_hash", "errors", "errors_total", "errors_omitted", "errors_detail", "errors_detail_total", "errors_detail_omitted", "flags", "flags_total", "flags_omitted", "hints", "hints_total", "hints_omitted", "schema_compliance", "integrity_checks", "overall"} {
			delete(m, k)
		}
		b, _ := json.Marshal(m)
		return attach(t, priv2, ContextVerify, "k2", fixtureTime, b)
	}()

	card := cardWith("k2", cardKey{version: "k1", status: StatusRetired, pub: pub1}, cardKey{version: "k2", status: StatusCurrent, pub: pub2})
	cardKeys, err := KeysFromCard(card)
	if err != nil {
		t.Fatal(err)
	}

	type check func(t *testing.T, err error)
	valid := func(t *testing.T, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("want valid, got %v", err)
		}
	}
	is := func(target error) check {
		return func(t *testing.T, err error) {
			t.Helper()
			if !errors.Is(err, target) {
				t.Fatalf("want %v, got %v", target, err)
			}
		}
	}
	says := func(text string) check {
		return func(t *testing.T, err error) {
			t.Helper()
			if err == nil || !strings.Contains(err.Error(), text) {
				t.Fatalf("want an error saying %q, got %v", text, err)
			}
		}
	}

	tests := []struct {
		desc    string
		receipt []byte
		keys    KeySet
		context string
		want    check
	}{
		{desc: "a genuine full receipt verifies against the card", receipt: full2, keys: cardKeys, context: ContextVerify, want: valid},
		{desc: "a verification receipt's context is inferred from its output_hash", receipt: full2, keys: cardKeys, want: valid},
		{desc: "a genuine compact receipt verifies", receipt: compact, keys: cardKeys, want: valid},
		{desc: "a bare public key verifies without a card", receipt: full2, keys: SingleKey("", pub2), want: valid},
		{desc: "a bare public key pinned to the receipt's version verifies", receipt: full2, keys: SingleKey("k2", pub2), want: valid},
		{desc: "a receipt of a retired key stays valid after rotation", receipt: full1, keys: cardKeys, want: valid},
		{desc: "whitespace and key order do not matter, only the canonical form", receipt: edit(t, full2, func(map[string]any) {}), keys: cardKeys, want: valid},
		{desc: "a score receipt's context is inferred when it has no output_hash", receipt: score2, keys: cardKeys, want: valid},
		{desc: "a score receipt checked as a verification fails", receipt: score2, keys: cardKeys, context: ContextVerify, want: is(ErrSignature)},
		{desc: "a verification receipt checked as a score fails", receipt: full2, keys: cardKeys, context: ContextScore, want: says("receipt has no computed_at")},
		{desc: "a changed result breaks the signature", receipt: edit(t, full2, func(m map[string]any) { m["result"] = "pass" }), keys: cardKeys, want: is(ErrSignature)},
		{desc: "a changed output_hash breaks the signature", receipt: edit(t, full2, func(m map[string]any) { m["output_hash"] = strings.Repeat("0", 64) }), keys: cardKeys, want: is(ErrSignature)},
		{desc: "a changed number breaks the signature", receipt: edit(t, full2, func(m map[string]any) { sub(m, "overall")["passed"] = 23 }), keys: cardKeys, want: is(ErrSignature)},
		{desc: "a removed member breaks the signature", receipt: edit(t, full2, func(m map[string]any) { delete(m, "hints") }), keys: cardKeys, want: is(ErrSignature)},
		{desc: "an added member breaks the signature", receipt: edit(t, full2, func(m map[string]any) { m["bonus"] = true }), keys: cardKeys, want: is(ErrSignature)},
		{desc: "verify.key_version must equal attestation.key_version", receipt: edit(t, full2, func(m map[string]any) { sub(m, "verify")["key_version"] = "k1" }), keys: cardKeys, want: says(`attestation.key_version k2 differs from verify.key_version k1`)},
		{desc: "attestation.timestamp must be the instant of verified_at", receipt: edit(t, full2, func(m map[string]any) { sub(m, "attestation")["timestamp"] = "2026-11-29T21:22:29.123456+00:00" }), keys: cardKeys, want: says("is not the instant of verified_at")},
		{desc: "moving verified_at and the timestamp together breaks the signature", receipt: edit(t, full2, func(m map[string]any) {
			m["verified_at"] = "2026-11-29T21:22:29.123456+00:00"
			sub(m, "attestation")["timestamp"] = "2026-11-29T21:22:29.123456+00:00"
		}), keys: cardKeys, want: is(ErrSignature)},
		{desc: "a flipped signature bit breaks the signature", receipt: edit(t, full2, func(m map[string]any) {
			a := sub(m, "attestation")
			sig, _ := base64.StdEncoding.DecodeString(a["signature"].(string))
			sig[10] ^= 1
			a["signature"] = base64.StdEncoding.EncodeToString(sig)
		}), keys: cardKeys, want: is(ErrSignature)},
		{desc: "a receipt moved to another listed key version fails", receipt: edit(t, full2, func(m map[string]any) {
			sub(m, "attestation")["key_version"] = "k1"
			sub(m, "verify")["key_version"] = "k1"
		}), keys: cardKeys, want: is(ErrSignature)},
		{desc: "the wrong public key fails", receipt: full2, keys: SingleKey("", pubX), want: is(ErrSignature)},
		{desc: "a key version the card does not list is named", receipt: attach(t, priv2, ContextVerify, "k3", fixtureTime, fullResponse(t, "k3")), keys: cardKeys, want: says("no public key for key_version k3")},
		{desc: "a bare key pinned to another version does not apply", receipt: full2, keys: SingleKey("k1", pub2), want: says("no public key for key_version k2")},
		{desc: "an empty key set verifies nothing", receipt: full2, keys: KeySet{}, want: says("no public key")},
		{desc: "a key compromised before the receipt rejects it", receipt: full2, keys: mustKeys(t, cardWith("k3", cardKey{version: "k2", status: StatusCompromised, compromisedSince: "2026-11-01T00:00:00Z", pub: pub2})), want: says("marked compromised since 2026-11-01T00:00:00Z")},
		{desc: "a key compromised at the receipt's exact instant rejects it", receipt: full2, keys: mustKeys(t, cardWith("k3", cardKey{version: "k2", status: StatusCompromised, compromisedSince: fixtureTime, pub: pub2})), want: says("marked compromised")},
		{desc: "a key compromised after the receipt still verifies it", receipt: full2, keys: mustKeys(t, cardWith("k3", cardKey{version: "k2", status: StatusCompromised, compromisedSince: "2026-12-01T00:00:00Z", pub: pub2})), want: valid},
		// fixtureTime is 2026-11-29T21:22:28.123456Z; MaxSigningSkew is 5 min.
		{desc: "a receipt dated while its retired key was in service verifies", receipt: full1, keys: mustKeys(t, cardWith("k2", cardKey{version: "k1", status: StatusRetired, retiredAt: "2026-11-30T00:00:00Z", pub: pub1})), want: valid},
		{desc: "a receipt dated just after its key's retirement, within the signing skew, verifies", receipt: full1, keys: mustKeys(t, cardWith("k2", cardKey{version: "k1", status: StatusRetired, retiredAt: "2026-11-29T21:18:00Z", pub: pub1})), want: valid},
		{desc: "a receipt dated beyond the skew after its key's retirement is refused", receipt: full1, keys: mustKeys(t, cardWith("k2", cardKey{version: "k1", status: StatusRetired, retiredAt: "2026-11-29T21:17:00Z", pub: pub1})), want: says("key k1 was retired at 2026-11-29T21:17:00Z and this receipt is dated 2026-11-29T21:22:28.123456+00:00, after it left service")},
		{desc: "a receipt dated just before its key's creation, within the signing skew, verifies", receipt: full1, keys: mustKeys(t, cardWith("k1", cardKey{version: "k1", status: StatusCurrent, createdAt: "2026-11-29T21:27:00Z", pub: pub1})), want: valid},
		{desc: "a receipt dated beyond the skew before its key's creation is refused", receipt: full1, keys: mustKeys(t, cardWith("k1", cardKey{version: "k1", status: StatusCurrent, createdAt: "2026-11-29T21:28:00Z", pub: pub1})), want: says("before it existed")},
		{desc: "a key marked compromised without a time rejects every receipt", receipt: full2, keys: mustKeys(t, cardWith("k3", cardKey{version: "k2", status: StatusCompromised, pub: pub2})), want: says("with no start time")},
		{desc: "a receipt without attestation is refused", receipt: fullResponse(t, "k2"), keys: cardKeys, want: says("receipt has no attestation")},
		{desc: "an attestation that is not an object is refused", receipt: edit(t, full2, func(m map[string]any) { m["attestation"] = "yes" }), keys: cardKeys, want: says("attestation is not an object")},
		{desc: "an attestation without a signature is refused", receipt: edit(t, full2, func(m map[string]any) { delete(sub(m, "attestation"), "signature") }), keys: cardKeys, want: says("attestation.signature is missing")},
		{desc: "an algorithm other than Ed25519 is refused", receipt: edit(t, full2, func(m map[string]any) { sub(m, "attestation")["algorithm"] = "RS256" }), keys: cardKeys, want: says("attestation.algorithm is RS256, want Ed25519")},
		{desc: "a signature that is not base64 is refused", receipt: edit(t, full2, func(m map[string]any) { sub(m, "attestation")["signature"] = "%%%" }), keys: cardKeys, want: says("not standard base64")},
		{desc: "a truncated signature is refused", receipt: edit(t, full2, func(m map[string]any) {
			sub(m, "attestation")["signature"] = base64.StdEncoding.EncodeToString(make([]byte, 63))
		}), keys: cardKeys, want: says("63 bytes, want 64")},
		{desc: "a timestamp that is not RFC 3339 is refused", receipt: edit(t, full2, func(m map[string]any) { sub(m, "attestation")["timestamp"] = "yesterday" }), keys: cardKeys, want: says("not an RFC 3339 time")},
		{desc: "a verify member that is not an object is refused", receipt: edit(t, full2, func(m map[string]any) { m["verify"] = 1 }), keys: cardKeys, want: says("verify is not an object")},
		{desc: "duplicate keys are refused, so no reader sees another value", receipt: []byte(strings.Replace(string(full2), `"result":"fail"`, `"result":"pass","result":"fail"`, 1)), keys: cardKeys, want: says("duplicate object key")},
		{desc: "a receipt that is not an object is refused", receipt: []byte(`[1,2]`), keys: cardKeys, want: says("not a JSON object")},
		{desc: "a receipt that is not JSON is refused", receipt: []byte(`{"result":`), keys: cardKeys, want: says("not valid JSON")},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			tc.want(t, VerifyReceipt(tc.receipt, tc.keys, tc.context))
		})
	}
}

func mustKeys(t *testing.T, card []byte) KeySet {
	t.Helper()
	ks, err := KeysFromCard(card)
	if err != nil {
		t.Fatal(err)
	}
	return ks
}

func TestVerifyReportsContextAndKey(t *testing.T) {
	_, priv := seededKey(2)
	pub, _ := seededKey(2)
	got, err := Verify(attach(t, priv, ContextScore, "k2", fixtureTime, scoreResponse("k2")), SingleKey("", pub), "")
	if err != nil {
		t.Fatal(err)
	}
	if got != (Verified{Context: ContextScore, KeyVersion: "k2", Timestamp: fixtureTime}) {
		t.Errorf("got %+v", got)
	}
}

func TestTimestampMayBeTheSameInstantInAnotherNotation(t *testing.T) {
	pub, priv := seededKey(3)
	r := attach(t, priv, ContextVerify, "k2", "2026-11-29T21:22:28.123456Z", fullResponse(t, "k2"))
	if err := VerifyReceipt(r, SingleKey("", pub), ""); err != nil {
		t.Fatal(err)
	}
}

func TestKeysFromCard(t *testing.T) {
	pub1, _ := seededKey(1)
	pub2, _ := seededKey(2)
	b64 := func(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
	wrap := func(exts string) []byte {
		return []byte(`{"name":"x","capabilities":{"extensions":[` + exts + `]}}`)
	}
	ext := func(uri, keys string) string {
		return `{"uri":"` + uri + `","params":{"publicKeys":[` + keys + `],"currentKeyVersion":"k2"}}`
	}
	entry := func(v, alg, key, enc string) string {
		return `{"keyVersion":"` + v + `","algorithm":"` + alg + `","publicKey":"` + key + `","publicKeyEncoding":"` + enc + `"}`
	}
	tests := []struct {
		desc     string
		card     []byte
		versions []string
		err      string
	}{
		{desc: "every key version of the card is read", card: cardWith("k2", cardKey{version: "k1", status: "retired", pub: pub1}, cardKey{version: "k2", status: "current", pub: pub2}), versions: []string{"k1", "k2"}},
		{desc: "a later version of the extension is still found by its prefix", card: wrap(ext("urn:json-schema-verifier:extension:attestation:v2", entry("k1", "Ed25519", b64(pub1), "base64"))), versions: []string{"k1"}},
		{desc: "keys of another algorithm are skipped", card: wrap(ext(ExtensionURI, entry("k1", "Ed25519", b64(pub1), "base64")+","+entry("p1", "ML-DSA-65", "AAAA", "base64"))), versions: []string{"k1"}},
		{desc: "the same key listed twice, in two extensions, is refused", card: wrap(ext(ExtensionURI, entry("k1", "Ed25519", b64(pub1), "base64")) + "," + ext(ExtensionURI, entry("k1", "Ed25519", b64(pub1), "base64"))), err: "key version k1 is listed twice"},
		// Which entry would win is the question a verifier must not answer:
		// keeping the later one here forgot the compromise.
		{desc: "the same key listed twice, once compromised, is refused", card: cardWith("k1", cardKey{version: "k1", status: StatusCompromised, compromisedSince: "2026-01-02T00:00:00Z", pub: pub1}, cardKey{version: "k1", status: StatusCurrent, pub: pub1}), err: "key version k1 is listed twice"},
		{desc: "a card without the attestation extension is refused", card: wrap(ext("urn:example:other", entry("k1", "Ed25519", b64(pub1), "base64"))), err: "no capabilities.extensions entry"},
		{desc: "a card without capabilities is refused", card: []byte(`{"name":"x"}`), err: "no capabilities.extensions entry"},
		{desc: "an extension with no Ed25519 key is refused", card: wrap(ext(ExtensionURI, "")), err: "lists no Ed25519 public key"},
		{desc: "a key that is not base64 is refused", card: wrap(ext(ExtensionURI, entry("k1", "Ed25519", "not base64!", "base64"))), err: "publicKeys[0]: publicKey is not standard base64"},
		{desc: "a key of the wrong length is refused", card: wrap(ext(ExtensionURI, entry("k1", "Ed25519", b64(pub1[:31]), "base64"))), err: "31 bytes, want 32"},
		{desc: "an unknown key encoding is refused", card: wrap(ext(ExtensionURI, entry("k1", "Ed25519", b64(pub1), "hex"))), err: `publicKeyEncoding hex is not supported`},
		{desc: "a key without a version is refused", card: wrap(ext(ExtensionURI, entry("", "Ed25519", b64(pub1), "base64"))), err: "keyVersion is empty"},
		{desc: "one version with two different keys is refused", card: wrap(ext(ExtensionURI, entry("k1", "Ed25519", b64(pub1), "base64")+","+entry("k1", "Ed25519", b64(pub2), "base64"))), err: "key version k1 is listed twice"},
		{desc: "a retiredAt that is not a time is refused", card: wrap(ext(ExtensionURI, `{"keyVersion":"k1","algorithm":"Ed25519","publicKey":"`+b64(pub1)+`","publicKeyEncoding":"base64","status":"retired","retiredAt":"yesterday"}`)), err: "retiredAt is not an RFC 3339 time"},
		{desc: "a createdAt that is not a time is refused", card: wrap(ext(ExtensionURI, `{"keyVersion":"k1","algorithm":"Ed25519","publicKey":"`+b64(pub1)+`","publicKeyEncoding":"base64","createdAt":"2026"}`)), err: "createdAt is not an RFC 3339 time"},
		{desc: "a compromisedSince that is not a time is refused", card: wrap(ext(ExtensionURI, `{"keyVersion":"k1","algorithm":"Ed25519","publicKey":"`+b64(pub1)+`","publicKeyEncoding":"base64","status":"compromised","compromisedSince":"soon"}`)), err: "compromisedSince is not an RFC 3339 time"},
		{desc: "a card that is not JSON is refused", card: []byte(`<html>`), err: "not valid JSON"},
		{desc: "a card with the wrong shape is refused", card: []byte(`{"capabilities":{"extensions":{}}}`), err: "unexpected shape"},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			ks, err := KeysFromCard(tc.card)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("want error %q, got %v", tc.err, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(ks.Versions(), ","); got != strings.Join(tc.versions, ",") {
				t.Errorf("versions %s, want %s", got, strings.Join(tc.versions, ","))
			}
			if ks.Len() != len(tc.versions) {
				t.Errorf("Len %d, want %d", ks.Len(), len(tc.versions))
			}
			if ks.Current() != "k2" {
				t.Errorf("current %q", ks.Current())
			}
		})
	}
}

func TestSingleKeyHoldsOneKey(t *testing.T) {
	pub, _ := seededKey(4)
	for _, v := range []string{"", "k1"} {
		if n := SingleKey(v, pub).Len(); n != 1 {
			t.Errorf("SingleKey(%q).Len() = %d", v, n)
		}
	}
	if n := (KeySet{}).Len(); n != 0 {
		t.Errorf("empty set Len %d", n)
	}
}

func TestParsePublicKey(t *testing.T) {
	pub, _ := seededKey(4)
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		got, err := ParsePublicKey(" " + enc.EncodeToString(pub) + "\n")
		if err != nil || !got.Equal(pub) {
			t.Errorf("%v: %v", enc, err)
		}
	}
	for _, bad := range []string{"", "!!!", base64.StdEncoding.EncodeToString(pub[:16])} {
		if _, err := ParsePublicKey(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestCheckHashes(t *testing.T) {
	_, priv := seededKey(5)
	want := hashesOf(t, invoiceRequest)
	want.Request = "9a3e0d1c2b4f5a6e7d8c9b0a1f2e3d4c5b6a7f8e9d0c1b2a3f4e5d6c7b8a9f0e"
	full := attach(t, priv, ContextVerify, "k2", fixtureTime, fullResponse(t, "k2"))
	compact := edit(t, full, func(m map[string]any) { delete(m, "request_hash") })
	other := hashesOf(t, strings.Replace(invoiceRequest, `"total": 135.0`, `"total": 129.5`, 1))

	tests := []struct {
		desc    string
		receipt []byte
		want    Hashes
		err     string
		fields  []string
	}{
		{desc: "the hashes of the request the holder kept match", receipt: full, want: want},
		{desc: "a compact receipt has no request_hash to compare", receipt: compact, want: want},
		{desc: "a receipt checked without a recomputed request_hash skips it", receipt: full, want: Hashes{Output: want.Output, Schema: want.Schema, Rules: want.Rules}},
		{desc: "another output is named with both hashes", receipt: full, want: Hashes{Output: other.Output, Schema: want.Schema, Rules: want.Rules, Request: want.Request},
			err: "output_hash differs: receipt has " + want.Output + ", request gives " + other.Output, fields: []string{"output_hash"}},
		{desc: "every differing hash is reported", receipt: full, want: Hashes{Output: "a", Schema: "b", Rules: "c", Request: "d"},
			err: "output_hash differs", fields: []string{"output_hash", "schema_hash", "rules_hash", "request_hash"}},
		{desc: "a receipt without output_hash is refused", receipt: scoreResponse("k2"), want: want, err: "receipt has no output_hash"},
		{desc: "a hash that is not a string is refused", receipt: edit(t, full, func(m map[string]any) { m["rules_hash"] = 1 }), want: want, err: "rules_hash is not a string"},
		{desc: "nothing computed to compare with is an error, not a pass", receipt: full, want: Hashes{}, err: "no output_hash was computed"},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			err := CheckHashes(tc.receipt, tc.want)
			if tc.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("want %q, got %v", tc.err, err)
			}
			var he *HashesError
			if len(tc.fields) > 0 {
				if !errors.As(err, &he) {
					t.Fatalf("not a *HashesError: %T", err)
				}
				var got []string
				for _, m := range he.Mismatches {
					got = append(got, m.Field)
				}
				if strings.Join(got, ",") != strings.Join(tc.fields, ",") {
					t.Errorf("fields %v, want %v", got, tc.fields)
				}
				var one HashMismatch
				if !errors.As(err, &one) || one.Field != tc.fields[0] {
					t.Errorf("errors.As HashMismatch: %+v", one)
				}
			}
		})
	}
}

func TestErrorsDoNotCarryControlCharactersFromTheReceipt(t *testing.T) {
	_, priv := seededKey(6)
	r := attach(t, priv, ContextVerify, "k\x1b[31m", fixtureTime, fullResponse(t, `k\u001b[31m`))
	err := VerifyReceipt(r, KeySet{}, "")
	if err == nil || !strings.Contains(err.Error(), `no public key for key_version "k\x1b[31m"`) {
		t.Fatalf("got %q", err)
	}
	long := strings.Repeat("k", 5000)
	err = VerifyReceipt(attach(t, priv, ContextVerify, long, fixtureTime, fullResponse(t, long)), KeySet{}, "")
	if err == nil || !strings.Contains(err.Error(), "no public key") || len(err.Error()) > 300 {
		t.Fatalf("error of %d bytes", len(err.Error()))
	}
}

func TestOversizedReceiptsAreRefusedBeforeParsing(t *testing.T) {
	big := make([]byte, maxReceiptBytes+1)
	for _, f := range []func() error{
		func() error { return VerifyReceipt(big, KeySet{}, "") },
		func() error { return CheckHashes(big, Hashes{}) },
	} {
		if err := f(); err == nil || !strings.Contains(err.Error(), "larger than") {
			t.Errorf("got %v", err)
		}
	}
}

func TestCheckRequest(t *testing.T) {
	_, priv := seededKey(5)
	full := attach(t, priv, ContextVerify, "k2", fixtureTime, fullResponse(t, "k2"))
	hs := hashesOf(t, invoiceRequest)
	agent := "test-seller-1"
	want := Expected{Hashes: Hashes{Output: hs.Output, Schema: hs.Schema, Rules: hs.Rules}, TaskID: "invoice-7731", AgentID: &agent, EnforceRules: true}
	with := func(f func(e *Expected)) Expected { e := want; f(&e); return e }
	other := "seller-\u202e9"
	for _, tc := range []struct {
		desc    string
		receipt []byte
		want    Expected
		err     string
	}{
		{desc: "the receipt states the request's members", receipt: full, want: want},
		{desc: "a null agent_id differs from the receipt's", receipt: full, want: with(func(e *Expected) { e.AgentID = nil }), err: `agent_id differs: receipt has "test-seller-1", request gives null`},
		{desc: "another agent_id is printed escaped", receipt: full, want: with(func(e *Expected) { e.AgentID = &other }), err: `agent_id differs: receipt has "test-seller-1", request gives "seller-\u202e9"`},
		{desc: "strict_content_check is compared", receipt: full, want: with(func(e *Expected) { e.StrictContentCheck = true }), err: "strict_content_check differs: receipt has false, request gives true"},
		{desc: "hashes and members are reported together", receipt: full, want: with(func(e *Expected) { e.Output = "a"; e.EnforceRules = false }), err: "output_hash differs: receipt has " + hs.Output + ", request gives a; enforce_rules differs: receipt has true, request gives false"},
		{desc: "a receipt without the member is refused", receipt: edit(t, full, func(m map[string]any) { delete(m, "enforce_rules") }), want: want, err: "receipt has no enforce_rules"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			err := CheckRequest(tc.receipt, tc.want)
			if tc.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || err.Error() != tc.err {
				t.Fatalf("got %v\nwant %s", err, tc.err)
			}
		})
	}
}

// A signed receipt with a number rewritten as a text strconv misreads is
// refused: "0.<100000 zeros>1e100001" is exactly 1 (to a JavaScript
// parser or math/big), but strconv reads 0, so it canonicalized to the
// signed bytes of "passed":0 and verified.
func TestVerifyRefusesANumberStrconvMisreads(t *testing.T) {
	pub, priv := seededKey(2)
	card := cardWith("k2", cardKey{version: "k2", status: StatusCurrent, pub: pub})
	keys, err := KeysFromCard(card)
	if err != nil {
		t.Fatal(err)
	}
	signed := attach(t, priv, ContextVerify, "k2", fixtureTime, fullResponse(t, "k2"))
	if err := VerifyReceipt(signed, keys, ContextVerify); err != nil {
		t.Fatalf("the genuine receipt: %v", err)
	}
	for _, forged := range []string{"0." + strings.Repeat("0", 100000) + "1e100001", "1e-400"} {
		was := `"integrity_checks":{"ratio":0.0,"passed":0,`
		resp := bytes.Replace(signed, []byte(was), []byte(`"integrity_checks":{"ratio":0.0,"passed":`+forged+`,`), 1)
		if bytes.Equal(resp, signed) {
			t.Fatal("fixture changed: no integrity_checks.passed of 0")
		}
		if err := VerifyReceipt(resp, keys, ContextVerify); err == nil {
			t.Errorf("a receipt with passed %.20s… in place of the signed 0 verifies", forged)
		}
	}
}

// The key versions NoKeyError lists come from the card, which may be
// hostile: each is quoted when it is not plain (so no control character
// reaches a terminal) and cut at 80 bytes, and the list stops at ten.
func TestNoKeyErrorQuotesAndCapsTheCardsVersions(t *testing.T) {
	known := []string{"k1", "\x1b]0;owned\x07\x1b[2J", strings.Repeat("k", 200)}
	for i := range 20 {
		known = append(known, fmt.Sprintf("v%d", i))
	}
	got := (&NoKeyError{KeyVersion: "k9", Known: known}).Error()
	want := `no public key for key_version k9 (the keys given are k1, "\x1b]0;owned\a\x1b[2J", "` + strings.Repeat("k", 80) + `"…, v0, v1, v2, v3, v4, v5, v6, ... (+13 more))`
	if got != want {
		t.Errorf("NoKeyError = %q\nwant          %q", got, want)
	}
	if strings.ContainsFunc(got, func(r rune) bool { return r < ' ' || r == 0x7f }) {
		t.Errorf("a control character reaches the message: %q", got)
	}
}

// TestKeysFromCardReadsExactMemberNames: a card is read by its exact member
// names, as JavaScript, jq and RFC 8785 read it. encoding/json matches a
// struct field to any member equal to its name without regard to case
// (U+017F ſ folds to s), the last one winning: an entry reading
// "status":"compromised" to every other reader, with a "Status":"current"
// after it, was trusted here.
func TestKeysFromCardReadsExactMemberNames(t *testing.T) {
	pub, priv := seededKey(2)
	rec := attach(t, priv, ContextVerify, "k2", fixtureTime, fullResponse(t, "k2"))
	card := func(entry string) []byte {
		return []byte(`{"capabilities":{"extensions":[{"uri":"` + ExtensionURI + `","params":{"publicKeys":[{"keyVersion":"k2","algorithm":"Ed25519","publicKey":"` +
			base64.StdEncoding.EncodeToString(pub) + `","publicKeyEncoding":"base64"` + entry + `}]}}]}}`)
	}
	for _, tc := range []struct {
		desc, entry string
		err         string // "" when the receipt verifies
	}{
		{"a twin Status after status compromised is another member", `,"status":"compromised","Status":"current"`, "is marked compromised"},
		{"a twin ſtatus (U+017F) after status compromised is another member", `,"status":"compromised","ſtatus":"current"`, "is marked compromised"},
		{"twins of status and compromisedSince change nothing", `,"status":"compromised","compromisedSince":"2026-01-01T00:00:00Z","Status":"current","CompromisedSince":""`, "is marked compromised since 2026-01-01"},
		{"compromisedsince is not compromisedSince", `,"status":"current","compromisedsince":"2026-01-02T00:00:00Z"`, ""},
		{"Status alone is not status", `,"Status":"compromised"`, ""},
		{"a status that is not a string is refused", `,"status":["compromised"]`, "publicKeys[0].status is not a string"},
		{"a compromisedSince that is not a string is refused", `,"compromisedSince":1`, "publicKeys[0].compromisedSince is not a string"},
		{"null is an absent member", `,"status":null,"retiredAt":null`, ""},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			ks, err := KeysFromCard(card(tc.entry))
			if err == nil {
				err = VerifyReceipt(rec, ks, "")
			}
			if tc.err == "" && err != nil {
				t.Fatalf("want the receipt verified, got %v", err)
			}
			if tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("want an error with %q, got %v", tc.err, err)
			}
		})
	}
	// A keyVersion spelled otherwise is no keyVersion.
	c := bytes.Replace(card(""), []byte(`"keyVersion"`), []byte(`"KeyVersion"`), 1)
	if _, err := KeysFromCard(c); err == nil || !strings.Contains(err.Error(), "keyVersion is empty") {
		t.Errorf("a card whose key has KeyVersion only: %v", err)
	}
}

// TestTimesAreReadInTheFormRFC3339WritesThem: receipts and cards carry
// times as RFC 3339 writes them. time.Parse also takes forms no RFC 3339
// reader does (a one-digit hour, a comma before the fraction, an offset of
// +24:00 or 60 minutes), which a JavaScript or Python verifier refuses, so
// one receipt would verify with this package and not with theirs. More than
// 9 fraction digits are RFC 3339 and read as time.Parse reads them, cut to
// the nanosecond.
func TestTimesAreReadInTheFormRFC3339WritesThem(t *testing.T) {
	for s, want := range map[string]string{
		"2026-11-29T21:22:28Z":            "2026-11-29T21:22:28Z",
		"2026-11-29T21:22:28.1234567891Z": "2026-11-29T21:22:28.123456789Z",
		"2026-11-29T23:22:28+02:00":       "2026-11-29T21:22:28Z",
		"2026-11-29T21:22:28-00:00":       "2026-11-29T21:22:28Z",
		"2024-02-29T00:00:00Z":            "2024-02-29T00:00:00Z",
		"2026-11-29T1:22:28Z":             "",
		"2026-11-29T21:22:28,5Z":          "",
		"2026-01-01T00:00:00+24:00":       "",
		"2026-01-01T00:00:00+23:60":       "",
		"2026-02-30T00:00:00Z":            "",
		"2026-11-31T00:00:00Z":            "",
		"2026-11-29T24:00:00Z":            "",
		"2026-11-29T23:59:60Z":            "",
		"2026-11-29t21:22:28z":            "",
		"2026-11-29T21:22:28.Z":           "",
		"2026-11-29T21:22:28":             "",
		" 2026-11-29T21:22:28Z":           "",
	} {
		got, err := ParseTime(s)
		switch {
		case want == "" && err == nil:
			t.Errorf("ParseTime(%q) = %v, want it refused", s, got)
		case want != "" && (err != nil || got.UTC().Format(time.RFC3339Nano) != want):
			t.Errorf("ParseTime(%q) = %v, %v; want %s", s, got, err, want)
		}
	}
	// Where the package reads them: a card's times, a receipt's timestamp.
	pub, priv := seededKey(2)
	if _, err := KeysFromCard(cardWith("k2", cardKey{version: "k2", status: StatusCurrent, createdAt: "2026-01-01T00:00:00+24:00", pub: pub})); err == nil || !strings.Contains(err.Error(), "createdAt is not an RFC 3339 time") {
		t.Errorf("a createdAt with offset +24:00: %v", err)
	}
	r := attach(t, priv, ContextScore, "k2", "2026-11-29T21:22:28,5Z", scoreResponse("k2"))
	if err := VerifyReceipt(r, SingleKey("", pub), ""); err == nil || !strings.Contains(err.Error(), "is not an RFC 3339 time") {
		t.Errorf("a receipt dated with a comma before the fraction: %v", err)
	}
}

// TestBase64HasNoLineBreaks: encoding/base64 skips CR and LF even in strict
// mode, so a signature or a card's key with a line break inside read as
// the same bytes here while other readers refuse them (or read others).
func TestBase64HasNoLineBreaks(t *testing.T) {
	pub, priv := seededKey(2)
	r := attach(t, priv, ContextVerify, "k2", fixtureTime, fullResponse(t, "k2"))
	i := bytes.Index(r, []byte(`"signature":"`)) + len(`"signature":"`) + 10
	broken := append(append(append([]byte(nil), r[:i]...), `\n`...), r[i:]...)
	if err := VerifyReceipt(broken, SingleKey("", pub), ""); err == nil || !strings.Contains(err.Error(), "attestation.signature is not standard base64") {
		t.Errorf("a signature with a line break: %v", err)
	}
	c := cardWith("k2", cardKey{version: "k2", status: StatusCurrent, pub: pub})
	c = bytes.Replace(c, []byte(base64.StdEncoding.EncodeToString(pub)[:8]), []byte(base64.StdEncoding.EncodeToString(pub)[:8]+`\r\n`), 1)
	if _, err := KeysFromCard(c); err == nil || !strings.Contains(err.Error(), "publicKey is not standard base64") {
		t.Errorf("a card's publicKey with a line break: %v", err)
	}
}

// The attestation is the one part of a receipt the signature does not
// cover. SPEC §5 gives it four members; anything more is text a holder
// added that a reader may take for the service's (a "verified": true, a
// second key URL), and Verify refuses it. (Before: other members were
// ignored, and these receipts verified.)
func TestAttestationMembersBeyondTheFourAreRefused(t *testing.T) {
	pub, priv := seededKey(2)
	keys := mustKeys(t, cardWith("k2", cardKey{version: "k2", status: StatusCurrent, pub: pub}))
	genuine := attach(t, priv, ContextVerify, "k2", fixtureTime, fullResponse(t, "k2"))
	if err := VerifyReceipt(genuine, keys, ""); err != nil {
		t.Fatalf("genuine receipt: %v", err)
	}
	for extra, want := range map[string]string{
		`,"verified":true,"result":"pass"`:                                     "attestation has a member ",
		`,"keyVersion":"k9","public_key_url":"https://evil.example/card.json"`: "attestation has a member ",
		`,"Signature":"x"`: "attestation has a member Signature, which is not signed",
	} {
		i := bytes.LastIndex(genuine, []byte(`}}`))
		forged := append(append(append([]byte(nil), genuine[:i]...), extra...), genuine[i:]...)
		if err := VerifyReceipt(forged, keys, ""); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("attestation with the unsigned members %s: %v; want %q", extra, err, want)
		}
	}
}
