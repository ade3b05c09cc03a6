package svmfacilitator

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"sort"

	"github.com/aovhq/aov/x402"
)

// The buyer's side of an exact payment: a transaction compiler laid out as
// the official client lays out a payment (the fee payer first, then the
// other signers, then writable and read-only accounts, v0 with no lookup
// tables). The facilitator's tests build their payments with it, and so
// does the load generator (cmd load), so both speak exactly what Verify
// accepts. It signs as the buyer only: the fee payer's slot stays empty
// for the facilitator.

// Ix is one instruction to compile: its program, accounts and data.
type Ix struct {
	program  PublicKey
	accounts []meta
	data     []byte
}

type meta struct {
	key              PublicKey
	signer, writable bool
}

// ComputeLimitIx is ComputeBudget's SetComputeUnitLimit.
func ComputeLimitIx(units uint32) Ix {
	d := make([]byte, 5)
	d[0] = 2
	binary.LittleEndian.PutUint32(d[1:], units)
	return Ix{program: ComputeBudgetProgram, data: d}
}

// ComputePriceIx is ComputeBudget's SetComputeUnitPrice, in micro-lamports.
func ComputePriceIx(micro uint64) Ix {
	d := make([]byte, 9)
	d[0] = 3
	binary.LittleEndian.PutUint64(d[1:], micro)
	return Ix{program: ComputeBudgetProgram, data: d}
}

// TransferCheckedIx is the token program's TransferChecked of amount from
// source to dest, signed by authority.
func TransferCheckedIx(program, source, mint, dest, authority PublicKey, amount uint64, decimals byte) Ix {
	d := make([]byte, 10)
	d[0] = 12
	binary.LittleEndian.PutUint64(d[1:], amount)
	d[9] = decimals
	return Ix{program: program, data: d, accounts: []meta{
		{key: source, writable: true}, {key: mint}, {key: dest, writable: true}, {key: authority, signer: true},
	}}
}

// MemoIx is a Memo instruction, signed by signers (usually none).
func MemoIx(memo string, signers ...PublicKey) Ix {
	ix := Ix{program: MemoProgram, data: []byte(memo)}
	for _, s := range signers {
		ix.accounts = append(ix.accounts, meta{key: s, signer: true})
	}
	return ix
}

// Compile builds the wire transaction of ixs paid by feePayer, signed by
// signers (the fee payer's slot left empty unless it is among them).
func Compile(feePayer PublicKey, blockhash [32]byte, ixs []Ix, signers ...ed25519.PrivateKey) []byte {
	type flags struct{ signer, writable bool }
	order := []PublicKey{feePayer}
	fl := map[PublicKey]*flags{feePayer: {signer: true, writable: true}}
	add := func(m meta) {
		f, ok := fl[m.key]
		if !ok {
			f = &flags{}
			fl[m.key] = f
			order = append(order, m.key)
		}
		f.signer = f.signer || m.signer
		f.writable = f.writable || m.writable
	}
	for _, ix := range ixs {
		for _, a := range ix.accounts {
			add(a)
		}
		add(meta{key: ix.program})
	}
	rank := func(k PublicKey) int {
		f := fl[k]
		switch {
		case k == feePayer:
			return 0
		case f.signer && f.writable:
			return 1
		case f.signer:
			return 2
		case f.writable:
			return 3
		}
		return 4
	}
	sort.SliceStable(order, func(i, j int) bool { return rank(order[i]) < rank(order[j]) })
	index := map[PublicKey]byte{}
	var nsig, nroSigned, nro byte
	for i, k := range order {
		index[k] = byte(i)
		switch rank(k) {
		case 0, 1:
			nsig++
		case 2:
			nsig++
			nroSigned++
		case 4:
			nro++
		}
	}
	msg := []byte{0x80, nsig, nroSigned, nro, byte(len(order))}
	for _, k := range order {
		msg = append(msg, k[:]...)
	}
	msg = append(msg, blockhash[:]...)
	msg = append(msg, byte(len(ixs)))
	for _, ix := range ixs {
		msg = append(msg, index[ix.program], byte(len(ix.accounts)))
		for _, a := range ix.accounts {
			msg = append(msg, index[a.key])
		}
		msg = append(msg, byte(len(ix.data)))
		msg = append(msg, ix.data...)
	}
	msg = append(msg, 0) // no lookup tables
	raw := []byte{nsig}
	sigs := make([][]byte, nsig)
	for i := range sigs {
		sigs[i] = make([]byte, 64)
	}
	for _, s := range signers {
		var pk PublicKey
		copy(pk[:], s.Public().(ed25519.PublicKey))
		if i, ok := index[pk]; ok && i < nsig {
			sigs[i] = ed25519.Sign(s, msg)
		}
	}
	for _, s := range sigs {
		raw = append(raw, s...)
	}
	return append(raw, msg...)
}

// Payment is an exact payment as the official client builds it: Amount of
// Mint (under the token Program) from Authority's associated token account
// to PayTo's, fees paid by FeePayer, valid while Blockhash is recent.
type Payment struct {
	FeePayer  PublicKey
	Authority ed25519.PrivateKey
	Mint      PublicKey
	Program   PublicKey
	PayTo     PublicKey
	Amount    uint64
	Decimals  byte
	Blockhash [32]byte
	// Memo is the Memo instruction's text (default: a fixed 32-character
	// one). The chain refuses a transaction it has seen, so two payments
	// that must both land with the same blockhash differ in it.
	Memo string
}

// AuthorityKey is the buyer's public key.
func (p Payment) AuthorityKey() PublicKey {
	var k PublicKey
	copy(k[:], p.Authority.Public().(ed25519.PublicKey))
	return k
}

// Instructions are the payment's four instructions: compute limit, compute
// price, TransferChecked and Memo.
func (p Payment) Instructions() []Ix {
	auth := p.AuthorityKey()
	memo := p.Memo
	if memo == "" {
		memo = "0123456789abcdef0123456789abcdef"
	}
	return []Ix{
		ComputeLimitIx(20_000),
		ComputePriceIx(1),
		TransferCheckedIx(p.Program, AssociatedTokenAddress(auth, p.Mint, p.Program), p.Mint,
			AssociatedTokenAddress(p.PayTo, p.Mint, p.Program), auth, p.Amount, p.Decimals),
		MemoIx(memo),
	}
}

// Build compiles ixs as the payment's transaction, signed by the buyer.
func (p Payment) Build(ixs []Ix) []byte {
	return Compile(p.FeePayer, p.Blockhash, ixs, p.Authority)
}

// Transaction is the payment's wire transaction, signed by the buyer.
func (p Payment) Transaction() []byte { return p.Build(p.Instructions()) }

// Payload wraps a wire transaction as an x402 payment for req.
func Payload(raw []byte, req x402.PaymentRequirements) x402.PaymentPayload {
	b, _ := json.Marshal(map[string]string{"transaction": base64.StdEncoding.EncodeToString(raw)})
	return x402.PaymentPayload{X402Version: 2, Accepted: req, Payload: b}
}

// LatestBlockhash is the blockhash a new transaction names: the buyer's
// one chain read before it signs.
func (c *RPC) LatestBlockhash(ctx context.Context) ([32]byte, error) {
	var out struct {
		Value struct {
			Blockhash string `json:"blockhash"`
		} `json:"value"`
	}
	if err := c.call(ctx, "getLatestBlockhash", []any{map[string]any{"commitment": "confirmed"}}, &out); err != nil {
		return [32]byte{}, err
	}
	k, err := ParsePublicKey(out.Value.Blockhash)
	if err != nil {
		return [32]byte{}, fmt.Errorf("getLatestBlockhash: %w", err)
	}
	return k, nil
}
