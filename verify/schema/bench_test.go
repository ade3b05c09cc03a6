package schema

import (
	"fmt"
	"strings"
	"testing"
)

func bigInvoice(b *testing.B, n int) any {
	var sb strings.Builder
	sb.WriteString(`{"invoice_id": "INV-7731", "currency": "USD", "line_items": [`)
	for i := range n {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `{"sku": "SKU-%d", "qty": %d, "line_total": %d.5}`, i, i%9+1, i)
	}
	sb.WriteString(`], "total": 1.5}`)
	return decode(b, sb.String())
}

// BenchmarkCompileInvoice is a cold compilation (no cache).
func BenchmarkCompileInvoice(b *testing.B) {
	tree := decode(b, invoiceSchema)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := compile(tree, compileOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEvaluateInvoice(b *testing.B) {
	s := mustCompile(b, invoiceSchema)
	inst := decode(b, invoiceOutput)
	b.ReportAllocs()
	for b.Loop() {
		if rep := s.Evaluate(inst, Options{}); rep.Total != 22 {
			b.Fatal(rep)
		}
	}
}

// BenchmarkValidateInvoice is the bare validator on the two-item invoice.
func BenchmarkValidateInvoice(b *testing.B) {
	s := mustCompile(b, invoiceSchema)
	inst := decode(b, invoiceOutput)
	b.ReportAllocs()
	for b.Loop() {
		if err := s.sch.Validate(inst); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEvaluateInvoice1000Items(b *testing.B) {
	s := mustCompile(b, invoiceSchema)
	inst := bigInvoice(b, 1000)
	b.ReportAllocs()
	for b.Loop() {
		if rep := s.Evaluate(inst, Options{}); rep.Total != 8+7*1000 || rep.Passed != rep.Total {
			b.Fatal(rep.Passed, rep.Total)
		}
	}
}

func BenchmarkEvaluateInvoice1000ItemsUndeclared(b *testing.B) {
	s := mustCompile(b, invoiceSchema)
	inst := bigInvoice(b, 1000)
	b.ReportAllocs()
	for b.Loop() {
		s.Evaluate(inst, Options{Undeclared: true})
	}
}

// BenchmarkCountInvoice1000Items is the counting walk alone.
func BenchmarkCountInvoice1000Items(b *testing.B) {
	s := mustCompile(b, invoiceSchema)
	inst := bigInvoice(b, 1000)
	b.ReportAllocs()
	for b.Loop() {
		s.count(inst, false, DefaultMaxSteps)
	}
}

// BenchmarkValidateInvoice1000Items is the bare validator on the same
// instance, the baseline for the counting overhead.
func BenchmarkValidateInvoice1000Items(b *testing.B) {
	s := mustCompile(b, invoiceSchema)
	inst := bigInvoice(b, 1000)
	b.ReportAllocs()
	for b.Loop() {
		if err := s.sch.Validate(inst); err != nil {
			b.Fatal(err)
		}
	}
}
