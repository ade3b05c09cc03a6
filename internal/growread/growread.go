// Package growread reads a request body into a buffer that grows with the
// bytes that arrive, for every reader of an untrusted body (the gate's,
// verifierd's): what a client announces in Content-Length costs nothing
// until it is sent. Over HTTP/2 one connection holds up to 250 requests
// open at once (Go's default MaxConcurrentStreams), each of which would
// otherwise have the reader hold what it announced for as long as the
// server's read timeout lets it take to send it.
package growread

import "io"

// First is the most a buffer holds before any byte arrives: a body no
// larger is read in one allocation.
const First = 4 << 10

// Read appends r's bytes to dst[:0], to r's end or its first upTo bytes,
// whichever comes first. Its buffer is dst's when dst has room (a pooled
// buffer), else one of at most First bytes, and grows, doubling, with the
// bytes that arrive, never past upTo. On an error it returns what it read.
func Read(r io.Reader, upTo int64, dst []byte) ([]byte, error) {
	buf := dst[:0]
	if cap(buf) == 0 {
		buf = make([]byte, 0, min(upTo, First))
	}
	for int64(len(buf)) < upTo {
		if len(buf) == cap(buf) {
			grown := make([]byte, len(buf), min(2*int64(cap(buf)), upTo))
			copy(grown, buf)
			buf = grown
		}
		// A pooled dst may hold more than upTo: read no further.
		n, err := r.Read(buf[len(buf):min(int64(cap(buf)), upTo)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
	return buf, nil
}
