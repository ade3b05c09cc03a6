package svmfacilitator

import (
	"context"
	"testing"

	"github.com/aovhq/aov/x402"
)

// A gate runs CheckPays on the transaction it read before anything else
// judges it: one that uses an address lookup table is refused with the
// reason Verify gives it, whether its transfer names a static key or an
// address of the table. (Before: DecodeTransaction checks indexes only
// without lookup tables, CheckPays read them unchecked, and a transfer
// naming the table's address panicked the gate's handler.)
func TestCheckPaysRefusesALookupTablePayment(t *testing.T) {
	e := newEnv(t, Config{})
	base, err := DecodeTransaction(e.payment(t).Transaction())
	if err != nil {
		t.Fatal(err)
	}
	table := uint8(len(base.AccountKeys)) // the table's first address
	for _, tc := range []struct {
		name string
		edit func(ix *Instruction)
	}{
		{"static keys only", func(*Instruction) {}},
		{"destination from the table", func(ix *Instruction) { ix.Accounts[2] = table }},
		{"program from the table", func(ix *Instruction) { ix.ProgramIndex = table }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tx := *base
			tx.Instructions = append([]Instruction(nil), base.Instructions...)
			ix := &tx.Instructions[2]
			ix.Accounts = append([]uint8(nil), ix.Accounts...)
			tc.edit(ix)
			pp := Payload(signAgain(withLookupTable(&tx), e.payer), e.req)
			v, err := e.f.Verify(context.Background(), pp, e.req)
			if err != nil || v.IsValid || v.InvalidReason != ReasonLookupTables {
				t.Fatalf("Verify: %+v %v, want %s", v, err, ReasonLookupTables)
			}
			got, err := DecodePayload(pp.Payload)
			if err != nil {
				t.Fatal(err)
			}
			if err := got.CheckPays(e.req); x402.ReasonOf(err) != ReasonLookupTables {
				t.Fatalf("CheckPays: %v, want %s", err, ReasonLookupTables)
			}
		})
	}
}
