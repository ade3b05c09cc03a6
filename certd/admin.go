package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/aovhq/aov/keystore"
)

// rotate makes a new current key. On an empty directory it makes the first
// key, which is how an operator creates a production key.
func rotate(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("rotate", stderr)
	dir := keysFlag(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	ks, err := keystore.Open(*dir, keystore.Options{PublicOnly: true})
	if err != nil {
		return err
	}
	prev, prevErr := ks.Current()
	k, err := ks.Rotate()
	if err != nil {
		return err
	}
	if prevErr == nil {
		fmt.Fprintf(stdout, "%s is now the current signing key; %s is retired and stays published for the receipts it signed.\n", k.Version, prev.Version)
	} else {
		fmt.Fprintf(stdout, "%s is now the current signing key.\n", k.Version)
	}
	fmt.Fprintln(stdout, "A running certd picks it up on its next request (or send it SIGHUP).")
	return nil
}

// compromise marks a key compromised from an instant on, or from an earlier
// instant than its mark.
func compromise(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("compromise", stderr)
	dir := keysFlag(fs)
	version := fs.String("version", "", "key version to mark, e.g. k1 (required)")
	since := fs.String("since", "", "RFC 3339 instant from which the key may have been used by others, e.g. 2026-11-29T10:00:00Z (required; the earliest possible leak)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *version == "" || *since == "" {
		return usagef("-version and -since are both required")
	}
	t, err := time.Parse(time.RFC3339Nano, *since)
	if err != nil {
		return usagef("-since %q is not an RFC 3339 time such as 2026-11-29T10:00:00Z", *since)
	}
	ks, err := openExisting(*dir)
	if err != nil {
		return err
	}
	before, _ := ks.Current()
	stands, err := ks.MarkCompromised(*version, t)
	if err != nil {
		return err
	}
	// A mark only moves earlier (see MarkCompromised), so a later -since
	// leaves it where it was; say which instant stands, or the operator
	// believes the receipts in between are now trusted again. The mark
	// comes from MarkCompromised, read under its lock: a Lookup after it
	// could report another process's mark.
	if stands.IsZero() {
		fmt.Fprintf(stdout, "%s was already marked compromised with no start time (none of its receipts is trusted): the mark stays (it only ever moves earlier); nothing was changed.\n", *version)
		return nil
	}
	if stands.Before(t) {
		fmt.Fprintf(stdout, "%s was already marked compromised since %s, earlier than -since %s: the mark stays (it only ever moves earlier); nothing was changed.\n", *version, stands.UTC().Format(time.RFC3339Nano), t.UTC().Format(time.RFC3339Nano))
		return nil
	}
	fmt.Fprintf(stdout, "%s is marked compromised since %s: verifiers reject its receipts dated from then on.\n", *version, t.UTC().Format(time.RFC3339Nano))
	if after, err := ks.Current(); err == nil && after.Version != before.Version {
		fmt.Fprintf(stdout, "%s was the current key, so %s is now the current signing key.\n", before.Version, after.Version)
	}
	return nil
}

// openExisting opens a key directory that must already exist, so a typo
// in -keys is reported instead of creating an empty directory. Operator
// commands never read private keys (PublicOnly): marking a key compromised
// must work precisely when its file's mode is wrong.
func openExisting(dir string) (*keystore.Store, error) {
	if err := existingDir(dir); err != nil {
		return nil, err
	}
	return keystore.Open(dir, keystore.Options{PublicOnly: true})
}

// existingDir refuses a key directory that does not exist, rather than
// let opening it create an empty one.
func existingDir(dir string) error {
	if _, err := os.Stat(dir); err != nil {
		return fmt.Errorf("key directory: %w", err)
	}
	return nil
}

// keyRow is one key in `certd keys -json`.
type keyRow struct {
	KeyVersion       string `json:"key_version"`
	Status           string `json:"status"`
	PublicKey        string `json:"public_key"`
	CreatedAt        string `json:"created_at"`
	RetiredAt        string `json:"retired_at,omitempty"`
	CompromisedSince string `json:"compromised_since,omitempty"`
}

// listKeys prints every key version ever used, each with the status the
// card of a certd started now on this host gives it. It opens the directory
// as certd serve does (keystore.OpenSigner), so it reads the private keys
// that may still sign, as the user it runs as: whether they load is part
// of the verdict (certd signs nothing while one does not). What only a
// running certd knows (a key it forgot before its clock went back) its
// /health says.
func listKeys(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("keys", stderr)
	dir := keysFlag(fs)
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := existingDir(*dir); err != nil {
		return err
	}
	ks, err := keystore.OpenSigner(*dir, nil)
	if err != nil {
		return err
	}
	defer ks.Close()
	rows := []keyRow{}
	keys := ks.List()
	statuses := ks.Statuses(keys) // by this host's clock, as certd serve's card
	if _, err := ks.Current(); err != nil && len(keys) > 0 {
		// Why no key is current, with the fix, as certd logs it at start.
		fmt.Fprintf(stderr, "certd keys: a certd started now signs nothing: %v\n", err)
	}
	for i, k := range keys {
		rows = append(rows, keyRow{
			KeyVersion:       k.Version,
			Status:           statuses[i],
			PublicKey:        base64.StdEncoding.EncodeToString(k.Public),
			CreatedAt:        stamp(k.CreatedAt),
			RetiredAt:        stamp(k.RetiredAt),
			CompromisedSince: stamp(k.CompromisedSince),
		})
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	if len(rows) == 0 {
		fmt.Fprintf(stdout, "no keys in %s (create one with: certd rotate -keys %s)\n", *dir, *dir)
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VERSION\tSTATUS\tCREATED\tRETIRED\tCOMPROMISED SINCE\tPUBLIC KEY (base64)")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.KeyVersion, r.Status, r.CreatedAt, dash(r.RetiredAt), dash(r.CompromisedSince), r.PublicKey)
	}
	return tw.Flush()
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
