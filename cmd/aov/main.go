// Command aov is the command-line tool for people: check a signed receipt
// offline against an agent card or a bare public key, and generate an
// Ed25519 key pair.
//
//	aov receipt verify --card https://verifier.example/.well-known/agent-card.json receipt.json
//	aov receipt verify --public-key BASE64 --request request.json receipt.json
//	aov keygen --out keys --version k1
//
// The checks themselves live in package receipt; this command reads files
// and flags and reports. Exit status: 0 valid, 1 invalid, 2 could not check
// (usage error, unreadable file, unreachable card).
package main

import "os"

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
