package server

import "sync"

// A verification handles three documents of a few kilobytes each: the
// request body, the response and the response's canonical form (signed,
// then dropped). Allocating them fresh for every request costs their
// zeroing and, under load, the garbage collector's time; they are reused
// instead, through this pool, once nothing refers to them any more.
var buffers = sync.Pool{New: func() any { b := make([]byte, 0, 8<<10); return &b }}

// maxPooledBuffer is the largest buffer kept for reuse: a rare large
// request should not pin its memory for good.
const maxPooledBuffer = 256 << 10

func getBuffer() *[]byte { return buffers.Get().(*[]byte) }

// putBuffer returns b to the pool with its contents, which the caller
// must not use afterwards (nor anything sliced from them).
func putBuffer(b *[]byte, contents []byte) {
	if cap(contents) > maxPooledBuffer {
		return
	}
	*b = contents[:0]
	buffers.Put(b)
}
