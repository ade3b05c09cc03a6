package verify

import (
	"encoding/json"
	"errors"
	"math/big"
	"strings"
	"testing"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/internal/jsontree"
	"github.com/aovhq/aov/receipt"
	"github.com/aovhq/aov/strictjson"
)

func FuzzParse(f *testing.F) {
	for _, tc := range specVectors {
		f.Add([]byte(tc.request))
	}
	f.Add([]byte(invoiceRequest("135.0")))
	f.Add([]byte(body(`strict_content_check=true`, `submitted_output={"a":"TODO","b":["",{"c":"x"}]}`)))
	f.Add([]byte(body(`bounds={"items[].price":{"min":0,"max":1,"if_present":true}}`)))
	f.Add([]byte(body(`rules=[{"type":"exists_in","field":"items[].id","values":["a",1,null]},{"type":"unique","field":"$[]"}]`)))
	f.Add([]byte(body(`rules=[{"type":"lte","field":"a..b","value":"x"}]`, `detail="compact"`)))
	f.Add([]byte(`{"task_id":"t","expected_schema":{"$ref":"#/$defs/x","$defs":{"x":{"type":"integer"}}},"submitted_output":1}`))
	f.Add([]byte(`{"task_id":"t","task_id":"u"}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"task_id":"t","expected_schema":{"minimum":0.4,"multipleOf":1e-300},"submitted_output":[1e-400,0e-99999,5e-324,1e100000,1.` + strings.Repeat("0", 400) + `]}`))
	f.Add([]byte(`{"task_id":"t","expected_schema":{},"submitted_output":0.` + strings.Repeat("0", 100000) + `5e100001}`))
	f.Add([]byte(body(`rules=[{"type":"unique","field":"a[]"},{"type":"exists_in","field":"a[]","in_field":"a[]"}]`, `submitted_output={"a":[1,2,3,4,5,6]}`)))
	f.Add([]byte(body(`bounds={"a[]":{"min":0},"$.a[]":{"max":9}}`, `submitted_output={"a":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21]}`)))

	v := New(Config{ListCap: 5, SchemaCacheSize: 8})
	// tight has an integrity-work budget small enough for the fuzzer to
	// pass: the gateway's precheck must refuse what Parse refuses for it.
	tight := New(Config{ListCap: 5, SchemaCacheSize: 8, MaxIntegrityWork: 40})
	f.Fuzz(func(t *testing.T, data []byte) {
		if _, err := tight.Parse(data); err != nil {
			var ae *apierr.Error
			if errors.As(err, &ae) && len(ae.Fields) > 0 && strings.Contains(ae.Fields[0].Problem, "integrity-check work") {
				var pe *apierr.Error
				if perr := tight.Precheck(data); !errors.As(perr, &pe) || pe.Fields[0] != ae.Fields[0] {
					t.Fatalf("Parse refuses %+v; Precheck: %v", ae.Fields[0], perr)
				}
			}
		}
		req, err := v.Parse(data)
		if err != nil {
			var ae *apierr.Error
			if !errors.As(err, &ae) || (ae.Status != 422 && ae.Status != 413) {
				t.Fatalf("refusal is not a 413/422 apierr: %v", err)
			}
			for _, fl := range ae.Fields {
				if fl.Field == "" || fl.Problem == "" || fl.Fix == "" {
					t.Fatalf("incomplete field problem %+v", fl)
				}
			}
			return
		}
		// Accepted requests hash deterministically, however they arrive.
		again, err := v.Parse(data)
		if err != nil || again.Hashes != req.Hashes {
			t.Fatalf("second Parse: %v, hashes %+v vs %+v", err, again, req.Hashes)
		}
		hs, err := ComputeHashes(data)
		if err != nil || hs != req.Hashes {
			t.Fatalf("ComputeHashes = %+v, %v; Parse = %+v", hs, err, req.Hashes)
		}
		// The streamed request hash is the hash of the SPEC §5 document
		// built in one piece, which the independent JCS library agrees is
		// canonical.
		tree, err := strictjson.Decode(data, strictjson.Limits{MaxDepth: 64})
		if err != nil {
			t.Fatal(err)
		}
		canon, err := requestCanonical(tree.(map[string]any))
		if err != nil {
			t.Fatal(err)
		}
		// Every number means one value to every reader: its canonical
		// form (what is hashed) is exactly the value math/big reads from
		// its text (what the schema validator compares).
		for _, n := range jsontree.Numbers(tree) {
			c, err := receipt.Canonicalize([]byte(n))
			if err != nil {
				t.Fatalf("accepted number %.40s cannot be canonicalized: %v", n, err)
			}
			written, ok1 := new(big.Rat).SetString(string(n))
			hashed, ok2 := new(big.Rat).SetString(string(c))
			if !ok1 || !ok2 || written.Cmp(hashed) != 0 {
				t.Fatalf("accepted number %.40s is hashed as %s", n, c)
			}
		}
		if receipt.Hash(canon) != req.Hashes.Request {
			t.Fatalf("streamed request_hash differs from the hash of %s", canon)
		}
		if again, err := receipt.Canonicalize(canon); err != nil || string(again) != string(canon) {
			t.Fatalf("request document is not canonical: %v\n%s\n%s", err, canon, again)
		}
		for _, h := range []string{hs.Output, hs.Schema, hs.Rules, hs.Request} {
			if len(h) != 64 || strings.Trim(h, "0123456789abcdef") != "" {
				t.Fatalf("not a lowercase hex SHA-256: %q", h)
			}
		}
		// Checking never panics and yields a JSON document with a verdict
		// consistent with its blocking checks.
		r := v.Check(req, "id", verifiedAt)
		b, err := r.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		if !json.Valid(b) {
			t.Fatalf("result is not JSON: %s", b)
		}
		if _, err := receipt.Canonicalize(b); err != nil {
			t.Fatalf("result cannot be canonicalized for signing: %v", err)
		}
		if (r.Result == ResultFail) != (len(r.BlockingChecks) > 0) {
			t.Fatalf("result %s with blocking checks %q", r.Result, r.BlockingChecks)
		}
		if len(r.Errors) > 5 || r.Overall.Passed > r.Overall.Total || r.Integrity.Passed > r.Integrity.Total {
			t.Fatalf("caps or tallies broken: %d errors, %+v %+v", len(r.Errors), r.Overall, r.Integrity)
		}
	})
}

// FuzzCheck fuzzes the submitted output under a fixed request that uses
// every check, so that most inputs reach Check rather than the parser.
func FuzzCheck(f *testing.F) {
	for _, s := range []string{
		`{"items":[{"id":"a","price":1},{"id":"a","price":"x"}],"total":1}`,
		`{"items":[],"total":null}`, `[1,2,3]`, `"TODO"`, `{"items":[{"id":{"b":1,"a":[]}}]}`,
		`{"items":[{"price":1e300},{"price":1e300}],"total":-0.0}`,
	} {
		f.Add([]byte(s))
	}
	v := New(Config{ListCap: 3})
	prefix := `{"task_id":"f","expected_schema":{"type":"object","properties":{"items":{"type":"array","items":{"type":"object","properties":{"id":{"type":"string"},"price":{"type":"number","minimum":0}}}}}},` +
		`"strict_content_check":true,"bounds":{"items[].price":{"min":0,"max":100,"if_present":true},"total":{"max":1000}},` +
		`"rules":[{"type":"sum_equals","field":"items[].price","equals_field":"total"},{"type":"gte","field":"items[].price","other_field":"total","if_present":true},` +
		`{"type":"lte","field":"items[].price","value":50},{"type":"exists_in","field":"items[].id","in_field":"codes[]"},` +
		`{"type":"exists_in","field":"items[].id","values":["a",1,null]},{"type":"unique","field":"items[].id"}],"submitted_output":`
	f.Fuzz(func(t *testing.T, output []byte) {
		req, err := v.Parse([]byte(prefix + string(output) + `}`))
		if err != nil {
			return
		}
		r := v.Check(req, "id", verifiedAt)
		if r.Integrity.Total != 3+6+2 || r.Integrity.Passed > r.Integrity.Total {
			t.Fatalf("integrity = %+v", r.Integrity)
		}
		if (r.Result == ResultFail) != (len(r.BlockingChecks) > 0) {
			t.Fatalf("result %s with blocking checks %q", r.Result, r.BlockingChecks)
		}
		if r.HintsTotal != r.ErrorsTotal+r.FlagsTotal || len(r.Hints) > 3 || len(r.Errors) > 3 || len(r.Flags) > 3 {
			t.Fatalf("lists: %d/%d errors, %d/%d flags, %d/%d hints", len(r.Errors), r.ErrorsTotal, len(r.Flags), r.FlagsTotal, len(r.Hints), r.HintsTotal)
		}
		b, _ := r.MarshalJSON()
		if !json.Valid(b) {
			t.Fatalf("result is not JSON: %s", b)
		}
	})
}
