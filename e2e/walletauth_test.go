package e2e

import (
	"bytes"
	"net/http"
	"os/exec"
	"strings"
	"testing"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/plugins/evmfacilitator"
)

// SPEC §9 through the whole stack: a proof made with `aov wallet-auth` lets
// the request through and verifierd records the wallet; an agent whose id
// is the proven address has its verification counted as authenticated; the
// same proof again, or a forged one, is 401 in the error shape.
func TestWalletAuth(t *testing.T) {
	s := newStack(t)
	wallet := evmfacilitator.DevAccounts()[2]
	agent := wallet.Address.Hex()
	keyFile := writeFile(t, "wallet.hex", []byte(wallet.PrivateKeyHex+"\n"))
	url := s.url("/verify/schema")
	body := bytes.Replace(example(t, "invoice-fixed.json"), []byte(`"test-seller-1"`), []byte(`"`+agent+`"`), 1)

	out, err := exec.Command(bin.aov, "wallet-auth", "--key-file", keyFile, "--method", "POST", "--url", url, "--agent-id", agent).Output()
	if err != nil {
		t.Fatalf("aov wallet-auth: %v", err)
	}
	proof := strings.TrimSpace(string(out))

	t.Run("a valid proof is accepted", func(t *testing.T) {
		r := do(t, http.MethodPost, url, body, map[string]string{"X-Wallet-Auth": proof})
		mustStatus(t, r, http.StatusOK)
	})
	for _, tc := range []struct{ desc, header string }{
		{"the same proof again is refused with 401", proof},
		{"a forged proof is refused with 401", "eyJkb21haW4iOiJ4In0="},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			r := do(t, http.MethodPost, url, body, map[string]string{"X-Wallet-Auth": tc.header})
			mustStatus(t, r, http.StatusUnauthorized)
			if e := decode[apierr.Error](t, r); e.Code != apierr.CodeUnauthorized || e.Charged {
				t.Fatalf("error %+v", e)
			}
		})
	}
	t.Run("verifierd recorded the proven wallet for the bound agent, once", func(t *testing.T) {
		recs := s.history(t, agent)
		if len(recs) != 1 {
			t.Fatalf("%d records, want 1: %+v", len(recs), recs)
		}
		if !strings.EqualFold(recs[0].Wallet, wallet.Address.Hex()) || !recs[0].Authenticated {
			t.Fatalf("record %+v, want wallet %s and authenticated", recs[0], wallet.Address.Hex())
		}
	})
}
