package walletauth

import (
	"context"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/aovhq/aov/internal/interop"
)

// viem runs interop/wallet-auth-viem.mjs (viem's createSiweMessage and
// signMessage, code this project did not write) with input, and returns the
// header and the text viem signed. Without the npm peers the test is
// skipped, except under CI, where that is a failure.
func viem(t testing.TB, input map[string]any) (header, message string) {
	t.Helper()
	interop.Dir(t, "viem")
	var out struct{ Header, Message string }
	interop.Run(t, "wallet-auth-viem.mjs", nil, input, &out)
	return out.Header, out.Message
}

func keyHex(t testing.TB) string { return "0x" + common.Bytes2Hex(crypto.FromECDSA(testKey)) }

func TestViemHeadersVerify(t *testing.T) {
	cases := []struct {
		desc  string
		input map[string]any
		want  Expect
		agent string
	}{
		{"a plain viem proof verifies", map[string]any{"method": "post", "url": "https://verifier.example/verify/schema"},
			Expect{Domain: "verifier.example", Method: "POST", Path: "/verify/schema"}, ""},
		{"a viem proof with a statement and an agent verifies", map[string]any{"method": "GET", "url": "http://127.0.0.1:8080/score/seller-7",
			"statement": "Bind my agent", "agentId": "seller 7 (café)!"},
			Expect{Domain: "127.0.0.1:8080", Method: "GET", Path: "/score/seller-7"}, "seller 7 (café)!"},
		// The path as the request sends it, escaped: an encoded slash
		// stays one, and a non-ASCII character is its UTF-8 escapes.
		{"a viem proof for a path with an encoded slash verifies for that path", map[string]any{"method": "GET", "url": "https://verifier.example/report/caf%C3%A9%2Fb"},
			Expect{Domain: "verifier.example", Method: "GET", Path: "/report/caf%C3%A9%2Fb"}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			in := map[string]any{"kind": "x-wallet-auth", "privateKey": keyHex(t), "chainId": 8453, "ttlSeconds": 120}
			for k, v := range tc.input {
				in[k] = v
			}
			h, msg := viem(t, in)
			e, err := Parse(h)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			if got := e.Message(); got != msg {
				t.Fatalf("our text differs from viem's\n%q\n%q", got, msg)
			}
			v := &Verifier{Nonces: newDB(t).Claims()}
			p, err := v.Verify(context.Background(), h, tc.want)
			if err != nil {
				t.Fatalf("verify: %v", err)
			}
			if p.Address != crypto.PubkeyToAddress(testKey.PublicKey) || p.AgentID != tc.agent {
				t.Errorf("proof %+v", p)
			}
		})
	}
}

func TestViemSIWXProofOfOurChallengeVerifies(t *testing.T) {
	ext := SIWXChallenge("api.example.com", "https://api.example.com/data", []string{"eip155:8453"}, time.Now())
	h, msg := viem(t, map[string]any{"kind": "siwx", "privateKey": keyHex(t), "chainId": 8453, "info": ext["info"]})
	s, err := ParseSIWX(h)
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	if got := s.Message(); got != msg {
		t.Fatalf("our text differs from viem's\n%q\n%q", got, msg)
	}
	v := &Verifier{Nonces: newDB(t).Claims()}
	if _, err := v.VerifySIWX(context.Background(), h, siwxWant); err != nil {
		t.Fatalf("verify: %v", err)
	}
}
