package store

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/aovhq/aov/internal/base58"
)

func TestOwners(t *testing.T) {
	ctx := context.Background()
	const a, b = "0xAAaaAAaaAAaaAAaaAAaaAAaaAAaaAAaaAAaaAAaa", "0xBBbbBBbbBBbbBBbbBBbbBBbbBBbbBBbbBBbbBBbb"

	t.Run("the first binder owns the id and a later binder gets the owner back", func(t *testing.T) {
		db, _ := openTemp(t, Options{})
		if got, err := db.AgentOwner(ctx, "seller-7"); err != nil || got != "" {
			t.Fatalf("owner of an unbound id = %q, %v; want none", got, err)
		}
		if got, err := db.BindAgent(ctx, "seller-7", a); err != nil || got != a {
			t.Fatalf("first bind = %q, %v; want %s", got, err, a)
		}
		if got, err := db.BindAgent(ctx, "seller-7", b); err != nil || got != a {
			t.Fatalf("second wallet's bind = %q, %v; want the first owner %s", got, err, a)
		}
		if got, err := db.BindAgent(ctx, "seller-7", a); err != nil || got != a {
			t.Fatalf("the owner binding again = %q, %v", got, err)
		}
		if got, err := db.AgentOwner(ctx, "seller-7"); err != nil || got != a {
			t.Fatalf("owner = %q, %v; want %s", got, err, a)
		}
	})

	t.Run("ids that differ in any byte are different ids", func(t *testing.T) {
		db, _ := openTemp(t, Options{})
		if _, err := db.BindAgent(ctx, "seller-7", a); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{"Seller-7", "seller-7 ", "seller-\x007", "seller-"} {
			if got, err := db.AgentOwner(ctx, id); err != nil || got != "" {
				t.Fatalf("owner of %q = %q, %v; want none", id, got, err)
			}
		}
	})

	t.Run("an owner survives closing and reopening the database", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "db")
		db, err := Open(dir, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.BindAgent(ctx, "seller-7", a); err != nil {
			t.Fatal(err)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		db, err = Open(dir, Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if got, err := db.BindAgent(ctx, "seller-7", b); err != nil || got != a {
			t.Fatalf("after reopening, a second wallet's bind = %q, %v; want %s", got, err, a)
		}
	})

	t.Run("of many concurrent first binders exactly one wins and all agree on it", func(t *testing.T) {
		db, _ := openTemp(t, Options{NoSync: true})
		const n = 32
		owners := make([]string, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got, err := db.BindAgent(ctx, "contested", fmt.Sprintf("0x%040x", i+1))
				if err != nil {
					t.Error(err)
				}
				owners[i] = got
			}()
		}
		wg.Wait()
		winner, _ := db.AgentOwner(ctx, "contested")
		wins := 0
		for i, o := range owners {
			if o != winner {
				t.Fatalf("binder %d was told the owner is %q, the store says %q", i, o, winner)
			}
			if o == fmt.Sprintf("0x%040x", i+1) {
				wins++
			}
		}
		if winner == "" || wins != 1 {
			t.Fatalf("%d binders won (owner %q), want exactly 1", wins, winner)
		}
	})

	t.Run("bad arguments are refused and bind nothing", func(t *testing.T) {
		db, _ := openTemp(t, Options{})
		for _, c := range []struct{ desc, agent, wallet string }{
			{"an empty id", "", a},
			{"an id over the key limit", strings.Repeat("x", maxComponent+1), a},
			{"an empty wallet", "seller-7", ""},
			{"a wallet over the limit", "seller-7", strings.Repeat("x", maxOwner+1)},
		} {
			if _, err := db.BindAgent(ctx, c.agent, c.wallet); err == nil {
				t.Fatalf("%s: bound", c.desc)
			}
		}
		if got, _ := db.AgentOwner(ctx, "seller-7"); got != "" {
			t.Fatalf("a refused bind left owner %q", got)
		}
	})

	t.Run("a closed database answers ErrClosed", func(t *testing.T) {
		db, _ := openTemp(t, Options{})
		db.Close()
		if _, err := db.BindAgent(ctx, "seller-7", a); err != ErrClosed {
			t.Fatalf("bind on a closed store: %v", err)
		}
		if _, err := db.AgentOwner(ctx, "seller-7"); err != ErrClosed {
			t.Fatalf("lookup on a closed store: %v", err)
		}
	})
}

// TestAgentOwnersPages: AgentOwners lists every owner once, page after
// page, agent ids of any bytes included; Exists tells a directory that
// holds a store from one that does not, creating nothing.
func TestAgentOwnersPages(t *testing.T) {
	ctx := context.Background()
	db, dir := openTemp(t, Options{})
	want := map[string]string{"nul\x00id": "0xn"}
	for i := range 250 {
		want[fmt.Sprintf("agent-%d", i)] = fmt.Sprintf("0x%d", i)
	}
	want[strings.Repeat("z", 300)] = "0xlong"
	for agent, owner := range want {
		if _, err := db.BindAgent(ctx, agent, owner); err != nil {
			t.Fatal(err)
		}
	}
	got := map[string]string{}
	pages := 0
	for after := ""; ; {
		page, err := db.AgentOwners(ctx, after, 100)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, o := range page {
			if _, ok := got[o.AgentID]; ok {
				t.Fatalf("%q listed twice", o.AgentID)
			}
			got[o.AgentID] = o.Owner
		}
		if len(page) < 100 {
			break
		}
		after = page[len(page)-1].AgentID
	}
	if len(got) != len(want) || pages != 3 {
		t.Fatalf("%d owners in %d pages, want %d in 3", len(got), pages, len(want))
	}
	for agent, owner := range want {
		if got[agent] != owner {
			t.Fatalf("owner of %q listed as %q, want %q", agent, got[agent], owner)
		}
	}
	if ok, err := Exists(dir); !ok || err != nil {
		t.Fatalf("Exists of a store's directory = %v, %v", ok, err)
	}
	none := filepath.Join(t.TempDir(), "none")
	if ok, err := Exists(none); ok || err != nil {
		t.Fatalf("Exists of no directory = %v, %v", ok, err)
	}
}

// IsEVMAddress takes 0x and 40 hex digits in either case, and nothing that
// merely folds onto one: (Before: the bytes 0x10-0x19 folded onto '0'-'9',
// so "0x" and 40 control bytes read as an address no wallet can prove.)
func TestIsEVMAddress(t *testing.T) {
	for _, c := range []struct {
		s    string
		want bool
	}{
		{"0x52908400098527886E0F7030069857D2E4169EE7", true},
		{"0X52908400098527886e0f7030069857d2e4169ee7", true},
		{"0x" + strings.Repeat("\x10", 40), false},
		{"0x" + strings.Repeat("\x19", 40), false},
		{"0x\x1552908400098527886E0F7030069857D2E4169EE"[:42], false},
		{"0x" + strings.Repeat("G", 40), false},
		{"0x" + strings.Repeat("@", 40), false},
		{"0x" + strings.Repeat("`", 40), false},
		{"0x" + strings.Repeat("0", 39), false},
		{"1x" + strings.Repeat("0", 40), false},
	} {
		if got := IsEVMAddress(c.s); got != c.want {
			t.Errorf("IsEVMAddress(%q) = %v, want %v", c.s, got, c.want)
		}
	}
}

// A bound agent id is what people read as the agent's name, so
// BindableAgentID admits only ids that show every character they hold
// (SPEC §9): RFC 8264's FreeformClass, unchanged by the OpaqueString
// profile, and no character that renders blank. Each refused id below
// renders exactly as the victim's address, or as "seller-7", or is another
// spelling of one; ordinary names in any script still bind. (Before: any
// unicode.IsPrint character was admitted, so variation selectors, the
// combining grapheme joiner, Hangul fillers and the blank Braille pattern
// made an id that read as another's.)
func TestBindableAgentID(t *testing.T) {
	victim := "0x52908400098527886E0F7030069857D2E4169EE7"
	for _, id := range []string{"my agent", "café-✓", "代理人", "agent-7", "seller-7", victim, "eip155:8453:" + victim, "Ωμέγα 2", strings.Repeat("ü", MaxAgentIDChars),
		strings.Repeat("代理人", 12),                         // 36 letters of one other script: no address's lookalike
		"sales agent for café orders in the north region", // long, with spaces
		"7EcDhSYGxXyscszYEp35KHN8vvw3svAuLKTzXwCFLtV",     // a Solana address
		"Donaudampfschifffahrtsgesellschaftskapitän",      // ä has no single ASCII lookalike
		"ВерификацияСчетовФактурДляКомпании2024",
		"my-agent:Donaudampfschifffahrtsgesellschaftskapitän",
		"o\u2019reilly-customer-support-assistant", // a typographic apostrophe
		"acme-invoice-processing-agent\u2013production",
		"latency-\u03bcs-benchmark-agent-for-acme-corp",
		"\u0441\u043e\u0440\u043e\u043a-\u043f\u0435\u0440\u0435\u0432\u043e\u0437\u0447\u0438\u043a-invoice-agent-2024",
	} {
		if !BindableAgentID(id) {
			t.Errorf("BindableAgentID(%q) = false, want true", id)
		}
	}
	for _, id := range []string{
		"",
		strings.Repeat("a", MaxAgentIDChars+1),
		"seller-\xff7",
		"seller-\x007",
		victim + "\u200b",     // zero-width space (format)
		"\ufeff" + victim,     // byte-order mark
		"\u202e" + victim,     // right-to-left override
		"seller\u00a07",       // no-break space, which the profile maps to a space
		"seller\u30007",       // ideographic space, likewise
		"seller\ue0007",       // private use
		victim + "\ufe0f",     // variation selector-16
		victim + "\U000e0101", // variation selector-18
		victim + "\u034f",     // combining grapheme joiner
		victim + "\u3164",     // Hangul filler
		victim + "\u115f",     // Hangul choseong filler
		victim + "\u1160",     // Hangul jungseong filler
		victim + "\uffa0",     // halfwidth Hangul filler
		victim + "\u2800",     // Braille pattern blank
		victim + "\U0001d159", // musical symbol null notehead
		victim + "\U00016fe4", // Khitan small script filler
		"cafe\u0301-✓",        // café-✓ decomposed (not NFC): another spelling of a bindable id
		"seller-7\u0378",      // unassigned
		"0x52908400098527886\u04150F7030069857D2E4169EE7",             // a Cyrillic Е in an address
		"eip155:8453:0x52908400098527886\u04150F7030069857D2E4169EE7", // and in a CAIP-10 id
		"0\u04455290840009852788\u0415E0F7030069857D2E4169EE7",        // a Cyrillic х
		"\uff10\uff58" + strings.Repeat("\uff15", 40),                 // fullwidth 0x555…
		strings.Repeat("\U0001d7ce", 40),                              // mathematical digit zeros: 40 hex digits
		"7EcDhSYGxXyscszYEp35KHN8vvw3svAuLKTzXwCFLtV\u0405",           // a Solana address ending in a Cyrillic Ѕ
		"eip155\ua7898453\ua789" + victim,                             // U+A789 modifier letter colon for ':'
		"eip155\u22368453\u2236" + victim,                             // U+2236 ratio for ':'
		"solana\ua7895eykt4UsFv8P8NJdTREpY1vzqKqZKvdp\ua7897EcDhSYGxXyscszYEp35KHN8vvw3svAuLKTzXwCFLtV",
		lookalikes("0x5290840009852788ae0c7030069857c2e4169ee7"),               // no ASCII at all: monospace digits, Cyrillic х а с е
		"0x1234567890abcdef1234\ufb00567890abcdef123456",                       // ﬀ for ff
		"7xKXtg2CW87d97TXJSDpbD5jBk\u2171TqA83TZRuJosgAsU",                     // ⅱ for ii
		"0x1234567890\u0430bcdef1234\u0323ff567890abcdef123456",                // a combining dot below
		"0x1234567890abcdef1234ff56789\u17e0abcdef123456",                      // Khmer zero
		"eip155\u13618453\u13610x52908400098527886E0F7030069857D2E4169EE7",     // Ethiopic wordspace for ':'
		"eip155\u0f148453\u0f140x52908400098527886E0F7030069857D2E4169EE7",     // Tibetan gter tsheg for ':'
		"eip155\ua7898453\ua7890x1234567890abcdef1234\ufb00567890abcdef123456", // both
	} {
		if BindableAgentID(id) {
			t.Errorf("BindableAgentID(%q) = true, want false", id)
		}
	}
}

// The rule only ever narrowed: no character it admits is one
// unicode.IsPrint refuses (a control, format, private-use, unassigned or
// non-ASCII space character), so no id refused before is bindable now.
func TestBindableAgentIDAdmitsOnlyPrintable(t *testing.T) {
	for r := rune(0); r <= unicode.MaxRune; r++ {
		if utf8.ValidRune(r) && !unicode.IsPrint(r) && BindableAgentID("a"+string(r)) {
			t.Errorf("BindableAgentID admits %U, which is not printable", r)
		}
	}
}

// lookalikes writes a lowercase EVM address in no ASCII character:
// mathematical monospace digits and Cyrillic х, а, с, е.
func lookalikes(addr string) string {
	cyr := map[rune]rune{'x': 'х', 'a': 'а', 'c': 'с', 'e': 'е'}
	var b strings.Builder
	for _, r := range addr {
		if '0' <= r && r <= '9' {
			b.WriteRune(0x1D7F6 + r - '0')
		} else {
			b.WriteRune(cyr[r])
		}
	}
	return b.String()
}

// solanaLookalike writes a Solana address as an attacker copies it: its
// first letter that has a Cyrillic twin the confusables data maps back to
// it in Cyrillic, and every 1 as Ӏ (U+04C0 Cyrillic palochka, whose
// skeleton is l).
func solanaLookalike(addr string) string {
	twin := map[rune]rune{'a': 'а', 'e': 'е', 'o': 'о', 'p': 'р', 'c': 'с', 'x': 'х', 'y': 'у',
		'A': 'А', 'B': 'В', 'E': 'Е', 'K': 'К', 'M': 'М', 'H': 'Н', 'P': 'Р', 'C': 'С', 'T': 'Т', 'X': 'Х'}
	var b strings.Builder
	done := false
	for _, r := range addr {
		switch c, ok := twin[r]; {
		case r == '1':
			b.WriteRune('\u04c0')
		case ok && !done:
			b.WriteRune(c)
			done = true
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// A Solana wallet's address in lookalikes is refused whether or not its
// base58 holds a digit: about one random account in 1,700 has none, and
// the skeletons of 0 and 1 are the letters O and l, so a 1 written as a
// palochka is no digit either. Neither is a shorter address, whose
// leading 1s spell zero bytes. (Before: a run counted as an address only
// with a digit in it, so all of these bound.)
func TestImitatesAddressSolanaWithoutDigits(t *testing.T) {
	short := base58.Encode(append(make([]byte, 5), bytes.Repeat([]byte{0x9d, 0x31, 0xc4}, 9)...))
	if !IsSolanaAddress(short) || len(short) >= 43 || !strings.HasPrefix(short, "11111") {
		t.Fatalf("%s is no Solana address of 32 to 42 characters", short)
	}
	for _, c := range []struct {
		victim, why string
		wallet      bool
	}{
		{"GbYbVXrgsSRzBaoBZiJjLxkUaJawVYAGCWvqRmgQGnkP", "no digit", true},
		{"EuLSdYXAGAAtKBf1TXssA1XpGSNKWxucNEfcXddxJuxS", "1 its only digit", true},
		{short, "32 to 42 characters, starting with 1s", false},
	} {
		if _, ok := SolanaWalletKey(c.victim); c.wallet && !ok {
			t.Fatalf("%s is no Solana wallet address", c.victim)
		}
		id := solanaLookalike(c.victim)
		if id == c.victim || c.wallet && strings.ContainsAny(id, "0123456789") {
			t.Fatalf("lookalike %q of %s has a digit, or is the address", id, c.victim)
		}
		if !ImitatesAddress(id) || BindableAgentID(id) {
			t.Errorf("%s: %q (reads as %s): ImitatesAddress %v, BindableAgentID %v; want true, false",
				c.why, id, c.victim, ImitatesAddress(id), BindableAgentID(id))
		}
	}
}

// A letter or digit neither NFKC nor the confusables data maps to ASCII
// is read as one of unknown reading, not as the end of a run: the data is
// Unicode 13's and keeps x-height forms apart (Cyrillic ь and ƅ for b,
// small capital ᴇ for e), and letters added since are in no table (U+A7C8
// ꟈ, d with a stroke, whose older twin đ reads as d; U+A7FE ꟾ, a long I).
// Such letters only stand in among ASCII: a name made mostly of them, or
// of Chinese ideographs, which read so too, reads as no address. (Before:
// each of these ended the run, so two runs under 32 were left and the
// lookalike bound.)
func TestImitatesAddressReadsThroughUnmappedLetters(t *testing.T) {
	victim := "0x5290840009852788be0f7030069857d2e4169ee7"
	for _, id := range []string{
		strings.Replace(victim, "b", "\u044c", 1),
		strings.Replace(victim, "b", "\u0185", 1),
		strings.Replace(victim, "be", "b\u1d07", 1),
		strings.Replace(victim, "d", "\ua7c8", 1),
		strings.Replace(victim, "d", "\u0111", 1),
		strings.Replace(victim, "1", "\ua7fe", 1),
		strings.Replace(victim[2:], "b", "\u044c", 1),                                     // without 0x
		strings.Replace("GbYbVXrgsSRzBaoBZiJjLxkUaJawVYAGCWvqRmgQGnkP", "b", "\u044c", 1), // a Solana address
	} {
		if !ImitatesAddress(id) || BindableAgentID(id) {
			t.Errorf("%q: ImitatesAddress %v, BindableAgentID %v; want true, false", id, ImitatesAddress(id), BindableAgentID(id))
		}
	}
	for _, id := range []string{
		strings.Repeat("代理人", 15),
		strings.Repeat("代理人", 5) + "7f3a",
		"\u0432\u0435\u0440\u0438\u0444\u0438\u043a\u0430\u0442\u043e\u0440-" + strings.Repeat("\u0434\u0436", 25),
	} {
		if ImitatesAddress(id) || !BindableAgentID(id) {
			t.Errorf("%q: ImitatesAddress %v, BindableAgentID %v; want false, true", id, ImitatesAddress(id), BindableAgentID(id))
		}
	}
}

// An id with a character that is not ASCII binds like its ASCII twin when
// it does not read as an address as a whole: an address or a hash beside
// another word reads as what it is, as agent-0x<address> does, and so do
// names in other scripts with a year. (Before: any id not all ASCII with a
// run of 32 letters and digits and a digit among them was refused as "an
// address in lookalike characters", a git SHA-1 or a dashless UUID after
// café too.)
func TestBindableAgentIDHonestIdsWithASCIIRuns(t *testing.T) {
	for _, c := range []struct{ id, ascii string }{
		{"café-build-3f9a1c2e4b5d6f708192a3b4c5d6e7f8a9b0c1d2", "cafe-build-3f9a1c2e4b5d6f708192a3b4c5d6e7f8a9b0c1d2"},
		{"Müller-agent-550e8400e29b41d4a716446655440000", "Muller-agent-550e8400e29b41d4a716446655440000"},
		{"🤖 CustomerSupportAgentProductionV2", "bot CustomerSupportAgentProductionV2"},
		{"代理人-0x9858EfFD232B4033E47d90003D41EC34EcaEda94", "agent-0x9858EfFD232B4033E47d90003D41EC34EcaEda94"},
		{"代理人0x9858EfFD232B4033E47d90003D41EC34EcaEda94", "agent0x9858EfFD232B4033E47d90003D41EC34EcaEda94"},
		{"代理人3f9a1c2e4b5d6f708192a3b4c5d6e7f8a9b0c1d2", "agent3f9a1c2e4b5d6f708192a3b4c5d6e7f8a9b0c1d2"},
		{"bot代api人0x9858EfFD232B4033E47d90003D41EC34EcaEda94", "bot-api-0x9858EfFD232B4033E47d90003D41EC34EcaEda94"},
		{"Rechnungsprüfungsassistenzsystem2024", "Rechnungspruefungsassistenzsystem2024"},
		{"Donaudampfschifffahrtsgesellschaftskapitän", "Donaudampfschifffahrtsgesellschaftskapitaen"},
		{"Donaudampfschifffahrts-gesellschaftskapitäne", "Donaudampfschifffahrts-gesellschaftskapitaene"},
		{"ΠράκτοραςΤιμολογίωνΚαιΛογιστηρίουΕταιρείας2024", "PraktorasTimologionKaiLogistiriouEtaireias2024"},
		{"АгентПоПроверкеСчетовФактурИПлатежей2024", "AgentPoProverkeSchetovFakturIPlatezhei2024"},
		{"发票核对代理人二零二四年第一版本用于财务部门与审计部门的日常核对工作及其他事项2024", "fapiao-hedui-dailiren-2024"},
		{"代理人2024", "agent2024"},
		{"agent-7EcDhSYGxXyscszYEp35KHN8vvw3svAuLKTzXwCFLtV-über", "agent-7EcDhSYGxXyscszYEp35KHN8vvw3svAuLKTzXwCFLtV-uber"},
	} {
		if !BindableAgentID(c.ascii) {
			t.Fatalf("control %q is not bindable", c.ascii)
		}
		if ImitatesAddress(c.id) || !BindableAgentID(c.id) {
			t.Errorf("%q: ImitatesAddress %v, BindableAgentID %v; want false, true like %q",
				c.id, ImitatesAddress(c.id), BindableAgentID(c.id), c.ascii)
		}
	}
}

// ImitatesAddress never panics; an id all in ASCII never imitates an
// address, as it reads as what it is; and an id whose reading is not an
// address's shape (one with a space before or after it) never does
// either, whatever address it holds.
func FuzzImitatesAddress(f *testing.F) {
	for _, id := range []string{
		"0x52908400098527886\u04150F7030069857D2E4169EE7",
		"GbYbV\u0425rgsSRzBaoBZiJjLxkUaJawVYAGCWvqRmgQGnkP",
		"eip155\u13618453\u13610x52908400098527886E0F7030069857D2E4169EE7",
		"代理人-0x9858EfFD232B4033E47d90003D41EC34EcaEda94",
		"0x52908400098527886E0F7030069857D2E4169EE7",
		"0x529\u31478400098527886E0F7030069857D2E4169EE7",
		"eip155\ua7898453\ua789\u3147x52908400098527886E0F7030069857D2E4169EE7",
		"5eykt4UsFv8\u1d188\u0274\u1d0ad\u1d1b\u0280\u1d07pY1vzqKqZKvdpKuc147dw2N9d",
		"0x52908400098527886E0F7030069857D2E4\u096469EE7",
		"eip155\u13618453\u13610x52908400098527886E0F7030069857D2E4\u0f0d69EE7",
		"0x27b1f\u023804752bbc536007a920d24acb045561c26",
		"7EcDhSYGxXyscszYEp35KHN8\u0587w3svAuLKTzXwCFLtV",
		"test\u058aagent", "test\u05beagent", "test\u1806agent",
		"0x\u017fB6916095ca1d\u017f60bB79Ce92cE3Ea74c37c5d359",
		"eip155\ufe308453\ufe300xfB6916095ca1df60bB79Ce92cE3Ea74c37c5d359",
		"\u20dd\u0301x52908400098527886E0F7030069857D2E4169EE7", "a \u20dd",
		"\u30a8\u30fc\u30b8\u30a7\u30f3\u30c8SolanaTradingAssistantBotVersionTwo",
		"cafe\u0301", "\u0301", "\xff", "",
	} {
		f.Add(id)
	}
	f.Fuzz(func(t *testing.T, id string) {
		if ImitatesAddress(id) && isASCII(id) {
			t.Errorf("ImitatesAddress(%q) = true for an id all in ASCII", id)
		}
		for _, id := range []string{id + " ", " " + id} {
			if ImitatesAddress(id) {
				t.Errorf("ImitatesAddress(%q) = true for an id that reads as no address", id)
			}
		}
	})
}

// An id that reads as a reserved test- id without being one (Cyrillic е,
// a fullwidth hyphen) is not bindable: test- ids are examples nobody owns,
// and its binder would hold an owned, authenticated score under a name
// that reads as one. Ids that merely contain test, or start with Test-,
// still bind. (Before: tеst-agent with a Cyrillic е bound.)
func TestBindableAgentIDRefusesTestPrefixLookalike(t *testing.T) {
	for _, id := range []string{"t\u0435st-agent", "test\uff0dagent", "\uff54\uff45\uff53\uff54-agent", "t\u0435st-\u4ee3\u7406"} {
		if !ImitatesTestAgent(id) || BindableAgentID(id) {
			t.Errorf("%q: ImitatesTestAgent %v, BindableAgentID %v; want true, false", id, ImitatesTestAgent(id), BindableAgentID(id))
		}
	}
	for _, id := range []string{"test-agent", "Test-agent", "my-t\u0435st-agent", "t\u0435sting-agent", "test-代理"} {
		if ImitatesTestAgent(id) {
			t.Errorf("ImitatesTestAgent(%q) = true, want false", id)
		}
	}
	for _, id := range []string{"Test-agent", "my-t\u0435st-agent", "t\u0435sting-agent", "test-代理"} {
		if !BindableAgentID(id) {
			t.Errorf("BindableAgentID(%q) = false, want true", id)
		}
	}
}

// A Korean or Chinese character drawn like an ASCII digit (Hangul ieung ㅇ,
// a circle, for 0; Hangul i ㅣ, Han 丨 or Hangzhou numeral 〡, a vertical
// stroke, for 1) stands in an address as a reader sees it, so an id that
// reads as an address with one of them in it is refused, as one with a
// fullwidth zero or a palochka is. (Before: these characters ended the row
// of digits, the address was split below its length, and the lookalike
// bound.)
func TestImitatesAddressReadsCJKLookalikes(t *testing.T) {
	const evm = "0x52908400098527886E0F7030069857D2E4169EE7"
	const sol = "EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v" // a Solana account (the USDC mint)
	for _, id := range []string{
		strings.Replace(evm, "5290", "529\uff10", 1), // fullwidth zero
		strings.Replace(sol, "qN1x", "qN\u04c0x", 1), // palochka for 1
		strings.Replace(evm, "5290", "529\u3147", 1), // Hangul ieung for 0
		strings.Replace(evm, "4169", "4\u316369", 1), // Hangul i for 1
		strings.Replace(evm, "4169", "4\u4e2869", 1), // Han 丨 for 1
		strings.Replace(evm, "4169", "4\u302169", 1), // Hangzhou numeral one for 1
		"eip155:8453:" + strings.Replace(evm, "5290", "529\u3147", 1),
		strings.Replace(sol, "qN1x", "qN\u3163x", 1), // Hangul i for 1
	} {
		if !ImitatesAddress(id) || BindableAgentID(id) {
			t.Errorf("%q: ImitatesAddress %v, BindableAgentID %v; want true, false", id, ImitatesAddress(id), BindableAgentID(id))
		}
	}
}

// A Solana address with its capitals written as small capitals that no
// table maps (ᴀ ʙ ᴅ ᴇ ɢ ʜ ᴊ ᴋ ʟ ᴍ ɴ ᴘ ʀ ᴛ) reads as that account, and is
// refused like one with a Greek capital for a Latin one. (Before: the
// Solana rule asked for five capitals read as ASCII, which small capitals
// are not, so an address with at most four others bound.)
func TestImitatesAddressSmallCapitalsInSolana(t *testing.T) {
	small := map[rune]string{'A': "ᴀ", 'B': "ʙ", 'D': "ᴅ", 'E': "ᴇ", 'G': "ɢ", 'H': "ʜ", 'J': "ᴊ", 'K': "ᴋ", 'L': "ʟ", 'M': "ᴍ", 'N': "ɴ", 'P': "ᴘ", 'R': "ʀ", 'T': "ᴛ"}
	const addr = "5eykt4UsFv8P8NJdTREpY1vzqKqZKvdpKuc147dw2N9d" // a Solana account
	var b strings.Builder
	left := 0
	for _, r := range addr {
		if s, ok := small[r]; ok {
			b.WriteString(s)
			continue
		}
		if 'A' <= r && r <= 'Z' {
			left++
		}
		b.WriteRune(r)
	}
	id := b.String()
	if !IsSolanaAddress(addr) || left > 4 {
		t.Fatalf("%s: a Solana address %v, %d capitals left as ASCII; want one with at most 4", addr, IsSolanaAddress(addr), left)
	}
	for _, id := range []string{strings.Replace(addr, "Z", "\u0396", 1), id} { // Greek capital zeta for Z; small capitals
		if !ImitatesAddress(id) || BindableAgentID(id) {
			t.Errorf("%q (reads as %s): ImitatesAddress %v, BindableAgentID %v; want true, false", id, addr, ImitatesAddress(id), BindableAgentID(id))
		}
	}
}

// A long CamelCase name with an accented letter binds as its ASCII twin
// does: none of its characters imitates anything, and it is longer than
// any address. (Before: a row of 43 or more base58 letters with five
// capitals and five small letters read as a Solana address, and these were
// refused.)
func TestBindableAgentIDLongCamelCaseWithAccent(t *testing.T) {
	for _, c := range []struct{ id, ascii string }{
		{"MeinSuperÜberAgentFürDieBuchhaltungUndSteuern", "MeinSuperUeberAgentFuerDieBuchhaltungUndSteuern"},
		{"KundenserviceAgentFürRückfragenZuBestellungen", "KundenserviceAgentFuerRueckfragenZuBestellungen"},
		{"AgentDeSupportClientèlePourLesRéclamationsEnLigne", "AgentDeSupportClientelePourLesReclamationsEnLigne"},
	} {
		if !BindableAgentID(c.ascii) {
			t.Fatalf("control %q is not bindable", c.ascii)
		}
		if ImitatesAddress(c.id) || !BindableAgentID(c.id) {
			t.Errorf("%q: ImitatesAddress %v, BindableAgentID %v; want false, true like %q", c.id, ImitatesAddress(c.id), BindableAgentID(c.id), c.ascii)
		}
	}
}

// The one kind of honest id the rule refuses: one of exactly an address's
// length with no separator, mostly readable as ASCII. A 43-letter word
// with an accent reads as a Solana address (43 base58 digits, l read as
// 1), while the word a letter shorter, or with a hyphen, binds (see
// TestBindableAgentIDHonestIdsWithASCIIRuns). (Before: a Solana address
// needed five capitals and five small letters, so this word bound, and so
// did an address whose capitals were small capitals.)
func TestImitatesAddressWordOfAnAddressLength(t *testing.T) {
	const id = "Donaudampfschifffahrtsgesellschaftskapitäne"
	if !ImitatesAddress(id) || BindableAgentID(id) {
		t.Errorf("%q: ImitatesAddress %v, BindableAgentID %v; want true, false", id, ImitatesAddress(id), BindableAgentID(id))
	}
}

// A punctuation mark or symbol with no ASCII reading may stand for any
// character, a digit or letter too, not only for ':': Devanagari danda
// U+0964 and Tibetan shad U+0F0D are bare vertical strokes, drawn as the
// | the rule reads as 1, and Ethiopic wordspace ፡ may still be a colon.
// (Before: such a mark read only as ':', so an address with one of them
// for its 1 had a colon among its hex digits, no address's shape, and
// bound.)
func TestImitatesAddressReadsUnmappedPunctuationAsAnyCharacter(t *testing.T) {
	const evm = "0x52908400098527886E0F7030069857D2E4169EE7"
	const sol = "EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v"
	if !ImitatesAddress(strings.Replace(evm, "1", "\uff5c", 1)) {
		t.Fatal("a fullwidth | for the 1 is not read as 1")
	}
	for _, stroke := range []string{"\u0964", "\u0f0d"} {
		for _, id := range []string{
			strings.Replace(evm, "1", stroke, 1),
			strings.Replace(sol, "1", stroke, 1),
			"eip155\u1361" + "8453\u1361" + strings.Replace(evm, "1", stroke, 1),
		} {
			if !ImitatesAddress(id) || BindableAgentID(id) {
				t.Errorf("%q (its 1 as %U): ImitatesAddress %v, BindableAgentID %v; want true, false", id, []rune(stroke)[0], ImitatesAddress(id), BindableAgentID(id))
			}
		}
	}
}

// A character no table maps may be drawn as two letters, a digraph or a
// ligature (ȸ is "db", ȹ "qp", ʤ ʧ ʨ, Cyrillic ҥ ҵ, Armenian և), so a
// wildcard stands for one character or two: an address with two of its
// letters written as one such character is refused. (Before: a wildcard
// was one character, the reading was one short of the address, and the id
// bound.)
func TestImitatesAddressReadsDigraphsAsTwoLetters(t *testing.T) {
	const evm = "0x27b1fdb04752bbc536007a920d24acb045561c26"
	const sol = "7EcDhSYGxXyscszYEp35KHN8vvw3svAuLKTzXwCFLtV" // 43 long: a Solana address no shorter
	for _, digraph := range []string{"\u0238", "\u0239", "\u02a4", "\u02a7", "\u02a8", "\u04a5", "\u04b5", "\u0587"} {
		for _, id := range []string{
			strings.Replace(evm, "db", digraph, 1),
			strings.Replace(sol, "vv", digraph, 1),
			"eip155:8453:" + strings.Replace(evm, "db", digraph, 1),
		} {
			if !ImitatesAddress(id) || BindableAgentID(id) {
				t.Errorf("%q (two letters as %U): ImitatesAddress %v, BindableAgentID %v; want true, false", id, []rune(digraph)[0], ImitatesAddress(id), BindableAgentID(id))
			}
		}
	}
}

// ImitatesTestAgent reads the id as ImitatesAddress does, each wildcard
// for any character or two: a hyphen no table maps (Armenian hyphen
// U+058A, Hebrew maqaf U+05BE, Mongolian todo soft hyphen U+1806, Hangul
// ㅡ) is read as the '-' it is drawn as, and a ligature as two letters.
// Ids that merely begin with test, or hold it later, still bind. (Before:
// an unmapped character was no '-', so test֊agent bound.)
func TestImitatesTestAgentReadsWildcards(t *testing.T) {
	for _, id := range []string{"test\u058aagent", "test\u05beagent", "test\u1806agent", "test\u3161agent", "tes\u02a7-agent", "test\u058a"} {
		if !ImitatesTestAgent(id) || BindableAgentID(id) {
			t.Errorf("%q (reads as test-agent): ImitatesTestAgent %v, BindableAgentID %v; want true, false", id, ImitatesTestAgent(id), BindableAgentID(id))
		}
	}
	for _, id := range []string{"testing\u058aagent", "my-test\u058aagent", "test agent \u4ee3\u7406", "tes\u00e9-agent"} {
		if ImitatesTestAgent(id) || !BindableAgentID(id) {
			t.Errorf("%q: ImitatesTestAgent %v, BindableAgentID %v; want false, true", id, ImitatesTestAgent(id), BindableAgentID(id))
		}
	}
}

// A character that NFKC and the confusables data read differently may be
// taken for either: ſ (long s) and ẛ are drawn as an f without the right
// half of its bar, NFKC's s but UTS #39's f; ︰ (vertical two dot leader)
// is drawn as a colon, NFKC's ".." but UTS #39's ':'. An address with ſ
// for its f digits, or an account id with ︰ for its colons, is refused.
// (Before: NFKC's reading was the only one a character had when it had
// one, so these read as 0x…s… and eip155..8453..0x…, and bound.)
func TestImitatesAddressTakesEveryTablesReading(t *testing.T) {
	const evm = "0xfB6916095ca1df60bB79Ce92cE3Ea74c37c5d359"
	for _, id := range []string{
		strings.ReplaceAll(evm, "f", "\u017f"),
		strings.Replace(evm, "f", "\u1e9b", 1),
		"eip155\ufe308453\ufe30" + evm,
	} {
		if !ImitatesAddress(id) || BindableAgentID(id) {
			t.Errorf("%q: ImitatesAddress %v, BindableAgentID %v; want true, false", id, ImitatesAddress(id), BindableAgentID(id))
		}
	}
}

// A combining mark with no character before it to sit on, at the start of
// the id or after a space, is drawn on its own: the enclosing circle U+20DD
// is a circle, the 0 of 0x. Such a mark is read as a wildcard, and one
// after a character as nothing, as before. (Before: every combining mark
// read as nothing, so ⃝x<address> read as x<address> and bound.)
func TestImitatesAddressReadsLeadingMarkAsWildcard(t *testing.T) {
	const evm = "0x52908400098527886E0F7030069857D2E4169EE7"
	for _, id := range []string{
		"\u20dd" + evm[1:],
		"\u20dd\u0301" + evm[1:],
	} {
		if !ImitatesAddress(id) || BindableAgentID(id) {
			t.Errorf("%q: ImitatesAddress %v, BindableAgentID %v; want true, false", id, ImitatesAddress(id), BindableAgentID(id))
		}
	}
	for _, id := range []string{"caf\u00e9\u20dd", "\u20dd agent", "my \u20dd agent"} {
		if ImitatesAddress(id) || !BindableAgentID(id) {
			t.Errorf("%q: ImitatesAddress %v, BindableAgentID %v; want false, true", id, ImitatesAddress(id), BindableAgentID(id))
		}
	}
}

// A letter no table maps (a Han ideograph, a kana, a Hangul syllable, a
// Cyrillic letter) is drawn as one character of its own script, so it
// stands for one character only (and so does the kana length mark ー, a
// modifier letter): a Chinese, Japanese, Korean or Russian word beside a
// CamelCase name of 41 characters, no address's length, binds. Hangul
// jamo (ㄲ, two ㄱ, is drawn as 77), a syllable that begins with the
// silent ㅇ (이, a circle and a stroke, is drawn as 01), a Hangzhou numeral
// (〢 is drawn as ||, 11) and the digraphs of
// TestImitatesAddressReadsDigraphsAsTwoLetters still stand for two.
// (Before: every wildcard stood for one character or two, so three to six
// of them stretched 35 to 38 letters to a Solana address's 43, and these
// were refused.)
func TestBindableAgentIDIdeographsAndKanaAreOneCharacter(t *testing.T) {
	for _, id := range []string{
		"代理人SolanaTradingAssistantBotVersionTwoNew",
		"SolanaTradingAssistantBotVersionTwoNew代理人",
		"SolanaTradingAssistantBotVersionTwoエージェント",
		"SolanaTradingAssistantBotVersionTwoNew관리자",
		"ПомощникБухгалтераДляМалогоБизнесаВерсия3",
		"АссистентПоПродажамИнтернетМагазинаV2xxxx",
		"SolanaTradingAssistantBotVersionTwoNeスーパー", // the kana length mark ー too
	} {
		if n := utf8.RuneCountInString(id); n != 41 {
			t.Fatalf("%q has %d characters, want 41", id, n)
		}
		if ImitatesAddress(id) || !BindableAgentID(id) {
			t.Errorf("%q: ImitatesAddress %v, BindableAgentID %v; want false, true", id, ImitatesAddress(id), BindableAgentID(id))
		}
	}
	const evm = "0x7d2a3c77e0b9f1a4c58e6d30b2f9a11c4e8d5b01"
	for _, c := range [][2]string{{"77", "\u3132"}, {"01", "\uc774"}, {"11", "\u3022"}} {
		if id := strings.Replace(evm, c[0], c[1], 1); id == evm || !ImitatesAddress(id) || BindableAgentID(id) {
			t.Errorf("%q (%s as %s): ImitatesAddress %v, BindableAgentID %v; want true, false", id, c[0], c[1], ImitatesAddress(id), BindableAgentID(id))
		}
	}
}

// The other honest ids the rule refuses: a Solana address with k leading
// 1s (k zero bytes) is shorter than 43, 41 or 42 characters with 6 of
// them, and a wildcard may be a 1 (丨 is drawn as one), so a name of 41
// characters whose first six are katakana reads as such an address, 35
// letters and digits after six 1s.
func TestImitatesAddressLeadingWildcardsAsSolanaOnes(t *testing.T) {
	if lo, hi := 6+solanaRest[26][0], 6+solanaRest[26][1]; lo > 41 || hi < 41 {
		t.Fatalf("a Solana address with six leading 1s has %d to %d characters, not 41", lo, hi)
	}
	const id = "エージェントSolanaTradingAssistantBotVersionTwo"
	if !ImitatesAddress(id) || BindableAgentID(id) {
		t.Errorf("%q: ImitatesAddress %v, BindableAgentID %v; want true, false", id, ImitatesAddress(id), BindableAgentID(id))
	}
}

// BenchmarkImitatesAddress reads the ids walletauth and verifierd read on
// every proof and binding: a plain name, a lookalike address, the worst
// id of the longest length (every character a wildcard with two readings)
// and an id past that length, which is not read.
func BenchmarkImitatesAddress(b *testing.B) {
	for _, c := range []struct{ name, id string }{
		{"name", "seller-7 façade"},
		{"lookalike", "0x52908400098527886Е0F7030069857D2E4169EE7"},
		{"longest", strings.Repeat("ḿ", MaxAgentIDChars)},
		{"too_long", strings.Repeat("ḿ", 40*MaxAgentIDChars)},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				ImitatesAddress(c.id)
				ImitatesTestAgent(c.id)
			}
		})
	}
}

// The Egyptian hieroglyphs' full and half blanks (U+13441, U+13442, letters
// the FreeformClass admits) are drawn as empty space: before or after an
// address they make it read as no account id, so they are refused as the
// other blanks are. A character whose only reading has two letters but
// that is drawn as one (ɱ, m with a hook, which the confusables data reads
// as rn; ᵯ; ₥) may stand for one letter too. (Before: both bound in the
// place of a real address's characters.)
func TestBlanksAndOneLetterDrawnAsTwoRefused(t *testing.T) {
	const uni = "0x1f9840a85d5aF5bf1D1762F925BDADdC4201F984"
	const serum = "9xQeWvG816bUx9EPjHmaT23yvVM2ZWbrrpZb9PusVFin"
	ids := []string{uni + "\U00013441", "\U00013442" + uni, "eip155:8453:" + uni + "\U00013441", "\U00013441test-agent"}
	for _, r := range []string{"\u0271", "\u1d6f", "\u20a5"} {
		ids = append(ids, strings.Replace(serum, "m", r, 1))
	}
	for _, id := range ids {
		if BindableAgentID(id) {
			t.Errorf("BindableAgentID(%q) = true; it reads as an account id or a test- id", id)
		}
	}
}
