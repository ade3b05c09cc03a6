package servers

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/aovhq/aov/internal/interop"
)

// Tmpfs mounts a tmpfs of size (mount's notation: "160m") on a fresh
// directory and unmounts it when t ends: a file system that really fills,
// as a data disk does, without filling the machine's. Mounting takes root:
// elsewhere t is skipped, saying so (failed under CI, which runs as root).
func Tmpfs(t testing.TB, size string) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		interop.Missing(t, "the full-disk tests mount a tmpfs, which takes root: mount: "+err.Error()+" "+strings.TrimSpace(string(out)))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v %s", dir, err, out)
		}
	})
	return dir
}

// Ext4 makes an ext4 file system of size (truncate's notation: "200M") in
// a sparse image file, mounts it through a loop device on a fresh
// directory and unmounts it and detaches the device when t ends: a volume
// with ext4's blocks reserved for root, which a tmpfs has not. Like Tmpfs
// it takes root: elsewhere t is skipped, saying so.
func Ext4(t testing.TB, size string) string {
	t.Helper()
	tmp := t.TempDir()
	img, mnt := filepath.Join(tmp, "ext4.img"), filepath.Join(tmp, "mnt")
	run := func(name string, arg ...string) string {
		t.Helper()
		out, err := exec.Command(name, arg...).CombinedOutput()
		if err != nil {
			interop.Missing(t, "the ext4 tests make and mount a file system, which takes root and e2fsprogs: "+name+": "+err.Error()+" "+strings.TrimSpace(string(out)))
		}
		return strings.TrimSpace(string(out))
	}
	run("truncate", "-s", size, img)
	run("mkfs.ext4", "-q", "-F", img)
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	dev := run("losetup", "--find", "--show", img)
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
			t.Errorf("losetup -d %s: %v %s", dev, err, out)
		}
	})
	run("mount", dev, mnt)
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v %s", mnt, err, out)
		}
	})
	return mnt
}

// FillLeaving writes the file path until the file system holding it has
// at most leave bytes free, for as long as the caller keeps the file.
func FillLeaving(t testing.TB, path string, leave uint64) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		var st syscall.Statfs_t
		if err := syscall.Fstatfs(int(f.Fd()), &st); err != nil {
			t.Fatal(err)
		}
		free := st.Bavail * uint64(st.Bsize)
		if free <= leave {
			return
		}
		if _, err := f.Write(buf[:min(uint64(len(buf)), free-leave)]); err != nil {
			return // full: less was left than asked
		}
	}
}

// InChild runs the test named name again in a child process of the test
// binary with env added, and returns its output (up to the first
// goroutine's stack) and exit error: a fault that kills a process (a
// SIGBUS in a goroutine of a library cannot be recovered) then fails the
// test that caused it, not the whole run.
func InChild(t testing.TB, name string, env ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run", "^"+name+"$", "-test.v")
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	s := string(out)
	if i := strings.Index(s, "\ngoroutine "); i > 0 {
		s = s[:i]
	}
	return s, err
}

// tmpfsRoot is the environment variable that tells a child process of
// InChildOnTmpfs where its tmpfs is.
const tmpfsRoot = "AOV_TEST_TMPFS_ROOT"

// InChildOnTmpfs runs f(t, root), root a tmpfs of size (Tmpfs), in a child
// process of the test binary (InChild), and fails t with the child's
// output if the child fails or dies: a disk that fills can fault a
// process that writes through memory maps, and that must fail the one
// test, not the run. t must be a top-level test.
func InChildOnTmpfs(t *testing.T, size string, f func(t *testing.T, root string)) {
	t.Helper()
	if root := os.Getenv(tmpfsRoot); root != "" {
		f(t, root)
		return
	}
	root := Tmpfs(t, size)
	if out, err := InChild(t, t.Name(), tmpfsRoot+"="+root); err != nil {
		t.Fatalf("the child process on a %s tmpfs failed (%v):\n%s", size, err, out)
	}
}
