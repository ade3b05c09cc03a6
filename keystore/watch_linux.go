package keystore

import (
	"bytes"
	"errors"
	"syscall"
	"unsafe"
)

// dirEvents is every change to the directory's entries or to the files in
// it that could replace or alter the index: a rotation renames a new index
// over the old one (IN_MOVED_TO), an operator may edit it in place
// (IN_MODIFY, IN_CLOSE_WRITE) or restore it (IN_CREATE), and the directory
// itself may go (IN_DELETE_SELF, IN_MOVE_SELF: the watch then ends).
const dirEvents = syscall.IN_CREATE | syscall.IN_DELETE | syscall.IN_MODIFY | syscall.IN_CLOSE_WRITE |
	syscall.IN_MOVED_FROM | syscall.IN_MOVED_TO | syscall.IN_ATTRIB | syscall.IN_DELETE_SELF | syscall.IN_MOVE_SELF

// File systems whose files other machines can change: the kernel sends no
// event for those changes, so a directory on one is not watched. The magic
// numbers are 32 bits; Statfs_t.Type is signed, and 32 bits wide on some
// platforms, so it is compared as uint32.
var remoteFileSystems = map[uint32]bool{
	0x6969:     true, // NFS
	0x517b:     true, // SMB
	0xff534d42: true, // CIFS
	0xfe534d42: true, // SMB2
	0x65735546: true, // FUSE (sshfs and the like)
	0x01021997: true, // 9P
	0x00c36400: true, // Ceph
	0x47504653: true, // GPFS
	0x5346414f: true, // AFS
	0x0bd00bd0: true, // Lustre
}

// stepEvents is every change that makes a name along the key directory's
// path lead elsewhere: the entry renamed, removed or (after either)
// created again, and the directory holding it going.
const stepEvents = syscall.IN_CREATE | syscall.IN_DELETE | syscall.IN_MOVED_FROM | syscall.IN_MOVED_TO |
	syscall.IN_DELETE_SELF | syscall.IN_MOVE_SELF

// openWatch starts an inotify watch of dir and of each directory along its
// path (steps), and reports the watch descriptor of each step. The
// instance is non-blocking and read only by poll, in the caller's
// goroutine: no thread waits on it.
func openWatch(dir string, steps []step) (int, []int32, error) {
	var fs syscall.Statfs_t
	if err := syscall.Statfs(dir, &fs); err != nil {
		return -1, nil, err
	}
	if remoteFileSystems[uint32(fs.Type)] {
		return -1, nil, errors.New("the key directory is on a network file system")
	}
	fd, err := syscall.InotifyInit1(syscall.IN_CLOEXEC | syscall.IN_NONBLOCK)
	if err != nil {
		return -1, nil, err
	}
	fail := func(err error) (int, []int32, error) {
		syscall.Close(fd)
		return -1, nil, err
	}
	wds := make([]int32, len(steps))
	for i, st := range steps {
		wd, err := syscall.InotifyAddWatch(fd, st.parent, stepEvents|syscall.IN_ONLYDIR)
		if err != nil {
			return fail(err)
		}
		wds[i] = int32(wd)
	}
	// The path watched, a link put on it from now on is an event; none
	// may be there already (see watch).
	if !noLinks(steps) {
		return fail(errors.New("the key directory's path holds a symbolic link"))
	}
	if _, err := syscall.InotifyAddWatch(fd, dir, dirEvents|syscall.IN_ONLYDIR|syscall.IN_DONT_FOLLOW); err != nil {
		return fail(err)
	}
	return fd, wds, nil
}

// pollWatch drains the events queued on fd. It reports whether there were
// any, and what became of the watch: it holds, it ended (the directory was
// removed or moved, a name along its path changed, or the instance failed:
// the caller then stats instead), or the kernel's queue overflowed and
// events were lost. Events on the directories along the path about other
// names than the one in steps are no change, but they fill the queue all
// the same: a busy parent such as /tmp overflows it.
func pollWatch(fd int, steps map[int32]string) (events bool, state watchState) {
	// Room for one event with the longest name (the kernel refuses a read
	// that cannot take the next event whole), small enough for the stack
	// of the signing goroutine that calls this before every signature.
	var buf [syscall.SizeofInotifyEvent + syscall.NAME_MAX + 1 + 128]byte
	for {
		n, err := syscall.Read(fd, buf[:])
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.EAGAIN):
			return events, watchHolds
		case err != nil || n <= 0:
			return true, watchEnded
		}
		for off := 0; off+syscall.SizeofInotifyEvent <= n; {
			ev := (*syscall.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := buf[off+syscall.SizeofInotifyEvent : off+syscall.SizeofInotifyEvent+int(ev.Len)]
			off += syscall.SizeofInotifyEvent + int(ev.Len)
			if ev.Mask&syscall.IN_Q_OVERFLOW != 0 {
				return true, watchOverflowed
			}
			if ev.Mask&(syscall.IN_IGNORED|syscall.IN_DELETE_SELF|syscall.IN_MOVE_SELF|syscall.IN_UNMOUNT) != 0 {
				return true, watchEnded
			}
			step, onPath := steps[ev.Wd]
			if !onPath {
				events = true // in the key directory
				continue
			}
			if string(bytes.TrimRight(name, "\x00")) == step {
				return true, watchEnded
			}
		}
	}
}

func closeWatch(fd int) { syscall.Close(fd) }
