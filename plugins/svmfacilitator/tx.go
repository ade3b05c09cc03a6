package svmfacilitator

import (
	"crypto/ed25519"
	"crypto/sha256"
	"errors"
	"fmt"

	"filippo.io/edwards25519"

	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/internal/ed25519key"
)

// PublicKey is a Solana account address.
type PublicKey [32]byte

// String is the base58 form.
func (k PublicKey) String() string { return base58.Encode(k[:]) }

// ParsePublicKey decodes a base58 account address; it must be exactly 32
// bytes.
func ParsePublicKey(s string) (PublicKey, error) {
	var k PublicKey
	b, err := base58.Decode(s)
	if err != nil || len(b) != 32 {
		return k, fmt.Errorf("%q is not a base58 Solana address", truncate(s))
	}
	copy(k[:], b)
	return k, nil
}

func mustKey(s string) PublicKey {
	k, err := ParsePublicKey(s)
	if err != nil {
		panic(err)
	}
	return k
}

// The programs a payment may call.
var (
	ComputeBudgetProgram = mustKey("ComputeBudget111111111111111111111111111111")
	MemoProgram          = mustKey("MemoSq4gqABAXKb96qnH8TysNcWxMyWCqXgDLGmfcHr")
	TokenProgram         = mustKey("TokenkegQfeZyiNwAJbNbGKPFXCWuBvf9Ss623VQ5DA")
	Token2022Program     = mustKey("TokenzQdBNbLqP5VEhdkAS6EPFLC1PHnBqCXEpPxuEb")
	AssociatedTokenProg  = mustKey("ATokenGPvbdGVxr1b2hvZbsiqW5xWH25efTNsLJA8knL")
	LighthouseProgram    = mustKey("L2TExMFKdjpN9kozasaurPirfHy9P8sbXoAN1qA3S95")
)

// Instruction is one compiled instruction: indexes into the message's
// account keys.
type Instruction struct {
	ProgramIndex uint8
	Accounts     []uint8
	Data         []byte
}

// Transaction is a decoded wire transaction. Raw is the client's bytes;
// Message is the signed part of Raw and Signatures alias Raw, so writing
// a signature (co-signing) changes Raw in place and nothing is re-encoded.
type Transaction struct {
	Raw        []byte
	Signatures [][]byte // each 64 bytes, aliasing Raw
	Message    []byte   // aliasing Raw
	Versioned  bool     // v0 (true) or legacy

	NumSigners        uint8
	NumReadonlySigned uint8
	NumReadonly       uint8
	AccountKeys       []PublicKey
	Blockhash         [32]byte
	Instructions      []Instruction
	// LookupTables is the number of address lookup tables a v0 message
	// uses; a payment needs none.
	LookupTables int
}

// MaxTransactionSize is Solana's packet limit: a larger transaction cannot
// be sent, so it is refused before decoding.
const MaxTransactionSize = 1232

var errShort = errors.New("transaction truncated")

type reader struct {
	b   []byte
	off int
}

func (r *reader) byte() (byte, error) {
	if r.off >= len(r.b) {
		return 0, errShort
	}
	c := r.b[r.off]
	r.off++
	return c, nil
}

func (r *reader) bytes(n int) ([]byte, error) {
	if n < 0 || r.off+n > len(r.b) {
		return nil, errShort
	}
	s := r.b[r.off : r.off+n : r.off+n]
	r.off += n
	return s, nil
}

// shortvec is Solana's compact-u16 length: 1-3 bytes, 7 bits each, in
// canonical (shortest) form.
func (r *reader) shortvec() (int, error) {
	v := 0
	for i := 0; i < 3; i++ {
		c, err := r.byte()
		if err != nil {
			return 0, err
		}
		if i == 2 && c > 3 {
			return 0, errors.New("compact-u16 overflow")
		}
		v |= int(c&0x7f) << (7 * i)
		if c&0x80 == 0 {
			if c == 0 && i > 0 {
				return 0, errors.New("non-canonical compact-u16")
			}
			return v, nil
		}
	}
	return 0, errors.New("compact-u16 too long")
}

// DecodeTransaction decodes a wire transaction (legacy or v0). It checks
// the structure only: lengths, that the signature count matches the
// header, that every index points at an account key, and that nothing
// trails the message. Signatures are not checked here.
func DecodeTransaction(raw []byte) (*Transaction, error) {
	if len(raw) > MaxTransactionSize {
		return nil, fmt.Errorf("transaction is %d bytes, over Solana's %d", len(raw), MaxTransactionSize)
	}
	r := &reader{b: raw}
	n, err := r.shortvec()
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, errors.New("transaction has no signatures")
	}
	tx := &Transaction{Raw: raw, Signatures: make([][]byte, n)}
	for i := range tx.Signatures {
		if tx.Signatures[i], err = r.bytes(64); err != nil {
			return nil, err
		}
	}
	msgStart := r.off
	first, err := r.byte()
	if err != nil {
		return nil, err
	}
	if first&0x80 != 0 {
		if first != 0x80 {
			return nil, fmt.Errorf("transaction version %d is not supported", first&0x7f)
		}
		tx.Versioned = true
		if tx.NumSigners, err = r.byte(); err != nil {
			return nil, err
		}
	} else {
		tx.NumSigners = first
	}
	if tx.NumReadonlySigned, err = r.byte(); err != nil {
		return nil, err
	}
	if tx.NumReadonly, err = r.byte(); err != nil {
		return nil, err
	}
	nkeys, err := r.shortvec()
	if err != nil {
		return nil, err
	}
	if nkeys > 256 {
		return nil, errors.New("more than 256 account keys")
	}
	tx.AccountKeys = make([]PublicKey, nkeys)
	for i := range tx.AccountKeys {
		b, err := r.bytes(32)
		if err != nil {
			return nil, err
		}
		copy(tx.AccountKeys[i][:], b)
	}
	if int(tx.NumSigners) != n {
		return nil, fmt.Errorf("%d signatures for %d required signers", n, tx.NumSigners)
	}
	if int(tx.NumSigners) > nkeys || tx.NumReadonlySigned >= tx.NumSigners || int(tx.NumSigners)+int(tx.NumReadonly) > nkeys {
		return nil, errors.New("message header does not fit the account keys")
	}
	bh, err := r.bytes(32)
	if err != nil {
		return nil, err
	}
	copy(tx.Blockhash[:], bh)
	nix, err := r.shortvec()
	if err != nil {
		return nil, err
	}
	if nix > 64 {
		return nil, errors.New("too many instructions")
	}
	tx.Instructions = make([]Instruction, nix)
	for i := range tx.Instructions {
		ix := &tx.Instructions[i]
		if ix.ProgramIndex, err = r.byte(); err != nil {
			return nil, err
		}
		na, err := r.shortvec()
		if err != nil {
			return nil, err
		}
		if ix.Accounts, err = r.bytes(na); err != nil {
			return nil, err
		}
		nd, err := r.shortvec()
		if err != nil {
			return nil, err
		}
		if ix.Data, err = r.bytes(nd); err != nil {
			return nil, err
		}
	}
	if tx.Versioned {
		if tx.LookupTables, err = r.shortvec(); err != nil {
			return nil, err
		}
		for i := 0; i < tx.LookupTables; i++ {
			if _, err := r.bytes(32); err != nil {
				return nil, err
			}
			for j := 0; j < 2; j++ {
				k, err := r.shortvec()
				if err != nil {
					return nil, err
				}
				if _, err := r.bytes(k); err != nil {
					return nil, err
				}
			}
		}
	}
	if r.off != len(raw) {
		return nil, errors.New("bytes after the message")
	}
	tx.Message = raw[msgStart:]
	// Indexes must name static keys (a payment uses no lookup tables; one
	// that does is refused before its instructions are read).
	if tx.LookupTables == 0 {
		for _, ix := range tx.Instructions {
			if int(ix.ProgramIndex) >= nkeys {
				return nil, errors.New("instruction program index out of range")
			}
			for _, a := range ix.Accounts {
				if int(a) >= nkeys {
					return nil, errors.New("instruction account index out of range")
				}
			}
		}
	}
	return tx, nil
}

// Program returns the program an instruction calls.
func (tx *Transaction) Program(ix Instruction) PublicKey { return tx.AccountKeys[ix.ProgramIndex] }

// Account returns the i-th account of an instruction.
func (tx *Transaction) Account(ix Instruction, i int) PublicKey {
	return tx.AccountKeys[ix.Accounts[i]]
}

// MessageHash is the SHA-256 of the message bytes: the identity of a
// payment. The client controls the bytes of the fee payer's empty
// signature slot, so a key over the whole wire transaction could be
// dodged; the message is what every signature covers.
func (tx *Transaction) MessageHash() [32]byte { return sha256.Sum256(tx.Message) }

// verifySignature checks sig by k over msg, refusing a key that is not a
// signer's (ed25519key.Check: a non-canonical encoding, or a point of small
// order, under which crypto/ed25519 accepts forged signatures; the chain
// refuses such signers too).
func verifySignature(k PublicKey, msg, sig []byte) bool {
	return ed25519key.Check(k[:]) == nil && ed25519.Verify(ed25519.PublicKey(k[:]), msg, sig)
}

// onCurve reports whether b is the encoding of a curve point (a program
// derived address must not be one). It is not ed25519key.Check, and must
// not be: it is the runtime's derivation rule (bytes that decode to a
// point are on the curve, whatever its order), which decides the address
// an honest payer's token account has.
func onCurve(b []byte) bool {
	_, err := new(edwards25519.Point).SetBytes(b)
	return err == nil
}

// FindProgramAddress derives the program address of seeds under program,
// with the highest bump seed that puts it off the curve, as the runtime's
// find_program_address does.
func FindProgramAddress(seeds [][]byte, program PublicKey) (PublicKey, bool) {
	for bump := 255; bump >= 0; bump-- {
		h := sha256.New()
		for _, s := range seeds {
			h.Write(s)
		}
		h.Write([]byte{byte(bump)})
		h.Write(program[:])
		h.Write([]byte("ProgramDerivedAddress"))
		var k PublicKey
		h.Sum(k[:0])
		if !onCurve(k[:]) {
			return k, true
		}
	}
	return PublicKey{}, false
}

// AssociatedTokenAddress is the associated token account of owner for mint
// under tokenProgram (SPL Token or Token-2022).
func AssociatedTokenAddress(owner, mint, tokenProgram PublicKey) PublicKey {
	k, _ := FindProgramAddress([][]byte{owner[:], tokenProgram[:], mint[:]}, AssociatedTokenProg)
	return k
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
