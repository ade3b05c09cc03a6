package verify

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/receipt"
)

// topKeys returns the top-level keys of a JSON object in written order.
func topKeys(t *testing.T, b []byte) []string {
	t.Helper()
	return objectKeys(t, json.NewDecoder(bytes.NewReader(b)))
}

// objectKeys reads one object from dec and returns its keys in order.
func objectKeys(t *testing.T, dec *json.Decoder) []string {
	t.Helper()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("not an object: %v %v", tok, err)
	}
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, tok.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

// memberKeys returns the keys of the object at top-level member name.
func memberKeys(t *testing.T, b []byte, name string) []string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return topKeys(t, m[name])
}

// listItems returns the entries of the top-level list name.
func listItems(t *testing.T, b []byte, name string) []json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	var items []json.RawMessage
	if err := json.Unmarshal(m[name], &items); err != nil {
		t.Fatal(err)
	}
	return items
}

var fullKeys = []string{"summary", "next_actions", "result", "verification_id", "task_id", "agent_id",
	"output_hash", "schema_hash", "rules_hash", "request_hash", "verified_at", "verifier_version",
	"enforce_rules", "strict_content_check", "errors", "errors_total", "errors_omitted",
	"errors_detail", "errors_detail_total", "errors_detail_omitted", "flags", "flags_total",
	"flags_omitted", "hints", "hints_total", "hints_omitted", "schema_compliance",
	"integrity_checks", "overall", "verify", "attestation"}

var compactKeys = []string{"summary", "next_actions", "result", "verification_id", "task_id", "agent_id",
	"output_hash", "schema_hash", "rules_hash", "verified_at", "verifier_version", "enforce_rules",
	"strict_content_check", "verify", "attestation"}

func signed(r *Result) *Result {
	r.Verify = receipt.VerifyBlock{PublicKeyURL: "https://v.example/.well-known/agent-card.json", KeyVersion: "k1",
		Canonicalization: receipt.Canonicalization, HashAlgorithm: receipt.HashAlgorithm, Service: "aov", MCP: "https://v.example/mcp"}
	r.Attestation = &receipt.Attestation{Algorithm: receipt.Algorithm, KeyVersion: "k1", Timestamp: r.VerifiedAt, Signature: "c2ln"}
	return r
}

func TestResultKeyOrder(t *testing.T) {
	v := New(Config{})
	tests := []struct {
		desc   string
		detail string
		keys   []string
	}{
		{desc: "a full result has every SPEC §4 key in order, attestation last", detail: "full", keys: fullKeys},
		{desc: "a compact result keeps only the compact keys, in order", detail: "compact", keys: compactKeys},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			r := signed(check(t, v, invoiceRequest("135.0")[:len(invoiceRequest("135.0"))-1]+`,"detail":"`+tc.detail+`"}`))
			b, err := r.MarshalJSON()
			if err != nil {
				t.Fatal(err)
			}
			if got := topKeys(t, b); !reflect.DeepEqual(got, tc.keys) {
				t.Fatalf("keys\n got %q\nwant %q", got, tc.keys)
			}
			if got := memberKeys(t, b, "summary"); !reflect.DeepEqual(got, []string{"result", "blocking_checks"}) {
				t.Errorf("summary keys %q", got)
			}
			if got := memberKeys(t, b, "verify"); !reflect.DeepEqual(got, []string{"public_key_url", "key_version", "canonicalization", "hash_algorithm", "service", "mcp"}) {
				t.Errorf("verify keys %q", got)
			}
			if got := memberKeys(t, b, "attestation"); !reflect.DeepEqual(got, []string{"algorithm", "key_version", "timestamp", "signature"}) {
				t.Errorf("attestation keys %q", got)
			}
			if tc.detail == "full" {
				for _, block := range []string{"schema_compliance", "integrity_checks", "overall"} {
					if got := memberKeys(t, b, block); !reflect.DeepEqual(got, []string{"ratio", "passed", "total"}) {
						t.Errorf("%s keys %q", block, got)
					}
				}
				dec := json.NewDecoder(bytes.NewReader(listItems(t, b, "errors_detail")[0]))
				if got := objectKeys(t, dec); !reflect.DeepEqual(got, []string{"check", "path", "expected", "found", "message"}) {
					t.Errorf("errors_detail keys %q", got)
				}
				dec = json.NewDecoder(bytes.NewReader(listItems(t, b, "flags")[0]))
				if got := objectKeys(t, dec); !reflect.DeepEqual(got, []string{"check", "field", "severity", "detail"}) {
					t.Errorf("flags keys %q", got)
				}
				dec = json.NewDecoder(bytes.NewReader(listItems(t, b, "hints")[0]))
				if got := objectKeys(t, dec); !reflect.DeepEqual(got, []string{"source", "check", "path", "expected", "found"}) {
					t.Errorf("hints keys %q", got)
				}
			}
		})
	}
}

func TestUnsignedResultOmitsAttestation(t *testing.T) {
	r := check(t, New(Config{}), invoiceRequest("129.5"))
	b, _ := r.MarshalJSON()
	keys := topKeys(t, b)
	if keys[len(keys)-1] != "verify" || strings.Contains(string(b), `"attestation"`) {
		t.Fatalf("unsigned result keys end %q", keys[len(keys)-3:])
	}
	// The bytes are what gets signed: they canonicalize without error.
	if _, err := receipt.Canonicalize(b); err != nil {
		t.Fatal(err)
	}
}

func TestFlagKeyOrder(t *testing.T) {
	r := check(t, New(Config{}), body(`rules=[{"type":"gte","field":"total","value":5}]`))
	b, _ := r.MarshalJSON()
	flags := listItems(t, b, "flags")
	if len(flags) != 1 {
		t.Fatalf("flags %s", flags)
	}
	if got := objectKeys(t, json.NewDecoder(bytes.NewReader(flags[0]))); !reflect.DeepEqual(got, []string{"check", "field", "severity", "detail"}) {
		t.Errorf("flag keys %q", got)
	}
}

func TestResultFieldsCarryTheRequest(t *testing.T) {
	v := New(Config{VerifierVersion: "1.2.3"})
	req, err := v.Parse([]byte(body(`agent_id="seller-\"7\""`, `strict_content_check=true`)))
	if err != nil {
		t.Fatal(err)
	}
	r := v.Check(req, "id-1", time.Date(2026, 1, 2, 3, 4, 5, 6000, time.FixedZone("x", 3600)))
	var m map[string]any
	b, _ := r.MarshalJSON()
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	want := map[string]any{
		"verification_id": "id-1", "task_id": "t-1", "agent_id": `seller-"7"`, "verifier_version": "1.2.3",
		"verified_at": "2026-01-02T02:04:05.000006+00:00", "enforce_rules": false, "strict_content_check": true,
		"output_hash": req.Hashes.Output, "schema_hash": req.Hashes.Schema, "rules_hash": req.Hashes.Rules, "request_hash": req.Hashes.Request,
	}
	for k, w := range want {
		if m[k] != w {
			t.Errorf("%s = %#v, want %#v", k, m[k], w)
		}
	}
	r2 := check(t, v, body())
	b, _ = r2.MarshalJSON()
	if !strings.Contains(string(b), `"agent_id":null`) {
		t.Error("an absent agent_id is not written as null")
	}
}

func TestRatiosAreNumbersWithSixDecimals(t *testing.T) {
	tests := []struct {
		desc  string
		tally Tally
		want  string
	}{
		{desc: "no checks is ratio 1.0", tally: Tally{0, 0}, want: `{"ratio":1.0,"passed":0,"total":0}`},
		{desc: "all passed is 1.0", tally: Tally{22, 22}, want: `{"ratio":1.0,"passed":22,"total":22}`},
		{desc: "none passed is 0.0", tally: Tally{0, 3}, want: `{"ratio":0.0,"passed":0,"total":3}`},
		{desc: "ratios round to 6 decimals", tally: Tally{2, 3}, want: `{"ratio":0.666667,"passed":2,"total":3}`},
		{desc: "short ratios stay short", tally: Tally{1, 4}, want: `{"ratio":0.25,"passed":1,"total":4}`},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			got := string(appendTally(nil, "x", tc.tally))
			if want := `,"x":` + tc.want; got != want {
				t.Errorf("got %s, want %s", got, want)
			}
		})
	}
}

func TestFormatTime(t *testing.T) {
	tests := []struct {
		desc string
		in   time.Time
		want string
	}{
		{desc: "UTC with microseconds and +00:00", in: time.Date(2026, 11, 29, 21, 22, 28, 123456789, time.UTC), want: "2026-11-29T21:22:28.123456+00:00"},
		{desc: "whole seconds keep six zeros", in: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), want: "2026-01-01T00:00:00.000000+00:00"},
		{desc: "other zones are converted to UTC", in: time.Date(2026, 1, 1, 1, 0, 0, 0, time.FixedZone("CET", 3600)), want: "2026-01-01T00:00:00.000000+00:00"},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			if got := FormatTime(tc.in); got != tc.want {
				t.Errorf("FormatTime = %s, want %s", got, tc.want)
			}
		})
	}
}
