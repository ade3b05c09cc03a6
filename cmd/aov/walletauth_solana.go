package main

import (
	"fmt"
	"io"

	"github.com/aovhq/aov/plugins/svmfacilitator"
	"github.com/aovhq/aov/walletauth"
)

// walletAuthSolana signs an X-Wallet-Auth header with a Solana wallet's
// key (ed25519 over the Sign-In with Solana text). The key is read as
// solana-keygen writes it (a JSON array of 64 bytes) or as base58; errors
// never repeat it.
func walletAuthSolana(inline, file, address string, req walletauth.Request, stdout, stderr io.Writer) int {
	if address != "" {
		return usageError(stderr, walletAuthHelp, "aov wallet-auth: --address (a contract wallet) is for EVM chains only")
	}
	text := inline
	if file != "" {
		b, err := readKeyFile(file, stderr)
		if err != nil {
			return trouble(stderr, "aov wallet-auth: %v", err)
		}
		text = string(b)
	}
	key, err := svmfacilitator.ParseKey(text)
	if err != nil {
		return trouble(stderr, "aov wallet-auth: %v", err)
	}
	e, err := walletauth.New(req)
	if err != nil {
		return trouble(stderr, "aov wallet-auth: %v", err)
	}
	if err := e.SignSolana(key); err != nil {
		return trouble(stderr, "aov wallet-auth: %v", err)
	}
	h, err := e.Encode()
	if err != nil {
		return trouble(stderr, "aov wallet-auth: %v", err)
	}
	fmt.Fprintln(stdout, h)
	return exitValid
}
