package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/crypto"

	"github.com/aovhq/aov/walletauth"
)

// walletKeyHex is the well-known go-ethereum documentation test key.
const walletKeyHex = "4c0883a69102937d6231471b5dbb6204fe5129617082792ae468d01a3f362318"

func TestWalletAuthPrintsAHeaderTheGatewayAccepts(t *testing.T) {
	keyFile := writeFile(t, t.TempDir(), "wallet.hex", []byte("0x"+walletKeyHex+"\n"))
	cases := []struct {
		desc  string
		args  []string
		want  walletauth.Expect
		agent string
		chain string
	}{
		{"a key on the command line signs for the URL's host, method and path",
			[]string{"--key", walletKeyHex, "--method", "post", "--url", "https://verifier.example/verify/schema?debug=1"},
			walletauth.Expect{Domain: "verifier.example", Method: "POST", Path: "/verify/schema"}, "", "eip155:8453"},
		{"a key file, an agent, a chain and a short lifetime are honoured",
			[]string{"--key-file", keyFile, "--method", "GET", "--url", "http://127.0.0.1:8080/score/seller-7", "--agent-id", "seller-7", "--chain", "eip155:1337", "--ttl", "30s"},
			walletauth.Expect{Domain: "127.0.0.1:8080", Method: "GET", Path: "/score/seller-7"}, "seller-7", "eip155:1337"},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(append([]string{"wallet-auth"}, tc.args...), nil, &stdout, &stderr); code != exitValid {
				t.Fatalf("exit %d: %s", code, stderr.String())
			}
			h := strings.TrimSpace(stdout.String())
			v := &walletauth.Verifier{}
			p, err := v.Verify(context.Background(), h, tc.want)
			if err != nil {
				t.Fatalf("the printed header does not verify: %v", err)
			}
			key, _ := crypto.HexToECDSA(walletKeyHex)
			if p.Address != crypto.PubkeyToAddress(key.PublicKey) || p.AgentID != tc.agent || p.ChainID != tc.chain {
				t.Errorf("proof %+v", p)
			}
			if life := time.Until(p.Expires); life > 5*time.Minute+time.Second || (tc.agent != "" && life > 31*time.Second) {
				t.Errorf("proof lives %v", life)
			}
		})
	}
}

func TestWalletAuthUsageErrors(t *testing.T) {
	dir := t.TempDir()
	badKeyFile := writeFile(t, dir, "bad.hex", []byte("not-a-key-SECRETISH"))
	cases := []struct {
		desc string
		args []string
		want string
	}{
		{"a key is required", []string{"--method", "GET", "--url", "https://x.example/"}, "exactly one of --key and --key-file"},
		{"two keys are refused", []string{"--key", walletKeyHex, "--key-file", badKeyFile, "--method", "GET", "--url", "https://x.example/"}, "exactly one of"},
		{"the method is required", []string{"--key", walletKeyHex, "--url", "https://x.example/"}, "--method and --url are required"},
		{"the URL is required", []string{"--key", walletKeyHex, "--method", "GET"}, "--method and --url are required"},
		{"a relative URL is refused", []string{"--key", walletKeyHex, "--method", "GET", "--url", "/verify/schema"}, "absolute http or https URL"},
		{"a zero lifetime is refused", []string{"--key", walletKeyHex, "--method", "GET", "--url", "https://x.example/", "--ttl", "0s"}, "--ttl must be positive"},
		{"a bad key file is named without its content", []string{"--key-file", badKeyFile, "--method", "GET", "--url", "https://x.example/"}, "not a secp256k1 private key"},
		{"a missing key file is reported", []string{"--key-file", filepath.Join(dir, "none"), "--method", "GET", "--url", "https://x.example/"}, "reading the key file"},
		{"a bad chain is refused", []string{"--key", walletKeyHex, "--method", "GET", "--url", "https://x.example/", "--chain", "solana:x"}, "chain_id"},
		{"a bad contract wallet address is refused", []string{"--key", walletKeyHex, "--method", "GET", "--url", "https://x.example/", "--address", "0x12"}, "--address must be a 0x address"},
		{"a stray argument is refused", []string{"--key", walletKeyHex, "--method", "GET", "--url", "https://x.example/", "extra"}, "unexpected argument"},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(append([]string{"wallet-auth"}, tc.args...), nil, &stdout, &stderr)
			if code != exitTrouble || stdout.Len() != 0 {
				t.Fatalf("exit %d, stdout %q", code, stdout.String())
			}
			if !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("stderr %q lacks %q", stderr.String(), tc.want)
			}
			if strings.Contains(stderr.String(), "SECRETISH") || strings.Contains(stderr.String(), walletKeyHex) {
				t.Error("the key material was echoed")
			}
		})
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"help", "wallet-auth"}, nil, &stdout, &stderr); code != exitValid || !strings.Contains(stdout.String(), "X-Wallet-Auth") {
		t.Errorf("help wallet-auth: exit %d, %q", code, stdout.String())
	}
}
