package signer

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/keystore"
	"github.com/aovhq/aov/receipt"
)

// Local is the signing protocol without the protocol: verifierd signs in
// its own process with the current key of the key directory certd manages,
// for one-machine installs where both run as the same user anyway (that
// user can read the 0600 key files, so the socket isolates nothing there).
// It saves the round trip to certd on every verification: two HTTP stacks,
// the canonical re-check of the signing input, and the scheduling between
// three processes on a small machine.
//
// certd stays the keys' owner: it generates and rotates them and publishes
// every version in the agent card. Local only reads the directory. Like
// certd it re-checks the key index before every signature, so a `certd
// rotate` takes effect on the next verification, and a response built for
// the previous key gets *StaleKeyError and is rebuilt, exactly as over the
// socket. It watches the directory (keystore.Options.Watch): the re-check
// is a look for a change the kernel reported, not a stat of the index.
//
// The trade-off: the current private key then lives in the process that
// parses untrusted schemas and documents (only that one: Local opens the
// directory with keystore.Options.CurrentOnly, so it never reads a retired
// key and forgets a key once it is rotated away). Someone who takes over verifierd through certd's socket
// can have documents signed only while they are in, dated within certd's
// clock skew, so marking the key compromised from the intrusion on is
// enough. Someone who takes over a verifierd that holds the key can carry
// it away and sign receipts dated whenever they like, so the key must be
// marked compromised from its creation, and every receipt it ever signed is
// then refused. Where verifierd runs exposed or under another user than
// certd, use certd's socket (the default).
type Local struct {
	keys *keystore.Store
	log  *slog.Logger
}

// NewLocal opens the key directory dir for signing in process. The
// directory must exist (certd creates it); it may still be empty, in which
// case every signature is a retryable 503 until certd has made the first
// key. A private key file readable by group or others is refused, as certd
// refuses it.
func NewLocal(dir string, log *slog.Logger) (*Local, error) { return newLocal(dir, nil, log) }

// newLocal is NewLocal on the clock now (nil: the system clock), for tests
// that step it.
func newLocal(dir string, now func() time.Time, log *slog.Logger) (*Local, error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("in-process signer: key directory: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("in-process signer: %s is not a directory", dir)
	}
	keys, err := keystore.OpenSigner(dir, now)
	if err != nil {
		return nil, fmt.Errorf("in-process signer: %w", err)
	}
	// verifierd serves no card, so unlike certd it has nothing to publish
	// while a key file does not load: it does not start.
	if _, err := keys.Current(); err != nil {
		if kf, ok := errors.AsType[*keystore.KeyFileError](err); ok {
			keys.Close()
			return nil, fmt.Errorf("in-process signer: %w", kf)
		}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Local{keys: keys, log: log}, nil
}

// CurrentKey reports the current key version as of the last signature
// (the directory is re-read only when no key is loaded yet): Sign checks
// the index anyway, and a response built for a key rotated away meanwhile
// gets *StaleKeyError, as from a Client whose cache is behind. This saves
// a second check of the index per verification.
func (l *Local) CurrentKey(context.Context) (string, error) {
	if k, err := l.keys.Current(); err == nil {
		return k.Version, nil
	}
	k, err := l.current(false, "", time.Time{})
	if err != nil {
		return "", err
	}
	return k.Version, nil
}

// Reload re-reads the key directory now, as certd does on SIGHUP
// (verifierd calls it on SIGHUP), and reports the key in service after it
// ("" if none is) and how many versions the directory holds. Signatures
// re-read the directory only when it changed, so this is what loads a key
// it did not change for: after this host's clock went back behind a
// retirement, the retired key is in service again but its private key was
// forgotten, and signing waits for it. A directory that does not load
// stops signing until it does, as a failed refresh does.
func (l *Local) Reload() (current string, versions int, err error) {
	if err := l.keys.Reload(); err != nil {
		return "", 0, err
	}
	k, _ := l.keys.Current()
	return k.Version, len(l.keys.List()), nil
}

// Close releases the watch of the key directory. A closed Local still
// signs, with a stat of the key index before every signature.
func (l *Local) Close() error { return l.keys.Close() }

// Sign signs response under signContext at attestedAt with the current key,
// which must be keyVersion (*StaleKeyError otherwise, naming the current
// one). Errors are those of Client.Sign: 503 without a usable key, 500 for
// a request certd would refuse (a context not of this service, an
// attested_at not in RFC 3339 form, a response that is not a JSON object,
// already carries an attestation, or states a time verifiers refuse:
// receipt.SigningDocument.CheckTimes, as certd runs it).
func (l *Local) Sign(_ context.Context, signContext, keyVersion, attestedAt string, response []byte) (receipt.Attestation, error) {
	buf := inputs.Get().(*[]byte)
	defer putInput(buf)
	canon, err := receipt.AppendCanonicalJSON((*buf)[:0], response)
	if err != nil {
		return receipt.Attestation{}, apierr.Internal(fmt.Errorf("building the signing input: response: %w", err))
	}
	*buf = canon[:0]
	return l.sign(signContext, keyVersion, attestedAt, canon)
}

// SignCanonical is Sign for a response already in RFC 8785 form (see
// receipt.SigningInputCanonical): the signing input is assembled around it
// without canonicalizing it again.
func (l *Local) SignCanonical(_ context.Context, signContext, keyVersion, attestedAt string, canonResponse []byte) (receipt.Attestation, error) {
	return l.sign(signContext, keyVersion, attestedAt, canonResponse)
}

// inputs holds signing inputs (a response of a few kilobytes in its
// five-member document) and canonical responses from one signature to the
// next: nothing keeps one once it is signed.
var inputs = sync.Pool{New: func() any { b := make([]byte, 0, 8<<10); return &b }}

// maxPooledInput is the largest buffer kept for reuse.
const maxPooledInput = 256 << 10

// putInput returns buf to inputs unless it grew too large to keep.
func putInput(buf *[]byte) {
	if cap(*buf) <= maxPooledInput {
		inputs.Put(buf)
	}
}

// sign signs canonResponse, in RFC 8785 form, after the checks certd makes
// of a signing input it is sent, so the in-process signer signs nothing
// certd would refuse.
func (l *Local) sign(signContext, keyVersion, attestedAt string, canonResponse []byte) (receipt.Attestation, error) {
	if signContext != receipt.ContextVerify && signContext != receipt.ContextScore {
		return receipt.Attestation{}, apierr.Internal(fmt.Errorf("in-process signer: %q is not a signing context of this service", signContext))
	}
	at, err := receipt.ParseTime(attestedAt)
	if err != nil {
		return receipt.Attestation{}, apierr.Internal(fmt.Errorf("in-process signer: attested_at is not an RFC 3339 time: %w", err))
	}
	doc := receipt.SigningDocument{Context: signContext, KeyVersion: keyVersion, AttestedAt: attestedAt, Response: canonResponse}
	if err := doc.CheckTimes(); err != nil {
		return receipt.Attestation{}, apierr.Internal(fmt.Errorf("in-process signer: %w", err))
	}
	k, err := l.current(false, keyVersion, at)
	if err != nil {
		return receipt.Attestation{}, err
	}
	if k.Version != keyVersion {
		return receipt.Attestation{}, &StaleKeyError{Current: k.Version}
	}
	buf := inputs.Get().(*[]byte)
	defer putInput(buf)
	msg, err := receipt.AppendSigningInputCanonical((*buf)[:0], signContext, keyVersion, attestedAt, canonResponse)
	if err != nil {
		return receipt.Attestation{}, apierr.Internal(fmt.Errorf("building the signing input: %w", err))
	}
	*buf = msg[:0]
	return receipt.Attestation{
		Algorithm:  receipt.Algorithm,
		KeyVersion: keyVersion,
		Timestamp:  attestedAt,
		Signature:  base64.StdEncoding.EncodeToString(ed25519.Sign(k.Private, msg)),
	}, nil
}

// Ping reports whether a signing key is loaded. It answers verifierd's
// /health, which anyone may ask: a key directory that does not load is
// retried at most once per keystore.RetryEvery for it.
func (l *Local) Ping(context.Context) error {
	_, err := l.current(true, "", time.Time{})
	return err
}

// current is currentKey as a retryable 503.
func (l *Local) current(anonymous bool, keyVersion string, at time.Time) (keystore.Key, error) {
	k, err := currentKey(l.keys, l.log, anonymous, keyVersion, at)
	if err != nil {
		if errors.Is(err, keystore.ErrNoKey) {
			err = fmt.Errorf("%w (certd makes the first key)", err)
		}
		return keystore.Key{}, apierr.Unavailable("signing key", 5, err)
	}
	return k, nil
}

// currentKey refreshes keys (a rotation by `certd rotate` shows up on the
// next call) and returns the key in service now, recorded as signing a
// receipt dated at when it is keyVersion (keystore.Store.Choose; "" for a
// look that signs nothing). A request anyone may send (anonymous: a health
// check) refreshes with keystore.Store.RefreshLimited, so it cannot make
// the process re-read a key directory that does not load on every call.
// A refresh that fails leaves no key in service: the index it could not
// load may be a `certd compromise` whose new key file this process cannot
// read, and the key loaded before is then exactly the one that must not
// sign. So signing answers 503 until the directory loads. The cause is
// logged once per change (keystore.Store.StateChanged), and again when
// signing resumes, not once per request. certd's handler and Local both
// sign with what it returns.
func currentKey(keys *keystore.Store, log *slog.Logger, anonymous bool, keyVersion string, at time.Time) (keystore.Key, error) {
	var changed bool
	if anonymous {
		changed, _ = keys.RefreshLimited() // a failure is Choose's error
	} else {
		changed, _ = keys.Refresh()
	}
	k, err := keys.Choose(keyVersion, at)
	switch news := keys.StateChanged(err); {
	case err != nil && news:
		log.Error("not signing until a key is in service", "error", err)
	case err == nil && (changed || news):
		log.Info("signing", "current_key_version", k.Version, "versions", len(keys.List()))
	}
	return k, err
}
