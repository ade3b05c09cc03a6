package growread

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

func TestRead(t *testing.T) {
	body := strings.Repeat("0123456789", 10_000)
	for _, c := range []struct {
		desc string
		in   string
		upTo int64
		dst  []byte
		want string
	}{
		{"to the end", body, 1 << 20, nil, body},
		{"stops at upTo", body, 12_345, nil, body[:12_345]},
		{"an empty body", "", 10, nil, ""},
		{"a pooled buffer larger than upTo", body, 100, make([]byte, 0, 1<<20), body[:100]},
		{"a pooled buffer smaller than the body", body, 1 << 20, make([]byte, 7, 16), body},
	} {
		got, err := Read(iotest.HalfReader(strings.NewReader(c.in)), c.upTo, c.dst)
		if err != nil || string(got) != c.want {
			t.Errorf("%s: %d bytes, %v; want %d bytes", c.desc, len(got), err, len(c.want))
		}
	}
}

// A buffer holds no more than First before any byte arrives, whatever
// upTo (a Content-Length announced and not sent), and grows with the
// bytes that do, at most twice what arrived.
func TestReadGrowsWithTheBytesThatArrive(t *testing.T) {
	r, w := io.Pipe()
	done := make(chan []byte)
	go func() {
		b, _ := Read(r, 1<<20, nil)
		done <- b
	}()
	w.Write(bytes.Repeat([]byte{'x'}, 10_000))
	w.CloseWithError(errors.New("client gone"))
	b := <-done
	if len(b) != 10_000 || cap(b) > 2*len(b) {
		t.Errorf("read %d bytes into a buffer of %d; want 10000 into at most twice that", len(b), cap(b))
	}
	if b, _ := Read(iotest.ErrReader(errors.New("nothing sent")), 1<<20, nil); cap(b) > First {
		t.Errorf("a body that sent nothing holds %d bytes; want at most %d", cap(b), First)
	}
}

func TestReadReturnsTheReadersError(t *testing.T) {
	cut := errors.New("cut")
	got, err := Read(io.MultiReader(strings.NewReader("abc"), iotest.ErrReader(cut)), 100, nil)
	if !errors.Is(err, cut) || string(got) != "abc" {
		t.Errorf("Read = %q, %v; want abc, cut", got, err)
	}
}
