package store

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"math"
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
// reading in lookalike characters neither as an account id nor as a test-
// id (ImitatesAddress, ImitatesTestAgent). It is the one rule of what a bound
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
// (TestAgentPrefix) without being one: some reading of its first
// characters, as ImitatesAddress reads them (testShape), is "test-", one
// of them not ASCII (tеst-agent with a Cyrillic е, test֊agent with an
// Armenian hyphen, a wildcard that may stand for '-'), and more than half
// of the characters read as "test-" are no wildcards, as a name in Chinese
// whose first characters may stand for anything is no test- id. test- ids
// are examples nobody owns, never authenticated nor scored; a wallet that
// bound such a lookalike would hold an owned, authenticated score under a
// name that reads as one.
func ImitatesTestAgent(id string) bool {
	if strings.HasPrefix(id, TestAgentPrefix) || isASCII(id) || tooLongToRead(id) {
		return false
	}
	d, ok := testShape.match(readAs(id), true)
	return ok && d > 0 // one of them is not ASCII, as id does not start with test-
}

// testShape reads a test- id's prefix (see ImitatesTestAgent), and then
// anything: a wildcard may stand for the '-' and the character after it.
var testShape = func() *automaton {
	a := &automaton{}
	s := a.add(true, false)
	a.start = []int32{s}
	for i := 0; i < len(TestAgentPrefix); i++ {
		last := i == len(TestAgentPrefix)-1
		n := a.add(!last, last)
		a.on(s, charsetOf(TestAgentPrefix[i:i+1]), n)
		s = n
	}
	a.on(s, printable, s)
	return a
}()

// ImitatesAddress reports whether id, which is not all ASCII, reads as a
// whole as an account id: a reader takes it for that wallet's account,
// whose owned score it would pass for. An id all in ASCII reads as what it
// is, and one that merely holds an address among other characters
// (代理人-0x<address>) reads as no more than agent-0x<address> does, which
// anyone may bind; so only the whole id's reading matters.
//
// The id is read as readAs has it: an ASCII character as itself, another
// as the ASCII it looks like when NFKC or Unicode's confusables data gives
// it one, as either when the two differ (ſ as s or f, ︰ as ".." or ':'), a
// combining mark on a character as nothing (one with none before it, at
// the start or after a space, is drawn on its own and read as any other
// character), a space, control or format character as none of the
// characters an account id is written in, and any other character as a
// wildcard, since a reader may take it for what it is drawn like and the
// tables do not say what that is (Hangul ㅇ for 0, ㅣ for 1, ᴘ for P,
// Devanagari danda । for the | read as 1, Ethiopic ፡ for ':'). A letter or
// number (a Chinese, Japanese or Korean character, a small capital, a
// Latin or Cyrillic letter no table maps) may stand for any character but
// ':', so that a name with Chinese words between ASCII ones
// (bot代api人0x<address>) reads as no CAIP-10 id; a modifier letter,
// spacing mark, symbol or punctuation mark for any character at all. A
// letter stands for one character, but one drawn as two (a digraph or
// ligature no table maps, ȸ as db, ʤ, Cyrillic ҥ, Armenian և, Hangul jamo
// ㄲ as 77, the syllable 이 as 01) and a number or symbol may stand for two
// (drawnAsTwo).
//
// The id imitates an account id when some reading of its wildcards
// (accountShape), or that reading's part after a CAIP-10 prefix X:Y: (X 3
// to 8 of letters, digits and -, Y 1 to 32 of letters, digits, - and _, as
// verifierd reads account ids), is
//
//   - an EVM address: 0x and 40 hex digits, or the 40 alone (o and O
//     read as 0, l, I and | as 1), or
//   - a Solana address: base58 digits (l, I and | read as 1) as many as
//     the spelling of 32 bytes can have given its k leading 1s, the zero
//     bytes: the other 32-k bytes, whose first is not zero, spell 43 or 44
//     when k is 0 (solanaRest),
//
// and more than half of that part's characters are no wildcards, so that a
// name of that length in Chinese is no address; an imitation needs mostly
// characters that read as the address.
//
// An honest id can read so only when it has no separator, is mostly
// readable as ASCII, and has such a length, each wildcard counted as one
// character or (drawnAsTwo) two, where a Solana address with k
// leading 1s is shorter than 43 (41 or 42 with six) and its leading
// wildcards may be those 1s: a 43- or 44-letter word with an accent
// (Donaudampfschifffahrtsgesellschaftskapitäne) is refused, and so is
// エージェントSolanaTradingAssistantBotVersionTwo (six katakana read as
// six 1s, then 35 letters), while the word with a hyphen in it, or the
// katakana after the letters, binds.
//
// An id longer than MaxAgentIDChars is not read (false): it is never
// bindable (BindableAgentID), and reading takes time with its length,
// which a request's header or body would otherwise choose.
func ImitatesAddress(id string) bool {
	if isASCII(id) || tooLongToRead(id) {
		return false
	}
	d, ok := accountShape.match(readAs(id), false)
	return ok && d > 0
}

// tooLongToRead reports whether id has more characters than an agent id
// may (MaxAgentIDChars), counting no further than that.
func tooLongToRead(id string) bool {
	n := 0
	for range id {
		if n++; n > MaxAgentIDChars {
			return true
		}
	}
	return false
}

// reading is one way a character of an id may read (see ImitatesAddress):
// the ASCII characters it reads as in turn, each a set of those it may be;
// a wildcard, which stands for one character or for two (two) and which
// the rule's "more than half no wildcards" counts once.
type reading struct {
	chars []charset
	wild  bool
	two   bool
}

// selfReadings are the readings of the ASCII characters: each itself.
var selfReadings = func() (t [utf8.RuneSelf][]reading) {
	for b := range t {
		t[b] = []reading{{chars: []charset{charsetOf(string(rune(b)))}}}
	}
	return t
}()

// readAs reads id as ASCII, as a reader does (see ImitatesAddress), one
// list of readings for each of its characters: an ASCII character as
// itself; another as each of its NFKC form and its UTS #39 skeleton, less
// any combining marks, that is ASCII (Cyrillic а, fullwidth ０, 𝟶, ﬀ as
// "ff", ⅱ as "ii", Ẹ as E, ꞉ as ':', ſ as s or f, ︰ as ".." or ':'), as a
// reader may take it for either; a combining mark after a character it
// sits on as nothing, as it takes no place, but one with none (at the
// start, or after a space) as any other character, as it is then drawn
// on its own (the enclosing circle U+20DD as a 0); a space, control or format
// character as nothing an account id holds (no reading); a letter or
// number as a wildcard for any character but ':', and any other character
// as a wildcard for any character, each wildcard for one character or,
// for a letter or number drawnAsTwo, and any other, two; a character whose
// readings are all of two or more characters (ɱ read as rn) as a wildcard
// for one too, as it is drawn as one.
func readAs(id string) [][]reading {
	var out [][]reading
	base := false // a combining mark here sits on the character before it
	for _, r := range id {
		onBase := base
		base = !unicode.In(r, unicode.Z, unicode.Cc, unicode.Cf)
		if r < utf8.RuneSelf {
			out = append(out, selfReadings[r])
			continue
		}
		if onBase && unicode.In(r, unicode.Mn, unicode.Me) {
			continue
		}
		var rs []reading
		single := false // one of its readings is one character
		for _, a := range asciiReadings(r) {
			c := make([]charset, len(a))
			for i := 0; i < len(a); i++ {
				c[i] = charsetOf(a[i : i+1])
			}
			rs = append(rs, reading{chars: c})
			single = single || len(a) == 1
		}
		switch {
		case single:
		case unicode.In(r, unicode.Z, unicode.Cc, unicode.Cf):
		case unicode.In(r, unicode.L, unicode.N) && !unicode.Is(unicode.Lm, r):
			rs = append(rs, reading{chars: []charset{notColon}, wild: true, two: drawnAsTwo(r)})
		default:
			rs = append(rs, reading{chars: []charset{printable}, wild: true, two: r != 'ー'})
		}
		out = append(out, rs)
	}
	return out
}

// drawnAsTwo reports the letters and numbers that, read as wildcards, may
// stand for two characters: a digraph or ligature no table maps (ȸ as db,
// ʤ, Cyrillic ҥ, Armenian և and its ligatures), a Hangul compatibility
// jamo (ㄲ as 77), a Hangul syllable whose first sound is the silent ㅇ,
// drawn as a circle beside its vowel (이 as 01), and a number no table maps
// (the Hangzhou numeral 〢 drawn as ||, read as 11). Any other letter, of
// any script, is one character of its own: a wildcard for one, so that a
// name in Russian or Chinese is not stretched to an address's length.
// Symbols, punctuation and modifier letters may always stand for two, but
// the kana length mark ー, drawn in a square of its own.
func drawnAsTwo(r rune) bool {
	switch {
	case unicode.Is(unicode.N, r),
		0x0238 <= r && r <= 0x0239,                               // ȸ ȹ
		0x02a3 <= r && r <= 0x02ab,                               // ʣ ʤ ʥ ʦ ʧ ʨ ʩ ʪ ʫ
		r == 0x1d6b || r == 0xab63,                               // ᵫ ꭣ
		r == 0x04a4 || r == 0x04a5 || r == 0x04b4 || r == 0x04b5, // Ҥ ҥ Ҵ ҵ
		r == 0x04d4 || r == 0x04d5 || r == 0xa656 || r == 0xa657, // Ӕ ӕ Ꙗ ꙗ
		r == 0x0587 || 0xfb13 <= r && r <= 0xfb17,                // Armenian և and ligatures
		0x3131 <= r && r <= 0x318e:                               // Hangul compatibility jamo
		return true
	case 0xac00 <= r && r <= 0xd7a3: // Hangul syllables
		return (r-0xac00)/588 == 11 // first sound ㅇ
	}
	return false
}

// asciiReadings are the ASCII a character that is not ASCII reads as by
// NFKC and by the confusables data, less combining marks: none, one, or
// two when the tables differ (ſ is s by NFKC and f by UTS #39).
func asciiReadings(r rune) []string {
	var out []string
	for _, f := range []string{norm.NFKC.String(string(r)), confusables.Skeleton(string(r))} {
		if a := unmarked(f); a != "" && (len(out) == 0 || out[0] != a) {
			out = append(out, a)
		}
	}
	return out
}

// charset is a set of ASCII characters, one bit each.
type charset [2]uint64

func charsetOf(s string) (c charset) {
	for i := 0; i < len(s); i++ {
		c[s[i]>>6] |= 1 << (s[i] & 63)
	}
	return c
}

func charsetFunc(f func(byte) bool) (c charset) {
	for b := 0; b < utf8.RuneSelf; b++ {
		if f(byte(b)) {
			c[b>>6] |= 1 << (b & 63)
		}
	}
	return c
}

func (c charset) has(b byte) bool { return b < utf8.RuneSelf && c[b>>6]>>(b&63)&1 != 0 }

func (c charset) meets(o charset) bool { return c[0]&o[0] != 0 || c[1]&o[1] != 0 }

// The characters an account id's parts are read in (see ImitatesAddress).
var (
	printable = charsetFunc(func(b byte) bool { return ' ' < b && b <= '~' })
	notColon  = charsetFunc(func(b byte) bool { return ' ' < b && b <= '~' && b != ':' })
	colon     = charsetOf(":")
	nsChars   = charsetFunc(func(b byte) bool { return isAlnum(b) || b == '-' })
	refChars  = charsetFunc(func(b byte) bool { return isAlnum(b) || b == '-' || b == '_' })
	zeroChars = charsetOf("0oO")
	xChars    = charsetOf("xX")
	oneChars  = charsetOf("1lI|")
	hexChars  = charsetFunc(func(b byte) bool { return isHex(b) || zeroChars.has(b) || oneChars.has(b) })
	b58Chars  = charsetFunc(func(b byte) bool { return base58.IsDigit(b) || oneChars.has(b) })
	b58First  = charsetFunc(func(b byte) bool { return base58.IsDigit(b) && b != '1' })
)

// automaton is a nondeterministic automaton over the ASCII an id reads
// as. The shapes the rule looks for are written once each as one, and
// match runs it over readAs's readings, every character taking every reading
// it may have, so that no reading of an id escapes the rule.
type automaton struct {
	states []state
	start  []int32
}

type state struct {
	next   []transition
	accept bool
	// part marks the states reading the part whose wildcards are counted
	// (an account id's address, after any CAIP-10 prefix).
	part bool
}

type transition struct {
	on charset
	to int32
}

func (a *automaton) add(part, accept bool) int32 {
	a.states = append(a.states, state{part: part, accept: accept})
	return int32(len(a.states) - 1)
}

func (a *automaton) on(from int32, c charset, to int32) {
	a.states[from].next = append(a.states[from].next, transition{c, to})
}

// match reports whether some reading of id's characters is accepted, and
// of those readings the most by which the characters read from part states
// that are no wildcards outnumber the wildcards among them. With prefix, a
// reading of only id's first characters is enough, counted when it
// reaches an accepting state.
func (a *automaton) match(id [][]reading, prefix bool) (best int, ok bool) {
	cur, nxt, mid, mid2 := a.frontier(), a.frontier(), a.frontier(), a.frontier()
	for _, s := range a.start {
		cur.reach(s, 0)
	}
	for _, rs := range id {
		nxt.clear()
		for _, r := range rs {
			if r.wild {
				mid.clear()
				a.step(cur, r.chars[0], -1, mid)
				nxt.merge(mid)
				if r.two { // drawn as two letters, a digraph or ligature
					a.step(mid, r.chars[0], 0, nxt)
				}
				continue
			}
			from := cur
			for i, c := range r.chars {
				into := nxt
				if i < len(r.chars)-1 {
					into = mid
					if from == mid {
						into = mid2
					}
					into.clear()
				}
				a.step(from, c, +1, into)
				from = into
			}
		}
		cur, nxt = nxt, cur
		if prefix {
			best, ok = a.best(cur, best, ok)
		}
	}
	return a.best(cur, best, ok)
}

// frontier is the states a reading of an id's first characters reaches,
// each with the most its count can be there.
type frontier struct {
	on    []int32
	count []int32
}

const unreached = math.MinInt32

func (a *automaton) frontier() *frontier {
	f := &frontier{count: make([]int32, len(a.states))}
	for i := range f.count {
		f.count[i] = unreached
	}
	return f
}

func (f *frontier) reach(s, d int32) {
	if f.count[s] == unreached {
		f.on = append(f.on, s)
	}
	f.count[s] = max(f.count[s], d)
}

func (f *frontier) merge(o *frontier) {
	for _, s := range o.on {
		f.reach(s, o.count[s])
	}
}

func (f *frontier) clear() {
	for _, s := range f.on {
		f.count[s] = unreached
	}
	f.on = f.on[:0]
}

// step adds to into the states one character that may be any of c leads
// to from those of from, adding part to the count of one read in a part
// state.
func (a *automaton) step(from *frontier, c charset, part int32, into *frontier) {
	for _, s := range from.on {
		d := from.count[s]
		if a.states[s].part {
			d += part
		}
		for _, t := range a.states[s].next {
			if t.on.meets(c) {
				into.reach(t.to, d)
			}
		}
	}
}

// best is the greater of best (when ok) and the counts of the accepting
// states of f.
func (a *automaton) best(f *frontier, best int, ok bool) (int, bool) {
	for _, s := range f.on {
		if a.states[s].accept && (!ok || int(f.count[s]) > best) {
			best, ok = int(f.count[s]), true
		}
	}
	return best, ok
}

// accountShape reads an account id (see ImitatesAddress): an optional
// CAIP-10 prefix, then an EVM or a Solana address, the part it counts.
var accountShape = func() *automaton {
	a := &automaton{}
	var ns [9]int32
	var ref [33]int32
	for i := range ns {
		ns[i] = a.add(false, false)
	}
	for j := range ref {
		ref[j] = a.add(false, false)
	}
	addr := a.add(true, false)
	a.start = []int32{ns[0], addr}
	for i := 0; i < 8; i++ {
		a.on(ns[i], nsChars, ns[i+1])
	}
	for i := 3; i <= 8; i++ {
		a.on(ns[i], colon, ref[0])
	}
	for j := 0; j < 32; j++ {
		a.on(ref[j], refChars, ref[j+1])
	}
	for j := 1; j <= 32; j++ {
		a.on(ref[j], colon, addr)
	}

	// EVM: 0x and 40 hex digits, or the 40 alone.
	p := a.add(true, false)
	zero := a.add(true, false)
	a.on(addr, zeroChars, zero)
	a.on(zero, xChars, p)
	b := addr
	for i := 1; i <= 40; i++ {
		np, nb := a.add(true, i == 40), a.add(true, i == 40)
		a.on(p, hexChars, np)
		a.on(b, hexChars, nb)
		p, b = np, nb
	}

	// Solana: k leading 1s, then a digit other than 1 and as many more as
	// the other 32-k bytes' spelling has in all (solanaRest).
	ones := addr
	for k := 0; k <= 32; k++ {
		if k > 0 {
			n := a.add(true, k == 32)
			a.on(ones, oneChars, n)
			ones = n
		}
		if k == 32 {
			break
		}
		lo, hi := solanaRest[32-k][0], solanaRest[32-k][1]
		r := a.add(true, lo <= 1)
		a.on(ones, b58First, r)
		for m := 2; m <= hi; m++ {
			n := a.add(true, lo <= m)
			a.on(r, b58Chars, n)
			r = n
		}
	}
	return a
}()

// solanaRest[n] is the shortest and the longest base58 spelling of n bytes
// whose first is not zero: of 2^(8(n-1)) and of 2^(8n)-1 (43 and 44 for
// 32 bytes; 0 and 0 for none).
var solanaRest = func() (t [33][2]int) {
	for n := 1; n <= 32; n++ {
		least := make([]byte, n)
		least[0] = 1
		t[n] = [2]int{len(base58.Encode(least)), len(base58.Encode(bytes.Repeat([]byte{0xff}, n)))}
	}
	return t
}()

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

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
// U+1D159 MUSICAL SYMBOL NULL NOTEHEAD, U+16FE4 KHITAN SMALL SCRIPT
// FILLER and U+13441 and U+13442, the Egyptian hieroglyphs' full and half
// blanks. The class has no property for them, so they are named here.
func blankRune(r rune) bool {
	return r == '\u2800' || r == '\U0001D159' || r == '\U00016FE4' || r == '\U00013441' || r == '\U00013442'
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
