package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// Exit statuses. Scripts depend on them: 1 means "checked and it does not
// hold", never "could not check".
const (
	exitValid   = 0
	exitInvalid = 1
	exitTrouble = 2
)

const mainHelp = `aov: check Agent Output Verifier receipts and make signing keys.

Usage:
  aov receipt verify [flags] RECEIPT_FILE|-   check a signed receipt offline
  aov keygen [--out DIR] [--version LABEL]    make a new Ed25519 key pair
  aov wallet-auth --key-file F --method M --url U
                                              sign an X-Wallet-Auth header
  aov help [COMMAND]                          show help (also: COMMAND -h)

A receipt is the JSON response of /verify/schema, /verify/deliverable or
/score/{agent_id}: it carries an "attestation" signed with Ed25519 over the
RFC 8785 canonical form of the response. Anyone can check it with the
service's public key, published in its agent card.

Examples:
  aov receipt verify --card https://verifier.example/.well-known/agent-card.json receipt.json
  aov receipt verify --card agent-card.json --request request.json receipt.json
  curl -s https://verifier.example/verify/schema -H 'Content-Type: application/json' \
    -d @request.json | aov receipt verify --public-key "$(cat keys/k1.pub)" -

Run "aov receipt verify -h" or "aov keygen -h" for the flags.
`

// run is the whole command, with its streams passed in so tests run it
// in-process. It returns the exit status.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, mainHelp)
		return exitTrouble
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		return help(args[1:], stdout, stderr)
	case "receipt":
		if len(args) < 2 {
			fmt.Fprint(stderr, "aov receipt: missing subcommand (verify)\n\n"+receiptVerifyHelp)
			return exitTrouble
		}
		switch args[1] {
		case "verify":
			return receiptVerify(args[2:], stdin, stdout, stderr)
		case "help", "-h", "-help", "--help":
			fmt.Fprint(stdout, receiptVerifyHelp)
			return exitValid
		}
		fmt.Fprintf(stderr, "aov receipt: unknown subcommand %q (want verify)\n", args[1])
		return exitTrouble
	case "keygen":
		return keygen(args[1:], stdout, stderr)
	case "wallet-auth":
		return walletAuth(args[1:], stdout, stderr)
	}
	fmt.Fprintf(stderr, "aov: unknown command %q\n\n%s", args[0], mainHelp)
	return exitTrouble
}

func help(topic []string, stdout, stderr io.Writer) int {
	switch strings.Join(topic, " ") {
	case "":
		fmt.Fprint(stdout, mainHelp)
	case "receipt", "receipt verify", "verify":
		fmt.Fprint(stdout, receiptVerifyHelp)
	case "keygen":
		fmt.Fprint(stdout, keygenHelp)
	case "wallet-auth":
		fmt.Fprint(stdout, walletAuthHelp)
	default:
		fmt.Fprintf(stderr, "aov help: no help for %q\n\n%s", strings.Join(topic, " "), mainHelp)
		return exitTrouble
	}
	return exitValid
}

// parseInterspersed parses flags that may come before or after the
// positional arguments ("aov receipt verify r.json --card c.json" works),
// which the flag package alone stops at the first positional.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// newFlagSet makes a flag set that reports errors instead of exiting; the
// caller prints help (see flagError).
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {}
	return fs
}

// flagError turns a flag parsing error into an exit status: -h is help on
// stdout and success; anything else was already named by the flag package
// on stderr and gets the usage text after it.
func flagError(err error, usage string, stdout, stderr io.Writer) int {
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, usage)
		return exitValid
	}
	fmt.Fprint(stderr, "\n"+usage)
	return exitTrouble
}

// usageError reports a usage mistake with the command's help.
func usageError(stderr io.Writer, usage, format string, args ...any) int {
	fmt.Fprintf(stderr, format+"\n\n", args...)
	fmt.Fprint(stderr, usage)
	return exitTrouble
}
