package store

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"unicode"
	"unicode/utf8"
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
	for _, id := range []string{"my agent", "café-✓", "代理人", "agent-7", "seller-7", victim, "eip155:8453:" + victim, "Ωμέγα 2", strings.Repeat("é", MaxAgentIDChars),
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
		strings.Repeat("\U0001d7ce", 42),                              // mathematical digit zeros
		"7EcDhSYGxXyscszYEp35KHN8vvw3svAuLKTzXwCFLtV\u0405",           // a Solana address ending in a Cyrillic Ѕ
		"eip155\ua7898453\ua789" + victim,                             // U+A789 modifier letter colon for ':'
		"eip155\u22368453\u2236" + victim,                             // U+2236 ratio for ':'
		"solana\ua7895eykt4UsFv8P8NJdTREpY1vzqKqZKvdp\ua7897EcDhSYGxXyscszYEp35KHN8vvw3svAuLKTzXwCFLtV",
		lookalikes("0x5290840009852788ae0c7030069857c2e4169ee7"),               // no ASCII at all: monospace digits, Cyrillic х а с е
		"0x1234567890abcdef1234\ufb00567890abcdef123456",                       // ﬀ for ff
		"7xKXtg2CW87d97TXJSDpbD5jBk\u2171TqA83TZRuJosgAsU",                     // ⅱ for ii
		"0x1234567890\u0430bcdef1234\u0323ff567890abcdef123456",                // a combining dot below
		"0x1234567890abcdef1234ff5678\u17e0abcdef123456",                       // Khmer zero
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
