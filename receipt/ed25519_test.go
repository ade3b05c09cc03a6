package receipt

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aovhq/aov/internal/testdata"
)

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatalf("hex %q: %v", s, err)
	}
	return b
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func TestEd25519SignsAndVerifiesEveryRFC8032Vector(t *testing.T) {
	var vs []struct{ Name, SecretKey, PublicKey, Message, Signature string }
	readJSON(t, filepath.Join(testdata.Dir(t, "ed25519"), "rfc8032_ed25519_vectors.json"), &vs)
	if len(vs) == 0 {
		t.Fatal("no vectors")
	}
	for _, v := range vs {
		t.Run(v.Name, func(t *testing.T) {
			priv := ed25519.NewKeyFromSeed(mustHex(t, v.SecretKey))
			pub := mustHex(t, v.PublicKey)
			if !bytes.Equal(priv.Public().(ed25519.PublicKey), pub) {
				t.Fatal("public key derived from the seed differs")
			}
			msg, sig := mustHex(t, v.Message), mustHex(t, v.Signature)
			if got := ed25519.Sign(priv, msg); !bytes.Equal(got, sig) {
				t.Errorf("signature %x, want %x", got, sig)
			}
			if !verifySignature(pub, msg, sig) {
				t.Error("vector signature does not verify")
			}
			bad := append([]byte(nil), sig...)
			bad[0] ^= 0x80
			if verifySignature(pub, msg, bad) {
				t.Error("altered signature verifies")
			}
		})
	}
	t.Logf("%d RFC 8032 vectors", len(vs))
}

// Go's crypto/ed25519 rejects a non-canonical S (S >= L), a signature of the
// wrong length and an R or public key that does not decode, which is what
// Wycheproof expects of every vector: its "valid" set includes the TinkOverflow
// cases and its "invalid" set the malleability and encoding cases.
func TestEd25519MatchesEveryWycheproofVerdict(t *testing.T) {
	var file struct {
		TestGroups []struct {
			PublicKey struct{ PK string } `json:"publicKey"`
			Tests     []struct {
				TcID    int `json:"tcId"`
				Comment string
				Flags   []string
				Msg     string
				Sig     string
				Result  string
			}
		} `json:"testGroups"`
	}
	readJSON(t, filepath.Join(testdata.Dir(t, "ed25519"), "wycheproof_ed25519_test.json"), &file)
	counts := map[string]int{}
	total := 0
	for _, g := range file.TestGroups {
		pub := mustHex(t, g.PublicKey.PK)
		for _, tc := range g.Tests {
			total++
			got := verifySignature(pub, mustHex(t, tc.Msg), mustHex(t, tc.Sig))
			want := tc.Result == "valid"
			if tc.Result != "valid" && tc.Result != "invalid" {
				t.Fatalf("tcId %d: unexpected result %q", tc.TcID, tc.Result)
			}
			if got != want {
				t.Errorf("tcId %d (%s, %v): verify = %v, want %s", tc.TcID, tc.Comment, tc.Flags, got, tc.Result)
				continue
			}
			counts[tc.Result+" "+strings.Join(tc.Flags, "+")]++
		}
	}
	if total == 0 {
		t.Fatal("no vectors")
	}
	t.Logf("%d Wycheproof vectors agree: %v", total, counts)
}

// The W3C eddsa-jcs-2022 vectors sign with JCS + SHA-256 + Ed25519, the same
// three primitives as our receipts, so they cross-check canonicalization,
// hashing and signing against an independent implementation.
func TestEddsaJCS2022VectorsCrossCheckJCSAndEd25519(t *testing.T) {
	dir := testdata.Dir(t, "vc-di-eddsa-jcs-2022")
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	text := func(name string) string { return strings.TrimSpace(string(read(name))) }

	var kp struct{ PublicKeyMultibase, PrivateKeyMultibase string }
	readJSON(t, filepath.Join(dir, "keyPair.json"), &kp)
	pubMC := base58btc(t, kp.PublicKeyMultibase)
	privMC := base58btc(t, kp.PrivateKeyMultibase)
	// Multicodec prefixes: ed25519-pub 0xed01, ed25519-priv 0x8026.
	if !bytes.HasPrefix(pubMC, []byte{0xed, 0x01}) || !bytes.HasPrefix(privMC, []byte{0x80, 0x26}) {
		t.Fatalf("unexpected multicodec prefixes %x %x", pubMC[:2], privMC[:2])
	}
	pub := ed25519.PublicKey(pubMC[2:])
	priv := ed25519.NewKeyFromSeed(privMC[2:])
	if !priv.Public().(ed25519.PublicKey).Equal(pub) {
		t.Fatal("key pair does not match")
	}

	unsigned := read("unsigned.json")
	canonDoc, err := Canonicalize(unsigned)
	if err != nil {
		t.Fatal(err)
	}
	treeDoc, err := AppendCanonical(nil, decodeTree(t, unsigned))
	if err != nil {
		t.Fatal(err)
	}
	if string(canonDoc) != text("canonDocJCS.txt") || string(treeDoc) != text("canonDocJCS.txt") {
		t.Errorf("canonical document differs:\n got %s\nwant %s", canonDoc, text("canonDocJCS.txt"))
	}
	if got := Hash(canonDoc); got != text("docHashJCS.txt") {
		t.Errorf("document hash %s, want %s", got, text("docHashJCS.txt"))
	}

	proofConfig := read("proofConfigJCS.json")
	canonProof, err := Canonicalize(proofConfig)
	if err != nil {
		t.Fatal(err)
	}
	if string(canonProof) != text("proofCanonJCS.txt") {
		t.Errorf("canonical proof config differs:\n got %s\nwant %s", canonProof, text("proofCanonJCS.txt"))
	}
	if got := Hash(canonProof); got != text("proofHashJCS.txt") {
		t.Errorf("proof hash %s, want %s", got, text("proofHashJCS.txt"))
	}

	ph, dh := sha256.Sum256(canonProof), sha256.Sum256(canonDoc)
	combined := append(ph[:], dh[:]...)
	if got := hex.EncodeToString(combined); got != text("combinedHashJCS.txt") {
		t.Errorf("combined hash %s, want %s", got, text("combinedHashJCS.txt"))
	}
	sig := ed25519.Sign(priv, combined)
	if got := hex.EncodeToString(sig); got != text("sigHexJCS.txt") {
		t.Errorf("signature %s, want %s", got, text("sigHexJCS.txt"))
	}
	if !verifySignature(pub, combined, sig) {
		t.Error("signature does not verify")
	}
	if got := base58btc(t, text("sigBTC58JCS.txt")); !bytes.Equal(got, sig) {
		t.Errorf("proofValue decodes to %x", got)
	}

	// The signed credential, proof removed, is the same document again.
	var signed map[string]any
	readJSON(t, filepath.Join(dir, "signedJCS.json"), &signed)
	delete(signed, "proof")
	again, err := AppendCanonical(nil, signed)
	if err != nil || !bytes.Equal(again, canonDoc) {
		t.Errorf("signed credential without proof canonicalizes to %s (%v)", again, err)
	}
}

// base58btc decodes a multibase 'z' string (Bitcoin alphabet).
func base58btc(t *testing.T, s string) []byte {
	t.Helper()
	const alphabet = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
	if !strings.HasPrefix(s, "z") {
		t.Fatalf("%q is not multibase base58btc", s)
	}
	s = s[1:]
	n := new(big.Int)
	for _, c := range s {
		i := strings.IndexRune(alphabet, c)
		if i < 0 {
			t.Fatalf("bad base58 character %q", c)
		}
		n.Mul(n, big.NewInt(58)).Add(n, big.NewInt(int64(i)))
	}
	out := n.Bytes()
	for i := 0; i < len(s) && s[i] == '1'; i++ {
		out = append([]byte{0}, out...)
	}
	return out
}
