package server_test

import (
	"net/http"
	"testing"
)

// BenchmarkVerifyOwnedAgent is one verification (nosync) for seller-7 by a
// caller without a wallet (the baseline), by one proving the wallet
// without naming the agent, and by the owner whose proof names it (one
// owner lookup in Badger before the check).
func BenchmarkVerifyOwnedAgent(b *testing.B) {
	for _, c := range []struct {
		name string
		hdr  map[string]string
	}{
		{"label", nil},
		{"wallet", proves(wallet, "")},
		{"owner-proof", proves(wallet, "seller-7")},
	} {
		b.Run(c.name, func(b *testing.B) {
			f := newFixture(b, fixtureOpts{noSync: true})
			body := invoice("135.0", "")
			if w := f.do(http.MethodPost, "/verify/schema", body, proves(wallet, "seller-7")); w.Code != 200 {
				b.Fatalf("bind: %d %s", w.Code, w.Body)
			}
			b.ReportAllocs()
			for b.Loop() {
				if w := f.do(http.MethodPost, "/verify/schema", body, c.hdr); w.Code != http.StatusOK {
					b.Fatalf("status %d: %s", w.Code, w.Body)
				}
			}
		})
	}
}
