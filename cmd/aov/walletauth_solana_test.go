package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"fmt"
	"strings"
	"testing"

	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/walletauth"
)

func TestWalletAuthSignsWithASolanaKey(t *testing.T) {
	seed := sha256.Sum256([]byte("aov wallet-auth solana"))
	key := ed25519.NewKeyFromSeed(seed[:])
	var arr []string
	for _, b := range key {
		arr = append(arr, fmt.Sprint(b))
	}
	dir := t.TempDir()
	jsonFile := writeFile(t, dir, "id.json", []byte("["+strings.Join(arr, ",")+"]\n"))
	b58File := writeFile(t, dir, "id.b58", []byte(base58.Encode(key)))
	for _, file := range []string{jsonFile, b58File} {
		var stdout, stderr bytes.Buffer
		args := []string{"wallet-auth", "--key-file", file, "--method", "POST", "--url", "https://verifier.example/verify/schema",
			"--chain", "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp", "--agent-id", "seller-sol"}
		if code := run(args, nil, &stdout, &stderr); code != exitValid {
			t.Fatalf("exit %d: %s", code, stderr.String())
		}
		v := &walletauth.Verifier{}
		p, err := v.Verify(context.Background(), strings.TrimSpace(stdout.String()), walletauth.Expect{Domain: "verifier.example", Method: "POST", Path: "/verify/schema"})
		if err != nil {
			t.Fatal(err)
		}
		if p.Wallet() != base58.Encode(key.Public().(ed25519.PublicKey)) || p.AgentID != "seller-sol" {
			t.Fatalf("proof %+v", p)
		}
	}
	var stdout, stderr bytes.Buffer
	bad := writeFile(t, dir, "bad", []byte("not a key"))
	if code := run([]string{"wallet-auth", "--key-file", bad, "--method", "GET", "--url", "https://x.example/", "--chain", "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp"}, nil, &stdout, &stderr); code == exitValid || strings.Contains(stderr.String(), "not a key") {
		t.Fatalf("a bad key: exit %d, %s", code, stderr.String())
	}
}
