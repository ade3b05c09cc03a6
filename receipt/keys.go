package receipt

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/aovhq/aov/internal/ed25519key"
)

// Key statuses an agent card may publish.
const (
	StatusCurrent     = "current"
	StatusRetired     = "retired"
	StatusCompromised = "compromised"
)

// PublicKey is one entry of the agent card's params.publicKeys: every key
// version the service ever signed with, so that old receipts stay verifiable
// after a rotation. PublicKey is the standard base64 of the raw 32-byte key.
type PublicKey struct {
	KeyVersion        string `json:"keyVersion"`
	Algorithm         string `json:"algorithm"`
	PublicKey         string `json:"publicKey"`
	PublicKeyEncoding string `json:"publicKeyEncoding"`
	Status            string `json:"status,omitempty"`
	CreatedAt         string `json:"createdAt,omitempty"`
	RetiredAt         string `json:"retiredAt,omitempty"`
	CompromisedSince  string `json:"compromisedSince,omitempty"`
}

// key is a parsed, usable PublicKey.
type key struct {
	version     string
	pub         ed25519.PublicKey
	compromised bool
	// since is when the key stopped being trustworthy; zero with
	// compromised set means "from the start": nothing it signed is trusted.
	since time.Time
	// created and retired bound when the key could sign (zero: not
	// published): see Verify.
	created, retired time.Time
	// err is why the key may not be used (CheckPublicKey), for a key
	// handed to SingleKey, which returns no error: Verify reports it.
	err error
}

// KeySet is the set of public keys a receipt may be checked against, by key
// version. The zero KeySet holds no key and verifies nothing.
type KeySet struct {
	keys map[string]key
	// any is a bare public key given without a version: it is tried for
	// whatever key_version a receipt names.
	any *key
	// current is the card's currentKeyVersion, informational.
	current string
}

// Versions lists the key versions in the set, sorted.
func (ks KeySet) Versions() []string {
	v := make([]string, 0, len(ks.keys))
	for k := range ks.keys {
		v = append(v, k)
	}
	sort.Strings(v)
	return v
}

// Current reports the card's currentKeyVersion ("" when unknown).
func (ks KeySet) Current() string { return ks.current }

// Len reports how many keys the set holds (a bare key counts as one).
func (ks KeySet) Len() int {
	if ks.any != nil {
		return len(ks.keys) + 1
	}
	return len(ks.keys)
}

// SingleKey makes a KeySet of one bare public key, for checking a receipt
// offline without a card. With keyVersion "" the key is tried for any
// key_version the receipt names; otherwise only for that version. A key
// CheckPublicKey refuses verifies nothing: Verify reports why.
func SingleKey(keyVersion string, pub ed25519.PublicKey) KeySet {
	k := key{version: keyVersion, pub: append(ed25519.PublicKey(nil), pub...), err: CheckPublicKey(pub)}
	if keyVersion == "" {
		return KeySet{any: &k}
	}
	return KeySet{keys: map[string]key{keyVersion: k}}
}

// ParsePublicKey decodes a bare Ed25519 public key given as standard base64
// of its 32 raw bytes (the card's encoding). URL-safe and unpadded base64
// are accepted too, since people paste keys from many places.
func ParsePublicKey(b64 string) (ed25519.PublicKey, error) {
	s := strings.TrimSpace(b64)
	var raw []byte
	var err error
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if raw, err = enc.Strict().DecodeString(s); err == nil {
			break
		}
	}
	if err != nil {
		return nil, errors.New("public key is not base64")
	}
	if err := CheckPublicKey(raw); err != nil {
		return nil, err
	}
	return ed25519.PublicKey(raw), nil
}

// CheckPublicKey refuses an Ed25519 public key that no signature may be
// checked against (ed25519key.Check: not 32 bytes, not canonically
// encoded, or of small order). Under a small-order key crypto/ed25519
// accepts forgeries, so a card (or a bare key) with one would make
// receipts anyone wrote verify; readers that follow RFC 8032 strictly
// refuse the non-canonical ones, and refusing them here keeps this package
// in agreement with the by-hand check. Every reader of a key calls it:
// KeysFromCard, ParsePublicKey, SingleKey, and the agent card before
// publishing a key.
func CheckPublicKey(pub []byte) error { return ed25519key.Check(pub) }

// KeysFromCard reads the public keys from an agent card: the entries of
// params.publicKeys of every capabilities.extensions element whose uri starts
// with ExtensionURIPrefix.
//
// The card is read by its exact member names, as JavaScript, jq and RFC 8785
// read it, never through encoding/json's struct matching: that takes a
// member equal to a field's name in any letter case (U+017F ſ folds to s),
// the last one winning, so an entry that says "status":"compromised" to
// every other reader would be trusted here when a "Status":"current"
// follows it. A member with another spelling is just another member.
//
// An entry with another algorithm, or that is not an object, is skipped (a
// later card may add other key types); an Ed25519 entry that does not
// decode, whose key CheckPublicKey refuses, or a key version listed twice,
// make the whole card unusable: a
// card that contradicts itself cannot be trusted for any receipt. Twice
// means twice even with the same public key: the entries also carry the
// key's status and lifetime, and keeping either one would let the other
// (say, one without the compromise mark) decide which receipts verify.
// certd never publishes a version twice. A null member is an absent one.
func KeysFromCard(cardJSON []byte) (KeySet, error) {
	if _, err := Canonicalize(cardJSON); err != nil {
		return KeySet{}, fmt.Errorf("reading agent card: not valid JSON: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(cardJSON))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return KeySet{}, fmt.Errorf("reading agent card: not valid JSON: %w", err)
	}
	top, ok := v.(map[string]any)
	if !ok {
		return KeySet{}, errors.New("reading agent card: unexpected shape: the card is not a JSON object")
	}
	caps, ok := top["capabilities"].(map[string]any)
	if !ok && top["capabilities"] != nil {
		return KeySet{}, errors.New("reading agent card: unexpected shape: capabilities is not an object")
	}
	exts, ok := caps["extensions"].([]any)
	if !ok && caps["extensions"] != nil {
		return KeySet{}, errors.New("reading agent card: unexpected shape: capabilities.extensions is not an array")
	}
	ks := KeySet{keys: map[string]key{}}
	found := false
	for _, e := range exts {
		ext, _ := e.(map[string]any)
		if uri, _ := ext["uri"].(string); !strings.HasPrefix(uri, ExtensionURIPrefix) {
			continue
		}
		found = true
		params, _ := ext["params"].(map[string]any)
		if cur, _ := params["currentKeyVersion"].(string); cur != "" {
			ks.current = cur
		}
		pks, ok := params["publicKeys"].([]any)
		if !ok && params["publicKeys"] != nil {
			return KeySet{}, errors.New("reading agent card: params.publicKeys is not an array")
		}
		for i, p := range pks {
			entry, _ := p.(map[string]any)
			if alg, _ := entry["algorithm"].(string); alg != Algorithm {
				continue
			}
			pk, err := cardEntry(entry)
			if err != nil {
				return KeySet{}, fmt.Errorf("reading agent card: publicKeys[%d].%w", i, err)
			}
			k, err := parseCardKey(pk)
			if err != nil {
				return KeySet{}, fmt.Errorf("reading agent card: publicKeys[%d]: %w", i, err)
			}
			if _, dup := ks.keys[k.version]; dup {
				return KeySet{}, fmt.Errorf("reading agent card: key version %s is listed twice; a card lists each key version once", quoteShort(k.version))
			}
			ks.keys[k.version] = k
		}
	}
	if !found {
		return KeySet{}, fmt.Errorf("reading agent card: no capabilities.extensions entry with a uri starting %q", ExtensionURIPrefix)
	}
	if len(ks.keys) == 0 {
		return KeySet{}, errors.New("reading agent card: the attestation extension lists no Ed25519 public key")
	}
	return ks, nil
}

// cardEntry reads the members of one Ed25519 publicKeys entry by their
// exact names; each is a string or absent (null is absent). Its error
// names the member, after the "publicKeys[i]." its caller prints.
func cardEntry(entry map[string]any) (PublicKey, error) {
	var pk PublicKey
	for _, f := range []struct {
		name string
		dst  *string
	}{
		{"keyVersion", &pk.KeyVersion},
		{"algorithm", &pk.Algorithm},
		{"publicKey", &pk.PublicKey},
		{"publicKeyEncoding", &pk.PublicKeyEncoding},
		{"status", &pk.Status},
		{"createdAt", &pk.CreatedAt},
		{"retiredAt", &pk.RetiredAt},
		{"compromisedSince", &pk.CompromisedSince},
	} {
		v := entry[f.name]
		s, ok := v.(string)
		if !ok && v != nil {
			return PublicKey{}, fmt.Errorf("%s is not a string", f.name)
		}
		*f.dst = s
	}
	return pk, nil
}

func parseCardKey(pk PublicKey) (key, error) {
	if pk.KeyVersion == "" {
		return key{}, errors.New("keyVersion is empty")
	}
	if pk.PublicKeyEncoding != "" && pk.PublicKeyEncoding != "base64" {
		return key{}, fmt.Errorf("publicKeyEncoding %s is not supported (want base64)", quoteShort(pk.PublicKeyEncoding))
	}
	raw, err := decodeStdBase64(pk.PublicKey)
	if err != nil {
		return key{}, errors.New("publicKey is not standard base64")
	}
	if len(raw) != ed25519.PublicKeySize {
		return key{}, fmt.Errorf("publicKey is %d bytes, want %d", len(raw), ed25519.PublicKeySize)
	}
	if err := CheckPublicKey(raw); err != nil {
		return key{}, err
	}
	k := key{version: pk.KeyVersion, pub: ed25519.PublicKey(raw)}
	for _, f := range []struct {
		name, value string
		dst         *time.Time
	}{{"createdAt", pk.CreatedAt, &k.created}, {"retiredAt", pk.RetiredAt, &k.retired}} {
		if f.value == "" {
			continue
		}
		t, err := ParseTime(f.value)
		if err != nil {
			return key{}, fmt.Errorf("%s is not an RFC 3339 time", f.name)
		}
		*f.dst = t
	}
	if pk.Status == StatusCompromised || pk.CompromisedSince != "" {
		k.compromised = true
		if pk.CompromisedSince != "" {
			t, err := ParseTime(pk.CompromisedSince)
			if err != nil {
				return key{}, errors.New("compromisedSince is not an RFC 3339 time")
			}
			k.since = t
		}
	}
	return k, nil
}

// lookup finds the key for a receipt's key_version.
func (ks KeySet) lookup(version string) (key, error) {
	if k, ok := ks.keys[version]; ok {
		return k, k.err
	}
	if ks.any != nil {
		return *ks.any, ks.any.err
	}
	return key{}, &NoKeyError{KeyVersion: version, Known: ks.Versions()}
}
