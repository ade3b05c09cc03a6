package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/store"
)

// proves are the gateway's headers for a caller who proved wallet w with a
// proof naming agent (none when agent is "").
func proves(w, agent string) map[string]string {
	h := map[string]string{"X-Aov-Gateway-Token": gatewayToken, "X-Aov-Payment": "paid", "X-Aov-Wallet": w}
	if agent != "" {
		h["X-Aov-Wallet-Agent"] = agent
	}
	return h
}

// throwaway is the i-th address of an attacker's fresh wallets.
func throwaway(i int) string { return fmt.Sprintf("0x%040x", 0xbad000+i) }

// verifyCall sends the SPEC §10 invoice (total "129.5" passes, "135.0"
// fails) for agent with hdr and returns the answer.
func (f *fixture) verifyCall(agent, total string, hdr map[string]string) (int, map[string]any) {
	body := bytes.Replace(invoice(total, ""), []byte(`"seller-7"`), []byte(strconv.Quote(agent)), 1)
	w := f.do(http.MethodPost, "/verify/schema", body, hdr)
	var m map[string]any
	json.Unmarshal(w.Body.Bytes(), &m)
	return w.Code, m
}

func TestAgentOwnership(t *testing.T) {
	ctx := context.Background()
	const other = "0x3333333333333333333333333333333333333333"
	for _, c := range []struct {
		desc string
		// before are calls made first (agent, headers), all answered 200.
		before []map[string]string
		agent  string
		hdr    map[string]string
		// status is the answer; authn the recorded flag when 200.
		status int
		authn  bool
		// owner is the recorded owner afterwards of the id the proof
		// named (else of the body's): "" for none, as for account ids.
		owner string
	}{
		{desc: "the first wallet to name an id binds it and is authenticated",
			agent: "seller-7", hdr: proves(wallet, "seller-7"), status: 200, authn: true, owner: wallet},
		{desc: "the owner stays authenticated on later calls",
			before: []map[string]string{proves(wallet, "seller-7")},
			agent:  "seller-7", hdr: proves(wallet, "seller-7"), status: 200, authn: true, owner: wallet},
		{desc: "the owner's address in another letter case is the owner",
			before: []map[string]string{proves(wallet, "seller-7")},
			agent:  "seller-7", hdr: proves(strings.ToUpper(wallet[:2])+wallet[2:], "seller-7"), status: 200, authn: true, owner: wallet},
		{desc: "another wallet's proof for an owned id is refused with 403",
			before: []map[string]string{proves(wallet, "seller-7")},
			agent:  "seller-7", hdr: proves(other, "seller-7"), status: 403, owner: wallet},
		{desc: "another wallet's proof naming an owned id is refused whatever the body names",
			before: []map[string]string{proves(wallet, "seller-7")},
			agent:  "seller-8", hdr: proves(other, "seller-7"), status: 403, owner: wallet},
		{desc: "another wallet without a bind is recorded, unauthenticated",
			before: []map[string]string{proves(wallet, "seller-7")},
			agent:  "seller-7", hdr: proves(other, ""), status: 200, authn: false, owner: wallet},
		{desc: "a proof naming one id does not authenticate another in the body",
			agent: "seller-8", hdr: proves(wallet, "seller-7"), status: 200, authn: false, owner: wallet},
		{desc: "a proof naming another address's account id is refused",
			agent: "eip155:8453:" + other, hdr: proves(wallet, "eip155:8453:"+other), status: 403},
		// A namespace in another letter case names the same account.
		// (Before: EIP155:8453:0x… and SOLANA:… were ordinary names, and
		// the first wallet to name one owned it.)
		{desc: "a proof naming another address's account id with its namespace in capitals is refused",
			agent: "EIP155:8453:" + other, hdr: proves(wallet, "EIP155:8453:"+other), status: 403},
		{desc: "a proof naming another address's account id with its namespace in mixed case is refused",
			agent: "Eip155:8453:" + other, hdr: proves(wallet, "Eip155:8453:"+other), status: 403},
		{desc: "a proof naming another Solana address's account id with its namespace in capitals is refused",
			agent: "SOLANA:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp:7xKXtg2CW87d97TXJSDpbD5jBkheTqA83TZRuJosgAsU",
			hdr:   proves(wallet, "SOLANA:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp:7xKXtg2CW87d97TXJSDpbD5jBkheTqA83TZRuJosgAsU"), status: 403},
		{desc: "the wallet's own account id with its namespace in capitals is authenticated without a bind",
			agent: "EIP155:1:" + wallet, hdr: proves(wallet, ""), status: 200, authn: true},
		// Only eip155 and solana fold case: an id of another namespace
		// with a capital is an ordinary name, as it always was, so an
		// owner bound to one before stays its owner.
		{desc: "an id of another namespace with a capital ending in an address is an ordinary name, bound by its first wallet",
			agent: "Team:billing:" + other, hdr: proves(wallet, "Team:billing:"+other), status: 200, authn: true, owner: wallet},
		{desc: "and its first wallet stays its owner",
			before: []map[string]string{proves(wallet, "Team:billing:"+other)},
			agent:  "Team:billing:" + other, hdr: proves(wallet, "Team:billing:"+other), status: 200, authn: true, owner: wallet},
		{desc: "a proof naming another bare address is refused",
			agent: other, hdr: proves(wallet, other), status: 403},
		{desc: "the wallet's own CAIP-10 id on any chain is authenticated without a bind",
			agent: "eip155:1:" + wallet, hdr: proves(wallet, ""), status: 200, authn: true},
		{desc: "the wallet's own id named in the proof is authenticated",
			agent: "eip155:8453:" + wallet, hdr: proves(wallet, "eip155:8453:"+wallet), status: 200, authn: true},
		{desc: "a Solana CAIP-10 id is its address's, compared exactly",
			agent: "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp:7xKXtg2CW87d97TXJSDpbD5jBkheTqA83TZRuJosgAsU",
			hdr:   proves("7xKXtg2CW87d97TXJSDpbD5jBkheTqA83TZRuJosgAsU", ""), status: 200, authn: true},
		{desc: "a Solana CAIP-10 id is not another letter case's",
			agent: "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp:7xKXtg2CW87d97TXJSDpbD5jBkheTqA83TZRuJosgAsU",
			hdr:   proves("7XKXTG2CW87D97TXJSDPBD5JBKHETQA83TZRUJOSGASU", ""), status: 200, authn: false},
		// A bare Solana address is its account's, as a bare EVM address
		// is. (Before: the first wallet to name it owned it.)
		{desc: "a proof naming a bare Solana address from another wallet is refused",
			agent: "7xKXtg2CW87d97TXJSDpbD5jBkheTqA83TZRuJosgAsU", hdr: proves(wallet, "7xKXtg2CW87d97TXJSDpbD5jBkheTqA83TZRuJosgAsU"), status: 403},
		{desc: "a bare Solana address is its wallet's, authenticated without a bind",
			agent: "7xKXtg2CW87d97TXJSDpbD5jBkheTqA83TZRuJosgAsU", hdr: proves("7xKXtg2CW87d97TXJSDpbD5jBkheTqA83TZRuJosgAsU", ""), status: 200, authn: true},
		{desc: "a base58 name that is not 32 bytes is an ordinary id, bound by its first wallet",
			agent: "SellerSeven", hdr: proves(wallet, "SellerSeven"), status: 200, authn: true, owner: wallet},
		{desc: "an id merely ending in the wallet is an ordinary id, not an account",
			agent: "my-agent:" + wallet, hdr: proves(wallet, ""), status: 200, authn: false},
		{desc: "an eip155 id whose address is not an EVM address is an ordinary id",
			agent: "eip155:8453:" + wallet[:40], hdr: proves(wallet, ""), status: 200, authn: false},
		{desc: "a name shaped like CAIP-10 whose last part is no address is an ordinary id, bound by its first wallet",
			agent: "acme:invoice:v1", hdr: proves(wallet, "acme:invoice:v1"), status: 200, authn: true, owner: wallet},
		{desc: "an id of another namespace ending in an address stays its address's: another wallet cannot take it",
			agent: "team:billing:" + wallet, hdr: proves(other, "team:billing:"+wallet), status: 403},
		{desc: "and its address's own calls under it are authenticated, with nothing recorded",
			agent: "team:billing:" + wallet, hdr: proves(wallet, ""), status: 200, authn: true},
		{desc: "an eip155 id ending in a Solana address is an ordinary id",
			agent: "eip155:1:7xKXtg2CW87d97TXJSDpbD5jBkheTqA83TZRuJosgAsU", hdr: proves(wallet, "eip155:1:7xKXtg2CW87d97TXJSDpbD5jBkheTqA83TZRuJosgAsU"), status: 200, authn: true, owner: wallet},
		{desc: "a solana id whose address is not base58 of 32 bytes is an ordinary id",
			agent: "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp:v1", hdr: proves(wallet, "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp:v1"), status: 200, authn: true, owner: wallet},
		{desc: "test- ids are never bound and never authenticated",
			agent: "test-demo", hdr: proves(wallet, "test-demo"), status: 200, authn: false},
		{desc: "test- ids are never bound: a second wallet may name them too",
			before: []map[string]string{proves(wallet, "test-demo")},
			agent:  "test-demo", hdr: proves(other, "test-demo"), status: 200, authn: false},
		{desc: "without the gateway token a bind header is ignored and binds nothing",
			agent: "seller-7", hdr: map[string]string{"X-Aov-Wallet": wallet, "X-Aov-Wallet-Agent": "seller-7"}, status: 200, authn: false},
	} {
		t.Run(c.desc, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{noSync: true})
			for _, h := range c.before {
				if st, m := f.verifyCall(h["X-Aov-Wallet-Agent"], "129.5", h); st != 200 {
					t.Fatalf("setup call: %d %v", st, m)
				}
			}
			before := len(f.allRecords(t))
			st, m := f.verifyCall(c.agent, "129.5", c.hdr)
			if st != c.status {
				t.Fatalf("status %d, want %d: %v", st, c.status, m)
			}
			if st == 200 {
				rec, err := f.db.Verification(ctx, m["verification_id"].(string))
				if err != nil {
					t.Fatal(err)
				}
				if rec.Authenticated != c.authn {
					t.Fatalf("authenticated %v, want %v", rec.Authenticated, c.authn)
				}
			} else {
				if m["code"] != "forbidden" || m["charged"] != false || m["attestation"] != nil || m["verification_id"] != nil {
					t.Fatalf("refusal %v", m)
				}
				if fl := m["fields"].([]any)[0].(map[string]any); fl["field"] != "X-Wallet-Auth.agent_id" {
					t.Fatalf("fields %v", m["fields"])
				}
				if after := len(f.allRecords(t)); after != before {
					t.Fatalf("a refused call was recorded: %d records, had %d", after, before)
				}
			}
			id := c.hdr["X-Aov-Wallet-Agent"]
			if id == "" {
				id = c.agent
			}
			got, err := f.db.AgentOwner(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.EqualFold(got, c.owner) {
				t.Fatalf("recorded owner of %q is %q, want %q", id, got, c.owner)
			}
		})
	}
}

// TestAgentOwnershipMCP: the MCP tool verify_schema enforces the same
// ownership as REST, answering a tool error in the same shape.
func TestAgentOwnershipMCP(t *testing.T) {
	f := newFixture(t, fixtureOpts{noSync: true})
	if st, m := f.verifyCall("seller-7", "129.5", proves(wallet, "seller-7")); st != 200 {
		t.Fatalf("owner's bind: %d %v", st, m)
	}
	before := len(f.allRecords(t))
	cs := mcpSession(t, f.serve(t), proves(throwaway(1), "seller-7"))
	res, text, doc := call(t, cs, "verify_schema", json.RawMessage(invoice("135.0", "")))
	if !res.IsError || doc["code"] != "forbidden" || doc["status"] != 403.0 {
		t.Fatalf("tool answer %s", text)
	}
	if after := len(f.allRecords(t)); after != before {
		t.Fatalf("a refused tool call was recorded: %d records, had %d", after, before)
	}
}

// TestScorePoisoning is the attack on a victim agent with three
// authenticated passes (score 0.438494): others send failing outputs under
// its id, with no wallet at all, with throw-away wallets that name it, and
// with throw-away wallets that name nothing. None of it moves the score;
// only the owner's own fails do. An unowned id still scores from labels.
func TestScorePoisoning(t *testing.T) {
	const victim = "victim-agent"
	score := func(t *testing.T, f *fixture, agent string) (float64, map[string]any) {
		t.Helper()
		w := f.do(http.MethodGet, "/score/"+agent, nil, viaGateway)
		if w.Code != 200 {
			t.Fatalf("score: %d %s", w.Code, w.Body)
		}
		doc := decode(t, w)
		return doc["score"].(float64), doc
	}
	setup := func(t *testing.T) *fixture {
		f := newFixture(t, fixtureOpts{noSync: true})
		for range 3 {
			if st, m := f.verifyCall(victim, "129.5", proves(wallet, victim)); st != 200 {
				t.Fatalf("victim's own verification: %d %v", st, m)
			}
		}
		if s, _ := score(t, f, victim); s != 0.438494 {
			t.Fatalf("victim's score %v before the attack, want 0.438494", s)
		}
		return f
	}
	// unmoved checks the victim's score and evidence after n records by
	// others: unchanged, with those n read and not counted.
	unmoved := func(t *testing.T, f *fixture, n int) {
		t.Helper()
		s, doc := score(t, f, victim)
		in := doc["inputs"].(map[string]any)
		c, win := in["counts"].(map[string]any), in["window"].(map[string]any)
		if s != 0.438494 || in["owned"] != true || win["records"] != 3.0 || win["not_counted"] != float64(n) ||
			c["authenticated_pass"] != 3.0 || c["authenticated_fail"] != 0.0 || c["unauthenticated_fail"] != 0.0 {
			t.Fatalf("score %v after %d records by others, want 0.438494 from the owner's 3 passes alone: %v", s, n, in)
		}
		// The history still shows every record, and which ones count.
		w := f.do(http.MethodGet, "/reputation/"+victim+"?limit=100", nil, nil)
		rep := decode(t, w)
		counted := 0
		for _, e := range rep["verifications"].([]any) {
			if e.(map[string]any)["counts_toward_score"] == true {
				counted++
			}
		}
		if rep["owned"] != true || rep["counts"].(map[string]any)["total"] != float64(3+n) || counted != 3 {
			t.Fatalf("reputation: owned %v, counts %v, %d records count toward the score, want 3", rep["owned"], rep["counts"], counted)
		}
	}

	t.Run("failing outputs under the id from callers with no wallet leave the score unchanged", func(t *testing.T) {
		f := setup(t)
		for range 20 {
			if st, m := f.verifyCall(victim, "135.0", nil); st != 200 {
				t.Fatalf("label: %d %v", st, m)
			}
		}
		unmoved(t, f, 20)
	})

	t.Run("throw-away wallets naming the victim are refused and the score does not move", func(t *testing.T) {
		f := setup(t)
		for i := range 4 {
			if st, m := f.verifyCall(victim, "135.0", proves(throwaway(i), victim)); st != 403 {
				t.Fatalf("attacker %d: %d %v", i, st, m)
			}
		}
		unmoved(t, f, 0)
	})

	t.Run("throw-away wallets that bind nothing add labels that do not count", func(t *testing.T) {
		f := setup(t)
		for i := range 4 {
			if st, m := f.verifyCall(victim, "135.0", proves(throwaway(i), "")); st != 200 {
				t.Fatalf("attacker %d: %d %v", i, st, m)
			}
		}
		unmoved(t, f, 4)
	})

	t.Run("records authenticated by a wallet that does not own the id do not count", func(t *testing.T) {
		// History written before ownership was enforced: authenticated
		// fails by four other wallets.
		f := setup(t)
		at := time.Now().UTC()
		for i := range 4 {
			v := store.Verification{ID: fmt.Sprintf("legacy-%d", i), VerifiedAt: at, AgentID: victim, TaskID: "t", Result: "fail",
				OutputHash: strings.Repeat("a", 64), SchemaHash: strings.Repeat("b", 64), RulesHash: strings.Repeat("c", 64),
				RequestHash: strings.Repeat("d", 64), Payment: store.PaymentPaid, Wallet: throwaway(i), Authenticated: true}
			if err := f.db.RecordVerification(context.Background(), v); err != nil {
				t.Fatal(err)
			}
		}
		unmoved(t, f, 4)
	})

	t.Run("the owner's own fails count", func(t *testing.T) {
		f := setup(t)
		if st, m := f.verifyCall(victim, "135.0", proves(wallet, victim)); st != 200 {
			t.Fatalf("owner's fail: %d %v", st, m)
		}
		s, doc := score(t, f, victim)
		if c := doc["inputs"].(map[string]any)["counts"].(map[string]any); !(s < 0.438494) || c["authenticated_fail"] != 1.0 {
			t.Fatalf("score %v after the owner's own fail, want below 0.438494: %v", s, c)
		}
	})

	t.Run("an address's id is owned by the address without any bind", func(t *testing.T) {
		f := newFixture(t, fixtureOpts{noSync: true})
		for range 3 {
			f.verifyCall(wallet, "129.5", proves(wallet, ""))
		}
		for range 4 {
			f.verifyCall(wallet, "135.0", nil)
		}
		if s, doc := score(t, f, wallet); s != 0.438494 {
			t.Fatalf("score %v, want 0.438494 from the address's own 3 passes: %v", s, doc["inputs"])
		}
	})

	t.Run("an unowned id still scores from labels, fails included", func(t *testing.T) {
		f := newFixture(t, fixtureOpts{noSync: true})
		for range 3 {
			f.verifyCall("open-agent", "129.5", nil)
		}
		before, _ := score(t, f, "open-agent")
		for range 4 {
			f.verifyCall("open-agent", "135.0", nil)
		}
		after, doc := score(t, f, "open-agent")
		in := doc["inputs"].(map[string]any)
		if before != 0.280815 || !(after < before) || in["owned"] != false || in["counts"].(map[string]any)["unauthenticated_fail"] != 4.0 {
			t.Fatalf("unowned agent: %v before 4 failing labels, %v after (want 0.280815, then lower): %v", before, after, in)
		}
	})
}

// TestPaidRoutesNeedTheGateway: verifierd serves the score (REST and MCP)
// only to the gateway, unless started with UngatedPaidRoutes.
func TestPaidRoutesNeedTheGateway(t *testing.T) {
	f := newFixture(t, fixtureOpts{noSync: true})
	for _, c := range []struct {
		desc string
		hdr  map[string]string
	}{
		{"no gateway token", nil},
		{"a wrong gateway token", map[string]string{"X-Aov-Gateway-Token": "wrong-token-0123456789"}},
		{"gateway headers without the token", map[string]string{"X-Aov-Payment": "paid"}},
	} {
		t.Run("REST: "+c.desc+" is 403", func(t *testing.T) {
			for _, m := range []string{http.MethodGet, http.MethodHead} {
				w := f.do(m, "/score/seller-7", nil, c.hdr)
				if w.Code != http.StatusForbidden {
					t.Fatalf("%s: %d %s", m, w.Code, w.Body)
				}
				if m == http.MethodGet {
					if doc := decode(t, w); doc["code"] != "forbidden" || doc["charged"] != false || doc["attestation"] != nil {
						t.Fatalf("answer %v", doc)
					}
				}
			}
		})
		t.Run("MCP: "+c.desc+" is a forbidden tool error", func(t *testing.T) {
			cs := mcpSession(t, f.serve(t), c.hdr)
			res, text, doc := call(t, cs, "get_verification_record", map[string]any{"agent_id": "seller-7"})
			if !res.IsError || doc["code"] != "forbidden" {
				t.Fatalf("tool answer %s", text)
			}
		})
	}
	t.Run("the free reputation route needs no token", func(t *testing.T) {
		if w := f.do(http.MethodGet, "/reputation/seller-7", nil, nil); w.Code != 200 {
			t.Fatalf("%d %s", w.Code, w.Body)
		}
	})

	t.Run("with UngatedPaidRoutes (development) anyone gets the score", func(t *testing.T) {
		f := newFixture(t, fixtureOpts{noSync: true, ungated: true})
		if w := f.do(http.MethodGet, "/score/seller-7", nil, nil); w.Code != 200 {
			t.Fatalf("%d %s", w.Code, w.Body)
		}
		cs := mcpSession(t, f.serve(t), nil)
		if res, text, _ := call(t, cs, "get_verification_record", map[string]any{"agent_id": "seller-7"}); res.IsError {
			t.Fatalf("tool answer %s", text)
		}
	})
}

// An agent_id of "0x" and 40 control bytes is no account (no wallet can
// prove it): an ordinary, unowned id whose labels count. (Before: the
// bytes 0x10-0x19 folded onto the digits '0'-'9', the id read as an EVM
// address, its score said owned and none of its labels counted.)
func TestControlByteIDIsNoAccount(t *testing.T) {
	f := newFixture(t, fixtureOpts{noSync: true})
	id := "0x" + strings.Repeat("\x11", 40)
	q, _ := json.Marshal(id)
	for range 3 {
		body := bytes.Replace(invoice("129.5", ""), []byte(`"seller-7"`), q, 1)
		if w := f.do(http.MethodPost, "/verify/schema", body, nil); w.Code != 200 {
			t.Fatalf("label: %d %s", w.Code, w.Body)
		}
	}
	w := f.do(http.MethodGet, "/score/"+url.PathEscape(id), nil, viaGateway)
	if w.Code != 200 {
		t.Fatalf("score: %d %s", w.Code, w.Body)
	}
	in := decode(t, w)["inputs"].(map[string]any)
	win := in["window"].(map[string]any)
	if in["owned"] != false || win["records"] != 3.0 || win["not_counted"] != 0.0 {
		t.Errorf("score of %q: inputs.owned %v, window %v; want owned false (nobody owns or can bind it) and its 3 labels counted", id, in["owned"], in["window"])
	}
}

// An id that renders as another wallet's address with an invisible
// character appended is never bound nor authenticated when a gateway
// forwards it as the id a proof named: SPEC §9 limits a bound agent_id to
// characters that show (store.BindableAgentID), and verifierd drops any
// other. The label itself is recorded, unauthenticated, as §3 allows.
// (Before: only control characters were dropped, and a squatter's
// verifications of "0x<victim>" + U+200B were wallet-authenticated under
// its own binding; then one with a variation selector, the combining
// grapheme joiner, a Hangul filler or the blank Braille pattern still was.)
func TestInvisibleAliasOfAnAddressIsNotBindable(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, fixtureOpts{noSync: true})
	victim := "0x52908400098527886E0F7030069857D2E4169EE7"
	for i, alias := range []string{
		victim + "\u200b", "\ufeff" + victim, victim + "\u2060", "\u202e" + victim, // format characters
		victim + "\ufe0f", victim + "\U000e0101", victim + "\u034f", // variation selectors, combining grapheme joiner
		victim + "\u3164", victim + "\u2800", // Hangul filler, Braille pattern blank
	} {
		st, m := f.verifyCall(alias, "129.5", proves(throwaway(i), alias))
		owner, _ := f.db.AgentOwner(ctx, alias)
		authenticated := true
		if id, ok := m["verification_id"].(string); ok {
			if rec, err := f.db.Verification(ctx, id); err == nil {
				authenticated = rec.Authenticated
			}
		}
		if st != 200 || owner != "" || authenticated {
			t.Errorf("squatter's proof naming %q: status %d, bound to %q, authenticated %v; want 200, the id never bound and its label unauthenticated", alias, st, owner, authenticated)
		}
	}
}

// An id that reads as a Solana wallet's address in lookalikes is never
// bound nor authenticated when a gateway forwards it as the id a proof
// named, though its base58 holds no digit (about one random account in
// 1,700): here GbYbVXrgs… with its X written as Cyrillic Х. The label
// itself is recorded, unauthenticated. (Before: a lookalike run counted as
// an address only with a digit in it, so any wallet bound this one and its
// verifications were authenticated under a name that reads as the
// victim's account.)
func TestSolanaLookalikeWithoutDigitsIsNotBindable(t *testing.T) {
	ctx := context.Background()
	const victim = "GbYbVXrgsSRzBaoBZiJjLxkUaJawVYAGCWvqRmgQGnkP"
	const imitation = "GbYbV\u0425rgsSRzBaoBZiJjLxkUaJawVYAGCWvqRmgQGnkP"
	if _, ok := store.SolanaWalletKey(victim); !ok {
		t.Fatal("victim is not a Solana wallet address")
	}
	f := newFixture(t, fixtureOpts{noSync: true})
	st, m := f.verifyCall(imitation, "129.5", proves(throwaway(1), imitation))
	owner, err := f.db.AgentOwner(ctx, imitation)
	if err != nil {
		t.Fatal(err)
	}
	authenticated := true
	if id, ok := m["verification_id"].(string); ok {
		if rec, err := f.db.Verification(ctx, id); err == nil {
			authenticated = rec.Authenticated
		}
	}
	if st != 200 || owner != "" || authenticated {
		t.Errorf("proof naming %q (reads as %s): status %d, bound to %q, authenticated %v; want 200, the id never bound and its label unauthenticated",
			imitation, victim, st, owner, authenticated)
	}
}
