package store

import "syscall"

// freeBytes is the space an unprivileged writer may still take on the
// file system holding the open descriptor fd.
func freeBytes(fd int) (uint64, error) {
	var st syscall.Statfs_t
	if err := syscall.Fstatfs(fd, &st); err != nil {
		return 0, err
	}
	return st.Bavail * uint64(st.Bsize), nil
}
