package server_test

import (
	"context"
	"testing"

	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/internal/ed25519key"
	"github.com/aovhq/aov/store"
)

// A readable agent id that happens to be the canonical base58 of 32 bytes
// but no Ed25519 key a Solana proof could carry (ed25519key.Check refuses
// it) stays an ordinary name: the wallet that bound it keeps it. (Before:
// it was read as a bare Solana address, so its owner was refused 403 and,
// since no Solana wallet proof can carry that address, nobody could ever be
// authenticated for it.)
func TestUnprovableBareSolanaAddressStaysItsBindersName(t *testing.T) {
	const id = "MyCompanyTaxReceiptsAgentEuropeanMarketsV2a"
	b, _ := base58.Decode(id)
	if !store.IsSolanaAddress(id) || ed25519key.Check(b) == nil {
		t.Fatalf("precondition: %s must be base58 of 32 bytes and not an Ed25519 key", id)
	}
	binderKeepsName(t, id, "owns")
}

// binderKeepsName binds id to a wallet, as a bare base58 id was bound when
// it was an ordinary name, and checks that the binder is still
// authenticated for it and another wallet is refused 403. did says what the
// binder did in the failures' words ("bound", "owns").
func binderKeepsName(t *testing.T, id, did string) {
	t.Helper()
	f := newFixture(t, fixtureOpts{noSync: true})
	owner := throwaway(7)
	// Bound when a bare base58 id was an ordinary name.
	if got, err := f.db.BindAgent(context.Background(), id, owner); err != nil || got != owner {
		t.Fatalf("bind: %q %v", got, err)
	}
	st, m := f.verifyCall(id, "129.5", proves(owner, id))
	if st != 200 {
		t.Fatalf("the wallet that %s %s: status %d %v, want 200", did, id, st, m["code"])
	}
	rec, err := f.db.Verification(context.Background(), m["verification_id"].(string))
	if err != nil {
		t.Fatal(err)
	}
	if !rec.Authenticated {
		t.Errorf("the wallet that %s %s was not authenticated for it", did, id)
	}
	if st, m := f.verifyCall(id, "129.5", proves(throwaway(8), id)); st != 403 || m["code"] != "forbidden" {
		t.Errorf("another wallet naming %s: status %d %v, want 403 forbidden (it is its binder's)", id, st, m["code"])
	}
}
