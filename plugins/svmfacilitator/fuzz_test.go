package svmfacilitator

import (
	"bytes"
	"testing"
)

// encode re-serializes a decoded transaction without lookup tables.
func encode(tx *Transaction) []byte {
	sv := func(out []byte, n int) []byte {
		for {
			c := byte(n & 0x7f)
			n >>= 7
			if n == 0 {
				return append(out, c)
			}
			out = append(out, c|0x80)
		}
	}
	out := sv(nil, len(tx.Signatures))
	for _, s := range tx.Signatures {
		out = append(out, s...)
	}
	if tx.Versioned {
		out = append(out, 0x80)
	}
	out = append(out, tx.NumSigners, tx.NumReadonlySigned, tx.NumReadonly)
	out = sv(out, len(tx.AccountKeys))
	for _, k := range tx.AccountKeys {
		out = append(out, k[:]...)
	}
	out = append(out, tx.Blockhash[:]...)
	out = sv(out, len(tx.Instructions))
	for _, ix := range tx.Instructions {
		out = append(out, ix.ProgramIndex)
		out = sv(out, len(ix.Accounts))
		out = append(out, ix.Accounts...)
		out = sv(out, len(ix.Data))
		out = append(out, ix.Data...)
	}
	if tx.Versioned {
		out = sv(out, 0)
	}
	return out
}

// FuzzDecodeTransaction: the decoder never panics, and what it accepts is
// exactly what it read: re-encoding the decoded fields gives the input
// bytes back, and the message is the signed suffix.
func FuzzDecodeTransaction(f *testing.F) {
	p := Payment{FeePayer: pub(testKey("fee payer")), Authority: testKey("payer"), Mint: mustKey("4zMMC9srt5Ri5X14GAgXhaHii3GnPAEERYPJgZJDncDU"),
		Program: TokenProgram, PayTo: pub(testKey("payee")), Amount: 20000, Decimals: 6}
	f.Add(p.Build(p.Instructions()))
	f.Add(p.Build(p.Instructions()[:1]))
	f.Add([]byte{1})
	f.Add([]byte{0x80, 0x80, 0x04})
	f.Fuzz(func(t *testing.T, raw []byte) {
		tx, err := DecodeTransaction(raw)
		if err != nil {
			return
		}
		if !bytes.HasSuffix(raw, tx.Message) || len(raw)-len(tx.Message) != 1+64*len(tx.Signatures) {
			t.Fatalf("message is not the signed suffix")
		}
		if tx.LookupTables == 0 {
			if got := encode(tx); !bytes.Equal(got, raw) {
				t.Fatalf("re-encoding differs:\n%x\n%x", got, raw)
			}
			for _, ix := range tx.Instructions {
				_ = tx.Program(ix)
				for i := range ix.Accounts {
					_ = tx.Account(ix, i)
				}
			}
		}
	})
}
