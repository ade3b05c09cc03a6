//go:build unix

package store

import (
	"os"
	"syscall"
)

// lockDir takes the lock Badger takes on its directory (an exclusive
// flock of the directory), for a look at the files before Badger opens
// them. ok is false when another process holds it (or the directory
// cannot be opened): Badger's Open reports that.
func lockDir(dir string) (unlock func(), ok bool) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, false
	}
	if err := syscall.Flock(int(d.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		d.Close()
		return nil, false
	}
	return func() { d.Close() }, true // closing the last descriptor releases it
}
