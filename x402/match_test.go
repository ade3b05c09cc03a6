package x402

import "testing"

func TestMatch(t *testing.T) {
	offerBase := PaymentRequirements{Scheme: "exact", Network: NetworkBase, Amount: "20000",
		Asset: "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913", PayTo: "0x209693Bc6afc0C5328bA36FaF03C514EF312287C",
		MaxTimeoutSeconds: 60, Extra: map[string]any{"name": "USD Coin", "version": "2"}}
	offerSol := PaymentRequirements{Scheme: "exact", Network: NetworkSolana, Amount: "20000",
		Asset: "EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v", PayTo: "9xQeWvG816bUx9EPjHmaT23yvVM2ZWbrrpZb9PusVFin", MaxTimeoutSeconds: 60}
	offers := []PaymentRequirements{offerBase, offerSol}
	with := func(r PaymentRequirements, f func(*PaymentRequirements)) PaymentRequirements {
		f(&r)
		return r
	}
	for _, tc := range []struct {
		desc     string
		accepted PaymentRequirements
		want     *PaymentRequirements
		mismatch string
	}{
		{"an unmodified copy of an offer matches it", offerBase, &offerBase, ""},
		{"the second offer is found", offerSol, &offerSol, ""},
		{"payTo in lower case matches the checksummed offer", with(offerBase, func(r *PaymentRequirements) { r.PayTo = "0x209693bc6afc0c5328ba36faf03c514ef312287c" }), &offerBase, ""},
		{"an asset in upper-case hex matches", with(offerBase, func(r *PaymentRequirements) { r.Asset = "0x833589FCD6EDB6E08F4C7C32D4F71B54BDA02913" }), &offerBase, ""},
		{"a different maxTimeoutSeconds still matches and the server's value is returned", with(offerBase, func(r *PaymentRequirements) { r.MaxTimeoutSeconds = 99999 }), &offerBase, ""},
		{"a different extra still matches and the server's extra is returned", with(offerBase, func(r *PaymentRequirements) { r.Extra = map[string]any{"name": "Evil"} }), &offerBase, ""},
		{"another scheme does not match", with(offerBase, func(r *PaymentRequirements) { r.Scheme = "upto" }), nil, "scheme"},
		{"another network does not match", with(offerBase, func(r *PaymentRequirements) { r.Network = NetworkBaseSepolia }), nil, "network"},
		{"a v1 network name does not match its CAIP-2 id", with(offerBase, func(r *PaymentRequirements) { r.Network = "base" }), nil, "network"},
		{"a smaller amount does not match", with(offerBase, func(r *PaymentRequirements) { r.Amount = "19999" }), nil, "amount"},
		{"a larger amount does not match", with(offerBase, func(r *PaymentRequirements) { r.Amount = "20001" }), nil, "amount"},
		{"the amount with a leading zero does not match", with(offerBase, func(r *PaymentRequirements) { r.Amount = "020000" }), nil, "amount"},
		{"another asset does not match", with(offerBase, func(r *PaymentRequirements) { r.Asset = "0x036CbD53842c5426634e7929541eC2318f3dCF7e" }), nil, "asset"},
		{"a truncated asset does not match", with(offerBase, func(r *PaymentRequirements) { r.Asset = offerBase.Asset[:41] }), nil, "asset"},
		{"another payTo does not match", with(offerBase, func(r *PaymentRequirements) { r.PayTo = "0x0000000000000000000000000000000000000001" }), nil, "payTo"},
		{"a Solana payTo in another case does not match (base58 is case-sensitive)", with(offerSol, func(r *PaymentRequirements) { r.PayTo = "9XQeWvG816bUx9EPjHmaT23yvVM2ZWbrrpZb9PusVFin" }), nil, "payTo"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			got, ok := Match(tc.accepted, offers)
			if tc.want == nil {
				if ok {
					t.Fatalf("matched %+v", got)
				}
				if m := Mismatch(tc.accepted, offers[0]); tc.accepted.Network != NetworkSolana && m != tc.mismatch {
					t.Errorf("mismatch %q, want %q", m, tc.mismatch)
				}
				if m := Mismatch(tc.accepted, offers[1]); tc.accepted.Network == NetworkSolana && m != tc.mismatch {
					t.Errorf("mismatch %q, want %q", m, tc.mismatch)
				}
				return
			}
			if !ok {
				t.Fatalf("no match (first mismatch %q)", Mismatch(tc.accepted, *tc.want))
			}
			if got.MaxTimeoutSeconds != tc.want.MaxTimeoutSeconds || got.PayTo != tc.want.PayTo || got.Asset != tc.want.Asset || got.Extra["name"] != tc.want.Extra["name"] {
				t.Fatalf("returned %+v, not the server's offer %+v", got, *tc.want)
			}
		})
	}
	t.Run("no offers match nothing", func(t *testing.T) {
		if _, ok := Match(offerBase, nil); ok {
			t.Fatal("matched an empty offer list")
		}
	})
}
