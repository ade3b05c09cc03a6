package pghistory

import (
	"bytes"
	"errors"
	"testing"

	"github.com/aovhq/aov/store"
)

// FuzzCursor: a cursor comes from the client. Any string either parses to
// a (time, id) that encodes back to itself, or is ErrBadCursor; never a
// panic or another error.
func FuzzCursor(f *testing.F) {
	f.Add(makeCursor(1796163319000000000, []byte("a08")))
	f.Add(makeCursor(-1, []byte{0}))
	for _, s := range []string{"", "!!!", "AAAA", "AAAAAAAAAAA", "AAAAAAAAAAAB", "not base64 at all"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		at, id, err := parseCursor(s)
		if err != nil {
			if !errors.Is(err, store.ErrBadCursor) {
				t.Fatalf("parseCursor(%q) = %v, want ErrBadCursor", s, err)
			}
			return
		}
		if len(id) == 0 || len(id) > 200 {
			t.Fatalf("parseCursor(%q) accepted an id of %d bytes", s, len(id))
		}
		back := makeCursor(at, id)
		if back != s {
			t.Fatalf("cursor %q parsed to (%d, %q), which encodes as %q", s, at, id, back)
		}
		at2, id2, err := parseCursor(back)
		if err != nil || at2 != at || !bytes.Equal(id2, id) {
			t.Fatalf("round trip of %q: (%d, %q, %v)", back, at2, id2, err)
		}
	})
}
