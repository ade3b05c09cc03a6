// Package regfile reads the small files a daemon is pointed at and trusts
// (a private key, a key index, a bearer secret) only when they are regular
// files, and never waits on one that is not.
//
// Opening a named pipe for reading waits for a writer, which would hang a
// start forever (or a reload holding a lock, and every request behind
// it), and a device such as /dev/zero never ends; neither holds a key or
// a secret. The keystore and the signer's secret files read through it,
// so they refuse such files alike.
package regfile

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// Open opens path for reading and refuses anything but a regular file
// (through a symbolic link too). It opens without blocking, so a named
// pipe is refused at once, and checks the file opened (fstat), so nothing
// can be swapped in between a check and the open.
func Open(path string) (*os.File, fs.FileInfo, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = fmt.Errorf("%s is not a regular file", path)
	}
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, fi, nil
}

// ReadAll reads f to its end and refuses it when it holds more than limit
// bytes: a file that large is the wrong file, and is not read on.
func ReadAll(f *os.File, limit int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("file is larger than %d bytes", limit)
	}
	return b, nil
}
