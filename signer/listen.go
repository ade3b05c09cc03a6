package signer

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/aovhq/aov/internal/regfile"
)

// MinSecretBytes is the shortest bearer secret accepted for TCP mode.
const MinSecretBytes = 16

// maxSecretFileBytes bounds a secret file: a secret is tens of bytes, so a
// larger file is the wrong one (a secret cut at the bound would be taken
// for another).
const maxSecretFileBytes = 4096

// ListenUnix listens on a unix socket at path that only certd's own user can
// connect to (mode 0600). The socket's directory is created with mode 0700
// when missing.
//
// The socket file never exists at path with any other mode. bind creates
// it with the process umask's mode, and chmod can only follow, so binding
// at path would leave an instant in which another user may connect
// wherever the directory lets them through (an existing /run/aov of mode
// 0755, say). Instead the socket is bound in a fresh directory of mode
// 0700 inside path's directory, restricted to 0600 there, where nobody
// else can reach it, and then hard-linked to path: link, unlike rename,
// fails when path exists, so of two certds starting at once one gets the
// path and the other is refused, as bind would. Setting the umask around
// bind would do too, but the umask is the whole process's, and ListenUnix
// runs while other goroutines may create files.
//
// A socket file left by a certd that died is removed; a live one (something
// answers on it) is refused, so two certds never fight over one socket. A
// path that exists and is not a socket is never deleted. Close removes the
// socket file.
func ListenUnix(path string) (net.Listener, error) {
	if path == "" {
		return nil, errors.New("listening on unix socket: no path given")
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("listening on unix socket: creating its directory: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("listening on unix socket: %s exists and is not a socket; remove it or choose another path", path)
		}
		conn, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			conn.Close()
			return nil, fmt.Errorf("listening on unix socket: another process is already serving on %s", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("listening on unix socket: removing the stale socket %s: %w", path, err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("listening on unix socket: %w", err)
	}
	private, err := os.MkdirTemp(dir, ".sock") // mode 0700
	if err != nil {
		return nil, fmt.Errorf("listening on unix socket: creating a private directory in %s: %w", dir, err)
	}
	defer os.RemoveAll(private)
	tmp := filepath.Join(private, "s")
	if len(tmp) > maxSocketPath {
		return nil, fmt.Errorf("listening on unix socket: the socket is first made at %s, %d bytes long, over the %d a socket path may have; choose a shorter path than %s", tmp, len(tmp), maxSocketPath, path)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listening on unix socket: %w", err)
	}
	ln.SetUnlinkOnClose(false) // its name is gone; unixListener removes path
	if err := os.Chmod(tmp, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("listening on unix socket: restricting it to mode 0600: %w", err)
	}
	if err := os.Link(tmp, path); err != nil {
		ln.Close()
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("listening on unix socket: %s appeared while certd was starting (another certd?); not replacing it", path)
		}
		return nil, fmt.Errorf("listening on unix socket: %w", err)
	}
	return &unixListener{UnixListener: ln, addr: &net.UnixAddr{Name: path, Net: "unix"}}, nil
}

// maxSocketPath is the longest socket path bind accepts on Linux (108
// bytes of sun_path with the terminating NUL); other systems allow fewer
// or as many, and bind reports it then.
const maxSocketPath = 107

// unixListener is ListenUnix's listener: the socket was bound under a
// temporary name, so it reports path as its address and removes path when
// closed, as a net.UnixListener does with its own name.
type unixListener struct {
	*net.UnixListener
	addr   *net.UnixAddr
	remove sync.Once
}

func (l *unixListener) Addr() net.Addr { return l.addr }

func (l *unixListener) Close() error {
	err := l.UnixListener.Close()
	l.remove.Do(func() { os.Remove(l.addr.Name) })
	return err
}

// ListenTCP listens on a loopback TCP address and refuses any other: the
// signing endpoint must never be reachable from the network, whatever the
// secret. addr is host:port with an IP literal or "localhost"; port 0 picks
// a free port.
func ListenTCP(addr string) (net.Listener, error) {
	if err := CheckLoopback(addr); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", addr, err)
	}
	return ln, nil
}

// CheckLoopback reports an error unless every address host:port can bind to
// is a loopback address.
func CheckLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("signing listen address %q: %w", addr, err)
	}
	if host == "" {
		return fmt.Errorf("signing listen address %q listens on every interface; use 127.0.0.1:PORT", addr)
	}
	var ips []net.IP
	if ip := net.ParseIP(host); ip != nil {
		ips = []net.IP{ip}
	} else if strings.EqualFold(host, "localhost") {
		addrs, err := net.DefaultResolver.LookupIPAddr(context.Background(), host)
		if err != nil {
			return fmt.Errorf("signing listen address %q: %w", addr, err)
		}
		for _, a := range addrs {
			ips = append(ips, a.IP)
		}
	} else {
		return fmt.Errorf("signing listen address %q is not an IP address or localhost; use 127.0.0.1:PORT", addr)
	}
	for _, ip := range ips {
		if !ip.IsLoopback() {
			return fmt.Errorf("signing listen address %q is not a loopback address; the signing endpoint must never be reachable from the network, use 127.0.0.1:PORT", addr)
		}
	}
	if len(ips) == 0 {
		return fmt.Errorf("signing listen address %q resolves to nothing", addr)
	}
	return nil
}

// ReadSecretFile reads the shared bearer secret of TCP mode from a file that
// only its owner can read (like a private key file), trimming surrounding
// whitespace. A short secret is refused, and so is anything but a regular
// file of at most maxSecretFileBytes (regfile): a named pipe there would
// hang the start of certd or verifierd forever.
func ReadSecretFile(path string) (string, error) {
	f, fi, err := regfile.Open(path)
	if err != nil {
		return "", fmt.Errorf("reading signing secret: %w", err)
	}
	defer f.Close()
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return "", fmt.Errorf("reading signing secret: %s has mode %04o and is readable by group or others; restrict it with `chmod 600 %s`", path, perm, path)
	}
	raw, err := regfile.ReadAll(f, maxSecretFileBytes)
	if err != nil {
		return "", fmt.Errorf("reading signing secret: %s: %w", path, err)
	}
	secret := strings.TrimSpace(string(raw))
	if len(secret) < MinSecretBytes {
		return "", fmt.Errorf("reading signing secret: %s holds %d bytes, want at least %d (e.g. `openssl rand -hex 32 > %s`)", path, len(secret), MinSecretBytes, path)
	}
	return secret, nil
}
