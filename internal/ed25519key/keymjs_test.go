package ed25519key

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"filippo.io/edwards25519"
)

// README's by-hand key.mjs must refuse exactly the card keys Check
// refuses. The weak() function is taken from README.md as written and
// run with node on many keys: random bytes, real keys, keys with the sign
// bit flipped, y near p, the small-order points and real points plus a
// torsion point.
func TestReadmeKeyMjsAgreesWithCheck(t *testing.T) {
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node not installed")
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(readme)
	i := strings.Index(s, "   const P = 2n ** 255n - 19n;")
	j := strings.Index(s, "   const four = [\"algorithm\"")
	if i < 0 || j < i {
		t.Fatal("weak() not found in README")
	}
	weak := regexp.MustCompile(`(?m)^   `).ReplaceAllString(s[i:j], "")

	var keys [][]byte
	add := func(b []byte) { keys = append(keys, append([]byte(nil), b...)) }
	// small-order points, all 8, with both sign bits
	torsion := []string{
		"0100000000000000000000000000000000000000000000000000000000000000",
		"ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
		"0000000000000000000000000000000000000000000000000000000000000000",
		"0000000000000000000000000000000000000000000000000000000000000080",
		"c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",
		"c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa",
		"26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",
		"26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc85",
	}
	var tpts []*edwards25519.Point
	for _, h := range torsion {
		b := mustHex(h)
		add(b)
		b[31] ^= 0x80
		add(b)
		if p, err := new(edwards25519.Point).SetBytes(mustHex(h)); err == nil {
			tpts = append(tpts, p)
		}
	}
	// y = p .. 2^255-1 with both sign bits, and y = p-1.. small
	for k := 0; k < 19; k++ {
		b := make([]byte, 32)
		for x := range b {
			b[x] = 0xff
		}
		b[31] = 0x7f
		b[0] = 0xed + byte(k) // p = 2^255-19 -> low byte 0xed
		if 0xed+k > 0xff {
			continue
		}
		add(b)
		b[31] |= 0x80
		add(b)
	}
	for k := 0; k < 64; k++ {
		b := make([]byte, 32)
		binary.LittleEndian.PutUint64(b, uint64(k))
		add(b)
		b[31] |= 0x80
		add(b)
	}
	for n := 0; n < 1500; n++ {
		pub, _, _ := ed25519.GenerateKey(rand.Reader)
		add(pub)
		f := append([]byte(nil), pub...)
		f[31] ^= 0x80
		add(f)
		p, _ := new(edwards25519.Point).SetBytes(pub)
		add(new(edwards25519.Point).Add(p, tpts[n%len(tpts)]).Bytes())
		r := make([]byte, 32)
		rand.Read(r)
		add(r)
	}
	var lines []string
	for _, k := range keys {
		lines = append(lines, base64.StdEncoding.EncodeToString(k))
	}
	js := "import { readFileSync } from \"node:fs\";\n" + weak +
		"for (const k of readFileSync(0, \"utf8\").trim().split(\"\\n\")) console.log(weak(k) ? 1 : 0);\n"
	dir := t.TempDir()
	os.WriteFile(dir+"/w.mjs", []byte(js), 0o644)
	cmd := exec.Command("node", dir+"/w.mjs")
	cmd.Stdin = strings.NewReader(strings.Join(lines, "\n"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, out)
	}
	got := strings.Fields(string(out))
	if len(got) != len(keys) {
		t.Fatalf("node answered %d of %d keys", len(got), len(keys))
	}
	bad := 0
	for i, k := range keys {
		goRefuses := Check(k) != nil
		jsRefuses := got[i] == "1"
		if goRefuses != jsRefuses {
			bad++
			if bad < 10 {
				t.Errorf("key %x: Check refuses=%v, key.mjs refuses=%v (%v)", k, goRefuses, jsRefuses, Check(k))
			}
		}
	}
	t.Logf("%d keys compared, %d disagreements", len(keys), bad)
}

func mustHex(h string) []byte {
	b := make([]byte, len(h)/2)
	for i := range b {
		var v byte
		for _, c := range h[2*i : 2*i+2] {
			v <<= 4
			switch {
			case c >= '0' && c <= '9':
				v |= byte(c - '0')
			default:
				v |= byte(c-'a') + 10
			}
		}
		b[i] = v
	}
	return b
}
