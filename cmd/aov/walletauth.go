package main

import (
	"crypto/ecdsa"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/aovhq/aov/internal/regfile"
	"github.com/aovhq/aov/walletauth"
)

const walletAuthHelp = `aov wallet-auth: sign an X-Wallet-Auth header for one request.

Usage:
  aov wallet-auth (--key HEX | --key-file FILE) --method METHOD --url URL
                  [--agent-id ID] [--chain CAIP2] [--ttl DURATION] [--statement TEXT]
                  [--address WALLET]

Prints the header value: base64 of a JSON envelope with the EIP-4361
(Sign-In with Ethereum) fields for this request (host, method and path of
URL, a fresh nonce, issued now, expiring after --ttl) signed with the
wallet's key (EIP-191 personal_sign). The gateway accepts it once, for that
method and path only, until it expires.

Flags:
  --key HEX         the wallet's secp256k1 private key, hex (0x optional).
                    Prefer --key-file: a key on the command line is visible
                    to other users of the machine.
  --key-file FILE   a file holding the key as hex: a regular file of at most
                    4 KiB. A file that group or others can read is used
                    with a warning on stderr (chmod 600 it; consider the
                    wallet exposed if others could read it).
  --method METHOD   the request's HTTP method (GET, POST, ...)
  --url URL         the full URL the request goes to (the query is not bound)
  --agent-id ID     bind this agent_id to the wallet (verifierd then counts
                    the agent's verifications as authenticated)
  --chain CAIP2     the wallet's chain (default eip155:8453, Base). On a
                    solana:… chain the key is a Solana wallet's (the
                    solana-keygen JSON array, or base58) and the proof is
                    signed with ed25519 (Sign-In with Solana text)
  --ttl DURATION    how long the proof is valid (default 5m; gateways
                    refuse more than their max_lifetime, 5m by default)
  --statement TEXT  a line of text wallets show when signing
  --address WALLET  sign for a contract wallet (EIP-1271) that the key owns;
                    the gateway must have chain_rpc for the wallet's chain

Example:
  curl -X POST https://verifier.example/verify/schema \
    -H "X-Wallet-Auth: $(aov wallet-auth --key-file wallet.hex --method POST --url https://verifier.example/verify/schema)" \
    -H 'Content-Type: application/json' -d @request.json
`

func walletAuth(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("aov wallet-auth", stderr)
	keyHex := fs.String("key", "", "private key, hex")
	keyFile := fs.String("key-file", "", "file holding the private key as hex")
	method := fs.String("method", "", "HTTP method of the request")
	url := fs.String("url", "", "URL of the request")
	agentID := fs.String("agent-id", "", "agent_id to bind to the wallet")
	chain := fs.String("chain", walletauth.DefaultChainID, "CAIP-2 chain of the wallet")
	ttl := fs.Duration("ttl", walletauth.DefaultMaxLifetime, "lifetime of the proof")
	statement := fs.String("statement", "", "statement wallets show")
	address := fs.String("address", "", "contract wallet the key signs for")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return flagError(err, walletAuthHelp, stdout, stderr)
	}
	if len(pos) != 0 {
		return usageError(stderr, walletAuthHelp, "aov wallet-auth: unexpected argument %q", pos[0])
	}
	if (*keyHex == "") == (*keyFile == "") {
		return usageError(stderr, walletAuthHelp, "aov wallet-auth: give exactly one of --key and --key-file")
	}
	if *method == "" || *url == "" {
		return usageError(stderr, walletAuthHelp, "aov wallet-auth: --method and --url are required")
	}
	if *ttl <= 0 {
		return usageError(stderr, walletAuthHelp, "aov wallet-auth: --ttl must be positive")
	}
	if *address != "" && !common.IsHexAddress(*address) {
		return usageError(stderr, walletAuthHelp, "aov wallet-auth: --address must be a 0x address")
	}
	if walletauth.IsSolanaChain(*chain) {
		return walletAuthSolana(*keyHex, *keyFile, *address, walletauth.Request{
			Method: *method, URL: *url, ChainID: *chain, AgentID: *agentID, Statement: *statement, TTL: *ttl, Now: time.Now(),
		}, stdout, stderr)
	}
	key, err := loadWalletKey(*keyHex, *keyFile, stderr)
	if err != nil {
		return trouble(stderr, "aov wallet-auth: %v", err)
	}
	e, err := walletauth.New(walletauth.Request{
		Method: *method, URL: *url, ChainID: *chain, AgentID: *agentID, Statement: *statement, TTL: *ttl, Now: time.Now(),
	})
	if err != nil {
		return trouble(stderr, "aov wallet-auth: %v", err)
	}
	account := crypto.PubkeyToAddress(key.PublicKey)
	if *address != "" {
		account = common.HexToAddress(*address)
	}
	if err := e.SignAs(key, account); err != nil {
		return trouble(stderr, "aov wallet-auth: %v", err)
	}
	h, err := e.Encode()
	if err != nil {
		return trouble(stderr, "aov wallet-auth: %v", err)
	}
	fmt.Fprintln(stdout, h)
	return exitValid
}

// loadWalletKey reads a secp256k1 key given as hex, inline or in a file.
// Errors never repeat the key material.
func loadWalletKey(inline, file string, stderr io.Writer) (*ecdsa.PrivateKey, error) {
	s := inline
	if file != "" {
		b, err := readKeyFile(file, stderr)
		if err != nil {
			return nil, err
		}
		s = string(b)
	}
	s = strings.TrimPrefix(strings.TrimSpace(s), "0x")
	key, err := crypto.HexToECDSA(s)
	if err != nil {
		return nil, fmt.Errorf("the key is not a secp256k1 private key in hex (64 hex digits)")
	}
	return key, nil
}

// maxKeyFileBytes bounds a --key-file: a key in hex is under 70 bytes and
// a solana-keygen JSON array a few hundred, so anything larger is the wrong
// file.
const maxKeyFileBytes = 4 << 10

// readKeyFile reads a wallet key file (either chain): a regular file (a
// FIFO or a device could block or never end; regfile opens without waiting
// and checks the file opened) of at most maxKeyFileBytes.
// A file others can read is used, with a warning: unlike certd's key
// files, which a daemon would go on signing with unattended, this one is
// read by its owner at the terminal, who can act on the warning, and
// refusing would not undo the exposure.
func readKeyFile(path string, stderr io.Writer) ([]byte, error) {
	f, fi, err := regfile.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading the key file: %w", err)
	}
	defer f.Close()
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		fmt.Fprintf(stderr, "warning: the key file %s has mode %04o and is readable by group or others; restrict it with `chmod 600 %s` (and consider the wallet exposed if others could read it)\n", printable(path), perm, printable(path))
	}
	b, err := regfile.ReadAll(f, maxKeyFileBytes)
	if err != nil {
		return nil, fmt.Errorf("reading the key file: %w", err)
	}
	return b, nil
}
