package svmfacilitator

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"sort"

	"github.com/aovhq/aov/x402"
)

// A test-only transaction compiler, laid out as the official client lays
// out a payment: the fee payer first, then the other signers, then writable
// and read-only accounts, v0 with no lookup tables.

type meta struct {
	key              PublicKey
	signer, writable bool
}

type testIx struct {
	program  PublicKey
	accounts []meta
	data     []byte
}

func computeLimitIx(units uint32) testIx {
	d := make([]byte, 5)
	d[0] = 2
	binary.LittleEndian.PutUint32(d[1:], units)
	return testIx{program: ComputeBudgetProgram, data: d}
}

func computePriceIx(micro uint64) testIx {
	d := make([]byte, 9)
	d[0] = 3
	binary.LittleEndian.PutUint64(d[1:], micro)
	return testIx{program: ComputeBudgetProgram, data: d}
}

func transferCheckedIx(program, source, mint, dest, authority PublicKey, amount uint64, decimals byte) testIx {
	d := make([]byte, 10)
	d[0] = 12
	binary.LittleEndian.PutUint64(d[1:], amount)
	d[9] = decimals
	return testIx{program: program, data: d, accounts: []meta{
		{key: source, writable: true}, {key: mint}, {key: dest, writable: true}, {key: authority, signer: true},
	}}
}

func memoIx(memo string, signers ...PublicKey) testIx {
	ix := testIx{program: MemoProgram, data: []byte(memo)}
	for _, s := range signers {
		ix.accounts = append(ix.accounts, meta{key: s, signer: true})
	}
	return ix
}

// compile builds the wire transaction of ixs paid by feePayer, signed by
// signers (the fee payer's slot left empty unless it is among them).
func compile(feePayer PublicKey, blockhash [32]byte, ixs []testIx, signers ...ed25519.PrivateKey) []byte {
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

// paymentTx is a payment as the official client builds it.
type paymentTx struct {
	feePayer  PublicKey
	authority ed25519.PrivateKey
	mint      PublicKey
	program   PublicKey
	payTo     PublicKey
	amount    uint64
	decimals  byte
	blockhash [32]byte
}

func (p paymentTx) authorityKey() PublicKey {
	var k PublicKey
	copy(k[:], p.authority.Public().(ed25519.PublicKey))
	return k
}

func (p paymentTx) instructions() []testIx {
	auth := p.authorityKey()
	return []testIx{
		computeLimitIx(20_000),
		computePriceIx(1),
		transferCheckedIx(p.program, AssociatedTokenAddress(auth, p.mint, p.program), p.mint,
			AssociatedTokenAddress(p.payTo, p.mint, p.program), auth, p.amount, p.decimals),
		memoIx("0123456789abcdef0123456789abcdef"),
	}
}

func (p paymentTx) build(ixs []testIx) []byte {
	return compile(p.feePayer, p.blockhash, ixs, p.authority)
}

// payload wraps a wire transaction as an x402 payment for req.
func payload(raw []byte, req x402.PaymentRequirements) x402.PaymentPayload {
	b, _ := json.Marshal(map[string]string{"transaction": base64.StdEncoding.EncodeToString(raw)})
	return x402.PaymentPayload{X402Version: 2, Accepted: req, Payload: b}
}
