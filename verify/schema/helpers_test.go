package schema

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"testing"
)

// decode parses test JSON the way requests are decoded: numbers stay
// json.Number.
func decode(t testing.TB, s string) any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader([]byte(s)))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("test JSON does not parse: %v\n%s", err, s)
	}
	return v
}

func hashOf(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// mustCompile compiles a schema given as JSON text in a fresh cache.
func mustCompile(t testing.TB, schema string) *Schema {
	t.Helper()
	s, err := NewCache(4).Compile(decode(t, schema), hashOf(schema))
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	return s
}

const invoiceSchema = `{
  "type": "object",
  "required": ["invoice_id", "currency", "line_items", "total"],
  "properties": {
    "invoice_id": {"type": "string", "pattern": "^INV-[0-9]{4}$"},
    "currency": {"enum": ["USD", "EUR"]},
    "line_items": {
      "type": "array",
      "minItems": 1,
      "items": {
        "type": "object",
        "required": ["sku", "qty", "line_total"],
        "properties": {
          "sku": {"type": "string"},
          "qty": {"type": "integer", "minimum": 1},
          "line_total": {"type": "number", "minimum": 0}
        }
      }
    },
    "total": {"type": "number"}
  }
}`

const invoiceOutput = `{
  "invoice_id": "INV-7731",
  "currency": "USD",
  "line_items": [
    {"sku": "A-1", "qty": 2, "line_total": 87.0},
    {"sku": "B-2", "qty": 1, "line_total": 42.5}
  ],
  "total": 135.0
}`
