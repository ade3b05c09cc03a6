package verify

import (
	"bytes"
	"strconv"
	"strings"
	"testing"

	"github.com/aovhq/aov/strictjson"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

// largeInvoiceRequest is the SPEC §10 request with n line items whose
// totals sum to the total, so every check passes.
func largeInvoiceRequest(n int) []byte {
	var b strings.Builder
	b.WriteString(`{"task_id":"invoice-large","agent_id":"seller-7","expected_schema":` + invoiceSchema +
		`,"submitted_output":{"invoice_id":"INV-7731","currency":"USD","line_items":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"sku":"SKU-` + strconv.Itoa(i) + `","qty":` + strconv.Itoa(i%5+1) + `,"line_total":12.5}`)
	}
	b.WriteString(`],"total":` + strconv.FormatFloat(12.5*float64(n), 'f', 1, 64) + `},` +
		`"bounds":{"line_items[].qty":{"min":1,"max":100}},` +
		`"rules":[{"type":"sum_equals","field":"line_items[].line_total","equals_field":"total","tolerance":0.001},` +
		`{"type":"unique","field":"line_items[].sku"}],"enforce_rules":true}`)
	return []byte(b.String())
}

func benchVerify(b *testing.B, v *Verifier, body []byte, fresh bool) {
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if fresh {
			v = New(Config{})
		}
		req, err := v.Parse(body)
		if err != nil {
			b.Fatal(err)
		}
		r := v.Check(req, "6f1c2a4e-8d3b-4c5a-9e7f-0a1b2c3d4e5f", verifiedAt)
		if _, err := r.MarshalJSON(); err != nil {
			b.Fatal(err)
		}
	}
}

// benchBare is the floor to compare with: the validator alone, decoding the
// same request body with its own decoder and validating the output against
// an already compiled schema. No hashes, no counting, no result document.
func benchBare(b *testing.B, body []byte) {
	c := jsonschema.NewCompiler()
	schemaDoc, err := jsonschema.UnmarshalJSON(strings.NewReader(invoiceSchema))
	if err != nil {
		b.Fatal(err)
	}
	if err := c.AddResource("schema.json", schemaDoc); err != nil {
		b.Fatal(err)
	}
	sch, err := c.Compile("schema.json")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		if err := sch.Validate(doc.(map[string]any)["submitted_output"]); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkInvoice(b *testing.B) {
	body := []byte(invoiceRequest("129.5"))
	b.Run("parse", func(b *testing.B) {
		v := New(Config{})
		b.ReportAllocs()
		for b.Loop() {
			if _, err := v.Parse(body); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("verify_warm", func(b *testing.B) { benchVerify(b, New(Config{}), body, false) })
	b.Run("verify_cold", func(b *testing.B) { benchVerify(b, nil, body, true) })
	b.Run("hashes", func(b *testing.B) {
		tree, err := strictjson.Decode(body, strictjson.Limits{})
		if err != nil {
			b.Fatal(err)
		}
		doc := tree.(map[string]any)
		b.ReportAllocs()
		for b.Loop() {
			var hs hashState
			if err := hs.compute(doc); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("bare_jsonschema", func(b *testing.B) { benchBare(b, body) })
}

func BenchmarkInvoice1000Lines(b *testing.B) {
	body := largeInvoiceRequest(1000)
	b.Run("verify_warm", func(b *testing.B) { benchVerify(b, New(Config{}), body, false) })
	b.Run("bare_jsonschema", func(b *testing.B) { benchBare(b, body) })
}

func TestLargeInvoicePasses(t *testing.T) {
	r := check(t, New(Config{}), string(largeInvoiceRequest(1000)))
	if r.Result != ResultPass || r.Schema.Total != 8+7*1000 || r.Integrity != (Tally{4, 4}) {
		t.Fatalf("result %s schema %+v integrity %+v errors %q", r.Result, r.Schema, r.Integrity, r.Errors)
	}
}

// worstCaseRequest is close to the default body limit: an output of about
// 200,000 failing numbers and the maximum number of rules over all of them,
// to show that a hostile request costs counting, not text.
func worstCaseRequest() []byte {
	var b strings.Builder
	b.WriteString(`{"task_id":"w","expected_schema":{},"enforce_rules":true,"strict_content_check":true,"submitted_output":{"v":[`)
	for i := range 200000 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`-1,""`[:2])
	}
	b.WriteString(`]},"bounds":{"v[]":{"min":0},"$.v[]":{"max":-5}},"rules":[`)
	for i := range DefaultMaxRules {
		if i > 0 {
			b.WriteByte(',')
		}
		switch i % 4 {
		case 0:
			b.WriteString(`{"type":"gte","field":"v[]","value":0}`)
		case 1:
			b.WriteString(`{"type":"unique","field":"v[]"}`)
		case 2:
			b.WriteString(`{"type":"exists_in","field":"v[]","values":[1]}`)
		default:
			b.WriteString(`{"type":"sum_equals","field":"v[]","equals":0}`)
		}
	}
	b.WriteString(`]}`)
	return []byte(b.String())
}

func BenchmarkWorstCase(b *testing.B) {
	body := worstCaseRequest()
	if len(body) > DefaultMaxBodyBytes {
		b.Fatalf("body %d bytes is over the default limit", len(body))
	}
	benchVerify(b, New(Config{}), body, false)
}
