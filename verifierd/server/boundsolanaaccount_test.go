package server_test

import (
	"context"
	"crypto/ed25519"
	"testing"

	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/internal/ed25519key"
	"github.com/aovhq/aov/store"
)

// A readable name that happens to be the base58 of a valid Ed25519 key
// (about half of the 43-character ones) was bound by a wallet when a bare
// base58 id was an ordinary name; that binding is honoured before the id is
// read as a Solana account, so its binder keeps it. (Before: it was read as
// the account of a key nobody holds, and its binder was refused 403 for
// ever.)
func TestOnCurveReadableNameStaysItsBindersName(t *testing.T) {
	id := ""
	for _, c := range "abcdefghijkmnopqrstuvwxyz" {
		s := "MyCompanyTaxReceiptsAgentEuropeanMarketsV2" + string(c)
		if _, ok := store.SolanaWalletKey(s); ok {
			id = s
			break
		}
	}
	if id == "" {
		t.Fatal("no readable candidate that is an Ed25519 key")
	}
	b, _ := base58.Decode(id)
	if ed25519key.Check(b) != nil {
		t.Fatalf("precondition: %s must be an Ed25519 key", id)
	}
	binderKeepsName(t, id, "bound")
}

// A bare Solana address nobody bound is its account's: no other wallet can
// bind it now. One another wallet bound before the bare-account rule keeps
// that owner, everywhere ownership is asked: the binder is authenticated
// for it, and the Solana wallet of that address is refused, whether its
// proof names the address or only the body does.
func TestBareSolanaAddressBoundBeforeKeepsItsOwner(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, fixtureOpts{noSync: true})
	address := func(seed byte) string {
		k := ed25519.NewKeyFromSeed(append(make([]byte, 31), seed))
		return base58.Encode(k.Public().(ed25519.PublicKey))
	}
	unbound, squatted := address(1), address(2)

	// Unbound: the account's, never bound by another wallet.
	if st, m := f.verifyCall(unbound, "129.5", proves(throwaway(9), unbound)); st != 403 || m["code"] != "forbidden" {
		t.Fatalf("another wallet naming the unbound %s: status %d %v, want 403", unbound, st, m["code"])
	}
	if got, err := f.db.AgentOwner(ctx, unbound); err != nil || got != "" {
		t.Fatalf("owner of the unbound address afterwards: %q %v, want none", got, err)
	}
	st, m := f.verifyCall(unbound, "129.5", proves(unbound, unbound))
	if st != 200 {
		t.Fatalf("the Solana wallet naming its own address: status %d %v", st, m["code"])
	}
	if rec, err := f.db.Verification(ctx, m["verification_id"].(string)); err != nil || !rec.Authenticated {
		t.Fatalf("the Solana wallet's own address: authenticated %v %v, want true", rec.Authenticated, err)
	}

	// Bound by another wallet before the rule: kept.
	squatter := throwaway(10)
	if got, err := f.db.BindAgent(ctx, squatted, squatter); err != nil || got != squatter {
		t.Fatalf("bind: %q %v", got, err)
	}
	st, m = f.verifyCall(squatted, "129.5", proves(squatter, squatted))
	if st != 200 {
		t.Fatalf("the wallet that bound %s: status %d %v, want 200", squatted, st, m["code"])
	}
	if rec, err := f.db.Verification(ctx, m["verification_id"].(string)); err != nil || !rec.Authenticated {
		t.Fatalf("the binder: authenticated %v %v, want true", rec.Authenticated, err)
	}
	if st, m := f.verifyCall(squatted, "129.5", proves(squatted, squatted)); st != 403 || m["code"] != "forbidden" {
		t.Errorf("the Solana wallet naming its address another wallet bound: status %d %v, want 403", st, m["code"])
	}
	st, m = f.verifyCall(squatted, "129.5", proves(squatted, ""))
	if st != 200 {
		t.Fatalf("the Solana wallet, the address in the body only: status %d %v", st, m["code"])
	}
	if rec, err := f.db.Verification(ctx, m["verification_id"].(string)); err != nil || rec.Authenticated {
		t.Errorf("the Solana wallet, the address in the body only: authenticated %v %v, want false (the id is its binder's)", rec.Authenticated, err)
	}
}
