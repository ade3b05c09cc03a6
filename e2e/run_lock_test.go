package e2e

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// make run's start-up lock is opened in a directory only the user can
// write: $XDG_RUNTIME_DIR, else aov-run-<uid> of $TMPDIR or /tmp, made mode
// 0700. It used to be aov-run-<uid>.lock right in a shared /tmp: another
// user's symlink by that name made the run (root, often) create a file
// where it pointed, and another user's file could block every run. A lock
// directory that is a symlink, another user's, or writable by others is
// refused with a message, before anything is opened in it.
func TestRunLockIsInADirectoryOnlyTheUserWrites(t *testing.T) {
	env, _, _ := runEnv(t, filepath.Join(t.TempDir(), "data"))
	// Each run stops right after the lock: its HTTP port is busy.
	ln, err := net.Listen("tcp", "127.0.0.1:"+envOf(env, "AOV_HTTP_PORT"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// shared is a directory like /tmp: anyone may write, sticky.
	shared := func(t *testing.T) string {
		dir := t.TempDir()
		if err := os.Chmod(dir, 0o1777); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	run := func(t *testing.T, tmp string) (string, int) {
		t.Helper()
		return runScriptToEnd(t, withEnv(withEnv(env, "TMPDIR", tmp), "XDG_RUNTIME_DIR", ""), 2*time.Minute)
	}
	// asNobody gives path to another user, as if they had made it.
	asNobody := func(t *testing.T, path string) {
		t.Helper()
		if os.Getuid() != 0 {
			t.Skip("needs root to make a file another user's")
		}
		if err := os.Lchown(path, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	lockDir := func(tmp string) string { return filepath.Join(tmp, fmt.Sprintf("aov-run-%d", os.Getuid())) }
	refused := func(t *testing.T, out string, code int) {
		t.Helper()
		if code == 0 || !strings.Contains(out, "start-up lock's directory") || strings.Contains(out, "already in use") {
			t.Errorf("run.sh was not refused for its lock directory (exit %d):\n%s", code, out)
		}
	}

	t.Run("made 0700 and used", func(t *testing.T) {
		tmp := shared(t)
		// Another user's symlink where the lock used to be.
		victim := filepath.Join(t.TempDir(), "nologin")
		old := filepath.Join(tmp, fmt.Sprintf("aov-run-%d.lock", os.Getuid()))
		if err := os.Symlink(victim, old); err != nil {
			t.Fatal(err)
		}
		out, code := run(t, tmp)
		if code == 0 || !strings.Contains(out, "already in use") {
			t.Fatalf("run.sh did not reach the address check (exit %d):\n%s", code, out)
		}
		if _, err := os.Lstat(victim); err == nil {
			t.Errorf("run.sh followed the symlink %s and created %s", old, victim)
		}
		fi, err := os.Lstat(lockDir(tmp))
		if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
			t.Fatalf("lock directory %s: %v %v, want a directory of mode 0700", lockDir(tmp), fi, err)
		}
		if _, err := os.Stat(filepath.Join(lockDir(tmp), "aov-run.lock")); err != nil {
			t.Errorf("no lock file in %s: %v", lockDir(tmp), err)
		}
		// The next run takes the same lock.
		if out, code := run(t, tmp); code == 0 || !strings.Contains(out, "already in use") {
			t.Errorf("a second run did not reach the address check (exit %d):\n%s", code, out)
		}
	})
	t.Run("a symlink is refused", func(t *testing.T) {
		tmp := shared(t)
		victim := t.TempDir()
		if err := os.Symlink(victim, lockDir(tmp)); err != nil {
			t.Fatal(err)
		}
		asNobody(t, lockDir(tmp))
		out, code := run(t, tmp)
		refused(t, out, code)
		if entries, _ := os.ReadDir(victim); len(entries) > 0 {
			t.Errorf("run.sh created %s in the directory the symlink points to", entries[0].Name())
		}
	})
	t.Run("another user's directory is refused", func(t *testing.T) {
		tmp := shared(t)
		if err := os.Mkdir(lockDir(tmp), 0o700); err != nil {
			t.Fatal(err)
		}
		asNobody(t, lockDir(tmp))
		out, code := run(t, tmp)
		refused(t, out, code)
	})
	t.Run("a directory others can write is refused", func(t *testing.T) {
		tmp := shared(t)
		if err := os.Mkdir(lockDir(tmp), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(lockDir(tmp), 0o777); err != nil {
			t.Fatal(err)
		}
		out, code := run(t, tmp)
		refused(t, out, code)
	})
	t.Run("a file is refused", func(t *testing.T) {
		tmp := shared(t)
		if err := os.WriteFile(lockDir(tmp), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		out, code := run(t, tmp)
		refused(t, out, code)
	})
}
