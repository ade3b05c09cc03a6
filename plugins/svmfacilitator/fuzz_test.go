package svmfacilitator

import (
	"bytes"
	"crypto/ed25519"
	"math"
	"math/big"
	"testing"

	"github.com/aovhq/aov/x402"
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

// FuzzPriorityFee: the fee a payment's compute budget asks the fee payer
// to risk, which the failure budget compares with its cap, is the chain's
// ceil(units × price / 10⁶) for any limit and price the payment names,
// saturating instead of wrapping, and the base fee is added without
// wrapping either.
func FuzzPriorityFee(f *testing.F) {
	f.Add(uint32(20_000), uint64(1), 2)
	f.Add(uint32(DefaultMaxComputeUnits), uint64(DefaultMaxComputeUnitPrice), 2)
	f.Add(uint32(DefaultMaxComputeUnits), uint64(100_001), 2)
	f.Add(uint32(math.MaxUint32), uint64(math.MaxUint64), 255)
	f.Add(uint32(1_000_001), uint64(18446725626983924632), 2) // floor is MaxUint64, with a remainder
	f.Fuzz(func(t *testing.T, units uint32, price uint64, signers int) {
		if signers < 0 || signers > 255 {
			return // NumSigners is one byte
		}
		want := new(big.Int).Mul(new(big.Int).SetUint64(price), new(big.Int).SetUint64(uint64(units)))
		want.Add(want, big.NewInt(999_999)).Quo(want, big.NewInt(1_000_000))
		sat := func(v *big.Int) uint64 {
			if !v.IsUint64() {
				return math.MaxUint64
			}
			return v.Uint64()
		}
		pf := priorityFee(units, price)
		if pf != sat(want) {
			t.Fatalf("priorityFee(%d, %d) = %d, want %s", units, price, pf, want)
		}
		want.Add(want, big.NewInt(int64(signers)*lamportsPerSignature))
		if got := feeOf(signers, pf); got != sat(want) {
			t.Fatalf("feeOf(%d, %d) = %d, want %s", signers, pf, got, want)
		}
	})
}

// FuzzMintRefusal: any account data a node serves for a mint is judged
// without panic; data that is not a Token-2022 mint gets no verdict, and a
// verdict of "no fee, no hook" is never given to data carrying either
// extension among entries before the first empty one, and data carrying
// MintCloseAuthority there is always reported closable (its verdict is
// not kept).
func FuzzMintRefusal(f *testing.F) {
	f.Add(token2022Mint())
	f.Add(token2022Mint(transferFee(100)))
	f.Add(token2022Mint(tlv(14, make([]byte, 64))))
	f.Add(token2022Mint(tlv(3, make([]byte, 32)), transferFee(0)))
	f.Add(token2022Mint(tlv(3, make([]byte, 32))))
	f.Add(make([]byte, mintLen))
	f.Add(token2022Mint(tlv(1, nil)[:3]))
	f.Fuzz(func(t *testing.T, data []byte) {
		why, closable, ok := mintRefusal(data)
		if !ok {
			if why != "" || closable {
				t.Fatalf("a verdict %q (closable %v) without a mint", why, closable)
			}
			return
		}
		if len(data) == mintLen {
			if closable {
				t.Fatal("a mint without extensions reported closable")
			}
			return
		}
		rest := data[tokenAccountLen+1:]
		for len(rest) >= 4 {
			typ, n := uint16(rest[0])|uint16(rest[1])<<8, int(rest[2])|int(rest[3])<<8
			if typ == extUninitialized {
				break
			}
			if (typ == extTransferFeeConfig || typ == extTransferHook) && why == "" {
				t.Fatalf("extension %d passed: %x", typ, data)
			}
			if typ == extMintCloseAuth && !closable {
				t.Fatalf("MintCloseAuthority not reported closable: %x", data)
			}
			rest = rest[4+n:]
		}
	})
}

// withLookupTable encodes tx (a v0 message, its instructions as the caller
// left them) with one address lookup table of two writable addresses,
// account indexes len(tx.AccountKeys) and the next, which instructions may
// name. The signatures are tx's: signAgain makes them valid.
func withLookupTable(tx *Transaction) []byte {
	raw := encode(tx)
	raw = append(raw[:len(raw)-1], 1)      // one lookup table:
	raw = append(raw, make([]byte, 32)...) // its address,
	return append(raw, 2, 0, 1, 0)         // two writable indexes, no read-only one
}

// signAgain signs raw's message in place as each of signers, a signer of
// it; raw the decoder refuses is returned as it is.
func signAgain(raw []byte, signers ...ed25519.PrivateKey) []byte {
	tx, err := DecodeTransaction(raw)
	if err != nil {
		return raw
	}
	for _, s := range signers {
		for i := 0; i < int(tx.NumSigners); i++ {
			if tx.AccountKeys[i] == pub(s) {
				copy(tx.Signatures[i], ed25519.Sign(s, tx.Message))
			}
		}
	}
	return raw
}

// FuzzCheckPaysAgreesWithVerify edits a payment's transfer (instruction
// 3: program, account indexes, data) and its form (with or without an
// address lookup table, whose addresses the indexes may then name), signs
// it again, and compares the gate's CheckPays with the facilitator's own
// static checks of the same bytes: CheckPays never panics, accepts what
// those checks pass, and refuses with their reason when it is one of its
// own (paysReasons). (Before: CheckPays read a lookup-table transaction's
// indexes unchecked, and one beyond the static keys panicked the gate's
// handler.)
func FuzzCheckPaysAgreesWithVerify(f *testing.F) {
	e := newEnv(f, Config{})
	p := e.payment(f)
	base, err := DecodeTransaction(p.Transaction())
	if err != nil {
		f.Fatal(err)
	}
	x := base.Instructions[2]
	f.Add(x.ProgramIndex, x.Accounts[0], x.Accounts[1], x.Accounts[2], x.Accounts[3], x.Data, false)
	f.Add(x.ProgramIndex, x.Accounts[0], x.Accounts[1], x.Accounts[2], x.Accounts[3], x.Data, true)
	f.Fuzz(func(t *testing.T, prog, a0, a1, a2, a3 uint8, data []byte, table bool) {
		n := uint8(len(base.AccountKeys))
		if table { // the table's two addresses follow the static keys
			n += 2
		}
		tx := *base
		tx.Instructions = append([]Instruction(nil), base.Instructions...)
		tx.Instructions[2] = Instruction{ProgramIndex: prog % n, Accounts: []uint8{a0 % n, a1 % n, a2 % n, a3 % n}, Data: data}
		raw := encode(&tx)
		if table {
			raw = withLookupTable(&tx)
		}
		pp := Payload(signAgain(raw, e.payer), e.req)
		got, err := DecodePayload(pp.Payload)
		if err != nil {
			return
		}
		pays := got.CheckPays(e.req)
		reason := e.f.checkStatic(pp, e.req, false).resp.InvalidReason
		switch {
		case reason == "" && pays != nil:
			t.Fatalf("the facilitator's checks pass, CheckPays refuses: %v", pays)
		case paysReasons[reason] && x402.ReasonOf(pays) != reason:
			t.Fatalf("the facilitator refuses %s, CheckPays says %v", reason, pays)
		}
	})
}
