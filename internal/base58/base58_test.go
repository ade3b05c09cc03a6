package base58

import "testing"

// FuzzBase58: decode and encode are inverses on what decode accepts.
func FuzzBase58(f *testing.F) {
	f.Add("11111111111111111111111111111111")
	f.Add("4zMMC9srt5Ri5X14GAgXhaHii3GnPAEERYPJgZJDncDU")
	f.Add("0OIl")
	f.Fuzz(func(t *testing.T, s string) {
		b, err := Decode(s)
		if err != nil {
			return
		}
		if got := Encode(b); got != s {
			t.Fatalf("%q decodes to %x, which encodes to %q", s, b, got)
		}
	})
}

// IsDigit admits exactly the bytes Decode accepts as a digit.
func TestIsDigit(t *testing.T) {
	n := 0
	for c := 0; c < 256; c++ {
		_, err := Decode(string([]byte{byte(c)}))
		if IsDigit(byte(c)) != (err == nil) {
			t.Errorf("IsDigit(%q) = %v, Decode error %v", rune(c), IsDigit(byte(c)), err)
		}
		if IsDigit(byte(c)) {
			n++
		}
	}
	if n != 58 {
		t.Errorf("IsDigit admits %d bytes, want 58", n)
	}
}
