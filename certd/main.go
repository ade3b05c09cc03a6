// Command certd is the signing daemon: it alone holds the service's Ed25519
// private keys, signs receipts for verifierd over a private socket, keeps
// every key version it ever used, and publishes the agent card.
//
//	certd serve     run the daemon
//	certd rotate    make a new current key (the old ones stay published)
//	certd compromise -version k1 -since 2026-11-29T10:00:00Z
//	                mark a key compromised from an instant on
//	certd keys      list every key version
//
// The operator commands work on the key directory directly and may run while
// certd serves: a running certd notices the change on its next request (it
// checks the key index before every signature and card build) or at once on
// SIGHUP.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `certd: the signing daemon (Ed25519 receipts, key history, agent card)

Usage:
  certd serve [flags]         run the daemon
  certd rotate -keys DIR      make a new current key; the previous one is retired
  certd compromise -keys DIR -version kN -since RFC3339
                              mark a key compromised from an instant on
  certd keys -keys DIR        list every key version ever used

Run "certd <command> -h" for the flags of a command.
`

// run dispatches a subcommand and returns the exit code: 0 success, 1
// failure, 2 bad usage.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "serve":
		err = serve(args[1:], stderr)
	case "rotate":
		err = rotate(args[1:], stdout, stderr)
	case "compromise":
		err = compromise(args[1:], stdout, stderr)
	case "keys":
		err = listKeys(args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "certd: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, new(usageError)):
		fmt.Fprintf(stderr, "certd %s: %v\n", args[0], err)
		return 2
	default:
		fmt.Fprintf(stderr, "certd %s: %v\n", args[0], err)
		return 1
	}
}

// usageError is a mistake in the command line rather than a failure.
type usageError struct{ error }

func usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

// env returns the value of an environment variable or a default, so every
// flag can also be set the way container deployments prefer.
func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

func envBool(name string) bool {
	switch os.Getenv(name) {
	case "1", "true", "TRUE", "yes":
		return true
	}
	return false
}

// flagSet reports whether the command line gave flag name.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// newFlags returns a flag set that reports errors instead of exiting.
func newFlags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("certd "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// parse parses flags and refuses stray arguments.
func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	return nil
}

const defaultKeysDir = "./data/keys"

func keysFlag(fs *flag.FlagSet) *string {
	return fs.String("keys", env("CERTD_KEYS", defaultKeysDir), "key directory (env CERTD_KEYS)")
}
