// Package syncbuf is a byte buffer that goroutines may write while others
// read it: the sink tests give a child process or a handler's logger when
// they read what was written before the writer is done.
//
// It is not for production output paths (use a real log sink there), and
// it does not bound what it keeps.
package syncbuf

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer behind a mutex. The zero value is ready to use.
// Writes from a process's stdout copier or a concurrent handler would race
// with a test reading a plain bytes.Buffer.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
