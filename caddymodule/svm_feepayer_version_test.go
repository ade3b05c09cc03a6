package caddymodule

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/x402"
)

// TestFeePayerIsTheVersion2Kinds: a remote facilitator's /supported lists,
// for the route's Solana network, an x402 version 1 kind (first) and the
// version 2 kind, each with its fee payer. The gate speaks version 2 only
// (MultiFacilitator.pick matches x402Version), so its 402 offers the
// version 2 kind's fee payer, the one that signs its settlements. (Before:
// the first kind's whatever its version, and every buyer built its
// transaction around a fee payer the v2 settlement does not sign for.)
func TestFeePayerIsTheVersion2Kinds(t *testing.T) {
	v1Payer := base58.Encode(bytes.Repeat([]byte{0x11}, 32))
	v2Payer := base58.Encode(bytes.Repeat([]byte{0x22}, 32))
	payee := base58.Encode(bytes.Repeat([]byte{0x33}, 32))
	fac := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path != "/supported" {
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"error":"down"}`))
			return
		}
		json.NewEncoder(w).Encode(map[string]any{
			"kinds": []any{
				map[string]any{"x402Version": 1, "scheme": "exact", "network": x402.NetworkSolanaDevnet, "extra": map[string]any{"feePayer": v1Payer}},
				map[string]any{"x402Version": 2, "scheme": "exact", "network": x402.NetworkSolanaDevnet, "extra": map[string]any{"feePayer": v2Payer}},
			},
			"extensions": []string{}, "signers": map[string]any{},
		})
	}))
	t.Cleanup(fac.Close)
	up := newUpstream(t)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept solana-devnet $0.02 %[3]s
			facilitator http {
				url %[2]s
			}
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), fac.URL, payee))
	pr := paymentRequired(t, post(t, base+"/verify/schema", "", nil))
	got, _ := pr.Accepts[0].Extra["feePayer"].(string)
	if got != v2Payer {
		t.Errorf("the 402 offers extra.feePayer %s (v1's is %s); want %s, the version 2 kind's the gate settles with", got, v1Payer, v2Payer)
	}
}
