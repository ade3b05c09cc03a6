package store

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/dgraph-io/badger/v4"
	"github.com/mtibben/confusables"
	"golang.org/x/text/secure/precis"
	"golang.org/x/text/unicode/norm"

	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/internal/ed25519key"
)

// Owners records which wallet owns an agent id that is not itself a wallet
// address: the first wallet that binds it. verifierd asks it before it
// counts a verification as authenticated, so that no other wallet can
// borrow the id's reputation, and it never changes an owner once written
// (there is no transfer and no delete: a record that could be rewritten
// would be a record that could be stolen).
//
// A distributed implementation needs one atomic "set if absent, then read"
// (Redis SET NX followed by GET in one Lua script; PostgreSQL INSERT ... ON
// CONFLICT DO NOTHING RETURNING, then SELECT).
type Owners interface {
	// BindAgent makes wallet the owner of agentID unless it already has
	// one, and returns the owner afterwards: wallet when this call bound
	// it (or wallet already owned it), the earlier owner otherwise. Of
	// concurrent first binders exactly one wins; the others get its
	// address back.
	BindAgent(ctx context.Context, agentID, wallet string) (owner string, err error)
	// AgentOwner returns agentID's owner, or "" when nobody bound it.
	AgentOwner(ctx context.Context, agentID string) (string, error)
}

// SameWallet reports whether two wallet addresses name one wallet: EVM
// (0x) ones compared without regard to case, since EIP-55 casing is only a
// display form; others (Solana's base58) exactly. An owner is compared with
// it wherever one is compared (verifierd's ownership checks, copy-history),
// so that one wallet is never two owners.
func SameWallet(a, b string) bool {
	if a == "" || b == "" {
		return false
	}
	if IsEVMAddress(a) && IsEVMAddress(b) {
		return strings.EqualFold(a, b)
	}
	return a == b
}

// IsSolanaAddress reports whether s is a Solana account as wallets write
// it: the canonical base58 spelling of 32 bytes, the only one a Solana
// wallet proof can carry. It is the one parse of a Solana address: the last
// part of a solana CAIP-10 id is that account's own agent id when it holds
// (a program's account too, which no wallet can own), and SolanaWalletKey
// starts with it.
func IsSolanaAddress(s string) bool {
	if len(s) < 32 || len(s) > 44 {
		return false // 32 bytes are 32 to 44 base58 digits
	}
	b, err := base58.Decode(s)
	return err == nil && len(b) == 32 && base58.Encode(b) == s
}

// SolanaWalletKey returns the public key of the Solana account s, and false
// when no Solana wallet proof can carry s as its address: s is not
// IsSolanaAddress, or its 32 bytes are no key a signature may be checked
// against (ed25519key.Check: off the curve, as about half of all 32-byte
// values are, or of small order). walletauth takes a proof's address with
// it, and verifierd reads a bare agent id as a Solana account only when it
// holds: a readable name that merely decodes to 32 bytes would otherwise
// belong to an address nobody can prove, and its owner would lose it.
func SolanaWalletKey(s string) (ed25519.PublicKey, bool) {
	if !IsSolanaAddress(s) {
		return nil, false
	}
	b, _ := base58.Decode(s)
	if ed25519key.Check(b) != nil {
		return nil, false
	}
	return ed25519.PublicKey(b), true
}

// MaxAgentIDChars bounds an agent id in Unicode characters: SPEC §3's
// limit of the agent_id a verification request carries, so any agent that
// can be verified can be bound.
const MaxAgentIDChars = 200

// BindableAgentID reports whether a wallet may bind id (SPEC §9): 1 to
// MaxAgentIDChars characters of UTF-8 that the OpaqueString profile of
// RFC 8264 (the FreeformClass, with its NFC and non-ASCII space mapping)
// leaves unchanged, none of them one that renders blank (blankRune). It is
// the one rule of what a bound agent id may contain: walletauth refuses a
// proof naming any other id and verifierd drops any other id the gateway
// forwards as the one a proof named.
//
// A bound id is a name people read, and one with a character that shows
// nothing reads exactly as another's ("0x<address>" and a zero-width space
// or a variation selector): the wallet that bound it would hold an owned,
// authenticated score under a name nobody can tell from the real one. The
// FreeformClass is the IETF's rule for such strings and refuses controls,
// default-ignorable code points (format characters, variation selectors,
// the combining grapheme joiner, the Hangul fillers), old Hangul jamo,
// private-use and unassigned characters; requiring the profile to leave
// the id unchanged also refuses non-ASCII spaces and spellings that are
// not NFC, which render as another id's. The ASCII space stays, as ids
// such as "my agent" were always bindable; walletauth refuses it at either
// end, which HTTP trims from the header that carries the id on. Every
// character the rule admits is also printable as unicode.IsPrint has it.
func BindableAgentID(id string) bool {
	if id == "" || !utf8.ValidString(id) || utf8.RuneCountInString(id) > MaxAgentIDChars {
		return false
	}
	if e, err := precis.OpaqueString.String(id); err != nil || e != id {
		return false
	}
	return !strings.ContainsFunc(id, blankRune) && !ImitatesAddress(id)
}

// ImitatesAddress reports whether id, which is not all ASCII, holds
// something that reads as an address: a run of 32 or more letters and
// digits (an EVM address is 42, a Solana one 32 to 44), one of them at
// least a digit, counting as letters and digits every character that
// reads as ASCII ones. Those are the characters whose NFKC form or UTS #39
// skeleton (Unicode's confusables data), less any combining marks, is
// ASCII letters and digits (Cyrillic а, fullwidth ０, mathematical 𝟶, ﬀ
// for "ff", ⅱ for "ii", Ẹ for E), any decimal digit of another script
// (Khmer ០), and combining marks, which a run reads through. So
// 0x52908400098527886Е0F… with a Cyrillic Е, an address in fullwidth or
// mathematical digits, and the victim's own address after lookalike
// colons (eip155꞉8453꞉0x…, eip155፡8453፡0x…) all are refused: each reads as
// the victim's account, whose owned score it would pass for. An id all
// ASCII reads as what it is, and a long word with no digit
// (Donaudampfschifffahrtsgesellschaftskapitän) is no address; names with
// punctuation between words (o’reilly-support-agent) never make a run.
func ImitatesAddress(id string) bool {
	if isASCII(id) {
		return false
	}
	run, digit := 0, false
	for _, r := range id {
		n, d := alnumUnits(r)
		switch {
		case n > 0:
			run, digit = run+n, digit || d
		case unicode.In(r, unicode.Mn, unicode.Me):
			continue // read through, on whatever it marks
		default:
			run, digit = 0, false
			continue
		}
		if run >= 32 && digit {
			return true
		}
	}
	return false
}

// alnumUnits is how many ASCII letters and digits r reads as (0: none, it
// ends a run), and whether a digit is among them.
func alnumUnits(r rune) (int, bool) {
	if r < utf8.RuneSelf {
		if c := byte(r); isAlnum(c) {
			return 1, '0' <= c && c <= '9'
		}
		return 0, false
	}
	for _, f := range []string{norm.NFKC.String(string(r)), confusables.Skeleton(string(r))} {
		if a := unmarked(f); a != "" {
			return len(a), strings.ContainsAny(a, "0123456789")
		}
	}
	if unicode.IsDigit(r) {
		return 1, true
	}
	return 0, false
}

// unmarked is s less its combining marks, when that is ASCII letters and
// digits; "" otherwise.
func unmarked(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.In(r, unicode.Mn, unicode.Me) {
			return -1
		}
		return r
	}, norm.NFD.String(s))
	for i := 0; i < len(s); i++ {
		if !isAlnum(s[i]) {
			return ""
		}
	}
	return s
}

func isAlnum(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// blankRune reports the characters the FreeformClass admits as symbols or
// letters that fonts draw as nothing at all: U+2800 BRAILLE PATTERN BLANK,
// U+1D159 MUSICAL SYMBOL NULL NOTEHEAD and U+16FE4 KHITAN SMALL SCRIPT
// FILLER. The class has no property for them, so they are named here.
func blankRune(r rune) bool {
	return r == '\u2800' || r == '\U0001D159' || r == '\U00016FE4'
}

// IsEVMAddress reports whether s is an EVM address: 0x and 40 hex digits,
// in any case. Each digit is compared as written, not folded with |0x20:
// folding maps the control bytes 0x10-0x19 onto '0'-'9', and such an id
// would read as the account of an address no wallet can prove.
func IsEVMAddress(s string) bool {
	if len(s) != 42 || s[0] != '0' || (s[1] != 'x' && s[1] != 'X') {
		return false
	}
	for i := 2; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// maxOwner bounds a stored owner address; real ones are at most 44 bytes
// (base58 Solana) or 42 (0x EVM).
const maxOwner = 128

func ownerKey(agent string) []byte {
	k := make([]byte, 0, 3+len(agent))
	k = append(k, tagOwner)
	return appendComponent(k, agent)
}

// BindAgent implements Owners. The read and the write are one Badger
// transaction: a concurrent binder that committed first makes this one
// conflict, and the retry reads the winner.
func (db *DB) BindAgent(ctx context.Context, agentID, wallet string) (string, error) {
	if agentID == "" || len(agentID) > MaxAgentIDBytes {
		return "", errAgentID
	}
	if wallet == "" || len(wallet) > maxOwner {
		return "", fmt.Errorf("store: owner address must be 1..%d bytes", maxOwner)
	}
	k := ownerKey(agentID)
	var owner string
	err := db.update(ctx, func(txn *tx) error {
		cur, err := getOwner(txn, k)
		if err != nil {
			return err
		}
		if cur != "" {
			owner = cur
			return nil
		}
		owner = wallet
		return txn.Set(k, []byte(wallet))
	})
	if err != nil {
		return "", err
	}
	return owner, nil
}

// AgentOwner implements Owners.
func (db *DB) AgentOwner(ctx context.Context, agentID string) (string, error) {
	if len(agentID) > MaxAgentIDBytes {
		return "", nil
	}
	var owner string
	err := db.view(ctx, func(txn *tx) error {
		var err error
		owner, err = getOwner(txn, ownerKey(agentID))
		return err
	})
	return owner, err
}

func getOwner(txn *tx, k []byte) (string, error) {
	item, err := txn.Get(k)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("reading agent owner: %w", err)
	}
	v, err := item.ValueCopy(nil)
	if err != nil {
		return "", fmt.Errorf("reading agent owner: %w", err)
	}
	return string(v), nil
}

// OwnerRecord is one agent id's owner, as AgentOwners lists them.
type OwnerRecord struct{ AgentID, Owner string }

// AgentOwners lists up to limit owner records (at least one), in the
// store's key order, starting after the agent id after ("" for the first
// page; then the last AgentID of the previous page). A page shorter than
// limit is the last. verifierd copy-history reads every owner with it to
// copy them into a shared history: a store has no other way to name them.
func (db *DB) AgentOwners(ctx context.Context, after string, limit int) ([]OwnerRecord, error) {
	limit = max(limit, 1)
	var out []OwnerRecord
	prefix := []byte{tagOwner}
	err := db.view(ctx, func(txn *tx) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, PrefetchValues: true, PrefetchSize: min(limit, 100)})
		defer it.Close()
		seek := ownerKey(after)
		for it.Seek(seek); it.ValidForPrefix(prefix) && len(out) < limit; it.Next() {
			k := it.Item().Key()
			if after != "" && bytes.Equal(k, seek) {
				continue
			}
			v, err := it.Item().ValueCopy(nil)
			if err != nil {
				return fmt.Errorf("reading agent owner: %w", err)
			}
			out = append(out, OwnerRecord{AgentID: string(k[3:]), Owner: string(v)})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Interface guard
var _ Owners = (*DB)(nil)
