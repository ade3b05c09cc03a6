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
// leaves unchanged, none of them one that renders blank (blankRune), and
// writing neither an address nor a test- prefix in lookalike characters
// (ImitatesAddress, ImitatesTestAgent). It is the one rule of what a bound
// agent id may contain: walletauth refuses a proof naming any other id and
// verifierd drops any other id the gateway forwards as the one a proof
// named.
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
	return !strings.ContainsFunc(id, blankRune) && !ImitatesAddress(id) && !ImitatesTestAgent(id)
}

// ImitatesTestAgent reports whether id reads as a reserved test- id
// (TestAgentPrefix) without being one: its first characters, each read as
// the ASCII it looks like as ImitatesAddress reads them, are "test-", one
// of them not ASCII (tеst-agent with a Cyrillic е). test- ids are
// examples nobody owns, never authenticated nor scored; a wallet that
// bound such a lookalike would hold an owned, authenticated score under a
// name that reads as one.
func ImitatesTestAgent(id string) bool {
	if strings.HasPrefix(id, TestAgentPrefix) || isASCII(id) {
		return false
	}
	u := readAs(id)
	if len(u) < len(TestAgentPrefix) {
		return false
	}
	for i, x := range u[:len(TestAgentPrefix)] {
		if x.c != TestAgentPrefix[i] {
			return false
		}
	}
	return true // one of them is not ASCII, as id does not start with test-
}

// ImitatesAddress reports whether id, which is not all ASCII, writes an
// address, or an account id ending in one, in lookalike characters: a
// reader takes it for that wallet's account, whose owned score it would
// pass for. It reads id as a reader does, each character as the ASCII it
// looks like (readAs), and looks there for the two address formats
// wallets prove, in a row of letters and digits:
//
//   - EVM: 40 or more in a row that read as hex digits, with or without 0x
//     before them (o and O read as 0, l and I as 1);
//   - Solana: the base58 spelling of 32 bytes, 43 or 44 characters, or 32
//     to 42 when it starts with the 1s that spell leading zero bytes: that
//     many in a row that read as base58 digits (no 0 and no O; l and I
//     read as 1), among them at least five capitals and five small
//     letters, as all but about one in 200,000 spellings of 43 or 44 have
//     (base58 has 24 capitals and 25 small letters among its 58 digits).
//     So a long word (Donaudampfschifffahrtsgesellschaftskapitäne) is no
//     address, while one without a digit (about one account in 1,700) is.
//
// That stretch, with its 0x and the CAIP-10 prefix before them (namespace
// and chain, eip155꞉8453꞉, whose separators may be any character that is
// not ASCII and reads as no letter or digit: Ethiopic ፡ is drawn as a
// colon the tables do not map), imitates an address when it holds a
// character that is not ASCII and at least three quarters of the stretch
// read as ASCII. The part that reads as the address is what must be in
// lookalikes: an id with an address or a git hash in ASCII beside another
// script's word reads as what it is (代理人-0x…, café-build-<sha1>) and
// binds like its ASCII twin (agent-0x…). A letter or digit the tables do
// not map reads as unknown (ꟈ, ь, ᴇ, Khmer ០), so a stretch reads
// through a few of them as a reader does, but one made mostly of them (a
// word in Russian) reads as no address.
func ImitatesAddress(id string) bool {
	if isASCII(id) {
		return false
	}
	u := readAs(id)
	for s := 0; s < len(u); {
		if !u[s].alnum() {
			s++
			continue
		}
		e := s
		for e < len(u) && u[e].alnum() {
			e++
		}
		if imitatesEVM(u, s, e) || imitatesSolana(u, s, e) {
			return true
		}
		s = e
	}
	return false
}

// unit is one ASCII character an id reads as (c), and whether it comes
// from a character that is not ASCII (foreign) or is a letter or digit
// the tables give no reading (wild, c is '*'); c is 0 for a Chinese,
// Japanese or Korean one (see readAs).
type unit struct {
	c             byte
	foreign, wild bool
}

func (x unit) alnum() bool { return x.wild || isAlnum(x.c) }

// readAs reads id as ASCII: an ASCII character as itself, another as its
// NFKC form or UTS #39 skeleton (Unicode's confusables data) less any
// combining marks when that is ASCII (Cyrillic а, fullwidth ０, 𝟶, ﬀ as
// "ff", ⅱ as "ii", Ẹ as E, ꞉ as ':'), a letter or digit with no such
// reading as a wild unit, and anything else as a space. The ideographs
// and syllables of Chinese, Japanese and Korean are no wild units, as
// none looks like an ASCII letter or digit (代理人 before a hash makes no
// stretch of hex a lookalike), nor spaces, as none looks like a colon
// either: they read as a zero byte. A combining mark adds nothing but
// marks the unit it sits on as foreign.
func readAs(id string) []unit {
	var u []unit
	for _, r := range id {
		switch {
		case r < utf8.RuneSelf:
			u = append(u, unit{c: byte(r)})
		case unicode.In(r, unicode.Mn, unicode.Me):
			if len(u) > 0 {
				u[len(u)-1].foreign = true
			}
		default:
			a := asciiReading(r)
			switch {
			case a != "":
				for i := 0; i < len(a); i++ {
					u = append(u, unit{c: a[i], foreign: true})
				}
			case !unicode.IsLetter(r) && !unicode.IsNumber(r):
				u = append(u, unit{c: ' ', foreign: true})
			case unicode.In(r, unicode.Han, unicode.Hiragana, unicode.Katakana, unicode.Hangul):
				u = append(u, unit{foreign: true}) // ends a row, but is no separator
			default:
				u = append(u, unit{c: '*', foreign: true, wild: true})
			}
		}
	}
	return u
}

// asciiReading is the ASCII a character that is not ASCII reads as, ""
// when the tables give none.
func asciiReading(r rune) string {
	for _, f := range []string{norm.NFKC.String(string(r)), confusables.Skeleton(string(r))} {
		if a := unmarked(f); a != "" {
			return a
		}
	}
	return ""
}

// imitatesEVM reports whether the run u[s:e] holds an EVM address in
// lookalikes: 40 or more units in a row that read as hex digits.
func imitatesEVM(u []unit, s, e int) bool {
	for i := s; i < e; {
		j := i
		for j < e && hexLike(u[j]) {
			j++
		}
		if j-i >= 40 {
			from := i
			if from-2 >= s && zeroLike(u[from-2]) && (u[from-1].c == 'x' || u[from-1].c == 'X') {
				from = caipPrefix(u, from-2)
			}
			if lookalike(u[from:j], u[i:j]) {
				return true
			}
		}
		i = j + 1
	}
	return false
}

// imitatesSolana reports whether the run u[s:e] holds a Solana address in
// lookalikes (see ImitatesAddress).
func imitatesSolana(u []unit, s, e int) bool {
	for i := s; i < e; {
		j := i
		upper, lower := 0, 0
		for ; j < e && base58Like(u[j]); j++ {
			switch c := u[j].c; {
			case u[j].wild || oneLike(u[j]):
			case 'A' <= c && c <= 'Z':
				upper++
			case 'a' <= c && c <= 'z':
				lower++
			}
		}
		n := j - i
		if (n >= 43 || n >= 32 && oneLike(u[i])) && upper >= 5 && lower >= 5 {
			from := i
			if from == s {
				from = caipPrefix(u, s)
			}
			if lookalike(u[from:j], u[i:j]) {
				return true
			}
		}
		i = j + 1
	}
	return false
}

// lookalike reports whether span, an address with what precedes it, holds
// a foreign unit, and at least three quarters of addr, the address, read
// as ASCII.
func lookalike(span, addr []unit) bool {
	foreign, wild := false, 0
	for _, x := range span {
		foreign = foreign || x.foreign
	}
	for _, x := range addr {
		if x.wild {
			wild++
		}
	}
	return foreign && 4*wild <= len(addr)
}

// caipPrefix returns where a CAIP-10 prefix ending at u[at] begins
// (namespace, separator, reference, separator: eip155:8453:), or at when
// there is none. A separator is a unit reading ':' or any other foreign
// one that is no letter or digit, since some scripts draw one as a colon
// that the tables do not map (Ethiopic wordspace ፡, Tibetan ༔).
func caipPrefix(u []unit, at int) int {
	sep := func(i int) bool { return i >= 0 && (u[i].c == ':' || u[i].foreign && u[i].c == ' ') }
	part := func(end, min, max int, ok func(byte) bool) int {
		i := end
		for i > 0 && end-i < max && !u[i-1].wild && ok(u[i-1].c) {
			i--
		}
		if end-i < min {
			return -1
		}
		return i
	}
	if !sep(at - 1) {
		return at
	}
	ref := part(at-1, 1, 32, func(c byte) bool { return isAlnum(c) || c == '-' || c == '_' })
	if ref < 0 || !sep(ref-1) {
		return at
	}
	ns := part(ref-1, 3, 8, func(c byte) bool { return isAlnum(c) || c == '-' })
	if ns < 0 || ns > 0 && (u[ns-1].alnum() || u[ns-1].c == '-') {
		return at
	}
	return ns
}

func hexLike(x unit) bool {
	c := x.c
	return x.wild || '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' || zeroLike(x) || oneLike(x)
}

func base58Like(x unit) bool {
	return x.alnum() && x.c != '0' && x.c != 'O'
}

func zeroLike(x unit) bool { return x.c == '0' || x.c == 'o' || x.c == 'O' }

func oneLike(x unit) bool { return x.c == '1' || x.c == 'l' || x.c == 'I' }

// unmarked is s less its combining marks, when that is printable ASCII;
// "" otherwise.
func unmarked(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.In(r, unicode.Mn, unicode.Me) {
			return -1
		}
		return r
	}, norm.NFD.String(s))
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
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
