package caddymodule

import (
	"crypto/ed25519"
	"crypto/sha256"
	"testing"

	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/walletauth"
)

// TestWalletAuthSolanaAccount: an X-Wallet-Auth proof by a Solana account
// passes wallet_auth; the upstream learns the base58 address and the bound
// agent; the same proof again is refused.
func TestWalletAuthSolanaAccount(t *testing.T) {
	base := startCaddy(t, walletSite(walletUpstream(t).URL, "required", ""))
	seed := sha256.Sum256([]byte("caddymodule solana wallet"))
	key := ed25519.NewKeyFromSeed(seed[:])
	e, err := walletauth.New(walletauth.Request{Method: "GET", URL: base + "/api/thing", ChainID: "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp", AgentID: "seller-sol"})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.SignSolana(key); err != nil {
		t.Fatal(err)
	}
	h, _ := e.Encode()
	st, _, body := walletCall(t, "GET", base+"/api/thing", "", map[string]string{walletauth.HeaderName: h})
	want := base58.Encode(key.Public().(ed25519.PublicKey))
	if st != 200 || body["wallet"] != want || body["agent"] != "seller-sol" {
		t.Fatalf("status %d, upstream saw %v; want wallet %s", st, body, want)
	}
	if st, _, _ := walletCall(t, "GET", base+"/api/thing", "", map[string]string{walletauth.HeaderName: h}); st != 401 {
		t.Fatalf("replayed proof: status %d", st)
	}
}
