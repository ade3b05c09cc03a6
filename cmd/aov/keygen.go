package main

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
)

const keygenHelp = `aov keygen: make a new Ed25519 signing key pair.

Usage:
  aov keygen [--out DIR] [--version LABEL]

Writes two files into DIR (default: the current directory):
  LABEL.key   the private key, PKCS#8 PEM, file mode 0600. Keep it secret:
              whoever holds it can sign receipts in your name.
  LABEL.pub   the public key, base64 of its 32 raw bytes, the form agent
              cards publish and "aov receipt verify --public-key" takes.
and prints the public key (base64) on standard output.

LABEL is the key version receipts will name in key_version (default k1):
letters, digits, '.', '_' and '-', at most 64 characters. Existing files are
never overwritten.

Examples:
  aov keygen --out keys --version k1
  aov receipt verify --public-key "$(cat keys/k1.pub)" receipt.json
`

var keyLabel = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

func keygen(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("aov keygen", stderr)
	out := fs.String("out", ".", "directory to write the key files into")
	version := fs.String("version", "k1", "key version label")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return flagError(err, keygenHelp, stdout, stderr)
	}
	if len(pos) != 0 {
		return usageError(stderr, keygenHelp, "aov keygen: unexpected argument %q", pos[0])
	}
	if !keyLabel.MatchString(*version) || *version == "." || *version == ".." {
		return usageError(stderr, keygenHelp, "aov keygen: --version must be 1 to 64 letters, digits, '.', '_' or '-'")
	}
	pub, err := writeKeyPair(*out, *version)
	if err != nil {
		return trouble(stderr, "%v", err)
	}
	b64 := base64.StdEncoding.EncodeToString(pub)
	fmt.Fprintln(stdout, b64)
	fmt.Fprintf(stderr, "wrote %s (private, keep it secret) and %s\n",
		filepath.Join(*out, *version+".key"), filepath.Join(*out, *version+".pub"))
	return exitValid
}

// writeKeyPair generates a key and writes LABEL.key (0600) and LABEL.pub,
// refusing to replace either file. The private file is created exclusively
// with its final mode, so it is never readable by others, not even briefly.
func writeKeyPair(dir, version string) (ed25519.PublicKey, error) {
	privPath := filepath.Join(dir, version+".key")
	pubPath := filepath.Join(dir, version+".pub")
	for _, p := range []string{privPath, pubPath} {
		if _, err := os.Lstat(p); err == nil {
			return nil, fmt.Errorf("%s already exists; refusing to overwrite a key (choose another --version or --out)", p)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating %s: %w", dir, err)
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, fmt.Errorf("encoding private key: %w", err)
	}
	privPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	if err := writeNew(privPath, privPEM, 0o600); err != nil {
		return nil, err
	}
	if err := writeNew(pubPath, []byte(base64.StdEncoding.EncodeToString(pub)+"\n"), 0o644); err != nil {
		os.Remove(privPath)
		return nil, err
	}
	return pub, nil
}

// writeNew creates path (failing if it exists), writes data and syncs it.
func writeNew(path string, data []byte, perm os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return fmt.Errorf("creating %s: %w", path, err)
	}
	// The umask can only narrow the mode; set it exactly so the public file
	// is readable as documented.
	if err := f.Chmod(perm); err != nil {
		f.Close()
		os.Remove(path)
		return fmt.Errorf("setting mode of %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(path)
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(path)
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return f.Close()
}
