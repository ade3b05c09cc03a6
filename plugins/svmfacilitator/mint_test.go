package svmfacilitator

import (
	"context"
	"encoding/binary"
	"testing"

	"github.com/aovhq/aov/x402"
)

// token2022Mint is a Token-2022 mint's data (6 decimals, no authority) with
// the given extensions, each a type and its value.
func token2022Mint(exts ...[]byte) []byte {
	d := make([]byte, 166)
	d[44], d[45] = 6, 1 // decimals, initialized
	d[165] = 1          // AccountType::Mint
	for _, e := range exts {
		d = append(d, e...)
	}
	return d
}

// tlv is one extension entry.
func tlv(typ uint16, value []byte) []byte {
	out := binary.LittleEndian.AppendUint16(nil, typ)
	out = binary.LittleEndian.AppendUint16(out, uint16(len(value)))
	return append(out, value...)
}

// transferFee is a TransferFeeConfig of bps basis points, now and next.
func transferFee(bps uint16) []byte {
	v := make([]byte, 32+32+8)
	for range 2 {
		fee := make([]byte, 18) // epoch 0, maximum fee, basis points
		binary.LittleEndian.PutUint64(fee[8:], 1<<40)
		binary.LittleEndian.PutUint16(fee[16:], bps)
		v = append(v, fee...)
	}
	return tlv(1, v)
}

// token2022Account is a token account of mint held by owner, with the
// TransferFeeAmount extension a fee mint's accounts carry.
func token2022Account(mint, owner PublicKey, amount uint64) []byte {
	d := make([]byte, 165)
	copy(d, mint[:])
	copy(d[32:], owner[:])
	binary.LittleEndian.PutUint64(d[64:], amount)
	d[108] = 1 // initialized
	d = append(d, 2)
	return append(d, tlv(2, make([]byte, 8))...)
}

// A Token-2022 mint with a transfer fee makes the payee receive the amount
// less the fee, and one with a transfer hook runs the issuer's code on every
// transfer; the amount check cannot see either. A payment in such a mint is
// refused (invalid_payment_requirements: the offer's asset cannot be
// settled exactly), before anything is simulated or sent; the mint is read
// once. A Token-2022 mint with neither settles.
func TestToken2022FeeAndHookMintsAreRefused(t *testing.T) {
	fr := &faultyRPC{}
	e := newEnv(t, Config{RPC: &RPC{URL: fr.serve(t)}})
	fr.set(func(f *faultyRPC) { f.target = e.chain.URL })
	ctx := context.Background()
	for _, c := range []struct {
		name string
		data []byte
	}{
		{"transfer fee", token2022Mint(transferFee(100))},
		{"transfer fee of zero (the issuer may raise it)", token2022Mint(transferFee(0))},
		{"transfer hook", token2022Mint(tlv(14, make([]byte, 64)))},
	} {
		t.Run(c.name, func(t *testing.T) {
			reads := fr.count("getAccountInfo")
			mint := pub(testKey("token-2022 mint " + c.name))
			e.chain.SetAccount(mint.String(), Token2022Program.String(), c.data)
			src := AssociatedTokenAddress(pub(e.payer), mint, Token2022Program)
			dst := AssociatedTokenAddress(e.payTo, mint, Token2022Program)
			e.chain.SetAccount(src.String(), Token2022Program.String(), token2022Account(mint, pub(e.payer), 500_000))
			e.chain.SetAccount(dst.String(), Token2022Program.String(), token2022Account(mint, e.payTo, 0))
			p := e.payment(t)
			p.Mint, p.Program = mint, Token2022Program
			req := e.req
			req.Asset = mint.String()
			for i := range 2 {
				pp := Payload(p.withMemo(c.name+string(rune('a'+i))), req)
				v, err := e.f.Verify(ctx, pp, req)
				if err != nil || v.IsValid || v.InvalidReason != x402.ReasonInvalidPaymentRequirements {
					t.Fatalf("verify: %+v %v, want %s", v, err, x402.ReasonInvalidPaymentRequirements)
				}
				s, err := e.f.Settle(ctx, pp, req)
				if err != nil || s.Success || s.ErrorReason != x402.ReasonInvalidPaymentRequirements {
					t.Fatalf("settle: %+v %v, want %s", s, err, x402.ReasonInvalidPaymentRequirements)
				}
			}
			if a, b := e.chain.TokenBalance(src.String()), e.chain.TokenBalance(dst.String()); a != 500_000 || b != 0 {
				t.Fatalf("balances moved: payer %d payee %d", a, b)
			}
			if n := fr.count("getAccountInfo") - reads; n != 1 {
				t.Fatalf("the mint was read %d times for two payments, want once", n)
			}
		})
	}
	// A Token-2022 mint without them settles.
	mint := pub(testKey("token-2022 plain mint"))
	e.chain.SetAccount(mint.String(), Token2022Program.String(), token2022Mint())
	e.chain.SetAccount(AssociatedTokenAddress(pub(e.payer), mint, Token2022Program).String(), Token2022Program.String(), token2022Account(mint, pub(e.payer), 500_000))
	dst := AssociatedTokenAddress(e.payTo, mint, Token2022Program)
	e.chain.SetAccount(dst.String(), Token2022Program.String(), token2022Account(mint, e.payTo, 0))
	p := e.payment(t)
	p.Mint, p.Program = mint, Token2022Program
	req := e.req
	req.Asset = mint.String()
	if s, err := e.f.Settle(ctx, Payload(p.Build(p.Instructions()), req), req); err != nil || !s.Success {
		t.Fatalf("settle in a plain Token-2022 mint: %+v %v", s, err)
	}
	if got := e.chain.TokenBalance(dst.String()); got != 20000 {
		t.Fatalf("payee has %d", got)
	}
}

// A Token-2022 mint with MintCloseAuthority can be closed (at supply 0) and
// initialized again at the same address with a transfer fee or hook: its
// clean verdict is not remembered, so the new mint is refused. A mint
// that cannot be closed is still read once.
func TestAClosableMintIsReadAgain(t *testing.T) {
	fr := &faultyRPC{}
	e := newEnv(t, Config{RPC: &RPC{URL: fr.serve(t)}})
	fr.set(func(f *faultyRPC) { f.target = e.chain.URL })
	ctx := context.Background()
	for _, c := range []struct {
		name  string
		exts  [][]byte
		again [][]byte
	}{
		{"transfer fee", [][]byte{tlv(3, make([]byte, 32))}, [][]byte{tlv(3, make([]byte, 32)), transferFee(100)}},
		{"transfer hook", [][]byte{tlv(3, make([]byte, 32))}, [][]byte{tlv(3, make([]byte, 32)), tlv(14, make([]byte, 64))}},
	} {
		t.Run(c.name, func(t *testing.T) {
			mint := pub(testKey("closable mint " + c.name))
			e.chain.SetAccount(mint.String(), Token2022Program.String(), token2022Mint(c.exts...))
			src := AssociatedTokenAddress(pub(e.payer), mint, Token2022Program)
			dst := AssociatedTokenAddress(e.payTo, mint, Token2022Program)
			e.chain.SetAccount(src.String(), Token2022Program.String(), token2022Account(mint, pub(e.payer), 500_000))
			e.chain.SetAccount(dst.String(), Token2022Program.String(), token2022Account(mint, e.payTo, 0))
			p := e.payment(t)
			p.Mint, p.Program = mint, Token2022Program
			req := e.req
			req.Asset = mint.String()
			if v, err := e.f.Verify(ctx, Payload(p.withMemo("a"), req), req); err != nil || !v.IsValid {
				t.Fatalf("verify in the plain mint: %+v %v", v, err)
			}
			e.chain.SetAccount(mint.String(), Token2022Program.String(), token2022Mint(c.again...))
			v, err := e.f.Verify(ctx, Payload(p.withMemo("b"), req), req)
			if err != nil || v.IsValid || v.InvalidReason != x402.ReasonInvalidPaymentRequirements {
				t.Fatalf("verify once the mint was made again with a %s: %+v %v; want %s", c.name, v, err, x402.ReasonInvalidPaymentRequirements)
			}
		})
	}
	e.f.mu.Lock()
	n := len(e.f.mints)
	e.f.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d verdicts kept for closable mints", n)
	}
}
