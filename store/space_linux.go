package store

import (
	"os"
	"syscall"
)

// diskSpace reads the file system holding the open descriptor fd: the
// space an unprivileged writer may still take (f_bavail), and the size of
// the whole that such a writer may use: its blocks less those reserved
// for root (f_bfree − f_bavail, ext4's 5% by default), the measure free
// is judged on.
func diskSpace(fd int) (free, size uint64, err error) {
	var st syscall.Statfs_t
	if err := syscall.Fstatfs(fd, &st); err != nil {
		return 0, 0, err
	}
	rootOnly := st.Bfree - min(st.Bavail, st.Bfree)
	return st.Bavail * uint64(st.Bsize), (st.Blocks - min(rootOnly, st.Blocks)) * uint64(st.Bsize), nil
}

// allocated is the bytes the file system allocated to the file fi, less
// than its size for a sparse file.
func allocated(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Blocks) * 512
	}
	return uint64(fi.Size())
}
