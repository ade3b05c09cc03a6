package server_test

import (
	"context"
	"testing"
)

// A bare Solana address is that account's own id, as a bare EVM address
// is: another wallet naming it is refused (403), and the Solana wallet it
// spells is authenticated under it without binding anything. (Before: it
// was an ordinary name, so any EVM wallet that named it first owned it,
// and the Solana wallet was then refused its own address.)
func TestBareSolanaAddressBelongsToItsAccount(t *testing.T) {
	const sol = "7xKXtg2CW87d97TXJSDpbD5jBkheTqA83TZRuJosgAsU"
	f := newFixture(t, fixtureOpts{noSync: true})
	st, m := f.verifyCall(sol, "129.5", proves(throwaway(1), sol))
	if st != 403 || m["code"] != "forbidden" {
		t.Errorf("an EVM wallet naming the bare Solana address %s: status %d %v, want 403 forbidden as for a bare EVM address", sol, st, m["code"])
	}
	st, m = f.verifyCall(sol, "129.5", proves(sol, sol))
	if st != 200 {
		t.Fatalf("the Solana wallet %s naming its own bare address: status %d %v, want 200", sol, st, m["code"])
	}
	rec, err := f.db.Verification(context.Background(), m["verification_id"].(string))
	if err != nil {
		t.Fatal(err)
	}
	if !rec.Authenticated {
		t.Errorf("the Solana wallet %s naming its own bare address was not authenticated", sol)
	}
	if owner, err := f.db.AgentOwner(context.Background(), sol); err != nil || owner != "" {
		t.Errorf("recorded owner of %s: %q %v, want none (an account id needs no binding)", sol, owner, err)
	}
}
