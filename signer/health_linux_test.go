package signer

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/aovhq/aov/keystore"
)

// countIndexOpens counts, with an inotify watch of its own (IN_OPEN), how
// often index.json in dir is opened from now on: every reload of the key
// store reads it.
func countIndexOpens(t *testing.T, dir string) func() int {
	t.Helper()
	fd, err := syscall.InotifyInit1(syscall.IN_CLOEXEC | syscall.IN_NONBLOCK)
	if err != nil {
		t.Skip(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if _, err := syscall.InotifyAddWatch(fd, dir, syscall.IN_OPEN); err != nil {
		t.Fatal(err)
	}
	n := 0
	return func() int {
		var buf [64 << 10]byte
		for {
			r, err := syscall.Read(fd, buf[:])
			if err != nil || r <= 0 {
				return n
			}
			for off := 0; off+syscall.SizeofInotifyEvent <= r; {
				ev := (*syscall.InotifyEvent)(unsafe.Pointer(&buf[off]))
				name := strings.TrimRight(string(buf[off+syscall.SizeofInotifyEvent:off+syscall.SizeofInotifyEvent+int(ev.Len)]), "\x00")
				off += syscall.SizeofInotifyEvent + int(ev.Len)
				if name == keystore.IndexFile {
					n++
				}
			}
		}
	}
}

// GET /health on the signing listener needs no secret. While the key
// directory does not load (`certd rotate` run as root left k2.key with a
// mode certd refuses), it answers 503, and re-reads the directory at most
// once a second however often it is asked, as card requests do.
func TestHealthRetriesAKeyDirectoryThatDoesNotLoadAtMostOnceASecond(t *testing.T) {
	const secret = "s3cret-s3cret-s3cret"
	dir := filepath.Join(shortDir(t), "keys")
	op, err := keystore.Open(dir, keystore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := op.Generate(); err != nil {
		t.Fatal(err)
	}
	keys, err := keystore.Open(dir, keystore.Options{Watch: true, CurrentOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { keys.Close() })
	srv, err := NewServer(ServerConfig{Keys: keys, Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := ListenTCP("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 5 * time.Second}
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })

	if _, err := op.Rotate(); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "k2.key"), 0o644); err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String() + PathHealth
	get := func() int {
		resp, err := http.Get(url) // no Authorization
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	opens := countIndexOpens(t, dir)
	start := time.Now()
	const n = 300
	for range n {
		if code := get(); code != http.StatusServiceUnavailable {
			t.Fatalf("health = %d, want 503", code)
		}
	}
	el := time.Since(start)
	if got, allowed := opens(), int(el/keystore.RetryEvery)+1; got > allowed {
		t.Fatalf("%d unauthenticated GET %s in %v re-read index.json %d times; want at most %d (once a second)", n, PathHealth, el.Round(time.Millisecond), got, allowed)
	}
	// The file fixed, health says so within a second.
	if err := os.Chmod(filepath.Join(dir, "k2.key"), 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(keystore.RetryEvery)
	if code := get(); code != http.StatusOK {
		t.Fatalf("health after the fix = %d, want 200", code)
	}
}
