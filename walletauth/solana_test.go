package walletauth

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/internal/interop"
)

const solanaDevnet = "solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1"

func solanaKeyFor(name string) ed25519.PrivateKey {
	seed := sha256.Sum256([]byte("walletauth solana " + name))
	return ed25519.NewKeyFromSeed(seed[:])
}

func solanaHeader(t *testing.T, key ed25519.PrivateKey, agent string, now time.Time) (string, *Envelope) {
	t.Helper()
	e, err := New(Request{Method: "POST", URL: "https://verifier.example/verify/schema", ChainID: solanaDevnet, AgentID: agent, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.SignSolana(key); err != nil {
		t.Fatal(err)
	}
	h, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return h, e
}

func TestSolanaWalletAuthText(t *testing.T) {
	now := time.Date(2026, 11, 29, 21, 22, 28, 0, time.UTC)
	e, _ := New(Request{Method: "POST", URL: "https://verifier.example/verify/schema", ChainID: solanaDevnet, AgentID: "seller-7", Now: now, Nonce: "3f9c0d1e7a2b4c5d6e7f8091"})
	if err := e.SignSolana(solanaKeyFor("a")); err != nil {
		t.Fatal(err)
	}
	want := "verifier.example wants you to sign in with your Solana account:\n" + e.Address + "\n\n" +
		"URI: https://verifier.example/verify/schema\nVersion: 1\nChain ID: EtWTRABZaYq6iMfeYKouRu166VU2xqa1\n" +
		"Nonce: 3f9c0d1e7a2b4c5d6e7f8091\nIssued At: 2026-11-29T21:22:28Z\nExpiration Time: 2026-11-29T21:27:28Z\n" +
		"Resources:\n- urn:x-wallet-auth:method:POST\n- urn:x-wallet-auth:agent:seller-7"
	if got := e.Message(); got != want {
		t.Fatalf("text:\n%s\nwant:\n%s", got, want)
	}
}

func TestSolanaWalletAuthVerifies(t *testing.T) {
	key := solanaKeyFor("a")
	v := &Verifier{Nonces: newDB(t).Claims()}
	h, e := solanaHeader(t, key, "seller-7", time.Now())
	want := Expect{Domain: "verifier.example", Method: "POST", Path: "/verify/schema"}
	p, err := v.Verify(context.Background(), h, want)
	if err != nil {
		t.Fatal(err)
	}
	if p.Wallet() != e.Address || p.AgentID != "seller-7" || p.ChainID != solanaDevnet {
		t.Fatalf("proof %+v", p)
	}
	var werr *Error
	if _, err := v.Verify(context.Background(), h, want); !errors.As(err, &werr) || werr.Kind != ErrReplayed {
		t.Fatalf("replay: %v", err)
	}
	if _, err := v.Verify(context.Background(), h, Expect{Domain: "other.example", Method: "POST", Path: "/verify/schema"}); !errors.As(err, &werr) || werr.Kind != ErrWrongRequest {
		t.Fatalf("other domain: %v", err)
	}
}

func TestSolanaWalletAuthRefusals(t *testing.T) {
	key := solanaKeyFor("a")
	want := Expect{Domain: "verifier.example", Method: "POST", Path: "/verify/schema"}
	var identity [32]byte
	identity[0] = 1
	cases := []struct {
		name  string
		edit  func(e *Envelope)
		kind  error
		field string
	}{
		{"another key's signature", func(e *Envelope) {
			e.Signature = base58.Encode(ed25519.Sign(solanaKeyFor("b"), []byte(e.Message())))
		}, ErrBadSignature, "signature"},
		{"signed text altered", func(e *Envelope) { e.Statement = "pay me" }, ErrBadSignature, "signature"},
		{"small-order key with the forgery crypto/ed25519 accepts", func(e *Envelope) {
			e.Address = base58.Encode(identity[:])
			e.Signature = base58.Encode(append(identity[:], make([]byte, 32)...))
		}, ErrMalformed, "address"},
		// y = p + 3: a point of large order under an unreduced spelling,
		// which no private key signs as (a signer's key is canonical) and
		// strict readers refuse: a second address for one key.
		{"non-canonical key", func(e *Envelope) {
			k, _ := hex.DecodeString("f0ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f")
			e.Address = base58.Encode(k)
		}, ErrMalformed, "address"},
		{"EVM type", func(e *Envelope) { e.Type = TypeEIP191 }, ErrMalformed, "type"},
		{"hex signature", func(e *Envelope) { e.Signature = "0x" + strings.Repeat("ab", 65) }, ErrMalformed, "signature"},
		{"EVM address", func(e *Envelope) { e.Address = "0x9858EfFD232B4033E47d90003D41EC34EcaEda94" }, ErrMalformed, "address"},
		{"expired", func(e *Envelope) {
			e.IssuedAt = time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
			e.ExpirationTime = time.Now().Add(-time.Hour + time.Minute).UTC().Format(time.RFC3339)
			e.Signature = base58.Encode(ed25519.Sign(key, []byte(e.Message())))
		}, ErrExpired, "expiration_time"},
	}
	// The forgery case proves something only while crypto/ed25519 accepts it.
	if !ed25519.Verify(identity[:], []byte("anything"), append(identity[:], make([]byte, 32)...)) {
		t.Fatal("crypto/ed25519 no longer accepts the small-order forgery")
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, e := solanaHeader(t, key, "", time.Now())
			c.edit(e)
			h, _ := e.Encode()
			v := &Verifier{Nonces: newDB(t).Claims()}
			_, err := v.Verify(context.Background(), h, want)
			var werr *Error
			if !errors.As(err, &werr) || werr.Kind != c.kind || werr.Field != c.field {
				t.Fatalf("err %v, want %s on %s", err, c.kind, c.field)
			}
		})
	}
}

// TestOfficialSolanaSIWXProofVerifies: @x402/extensions 2.27 signs our
// challenge with a Solana wallet; the gateway's verifier accepts it once.
func TestOfficialSolanaSIWXProofVerifies(t *testing.T) {
	interop.Dir(t, "@x402/extensions", "@solana/kit")
	t.Run("with a statement", func(t *testing.T) { officialSolanaSIWX(t, true) })
	// CAIP-122 for Solana then has one blank line where EIP-4361 has two.
	t.Run("without a statement", func(t *testing.T) { officialSolanaSIWX(t, false) })
}

func officialSolanaSIWX(t *testing.T, statement bool) {
	ext := SIWXChallenge("api.example.com", "https://api.example.com/data", []string{solanaDevnet}, time.Now())
	if !statement {
		delete(ext["info"].(map[string]any), "statement")
	}
	if sc := ext["supportedChains"].([]any)[0].(map[string]any); sc["type"] != TypeEd25519 {
		t.Fatalf("supported chain %v", sc)
	}
	key := solanaKeyFor("official")
	var out struct {
		Header string `json:"header"`
	}
	interop.Run(t, "siwx-solana.mjs", nil, map[string]any{
		"secretKey": base58.Encode(key), "chainId": solanaDevnet, "info": ext["info"], "url": "https://api.example.com/data",
	}, &out)
	v := &Verifier{Nonces: newDB(t).Claims()}
	p, err := v.VerifySIWX(context.Background(), out.Header, SIWXExpect{Domain: "api.example.com", Path: "/data"})
	if err != nil {
		t.Fatal(err)
	}
	if p.Wallet() != base58.Encode(key.Public().(ed25519.PublicKey)) || p.ChainID != solanaDevnet {
		t.Fatalf("proof %+v", p)
	}
	if _, err := v.VerifySIWX(context.Background(), out.Header, SIWXExpect{Domain: "api.example.com", Path: "/data"}); err == nil {
		t.Fatal("replayed sign-in accepted")
	}
	// Our own signer produces what the official client does.
	s, err := ParseSIWX(out.Header)
	if err != nil {
		t.Fatal(err)
	}
	mine := *s
	if err := mine.SignSolana(key); err != nil || mine.Signature != s.Signature {
		t.Fatalf("our signature %s, official %s (%v)", mine.Signature, s.Signature, err)
	}
}
