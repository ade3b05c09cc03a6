package verify

import (
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/aovhq/aov/receipt"
)

// Result values.
const (
	ResultPass = "pass"
	ResultFail = "fail"
)

// Result is an unsigned verification result (SPEC §4). Check fills
// everything except Verify and Attestation, which the caller sets around
// signing. MarshalJSON writes it in the contract's exact key order for
// Detail; receipts are signed over the canonical form of those bytes
// (which AppendCanonical writes directly), so the order matters only to
// people reading them, but it is part of the contract all the same.
type Result struct {
	VerificationID     string
	TaskID             string
	AgentID            *string
	Result             string   // ResultPass or ResultFail
	BlockingChecks     []string // names of the failed blocking checks, first failure first
	Hashes             receipt.Hashes
	VerifiedAt         string // FormatTime of the verification instant
	VerifierVersion    string
	EnforceRules       bool
	StrictContentCheck bool
	Detail             string // DetailFull or DetailCompact

	// The four lists hold at most Config.ListCap entries each; the totals
	// count every entry, shown or not.
	Errors            []string
	ErrorsTotal       int
	ErrorsDetail      []ErrorDetail
	ErrorsDetailTotal int
	Flags             []Flag
	FlagsTotal        int
	Hints             []Hint
	HintsTotal        int

	Schema, Integrity, Overall Tally

	Verify      receipt.VerifyBlock
	Attestation *receipt.Attestation // omitted from JSON while nil

	listCap int
	// listBytes is the text of the findings shown so far (report); once
	// one would pass MaxListBytes, listsClosed, and the lists take no more.
	listBytes   int
	listsClosed bool
}

// ErrorDetail is one entry of errors_detail. Message is the text of the
// matching errors entry.
type ErrorDetail struct {
	Check, Path, Expected, Found, Message string
}

// Flag is one entry of flags: a rule violation. Severity is "error" when it
// blocks (enforce_rules) and "warning" otherwise; Field is the rule's field
// as the caller wrote it; Detail is the finding without the check name.
type Flag struct {
	Check, Field, Severity, Detail string
}

// Hint is one entry of hints: where and what to repair, for an agent.
// Source is "schema" or "integrity".
type Hint struct {
	Source, Check, Path, Expected, Found string
}

// Tally counts the checks of one family.
type Tally struct{ Passed, Total int }

// Ratio is Passed/Total rounded to 6 decimals, and 1 when there are no
// checks (nothing failed).
func (t Tally) Ratio() float64 {
	if t.Total == 0 {
		return 1
	}
	return math.Round(float64(t.Passed)/float64(t.Total)*1e6) / 1e6
}

// count counts a finding of check that no list shows.
func (r *Result) count(check string, blocking, flagged bool) {
	if blocking {
		r.addBlocking(check)
		r.ErrorsTotal++
		r.ErrorsDetailTotal++
	}
	if flagged {
		r.FlagsTotal++
	}
	r.HintsTotal++
}

func (r *Result) addBlocking(check string) {
	for _, c := range r.BlockingChecks {
		if c == check {
			return
		}
	}
	r.BlockingChecks = append(r.BlockingChecks, check)
}

// FormatTime formats an instant as results carry it: UTC, RFC 3339 with
// exactly six fractional digits and a "+00:00" offset
// ("2026-11-29T21:22:28.123456+00:00"). The attestation timestamp uses the
// same string, so a receipt names one instant one way.
func FormatTime(t time.Time) string {
	return t.UTC().Format("2006-01-02T15:04:05.000000") + "+00:00"
}

// FormatNumber formats a number for result sentences the way the original
// service's documentation prints them: the shortest text that reads back as
// the same double, always with a decimal point or an exponent so a value
// reads as a number, not a count ("135.0", "129.5", "0.0001", "1e-05",
// "1e+16"). Plain digits are used from 1e-4 up to 1e16, exponents outside;
// a sum that overflows reads "inf".
func FormatNumber(f float64) string {
	return string(appendNumber(nil, f))
}

func appendNumber(dst []byte, f float64) []byte {
	if f == 0 {
		return append(dst, "0.0"...)
	}
	switch { // never in a decoded request, but a sum can overflow
	case math.IsInf(f, 1):
		return append(dst, "inf"...)
	case math.IsInf(f, -1):
		return append(dst, "-inf"...)
	case math.IsNaN(f):
		return append(dst, "nan"...)
	}
	if a := math.Abs(f); a >= 1e16 || a < 1e-4 {
		return strconv.AppendFloat(dst, f, 'e', -1, 64)
	}
	n := len(dst)
	dst = strconv.AppendFloat(dst, f, 'f', -1, 64)
	for _, c := range dst[n:] {
		if c == '.' {
			return dst
		}
	}
	return append(dst, ".0"...)
}

// MarshalJSON writes the result in SPEC §4's key order for r.Detail.
// Ratios are JSON numbers written with at least one decimal ("1.0",
// "0.954545"); attestation is left out while nil.
func (r *Result) MarshalJSON() ([]byte, error) {
	return r.AppendJSON(make([]byte, 0, 1024)), nil
}

// AppendJSON appends the JSON form of MarshalJSON to dst.
func (r *Result) AppendJSON(b []byte) []byte {
	full := r.Detail != DetailCompact
	b = append(b, `{"summary":{"result":`...)
	b = receipt.AppendString(b, r.Result)
	b = append(b, `,"blocking_checks":[`...)
	for i, c := range r.BlockingChecks {
		if i > 0 {
			b = append(b, ',')
		}
		b = receipt.AppendString(b, c)
	}
	b = append(b, `]},"next_actions":`...)
	if r.Result == ResultPass {
		b = append(b, `[{"action":"attach_receipt","for":"seller"},{"action":"proceed_to_payment","for":"buyer"}]`...)
	} else {
		b = append(b, `[{"action":"repair_and_reverify","using":"hints"}]`...)
	}
	b = appendKey(b, "result")
	b = receipt.AppendString(b, r.Result)
	b = appendKey(b, "verification_id")
	b = receipt.AppendString(b, r.VerificationID)
	b = appendKey(b, "task_id")
	b = receipt.AppendString(b, r.TaskID)
	b = appendKey(b, "agent_id")
	if r.AgentID == nil {
		b = append(b, "null"...)
	} else {
		b = receipt.AppendString(b, *r.AgentID)
	}
	b = appendKey(b, "output_hash")
	b = receipt.AppendString(b, r.Hashes.Output)
	b = appendKey(b, "schema_hash")
	b = receipt.AppendString(b, r.Hashes.Schema)
	b = appendKey(b, "rules_hash")
	b = receipt.AppendString(b, r.Hashes.Rules)
	if full {
		b = appendKey(b, "request_hash")
		b = receipt.AppendString(b, r.Hashes.Request)
	}
	b = appendKey(b, "verified_at")
	b = receipt.AppendString(b, r.VerifiedAt)
	b = appendKey(b, "verifier_version")
	b = receipt.AppendString(b, r.VerifierVersion)
	b = appendKey(b, "enforce_rules")
	b = strconv.AppendBool(b, r.EnforceRules)
	b = appendKey(b, "strict_content_check")
	b = strconv.AppendBool(b, r.StrictContentCheck)
	if full {
		b = appendKey(b, "errors")
		b = append(b, '[')
		for i, e := range r.Errors {
			if i > 0 {
				b = append(b, ',')
			}
			b = receipt.AppendString(b, e)
		}
		b = append(b, ']')
		b = appendCounts(b, "errors_total", "errors_omitted", r.ErrorsTotal, len(r.Errors))

		b = appendKey(b, "errors_detail")
		b = append(b, '[')
		for i, e := range r.ErrorsDetail {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"check":`...)
			b = receipt.AppendString(b, e.Check)
			b = appendKey(b, "path")
			b = receipt.AppendString(b, e.Path)
			b = appendKey(b, "expected")
			b = receipt.AppendString(b, e.Expected)
			b = appendKey(b, "found")
			b = receipt.AppendString(b, e.Found)
			b = appendKey(b, "message")
			b = receipt.AppendString(b, e.Message)
			b = append(b, '}')
		}
		b = append(b, ']')
		b = appendCounts(b, "errors_detail_total", "errors_detail_omitted", r.ErrorsDetailTotal, len(r.ErrorsDetail))

		b = appendKey(b, "flags")
		b = append(b, '[')
		for i, f := range r.Flags {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"check":`...)
			b = receipt.AppendString(b, f.Check)
			b = appendKey(b, "field")
			b = receipt.AppendString(b, f.Field)
			b = appendKey(b, "severity")
			b = receipt.AppendString(b, f.Severity)
			b = appendKey(b, "detail")
			b = receipt.AppendString(b, f.Detail)
			b = append(b, '}')
		}
		b = append(b, ']')
		b = appendCounts(b, "flags_total", "flags_omitted", r.FlagsTotal, len(r.Flags))

		b = appendKey(b, "hints")
		b = append(b, '[')
		for i, h := range r.Hints {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"source":`...)
			b = receipt.AppendString(b, h.Source)
			b = appendKey(b, "check")
			b = receipt.AppendString(b, h.Check)
			b = appendKey(b, "path")
			b = receipt.AppendString(b, h.Path)
			b = appendKey(b, "expected")
			b = receipt.AppendString(b, h.Expected)
			b = appendKey(b, "found")
			b = receipt.AppendString(b, h.Found)
			b = append(b, '}')
		}
		b = append(b, ']')
		b = appendCounts(b, "hints_total", "hints_omitted", r.HintsTotal, len(r.Hints))

		b = appendTally(b, "schema_compliance", r.Schema)
		b = appendTally(b, "integrity_checks", r.Integrity)
		b = appendTally(b, "overall", r.Overall)
	}
	b = appendKey(b, "verify")
	b = append(b, `{"public_key_url":`...)
	b = receipt.AppendString(b, r.Verify.PublicKeyURL)
	b = appendKey(b, "key_version")
	b = receipt.AppendString(b, r.Verify.KeyVersion)
	b = appendKey(b, "canonicalization")
	b = receipt.AppendString(b, r.Verify.Canonicalization)
	b = appendKey(b, "hash_algorithm")
	b = receipt.AppendString(b, r.Verify.HashAlgorithm)
	b = appendKey(b, "service")
	b = receipt.AppendString(b, r.Verify.Service)
	b = appendKey(b, "mcp")
	b = receipt.AppendString(b, r.Verify.MCP)
	b = append(b, '}')
	if a := r.Attestation; a != nil {
		b = appendKey(b, "attestation")
		b = append(b, `{"algorithm":`...)
		b = receipt.AppendString(b, a.Algorithm)
		b = appendKey(b, "key_version")
		b = receipt.AppendString(b, a.KeyVersion)
		b = appendKey(b, "timestamp")
		b = receipt.AppendString(b, a.Timestamp)
		b = appendKey(b, "signature")
		b = receipt.AppendString(b, a.Signature)
		b = append(b, '}')
	}
	return append(b, '}')
}

// AppendCanonical appends the RFC 8785 form of AppendJSON's document to b,
// written directly rather than by re-reading those bytes: the members of
// every object in the sorted order of their (ASCII) keys, numbers as
// ECMAScript prints them, strings as AppendString writes them (which is
// RFC 8785's string form). It is what a response is signed over, so that
// signing does not canonicalize the 4 KB document a second time; the tests
// hold it to receipt.AppendCanonicalJSON(AppendJSON) byte for byte.
//
// The keys of a result are the contract's fixed names, so their order is
// fixed too; a member added to AppendJSON must be added here in its sorted
// place (the property test fails until it is).
func (r *Result) AppendCanonical(b []byte) []byte {
	full := r.Detail != DetailCompact
	b = append(b, `{"agent_id":`...)
	if r.AgentID == nil {
		b = append(b, "null"...)
	} else {
		b = receipt.AppendString(b, *r.AgentID)
	}
	if a := r.Attestation; a != nil {
		b = append(b, `,"attestation":{"algorithm":`...)
		b = receipt.AppendString(b, a.Algorithm)
		b = appendKey(b, "key_version")
		b = receipt.AppendString(b, a.KeyVersion)
		b = appendKey(b, "signature")
		b = receipt.AppendString(b, a.Signature)
		b = appendKey(b, "timestamp")
		b = receipt.AppendString(b, a.Timestamp)
		b = append(b, '}')
	}
	b = appendKey(b, "enforce_rules")
	b = strconv.AppendBool(b, r.EnforceRules)
	if full {
		b = appendKey(b, "errors")
		b = appendStrings(b, r.Errors)
		b = appendKey(b, "errors_detail")
		b = append(b, '[')
		for i, e := range r.ErrorsDetail {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"check":`...)
			b = receipt.AppendString(b, e.Check)
			b = appendKey(b, "expected")
			b = receipt.AppendString(b, e.Expected)
			b = appendKey(b, "found")
			b = receipt.AppendString(b, e.Found)
			b = appendKey(b, "message")
			b = receipt.AppendString(b, e.Message)
			b = appendKey(b, "path")
			b = receipt.AppendString(b, e.Path)
			b = append(b, '}')
		}
		b = append(b, ']')
		b = appendCanonicalCounts(b, "errors_detail_omitted", "errors_detail_total", r.ErrorsDetailTotal, len(r.ErrorsDetail))
		b = appendCanonicalCounts(b, "errors_omitted", "errors_total", r.ErrorsTotal, len(r.Errors))

		b = appendKey(b, "flags")
		b = append(b, '[')
		for i, f := range r.Flags {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"check":`...)
			b = receipt.AppendString(b, f.Check)
			b = appendKey(b, "detail")
			b = receipt.AppendString(b, f.Detail)
			b = appendKey(b, "field")
			b = receipt.AppendString(b, f.Field)
			b = appendKey(b, "severity")
			b = receipt.AppendString(b, f.Severity)
			b = append(b, '}')
		}
		b = append(b, ']')
		b = appendCanonicalCounts(b, "flags_omitted", "flags_total", r.FlagsTotal, len(r.Flags))

		b = appendKey(b, "hints")
		b = append(b, '[')
		for i, h := range r.Hints {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"check":`...)
			b = receipt.AppendString(b, h.Check)
			b = appendKey(b, "expected")
			b = receipt.AppendString(b, h.Expected)
			b = appendKey(b, "found")
			b = receipt.AppendString(b, h.Found)
			b = appendKey(b, "path")
			b = receipt.AppendString(b, h.Path)
			b = appendKey(b, "source")
			b = receipt.AppendString(b, h.Source)
			b = append(b, '}')
		}
		b = append(b, ']')
		b = appendCanonicalCounts(b, "hints_omitted", "hints_total", r.HintsTotal, len(r.Hints))
		b = appendCanonicalTally(b, "integrity_checks", r.Integrity)
	}
	b = appendKey(b, "next_actions")
	if r.Result == ResultPass {
		b = append(b, `[{"action":"attach_receipt","for":"seller"},{"action":"proceed_to_payment","for":"buyer"}]`...)
	} else {
		b = append(b, `[{"action":"repair_and_reverify","using":"hints"}]`...)
	}
	b = appendKey(b, "output_hash")
	b = receipt.AppendString(b, r.Hashes.Output)
	if full {
		b = appendCanonicalTally(b, "overall", r.Overall)
		b = appendKey(b, "request_hash")
		b = receipt.AppendString(b, r.Hashes.Request)
	}
	b = appendKey(b, "result")
	b = receipt.AppendString(b, r.Result)
	b = appendKey(b, "rules_hash")
	b = receipt.AppendString(b, r.Hashes.Rules)
	if full {
		b = appendCanonicalTally(b, "schema_compliance", r.Schema)
	}
	b = appendKey(b, "schema_hash")
	b = receipt.AppendString(b, r.Hashes.Schema)
	b = appendKey(b, "strict_content_check")
	b = strconv.AppendBool(b, r.StrictContentCheck)
	b = appendKey(b, "summary")
	b = append(b, `{"blocking_checks":`...)
	b = appendStrings(b, r.BlockingChecks)
	b = appendKey(b, "result")
	b = receipt.AppendString(b, r.Result)
	b = append(b, '}')
	b = appendKey(b, "task_id")
	b = receipt.AppendString(b, r.TaskID)
	b = appendKey(b, "verification_id")
	b = receipt.AppendString(b, r.VerificationID)
	b = appendKey(b, "verified_at")
	b = receipt.AppendString(b, r.VerifiedAt)
	b = appendKey(b, "verifier_version")
	b = receipt.AppendString(b, r.VerifierVersion)
	b = appendKey(b, "verify")
	b = append(b, `{"canonicalization":`...)
	b = receipt.AppendString(b, r.Verify.Canonicalization)
	b = appendKey(b, "hash_algorithm")
	b = receipt.AppendString(b, r.Verify.HashAlgorithm)
	b = appendKey(b, "key_version")
	b = receipt.AppendString(b, r.Verify.KeyVersion)
	b = appendKey(b, "mcp")
	b = receipt.AppendString(b, r.Verify.MCP)
	b = appendKey(b, "public_key_url")
	b = receipt.AppendString(b, r.Verify.PublicKeyURL)
	b = appendKey(b, "service")
	b = receipt.AppendString(b, r.Verify.Service)
	b = append(b, '}')
	return append(b, '}')
}

// appendCanonicalCounts is appendCounts with the two keys in sorted order.
func appendCanonicalCounts(b []byte, omittedKey, totalKey string, total, shown int) []byte {
	b = appendKey(b, omittedKey)
	b = strconv.AppendInt(b, int64(total-shown), 10)
	b = appendKey(b, totalKey)
	return strconv.AppendInt(b, int64(total), 10)
}

func appendStrings(b []byte, list []string) []byte {
	b = append(b, '[')
	for i, s := range list {
		if i > 0 {
			b = append(b, ',')
		}
		b = receipt.AppendString(b, s)
	}
	return append(b, ']')
}

// appendCanonicalTally is appendTally in RFC 8785 form: keys sorted, and the
// ratio as ECMAScript prints it ("1", not "1.0").
func appendCanonicalTally(b []byte, name string, t Tally) []byte {
	b = appendKey(b, name)
	b = append(b, `{"passed":`...)
	b = strconv.AppendInt(b, int64(t.Passed), 10)
	b = append(b, `,"ratio":`...)
	b = receipt.AppendNumber(b, t.Ratio())
	b = append(b, `,"total":`...)
	b = strconv.AppendInt(b, int64(t.Total), 10)
	return append(b, '}')
}

// appendKey writes `,"name":`; every key after the first of an object goes
// through it.
func appendKey(b []byte, name string) []byte {
	b = append(b, ',', '"')
	b = append(b, name...)
	return append(b, '"', ':')
}

// appendCounts writes a list's total and how many of it were left out. The
// keys are spelled out by the caller: constant strings, not concatenations
// made for every response.
func appendCounts(b []byte, totalKey, omittedKey string, total, shown int) []byte {
	b = appendKey(b, totalKey)
	b = strconv.AppendInt(b, int64(total), 10)
	b = appendKey(b, omittedKey)
	return strconv.AppendInt(b, int64(total-shown), 10)
}

func appendTally(b []byte, name string, t Tally) []byte {
	b = appendKey(b, name)
	b = append(b, `{"ratio":`...)
	b = appendRatio(b, t.Ratio())
	b = append(b, `,"passed":`...)
	b = strconv.AppendInt(b, int64(t.Passed), 10)
	b = append(b, `,"total":`...)
	b = strconv.AppendInt(b, int64(t.Total), 10)
	return append(b, '}')
}

// appendRatio writes a ratio in [0, 1] with at least one decimal.
func appendRatio(b []byte, f float64) []byte {
	n := len(b)
	b = strconv.AppendFloat(b, f, 'f', -1, 64)
	if !strings.Contains(string(b[n:]), ".") {
		b = append(b, ".0"...)
	}
	return b
}
