// Package keystore keeps certd's Ed25519 signing keys on disk: one private key
// file per key version, and an index of every version ever used with its
// creation, retirement and compromise times.
//
// It is for the signing daemon (and the operator commands that rotate or mark
// keys) and for verifierd's in-process signer (signer.Local, which only
// reads): nothing else in the product reads a private key. It is not a
// general secret store and does not encrypt keys at rest; the protection is
// the file mode (0600, enforced on load) and the host.
//
// Layout of a key directory:
//
//	index.json   every key version in creation order (public key, times)
//	k1.key       PKCS#8 PEM private key of version k1, mode 0600
//	k2.key       ...
//	.lock        advisory lock serialising writers across processes
//
// Every write is a temp file in the same directory, fsynced, renamed over the
// target, then the directory is fsynced, so a crash leaves either the old or
// the new state, never half a key. A new key file is always written before
// the index that names it; a key file the index does not name is ignored on
// load, and a new key never takes its name (see addKey).
package keystore

import (
	"bytes"
	"cmp"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/aovhq/aov/internal/regfile"
	"github.com/aovhq/aov/receipt"
)

// Key statuses, as published in the agent card.
const (
	StatusCurrent     = "current"
	StatusRetired     = "retired"
	StatusCompromised = "compromised"
	// StatusPending is a key not in service yet: its created_at has not
	// come by the clock that describes it, or it is the key in service by
	// the history but certd cannot sign with it (see Store.Statuses).
	StatusPending = "pending"
)

// IndexFile is the name of the index inside a key directory.
const IndexFile = "index.json"

// indexFormat tags the index so a future layout can be told apart.
const indexFormat = "aov-keystore/v1"

// ErrNoKey reports a key directory that holds no key yet. certd's dev mode
// answers it by generating the first key; production start-up refuses.
var ErrNoKey = errors.New("the key directory holds no signing key")

// ErrKeysExist reports an attempt to generate a first key where keys exist;
// a new key next to existing ones is a rotation.
var ErrKeysExist = errors.New("the key directory already holds keys; use rotate to add a new one")

// Key is one key version. Private is nil in a Store opened PublicOnly, for
// the keys CurrentOnly does not read, and for a key whose file could not be
// loaded (Current then refuses, see Store.Current and KeyFileError).
type Key struct {
	Version   string
	Private   ed25519.PrivateKey
	Public    ed25519.PublicKey
	CreatedAt time.Time
	RetiredAt time.Time // zero while the key is current
	// Compromised is whether the key was marked compromised, and
	// CompromisedSince the instant of the mark. The mark is told by
	// Compromised, not by a non-zero time: a zero time stored by a
	// MarkCompromised that did not refuse it yet means compromised from the
	// start (the card then publishes no compromisedSince, and verifiers
	// trust none of the key's receipts), never "not compromised".
	Compromised      bool
	CompromisedSince time.Time
}

// Statuses reports how keys (a key history, oldest first) stand at now by
// the history alone: by the rule that chooses the key that signs
// (InService), the key in service being current. It cannot know whether a
// signer can sign with that key; the agent card and `certd keys` use
// Store.Statuses, which does.
func Statuses(keys []Key, now time.Time) []string {
	in, err := InService(keys, now)
	if err != nil {
		return statuses(keys, now, "", false)
	}
	return statuses(keys, now, in.Version, true)
}

// Statuses reports how the agent card and `certd keys` describe each of
// keys (List) at this store's clock: by the choice Current makes, so the
// card never names as current a key this store does not sign with at that
// instant. While it signs nothing (a key directory that does not load, a
// private key file that does not, key files newer than the index, a clock
// that went back behind a key it forgot: see Choose), no key is current,
// and the key in service by the history is pending: it becomes current
// when it can sign. Only a store that signs can tell (OpenSigner); one
// opened PublicOnly describes the keys by the history alone, as the
// package's Statuses.
func (s *Store) Statuses(keys []Key) []string {
	k, now, err := s.choose("", time.Time{})
	in, inErr := InService(keys, now)
	if inErr != nil {
		return statuses(keys, now, "", false)
	}
	return statuses(keys, now, in.Version, err == nil && k.Version == in.Version)
}

// statuses is the one description of each of keys at now given the key in
// service by the history (in, "" for none) and whether it signs.
// Compromised wins over everything, so a verifier learns to distrust the
// key; the key in service is current if it signs, pending if not; one
// whose created_at is still ahead (a rotation dated by a clock ahead of
// now) is pending; any other is retired (its retired_at has come, or a
// newer key is in service).
func statuses(keys []Key, now time.Time, in string, signs bool) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		switch {
		case k.Compromised:
			out[i] = StatusCompromised
		case k.Version == in && signs:
			out[i] = StatusCurrent
		case k.Version == in || k.CreatedAt.After(now):
			out[i] = StatusPending
		default:
			out[i] = StatusRetired
		}
	}
	return out
}

// Options tune a Store. The zero value is the production setting.
type Options struct {
	// Now is the clock for created_at and retired_at; tests move it.
	Now func() time.Time
	// PublicOnly opens the directory without reading any private key file:
	// for operator commands that change the index (rotate, mark
	// compromised), so they work even on a key file whose mode certd
	// refuses, which is exactly when an operator needs them. Keys then have
	// a nil Private.
	PublicOnly bool
	// CurrentOnly reads the private keys of the keys that may still sign
	// alone (not compromised, not retired by this clock: a key retired in
	// its future is still in service, see Current): the other keys have a
	// nil Private, and a key is forgotten once its retirement has come by
	// this clock. For a process that only ever signs
	// with the current key and parses untrusted input (verifierd's
	// in-process signer): whoever takes it over cannot sign with a retired
	// key, whose receipts verifiers still accept.
	CurrentOnly bool
	// Watch has the kernel report changes to the directory (inotify, on
	// Linux), so that a Refresh that finds none costs no stat of the index;
	// a change made by any process is still seen by the next Refresh after
	// it (see watch). For a process that refreshes before every signature.
	// Where the directory cannot be watched (another system, a network file
	// system whose other clients the kernel does not hear from, a path
	// through a symbolic link, which can be re-pointed without an event)
	// every Refresh stats, as without it. Close ends the watch.
	Watch bool
}

// Store is an open key directory. It is safe for concurrent use; writers
// are also serialised across processes by an advisory lock, so `certd
// rotate` can run while `certd serve` reads the same directory.
type Store struct {
	dir         string
	now         func() time.Time
	publicOnly  bool
	currentOnly bool

	mu   sync.RWMutex
	keys []Key       // creation order
	seen fs.FileInfo // index file as last loaded, to notice changes
	// broken is why the index on disk is not fully loaded (a reload after
	// a change failed); nil when it is. While it is set, Current refuses
	// and every Refresh tries again. See reloadLocked.
	broken error
	// checkNewer is whether a load still looks for key files newer than
	// the index (see NewerKeyFilesError): set by Open for a store that
	// signs, cleared by the first load that finds a non-empty index and
	// none, so a rotation's key file, written just before its index, never
	// stops a running process.
	checkNewer bool

	// signed is, per key version, the newest attested_at this process
	// signed with it (see Choose), so checkGrowth refuses a retirement
	// that would make a delivered receipt fail to verify.
	signedMu sync.Mutex
	signed   map[string]time.Time

	// retried is when RefreshLimited last refreshed (see there).
	retryMu sync.Mutex
	retried time.Time

	// state is the cause of the not-signing state last reported by
	// StateChanged, "" while signing.
	stateMu sync.Mutex
	state   string

	watch *watch // nil: Refresh stats the index every time
}

// statIndex is Refresh's stat of the index; tests count its calls.
var statIndex = os.Stat

// indexEntry is one key in index.json. Times are RFC 3339 UTC strings so the
// file reads well and the card copies them verbatim.
type indexEntry struct {
	Version          string `json:"key_version"`
	Algorithm        string `json:"algorithm"`
	PublicKey        string `json:"public_key"`
	CreatedAt        string `json:"created_at"`
	RetiredAt        string `json:"retired_at,omitempty"`
	CompromisedSince string `json:"compromised_since,omitempty"`
}

type index struct {
	Format string       `json:"format"`
	Keys   []indexEntry `json:"keys"`
}

// Open opens the key directory dir, creating it (mode 0700) when missing,
// and loads every key the index names. An empty directory opens fine and
// Current reports ErrNoKey. A private key file readable by group or others
// is refused: a key that may have leaked must not sign. A key file that
// fails so leaves the history loaded and nothing signing (KeyFileError);
// an index that cannot be read makes Open fail.
func Open(dir string, opts Options) (*Store, error) {
	if dir == "" {
		return nil, errors.New("opening key directory: no directory given")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating key directory: %w", err)
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	// Microseconds, like every timestamp of a receipt: enough to order a
	// compromise against receipts, and readable.
	s := &Store{dir: dir, publicOnly: opts.PublicOnly, currentOnly: opts.CurrentOnly, checkNewer: !opts.PublicOnly, signed: map[string]time.Time{}, now: func() time.Time { return now().UTC().Truncate(time.Microsecond) }}
	if opts.Watch {
		// Before the first load: a change from then on is an event.
		s.attachWatch()
	}
	// A key file that fails to load, or key files newer than the index,
	// open all the same, with signing stopped (Current says why): the
	// history the index holds is read, and the card must still publish it
	// (a compromise mark above all).
	var newer *NewerKeyFilesError
	var keyFile *KeyFileError
	if err := s.Reload(); err != nil && !errors.As(err, &newer) && !errors.As(err, &keyFile) {
		s.Close()
		return nil, err
	}
	return s, nil
}

// OpenSigner opens dir as a process that signs from it does (certd serve,
// verifierd's in-process signer), with now as its clock (nil: the
// system's): it reads the private key of every key that may still sign
// (CurrentOnly), looks for key files newer than the index, and watches the
// directory. Current then says whether such a process started now signs,
// and with which key, and Statuses how its card describes each key.
// `certd keys` opens the directory so too, so that it reaches its verdict
// by the very checks certd's start makes, not by a copy of them; what it
// cannot know is what only a running process holds (a private key it
// forgot before its clock went back, the receipts it signed: see Choose).
func OpenSigner(dir string, now func() time.Time) (*Store, error) {
	return Open(dir, Options{Now: now, CurrentOnly: true, Watch: true})
}

// Dir reports the key directory.
func (s *Store) Dir() string { return s.dir }

// Current reports the key in service now by this process's clock: the
// newest key, not marked compromised, whose published window (created_at up
// to retired_at) holds now. The window, not the index's order, decides:
// a rotation run on a clock ahead of this one publishes a new key whose
// created_at is still in this clock's future, and a receipt it signed now
// would be dated before that key existed, which verifiers refuse; so the
// key before it signs until its retired_at arrives here. Every receipt is
// then dated (attested_at, within the signer's skew of this clock, itself
// at most receipt.MaxSigningSkew) inside its key's window as verifiers
// widen it.
//
// It is ErrNoKey when no key can ever sign (none, or every one retired or
// compromised: a compromise whose replacement was refused), a
// *NotInServiceError when a key is due but its window has not begun by
// this clock, and an error naming the cause while the index on disk cannot
// be fully loaded: the key the process holds may be the one that index
// retires or marks compromised, and SPEC §5 has no receipt signed by a
// retired key. Signing stops until a Refresh or Reload succeeds.
func (s *Store) Current() (Key, error) { return s.Choose("", time.Time{}) }

// Choose is Current for a signature: when the key in service is version
// (a private key loaded), it records, before the caller signs, that a
// receipt dated at is signed with it. The choice and the record are one
// step as far as a reload is concerned (both under the read lock a reload
// waits for): a reload runs either before, and the key chosen is the one
// its index puts in service, or after, and it sees the record and refuses
// to retire the key before the receipt (see checkGrowth). Recorded after
// the signature instead, a reload between the choice and the record would
// accept a retirement dated before a receipt then delivered, which
// verifiers refuse. A record whose signature is never delivered only makes
// that refusal stricter. The record lives in the process alone: a restart,
// or another process signing with the same directory, does not know it. A
// version "" records nothing (Current).
func (s *Store) Choose(version string, at time.Time) (Key, error) {
	k, _, err := s.choose(version, at)
	return k, err
}

// choose is Choose, also reporting the instant of this store's clock the
// choice was made at (Statuses describes the keys at it).
//
// The clock is read under the read lock, which every change of the keys
// held (a reload, forgetRetired) takes for writing: a reading taken before
// the lock could be older than the one with which another signature chose
// the next key and forgot this one's private key, and would then find the
// key in service by it forgotten, as if the clock had gone back.
func (s *Store) choose(version string, at time.Time) (Key, time.Time, error) {
	s.mu.RLock()
	now := s.now()
	if s.broken != nil {
		defer s.mu.RUnlock()
		return Key{}, now, fmt.Errorf("no key signs until the key directory loads again: %w", s.broken)
	}
	k, err := InService(s.keys, now)
	if err == nil && version != "" && k.Version == version && k.Private != nil {
		s.signedMu.Lock()
		if at.After(s.signed[version]) {
			s.signed[version] = at
		}
		s.signedMu.Unlock()
	}
	stale := s.currentOnly && holdsRetired(s.keys, now)
	s.mu.RUnlock()
	if stale {
		s.forgetRetired(now)
	}
	if err == nil && k.Private == nil && !s.publicOnly {
		// Loaded public only: its window began after the last load by a
		// clock that has since gone back. Never sign with another key.
		return Key{}, now, fmt.Errorf("key %s is in service by this host's clock but its private key was not loaded (the clock went back); the next change to the key directory, or a SIGHUP, loads it", k.Version)
	}
	return k, now, err
}

// StateChanged reports whether err, what Current answered, differs in its
// cause from the answer last reported, and records it: callers log that
// signing stopped once per change of its cause, and once that it resumed,
// however many requests (anonymous card fetches among them) see it.
func (s *Store) StateChanged(err error) bool {
	var cause string
	if ns, ok := errors.AsType[*NotInServiceError](err); ok {
		cause = "not in service until " + ns.Version // its message moves with the clock
	} else if err != nil {
		cause = err.Error()
	}
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	changed := cause != s.state
	s.state = cause
	return changed
}

// InService reports the key of keys (a key history, oldest first) in
// service at now: the newest key, not marked compromised, whose published
// window (created_at up to retired_at) holds now. It is the one rule that
// decides which key signs (Store.Current) and which one the card and
// `certd keys` call current (Statuses). Its errors are Current's, bar the
// ones about loading.
func InService(keys []Key, now time.Time) (Key, error) {
	var due *Key // the earliest key whose window has not begun
	for i := len(keys) - 1; i >= 0; i-- {
		k := &keys[i]
		switch {
		case k.Compromised:
		case k.CreatedAt.After(now):
			due = k
		case k.RetiredAt.IsZero() || now.Before(k.RetiredAt):
			return *k, nil
		}
	}
	if due != nil {
		return Key{}, &NotInServiceError{Version: due.Version, CreatedAt: due.CreatedAt, Now: now}
	}
	if len(keys) > 0 {
		return Key{}, errAllRetired
	}
	return Key{}, ErrNoKey
}

// errAllRetired is ErrNoKey where keys exist: after a compromise whose
// replacement was refused (ReplacementRefusedError).
var errAllRetired = fmt.Errorf("%w: every key it holds is retired or marked compromised; `certd rotate` creates a new one", ErrNoKey)

// NotInServiceError stops signing while no key's window holds this
// process's clock but a key's begins later: the key before it was retired
// or marked compromised by this clock, and the new key was dated by a
// clock ahead of this one (another host on a shared key directory). A
// receipt signed now by the new key would be dated before its created_at,
// and verifiers refuse it. Signing resumes by itself at CreatedAt by this
// clock.
type NotInServiceError struct {
	Version   string
	CreatedAt time.Time
	Now       time.Time // this process's clock when it was found
}

func (e *NotInServiceError) Error() string {
	return fmt.Sprintf("not signing: no key is in service by this host's clock (%s); key %s begins at its created_at %s, %s ahead of this clock, so the clock that created it is ahead of this one "+
		"(receipts it signed now would be dated before it existed, and verifiers refuse them). Signing resumes at %s by this clock; correct the clocks (NTP)",
		formatTime(e.Now), e.Version, formatTime(e.CreatedAt), e.CreatedAt.Sub(e.Now), formatTime(e.CreatedAt))
}

// holdsRetired reports whether keys hold the private key of a key retired
// by now (see forgetRetired).
func holdsRetired(keys []Key, now time.Time) bool {
	for _, k := range keys {
		if k.Private != nil && !k.RetiredAt.IsZero() && !now.Before(k.RetiredAt) {
			return true
		}
	}
	return false
}

// forgetRetired drops, for Options.CurrentOnly, the private keys whose
// retirement has come by now: a load keeps those of keys retired in this
// clock's future (they are still in service), and this is when they stop
// being needed.
func (s *Store) forgetRetired(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, k := range s.keys {
		if !k.RetiredAt.IsZero() && !now.Before(k.RetiredAt) {
			s.keys[i].Private = nil
		}
	}
}

// List reports every key version ever used, oldest first. The agent card
// publishes all of them so receipts signed before a rotation stay verifiable.
// After a failed reload it is the history of the newest index that could be
// read: the new index itself when only a private key file failed (so a
// rotation or compromise mark is published even while signing stops),
// otherwise (an index that cannot be read, or that takes back part of the
// history loaded: see checkGrowth) the keys loaded before.
func (s *Store) List() []Key {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return append([]Key(nil), s.keys...)
}

func (s *Store) lastSigned(version string) time.Time {
	s.signedMu.Lock()
	defer s.signedMu.Unlock()
	return s.signed[version]
}

// Lookup reports the key of one version.
func (s *Store) Lookup(version string) (Key, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, k := range s.keys {
		if k.Version == version {
			return k, true
		}
	}
	return Key{}, false
}

// Generate creates the first key, k1. It refuses (ErrKeysExist) when the
// directory already holds keys, so a dev-mode start can never silently add a
// key beside production ones.
func (s *Store) Generate() (Key, error) {
	var out Key
	err := s.update(func(idx *index, now time.Time) error {
		if len(idx.Keys) > 0 {
			return ErrKeysExist
		}
		k, err := s.addKey(idx, now)
		out = k
		return err
	})
	return out, err
}

// Rotate makes a new current key and retires the previous one (retired_at =
// now). Old versions stay on disk and in List: they still verify the receipts
// they signed. On an empty directory it creates the first key.
func (s *Store) Rotate() (Key, error) {
	var out Key
	err := s.update(func(idx *index, now time.Time) error {
		k, err := s.addKey(idx, now)
		out = k
		return err
	})
	return out, err
}

// MarkCompromised records that the key of version may have been used by
// someone else since the instant since, so verifiers reject its receipts from
// then on, and reports the mark that stands after the call (zero: a mark
// with no time, stored before such marks were refused: nothing the key
// signed is trusted). Marking the current key also retires it and rotates:
// a compromised key never signs again. since may not lie in the future, nor
// before 1970: the zero time, "from the start" to an operator, was stored
// as a mark and read back as none. A since before the key was created is
// taken (a clock that dated the key ahead must not stop a mark in an
// emergency): verifiers then trust none of the key's receipts.
//
// A key already marked keeps the earlier of its mark and since: a mark only
// ever moves earlier. Moving it later would trust again, without a word, the
// receipts dated between the two instants, which whoever held the key may
// have signed; so a later since changes nothing (the reported mark is then
// earlier than since, which is how certd compromise says so; the index is
// not rewritten), and undoing a mark set too early is not something a
// command should make easy.
//
// The mark is what matters in an emergency, so it is recorded even when
// the new key cannot be created (a stray key file, a clock behind the
// index: see addKey): the error is then a *ReplacementRefusedError, the
// directory has no current key and nothing signs (ErrNoKey) until Rotate
// succeeds. The mark's only time is the operator's since, so a clock
// behind the index does not stop it.
func (s *Store) MarkCompromised(version string, since time.Time) (time.Time, error) {
	stands := since
	err := s.update(func(idx *index, now time.Time) error {
		if since.After(now) {
			return fmt.Errorf("marking key %s compromised: the time %s is in the future (this host's clock reads %s); give the earliest possible leak, which cannot be later than now; nothing was changed", version, since.UTC().Format(time.RFC3339), now.Format(time.RFC3339))
		}
		i := -1
		for j := range idx.Keys {
			if idx.Keys[j].Version == version {
				i = j
			}
		}
		if i < 0 {
			return fmt.Errorf("marking key compromised: no key version %q in %s", version, s.dir)
		}
		created, err := parseTime(idx.Keys[i].CreatedAt, version, "created_at")
		if err != nil {
			return err
		}
		if since.Before(unixEpoch) {
			return fmt.Errorf("marking key %s compromised: the time %s is before 1970, and no key existed then; to distrust every receipt the key signed, give %s (its created_at less the %s a signer may date a receipt early); nothing was changed", version, since.UTC().Format(time.RFC3339Nano), formatTime(created.Add(-receipt.MaxSigningSkew)), receipt.MaxSigningSkew)
		}
		if idx.Keys[i].CompromisedSince != "" {
			marked, err := parseTime(idx.Keys[i].CompromisedSince, version, "compromised_since")
			if err != nil {
				return err
			}
			if !since.Before(marked) {
				stands = marked
				return errUnchanged // the earlier mark stands; see the doc comment
			}
		}
		wasCurrent := idx.Keys[i].RetiredAt == "" && idx.Keys[i].CompromisedSince == "" && i == lastActive(idx.Keys)
		idx.Keys[i].CompromisedSince = formatTime(since)
		if !wasCurrent {
			return nil
		}
		// addKey retires the newest non-retired key; with this one already
		// marked, retire it here so its retired_at is set whatever becomes
		// of the new key. A clock behind the key's created_at would retire
		// it before it existed (an index verifiers must reject); created_at
		// instead loses nothing: since is not after this clock, so the key
		// is then compromised since before it was created and every
		// receipt it signed is rejected anyway.
		retired := now
		if retired.Before(created) {
			retired = created
		}
		idx.Keys[i].RetiredAt = formatTime(retired)
		if _, err := s.addKey(idx, now); err != nil {
			return &ReplacementRefusedError{Version: version, Since: since, Dir: s.dir, Err: err}
		}
		return nil
	})
	return stands, err
}

// unixEpoch bounds a compromise mark from below; see MarkCompromised.
var unixEpoch = time.Unix(0, 0)

// errUnchanged is a change's way to tell update that the index stays as it
// is: nothing is written, so nothing reloads and no card is rebuilt.
var errUnchanged = errors.New("keystore: nothing to change")

// ReplacementRefusedError reports a compromise of the current key that IS
// recorded (the key marked and retired: it never signs again) while the new
// key to replace it was refused. No key signs until one exists: signing
// answers ErrNoKey (certd: 503) until Rotate succeeds.
type ReplacementRefusedError struct {
	Version string    // the key marked compromised
	Since   time.Time // its compromised_since
	Dir     string
	Err     error // why the new key was refused (*StrayKeyFilesError, *ClockBehindError, ...)
}

func (e *ReplacementRefusedError) Error() string {
	problem, fix := e.Err.Error(), "Fix the cause"
	if r, ok := e.Err.(refusal); ok {
		problem, fix = r.problem(), r.fix()
	}
	return fmt.Sprintf("key %s IS marked compromised since %s and retired in %s: it signs nothing more and verifiers reject its receipts from then on. "+
		"But no new key was created: %s. Until one exists nothing is signed (certd answers 503). %s, then run `certd rotate` to create the new key",
		e.Version, formatTime(e.Since), filepath.Join(e.Dir, IndexFile), problem, fix)
}

func (e *ReplacementRefusedError) Unwrap() error { return e.Err }

// refusal is an error refusing a new key, in two parts, so that
// ReplacementRefusedError can tell what was recorded and what was not
// without the refusal's own "nothing was changed".
type refusal interface {
	problem() string // what stands in the way
	fix() string     // what the operator does about it
}

func lastActive(entries []indexEntry) int {
	for i := len(entries) - 1; i >= 0; i-- {
		if entries[i].RetiredAt == "" && entries[i].CompromisedSince == "" {
			return i
		}
	}
	return -1
}

// Reload re-reads the index and any key file not loaded yet. certd calls it
// on SIGHUP; Refresh calls it when the index changed on disk.
func (s *Store) Reload() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reloadLocked()
}

// Refresh reloads the index when it changed on disk since the last load (a
// rotation by another process) and reports whether it did. It costs one
// stat when nothing changed (with Options.Watch, not even that), so certd
// calls it before every signature and card build: `certd rotate` takes
// effect on the next request.
func (s *Store) Refresh() (bool, error) {
	if s.watch != nil {
		return s.watch.refresh(s.refresh, s.isBroken)
	}
	return s.refresh()
}

// RetryEvery is how often, at most, RefreshLimited retries loading a key
// directory that failed to load.
const RetryEvery = time.Second

// RefreshLimited is Refresh for requests anyone may send (the agent card,
// a health check): while the directory does not load, each Refresh reads
// the index, lists the directory and opens the failing key file again, so
// these requests retry that at most once per RetryEvery, all of them
// together, and otherwise find the store as the last load left it (false,
// and the error that stops signing). A signature refreshes with Refresh:
// it retries every time, so signing resumes on the first request after a
// fix.
func (s *Store) RefreshLimited() (bool, error) {
	now := time.Now() // monotonic: a step of the wall clock changes nothing
	s.retryMu.Lock()
	if wait := now.Sub(s.retried) < RetryEvery && s.isBroken(); wait {
		s.retryMu.Unlock()
		return false, s.brokenErr()
	}
	s.retried = now
	s.retryMu.Unlock()
	return s.Refresh()
}

func (s *Store) brokenErr() error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.broken
}

// isBroken reports whether the index on disk is not fully loaded (see
// reloadLocked).
func (s *Store) isBroken() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.broken != nil
}

// refresh is Refresh's stat of the index, and the reload if it changed.
func (s *Store) refresh() (bool, error) {
	fi, err := statIndex(filepath.Join(s.dir, IndexFile))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		// An index that cannot even be looked at may retire the key
		// held, as one that cannot be read may.
		err = fmt.Errorf("checking key index: %w", err)
		s.mu.Lock()
		s.broken = err
		s.mu.Unlock()
		return false, err
	}
	s.mu.RLock()
	same := sameFile(s.seen, fi) && s.broken == nil
	s.mu.RUnlock()
	if same {
		return false, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.reloadLocked(); err != nil {
		return false, err
	}
	return true, nil
}

func sameFile(a, b fs.FileInfo) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return os.SameFile(a, b) && a.ModTime().Equal(b.ModTime()) && a.Size() == b.Size()
}

// reloadLocked loads the index on disk and the private keys it needs, and
// records in s.broken whether that failed. It never falls back to signing
// with the keys loaded before: the index that failed to load may retire or
// mark compromised the key they hold (an operator's `certd compromise`
// whose new key file certd cannot read), so Current refuses until a load
// succeeds. What List reports meanwhile is the newest history that could
// be read; see List.
func (s *Store) reloadLocked() error {
	err := s.loadLocked()
	s.broken = err
	return err
}

func (s *Store) loadLocked() error {
	idx, fi, err := s.readIndex()
	if err != nil {
		return err
	}
	if fi == nil && len(s.keys) > 0 {
		// Never forget keys because a file vanished: the history is what
		// keeps old receipts verifiable.
		return fmt.Errorf("the key index %s disappeared; the agent card keeps the %d keys loaded before (restore the newest copy of it: an older one is refused while the process runs)", filepath.Join(s.dir, IndexFile), len(s.keys))
	}
	keys := make([]Key, 0, len(idx.Keys))
	now := s.now()
	var keyErr *KeyFileError // the first private key file that failed to load
	for _, e := range idx.Keys {
		k := Key{Version: e.Version, Compromised: e.CompromisedSince != ""}
		if k.CreatedAt, err = parseTime(e.CreatedAt, e.Version, "created_at"); err != nil {
			return err
		}
		if k.RetiredAt, err = parseTime(e.RetiredAt, e.Version, "retired_at"); err != nil {
			return err
		}
		if k.CompromisedSince, err = parseTime(e.CompromisedSince, e.Version, "compromised_since"); err != nil {
			return err
		}
		// CurrentOnly keeps every key that may still sign: not only the
		// newest, as a key retired in this clock's future is in service
		// until then (see Current).
		publicOnly := s.publicOnly || (s.currentOnly && (k.Compromised || !k.RetiredAt.IsZero() && !now.Before(k.RetiredAt)))
		if old, ok := findKey(s.keys, e.Version); ok && old.Public.Equal(mustPublic(e.PublicKey)) && (old.Private != nil || publicOnly) {
			k.Public = old.Public
			if !publicOnly {
				k.Private = old.Private
			}
		} else if !publicOnly {
			// A key file that fails leaves the key public only, so the
			// new history is still published (Open fails on it anyway);
			// s.broken stops signing.
			loaded, err := s.loadKeyFile(e.Version, mustPublic(e.PublicKey))
			if err != nil && keyErr == nil {
				keyErr = &KeyFileError{Version: e.Version, Err: err}
			}
			k.Public, k.Private = loaded.Public, loaded.Private
		}
		if k.Public == nil {
			if k.Public = mustPublic(e.PublicKey); k.Public == nil {
				return fmt.Errorf("reading key index: key %s has a bad public_key", e.Version)
			}
		}
		keys = append(keys, k)
	}
	if err := s.checkGrowth(keys); err != nil {
		return err
	}
	s.keys, s.seen = keys, fi
	if keyErr != nil {
		return keyErr
	}
	if s.checkNewer && len(idx.Keys) > 0 {
		if err := s.newerKeyFiles(idx); err != nil {
			return err
		}
		s.checkNewer = false
	}
	return nil
}

// checkGrowth refuses an index that takes back part of the key history
// the store has loaded (s.keys), so that within a running process the
// history only grows: every version loaded stays, with its public key and
// created_at, a retirement stays as it was, and a compromise mark stays
// or moves earlier. Retiring a key, marking one, moving a mark earlier
// and adding versions are what rotate and compromise write, and load.
// A retirement is refused, though, when it comes so early that a receipt
// this process signed with the key (Choose) would fall outside the key's
// window as verifiers widen it: the index was written on a clock behind
// the one that dated the receipt (see earlyRetirement), and loading it
// would silently invalidate delivered receipts. A compromise mark is not:
// it may mean to.
//
// An index that takes something back is most often one restored from a
// backup older than the last rotation: loading it would sign again with a
// key the newer history retired (receipts verifiers then refuse as dated
// after its retirement) and drop from the card keys whose receipts must
// stay verifiable. So the reload fails like any other: nothing signs and
// the card keeps the history loaded before until the index holds it again.
// A restart loads whatever the index holds, for a change that is meant.
func (s *Store) checkGrowth(next []Key) error {
	var dropped, changed []string
	var early []string // retirements before a receipt signed (see earlyRetirement)
	for _, h := range s.keys {
		n, ok := findKey(next, h.Version)
		var what string
		switch {
		case !ok:
			dropped = append(dropped, h.Version)
			continue
		case !n.Public.Equal(h.Public):
			what = "gives key " + h.Version + " another public_key"
		case !n.CreatedAt.Equal(h.CreatedAt):
			what = fmt.Sprintf("changes the created_at of key %s from %s to %s", h.Version, formatTime(h.CreatedAt), formatTime(n.CreatedAt))
		case !h.RetiredAt.IsZero() && n.RetiredAt.IsZero():
			what = fmt.Sprintf("no longer retires key %s (retired at %s)", h.Version, formatTime(h.RetiredAt))
		case !h.RetiredAt.IsZero() && !n.RetiredAt.Equal(h.RetiredAt):
			what = fmt.Sprintf("changes the retired_at of key %s from %s to %s", h.Version, formatTime(h.RetiredAt), formatTime(n.RetiredAt))
		case h.RetiredAt.IsZero() && !n.RetiredAt.IsZero() && !n.Compromised && s.lastSigned(h.Version).After(n.RetiredAt.Add(receipt.MaxSigningSkew)):
			// A compromise mark may mean to distrust receipts already
			// delivered; a retirement never does.
			last := s.lastSigned(h.Version)
			what = fmt.Sprintf("retires key %s at %s, %s before the newest receipt this process signed with it (dated %s), which verifiers would then refuse as signed after the key left service, as every receipt it signed dated after %s",
				h.Version, formatTime(n.RetiredAt), last.Sub(n.RetiredAt), formatTime(last), formatTime(n.RetiredAt.Add(receipt.MaxSigningSkew)))
			early = append(early, fmt.Sprintf("set the retired_at of key %s, and the created_at of the key after it, to %s or later", h.Version, formatTime(last)))
		case h.Compromised && !n.Compromised:
			what = fmt.Sprintf("no longer marks key %s compromised (since %s)", h.Version, formatTime(h.CompromisedSince))
		case h.Compromised && n.CompromisedSince.After(h.CompromisedSince):
			what = fmt.Sprintf("moves the compromise mark of key %s later, from %s to %s", h.Version, formatTime(h.CompromisedSince), formatTime(n.CompromisedSince))
		default:
			continue
		}
		changed = append(changed, what)
	}
	if len(dropped) > 0 {
		changed = append([]string{"no longer names key " + strings.Join(dropped, ", ")}, changed...)
	}
	if len(early) > 0 && len(early) == len(changed) {
		return earlyRetirement(filepath.Join(s.dir, IndexFile), changed, early)
	}
	if len(changed) > 0 {
		return fmt.Errorf("refusing the key index %s: it %s, unlike the index this process loaded before; "+
			"while a process runs its key history only grows (an index that takes part of it back is usually restored from a backup older than the last rotation, "+
			"and would sign with a key the newer history retired and drop keys whose receipts must stay verifiable). "+
			"Nothing is signed and the agent card keeps the history loaded before: put the newest index back (the next request loads it), "+
			"or, if the change is meant, restart the process", filepath.Join(s.dir, IndexFile), strings.Join(changed, "; it "))
	}
	return nil
}

// earlyRetirement is checkGrowth's refusal of an index whose only change
// it refuses is a retirement dated before a receipt this process signed
// with the key. No newer index exists to put back: the clock that dated
// the retirement read earlier than the one that dated the receipt, either
// another host's clock behind this one, or this host's own, ahead when it
// signed and stepped back since (NTP), `certd rotate` then being right.
// The refusal never lifts by itself (the record outlives the clock error),
// so it says both ways out: retire the key at or after its newest receipt,
// which keeps every receipt verifiable, or restart to accept the index as
// it is, which gives up the receipts dated after the retirement.
func earlyRetirement(path string, changed, fixes []string) error {
	return fmt.Errorf("refusing the key index %s: it %s. The clock that dated the retirement reads behind the one that dated those receipts (another host's clock behind this one, "+
		"or this host's clock ahead when it signed them and corrected since). Nothing is signed and the agent card keeps the history loaded before. "+
		"To keep those receipts verifiable, edit %s: %s (the next request loads it, and the key signs until then); "+
		"to accept the retirement as it is, restart the process (those receipts then fail verification)",
		path, strings.Join(changed, "; it "), path, strings.Join(fixes, "; "))
}

// KeyFileError is a private key file the index names that could not be
// loaded (missing, not a regular file, unreadable by this process, a mode
// readable by group or others, not the key the index names): the history
// the index holds is loaded all the same, and nothing signs until the file
// loads.
type KeyFileError struct {
	Version string
	Err     error
}

func (e *KeyFileError) Error() string { return e.Err.Error() }
func (e *KeyFileError) Unwrap() error { return e.Err }

// newerKeyFiles reports, as a *NewerKeyFilesError, key files in the
// directory numbered above the newest version idx names.
func (s *Store) newerKeyFiles(idx index) error {
	newest := 0
	for _, e := range idx.Keys {
		n, _ := versionNumber(e.Version) // checked by readIndex
		newest = max(newest, n)
	}
	stray, err := s.strayKeyFiles(idx, newest)
	if err != nil {
		return err
	}
	// Only a file loadKeyFile could load is the trace of a key: a regular
	// file, through a symbolic link too (it opens the path). A directory
	// or a dangling link holds none.
	newer := slices.DeleteFunc(stray, func(name string) bool {
		fi, err := os.Stat(filepath.Join(s.dir, name))
		return err != nil || !fi.Mode().IsRegular()
	})
	if len(newer) == 0 {
		return nil
	}
	return &NewerKeyFilesError{Stray: StrayKeyFilesError{Dir: s.dir, Files: newer}, Newest: "k" + strconv.Itoa(newest)}
}

// NewerKeyFilesError stops signing in a process that starts on a key
// directory holding key files numbered above the newest version its index
// names. That is the trace of a newer index: this one was restored from an
// older backup, and the key it makes current may have been retired since
// (receipts it signed now would be refused once the newest index is back);
// or of a rotation interrupted before it wrote the index (that key never
// signed). The store cannot tell which, so it does not sign until the
// operator decides, and says how; the card publishes the history the index
// holds meanwhile. It is looked for when a process starts only: a running
// one has loaded the newest index it saw, and checkGrowth keeps it.
type NewerKeyFilesError struct {
	Stray  StrayKeyFilesError
	Newest string // the newest version the index names
}

func (e *NewerKeyFilesError) Error() string {
	return fmt.Sprintf("not signing: %s, newer than %s, the newest key it names, so the index may be older than the keys. %s. The next request checks again; no restart is needed",
		e.Stray.found(), e.Newest, e.Stray.fix())
}

func findKey(keys []Key, version string) (Key, bool) {
	for _, k := range keys {
		if k.Version == version {
			return k, true
		}
	}
	return Key{}, false
}

func mustPublic(b64 string) ed25519.PublicKey {
	b, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(b) != ed25519.PublicKeySize {
		return nil
	}
	return b
}

// readIndex reads index.json; a missing index is an empty store.
func (s *Store) readIndex() (index, fs.FileInfo, error) {
	path := filepath.Join(s.dir, IndexFile)
	f, fi, err := regfile.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return index{Format: indexFormat}, nil, nil
	}
	if err != nil {
		return index{}, nil, fmt.Errorf("opening key index: %w", err)
	}
	defer f.Close()
	var idx index
	dec := json.NewDecoder(f)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&idx); err != nil {
		return index{}, nil, fmt.Errorf("reading key index %s: %w", path, err)
	}
	if idx.Format != indexFormat {
		return index{}, nil, fmt.Errorf("reading key index %s: unknown format %q (want %q)", path, idx.Format, indexFormat)
	}
	seen := map[string]bool{}
	for _, e := range idx.Keys {
		if _, err := versionNumber(e.Version); err != nil {
			return index{}, nil, fmt.Errorf("reading key index %s: %w", path, err)
		}
		if seen[e.Version] {
			return index{}, nil, fmt.Errorf("reading key index %s: key version %s listed twice", path, e.Version)
		}
		seen[e.Version] = true
		if e.Algorithm != "Ed25519" {
			return index{}, nil, fmt.Errorf("reading key index %s: key %s has algorithm %q, want Ed25519", path, e.Version, e.Algorithm)
		}
	}
	return idx, fi, nil
}

// loadKeyFile reads the private key of version and checks it is the one
// whose public key the index names, want.
func (s *Store) loadKeyFile(version string, want ed25519.PublicKey) (Key, error) {
	path := filepath.Join(s.dir, version+".key")
	f, fi, err := regfile.Open(path)
	if err != nil {
		return Key{}, fmt.Errorf("loading key %s: %w", version, err)
	}
	defer f.Close()
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return Key{}, fmt.Errorf("loading key %s: private key file %s has mode %04o and is readable by group or others; restrict it with `chmod 600 %s` (and consider the key compromised if others could read it)", version, path, perm, path)
	}
	raw, err := regfile.ReadAll(f, 64<<10)
	if err != nil {
		return Key{}, fmt.Errorf("loading key %s: %w", version, err)
	}
	priv, err := parsePrivateKey(raw)
	if err != nil {
		return Key{}, fmt.Errorf("loading key %s from %s: %w", version, path, err)
	}
	pub := priv.Public().(ed25519.PublicKey)
	if !pub.Equal(want) {
		return Key{}, fmt.Errorf("loading key %s: the private key in %s does not match the public key in the index", version, path)
	}
	return Key{Private: priv, Public: pub}, nil
}

func parsePrivateKey(raw []byte) (ed25519.PrivateKey, error) {
	block, rest := pem.Decode(raw)
	if block == nil || block.Type != "PRIVATE KEY" || len(bytes.TrimSpace(rest)) != 0 {
		return nil, errors.New("not a single PEM \"PRIVATE KEY\" block")
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parsing PKCS#8: %w", err)
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("the key is a %T, not Ed25519", k)
	}
	return priv, nil
}

// MarshalPrivateKey encodes an Ed25519 private key as the PKCS#8 PEM that
// key files hold (what `openssl genpkey -algorithm ed25519` writes).
func MarshalPrivateKey(priv ed25519.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, fmt.Errorf("encoding private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// update runs change on the index under the in-process and cross-process
// writer locks, against the index as it is on disk now (another process may
// have rotated), then writes the new index and reloads. change gets the
// one instant every time it records is taken from; a new key refuses it
// when it is earlier than a time the index already holds (addKey).
func (s *Store) update(change func(idx *index, now time.Time) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	unlock, err := lockDir(s.dir)
	if err != nil {
		return err
	}
	defer unlock()
	idx, _, err := s.readIndex()
	if err != nil {
		return err
	}
	// A compromise whose new key was refused is recorded all the same:
	// the index is written, then the refusal reported.
	changeErr := change(&idx, s.now())
	if changeErr == errUnchanged {
		return nil
	}
	var refused *ReplacementRefusedError
	if changeErr != nil && !errors.As(changeErr, &refused) {
		return changeErr
	}
	data, err := json.MarshalIndent(idx, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding key index: %w", err)
	}
	if err := writeFileAtomic(filepath.Join(s.dir, IndexFile), append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing key index: %w", err)
	}
	if err := s.reloadLocked(); err != nil {
		return err
	}
	return changeErr
}

// checkClock refuses a new key when now is earlier than a time the index
// already records. The clock of the process changing the index dates the
// new key and the retirement of the old one: behind (an NTP step, a
// restored VM) it would retire a key before it was created and create its
// successor before it, and verifiers reject every receipt dated outside a
// key's published service life.
func checkClock(idx index, now time.Time) error {
	var latest time.Time
	var what string
	for _, e := range idx.Keys {
		for _, f := range []struct{ name, value string }{{"created_at", e.CreatedAt}, {"retired_at", e.RetiredAt}, {"compromised_since", e.CompromisedSince}} {
			t, err := parseTime(f.value, e.Version, f.name)
			if err != nil {
				return err
			}
			if t.After(latest) {
				latest, what = t, "the "+f.name+" of key "+e.Version
			}
		}
	}
	if now.Before(latest) {
		return &ClockBehindError{Now: now, Latest: latest, What: what}
	}
	return nil
}

// ClockBehindError refuses a new key while this host's clock reads earlier
// than a time the index records (see checkClock).
type ClockBehindError struct {
	Now, Latest time.Time
	What        string // the time Latest is, e.g. "the created_at of key k1"
}

func (e *ClockBehindError) Error() string {
	return "refusing to change the key index: " + e.problem() + ". " + e.fix() + " and run the command again; nothing was changed"
}

func (e *ClockBehindError) problem() string {
	return fmt.Sprintf("this host's clock reads %s, earlier than %s (%s); keys changed now would be dated before their predecessors and verifiers would reject their receipts",
		formatTime(e.Now), formatTime(e.Latest), e.What)
}

func (e *ClockBehindError) fix() string { return "Correct the clock (NTP)" }

// addKey generates a key, writes its file and appends it to idx as the new
// current key, retiring the previous current key. It refuses while now is
// earlier than a time the index records (see checkClock), and while the
// directory holds a key file the index does not name (see strayKeyFiles),
// so a new key can never take the name, or overwrite the file, of a key
// that may have signed receipts.
func (s *Store) addKey(idx *index, now time.Time) (Key, error) {
	if err := checkClock(*idx, now); err != nil {
		return Key{}, err
	}
	next := 1
	for _, e := range idx.Keys {
		if n, _ := versionNumber(e.Version); n >= next {
			next = n + 1
		}
	}
	if stray, err := s.strayKeyFiles(*idx, 0); err != nil {
		return Key{}, err
	} else if len(stray) > 0 {
		return Key{}, &StrayKeyFilesError{Dir: s.dir, Files: stray}
	}
	version := "k" + strconv.Itoa(next)
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return Key{}, fmt.Errorf("generating key: %w", err)
	}
	pemBytes, err := MarshalPrivateKey(priv)
	if err != nil {
		return Key{}, err
	}
	if err := writeFileAtomic(filepath.Join(s.dir, version+".key"), pemBytes, 0o600); err != nil {
		return Key{}, fmt.Errorf("writing key %s: %w", version, err)
	}
	if i := lastActive(idx.Keys); i >= 0 {
		idx.Keys[i].RetiredAt = formatTime(now)
	}
	idx.Keys = append(idx.Keys, indexEntry{
		Version:   version,
		Algorithm: "Ed25519",
		PublicKey: base64.StdEncoding.EncodeToString(pub),
		CreatedAt: formatTime(now),
	})
	return Key{Version: version, Private: priv, Public: pub, CreatedAt: now}, nil
}

// strayKeyFiles lists the key files (k<n>.key, n > above) in the directory
// that idx does not name, in version order.
func (s *Store) strayKeyFiles(idx index, above int) ([]string, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("listing the key directory: %w", err)
	}
	named := make(map[string]bool, len(idx.Keys))
	for _, e := range idx.Keys {
		named[e.Version] = true
	}
	type file struct {
		n    int
		name string
	}
	var stray []file
	for _, d := range entries {
		v, ok := strings.CutSuffix(d.Name(), ".key")
		n, err := versionNumber(v)
		if ok && err == nil && n > above && !named[v] {
			stray = append(stray, file{n, d.Name()})
		}
	}
	slices.SortFunc(stray, func(a, b file) int { return cmp.Compare(a.n, b.n) })
	names := make([]string, len(stray))
	for i, f := range stray {
		names[i] = f.name
	}
	return names, nil
}

// StrayKeyFilesError refuses a new key while the key directory holds key
// files its index does not name. Either the index was restored from a
// backup older than those keys (they may have signed receipts, which stay
// verifiable only if the index names them again), or a rotation was
// interrupted between writing the key file and the index (that key never
// signed). The store cannot tell which, and a new key under the same
// version would overwrite a private key and give one version two keys, so
// the operator decides.
type StrayKeyFilesError struct {
	Dir   string
	Files []string // file names, in version order
}

func (e *StrayKeyFilesError) Error() string {
	return "refusing to add a key: " + e.problem() + ". " + e.fix() + ". Then run the command again; nothing was changed"
}

func (e *StrayKeyFilesError) problem() string {
	return e.found() + ", and a new key must never take the name of an existing one"
}

// found names the files and what is wrong with them.
func (e *StrayKeyFilesError) found() string {
	list := e.Files
	more := ""
	if len(list) > 5 {
		list, more = list[:5], fmt.Sprintf(" (+%d more)", len(e.Files)-5)
	}
	return fmt.Sprintf("%s holds %s%s, which %s does not name", e.Dir, strings.Join(list, ", "), more, IndexFile)
}

func (e *StrayKeyFilesError) fix() string {
	return "If the index was restored from an older backup, restore the newest one (the keys after it may have signed receipts); " +
		"if a rotation was interrupted before writing the index, that key never signed: move the file out of the directory"
}

// versionNumber parses a version label "k<n>", n ≥ 1 without leading zeros.
func versionNumber(v string) (int, error) {
	n, err := strconv.Atoi(strings.TrimPrefix(v, "k"))
	if !strings.HasPrefix(v, "k") || err != nil || n < 1 || "k"+strconv.Itoa(n) != v {
		return 0, fmt.Errorf("key version %q is not of the form k1, k2, ...", v)
	}
	return n, nil
}

// formatTime is RFC 3339 in UTC with the precision the clock gives, so a
// compromise instant compares exactly with receipt timestamps.
func formatTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

func parseTime(s, version, field string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("reading key index: key %s has a bad %s: %w", version, field, err)
	}
	return t.UTC(), nil
}

// lockDir takes the cross-process writer lock of a key directory.
func lockDir(dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("locking key directory: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("locking key directory: %w", err)
	}
	return func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}

// writeFileAtomic writes data to path so that a reader or a crash sees the
// old content or the new, never a mix: temp file in the same directory,
// fsync, rename, fsync of the directory.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err := f.Chmod(perm); err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	ok = true
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
