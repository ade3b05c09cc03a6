package signer

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"unsafe"
)

// The socket file never exists at its path with a mode other than 0600:
// it appears there once (no chmod follows, which is what would close an
// instant of the umask's mode), and after listening it has mode 0600. The
// directory already exists with mode 0755, so it does not shield the
// socket, and the umask is set to 0 so that a socket bound in place would
// be open to everyone until the chmod. The kernel's inotify events on the
// directory are the witness: they are queued before each system call
// returns, so none can be missed.
func TestListenUnixSocketNeverExistsWithAWiderMode(t *testing.T) {
	dir := filepath.Join(shortDir(t), "run")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	fd, err := syscall.InotifyInit1(syscall.IN_CLOEXEC | syscall.IN_NONBLOCK)
	if err != nil {
		t.Skipf("no inotify: %v", err)
	}
	defer syscall.Close(fd)
	if _, err := syscall.InotifyAddWatch(fd, dir, syscall.IN_CREATE|syscall.IN_ATTRIB|syscall.IN_MOVED_TO); err != nil {
		t.Skipf("no inotify watch: %v", err)
	}
	path := filepath.Join(dir, "certd.sock")
	ln, err := ListenUnix(path)
	if err != nil {
		t.Fatal(err)
	}
	syscall.Umask(old)
	defer ln.Close()

	var events []string
	buf := make([]byte, 64<<10)
	n, _ := syscall.Read(fd, buf)
	for off := 0; n > 0 && off+syscall.SizeofInotifyEvent <= n; {
		ev := (*syscall.InotifyEvent)(unsafe.Pointer(&buf[off]))
		name := string(bytes.TrimRight(buf[off+syscall.SizeofInotifyEvent:off+syscall.SizeofInotifyEvent+int(ev.Len)], "\x00"))
		off += syscall.SizeofInotifyEvent + int(ev.Len)
		if name != filepath.Base(path) {
			continue
		}
		switch {
		case ev.Mask&syscall.IN_ATTRIB != 0:
			events = append(events, "attrib")
		case ev.Mask&(syscall.IN_CREATE|syscall.IN_MOVED_TO) != 0:
			events = append(events, "create")
		}
	}
	if len(events) != 1 || events[0] != "create" {
		t.Errorf("events on %s: %v; want it created once, with no change of mode after", filepath.Base(path), events)
	}
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Errorf("%s: mode %v, want a socket of mode 0600", path, fi.Mode())
	}
	if got := ln.Addr().String(); got != path {
		t.Errorf("Addr = %s, want %s", got, path)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("the directory holds %d entries, want the socket alone (no private directory left)", len(entries))
	}
	ln.Close()
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Errorf("Close left the socket file: %v", err)
	}
}
