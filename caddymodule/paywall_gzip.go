package caddymodule

import (
	"bytes"
	"compress/flate"
	"encoding/binary"
	"hash/crc32"
	"net/http"
	"slices"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp/encode"
)

// gzipPage is an official page compressed once, for every browser that
// accepts gzip: 2.3 MB (EVM) and 1.2 MB (Solana) as vendored, about 650 KB
// and 320 KB compressed. Compressing each 402 as it goes out (as Caddy's
// encode handler would) costs tens of milliseconds of CPU per page, which
// any unpaid request could buy; a precompressed page costs a copy.
//
// Only the configuration script between the page's head and rest differs
// per request, so the gzip stream is built around it: the head compressed
// with a sync flush at its end (its last block not final, the stream at a
// byte boundary), the script in stored blocks (deflate's uncompressed
// blocks, which need no compressor), then the rest compressed on its own
// from an empty window (no match reaches back past its start, so it
// decodes after any bytes), its last block final. The trailer's CRC-32 of
// the whole page is the head's CRC extended over the script, combined
// with the rest's CRC (crc32Combine), so no request reads the page again.
type gzipPage struct {
	head, rest       []byte // gzip header + deflated head; deflated rest
	headCRC, restCRC uint32
	// restShift extends a CRC over len(rest) bytes (crc32Combine).
	restShift uint32
	size      int // uncompressed length of head and rest
}

// gzipHeader is a gzip member header without name, comment or time: deflate
// (8), no flags, mtime 0, maximum compression (2), unknown OS (255).
var gzipHeader = []byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 2, 255}

// maxStored is the most one stored block holds.
const maxStored = 0xffff

func newGzipPage(page officialPage) *gzipPage {
	deflate := func(out *bytes.Buffer, b []byte, final bool) {
		w, err := flate.NewWriter(out, flate.BestCompression)
		if err != nil {
			panic(err) // a valid level: cannot happen
		}
		w.Write(b) // a bytes.Buffer takes every write
		if final {
			w.Close()
		} else {
			w.Flush()
		}
	}
	var head, rest bytes.Buffer
	head.Write(gzipHeader)
	deflate(&head, page.head, false)
	deflate(&rest, page.rest, true)
	return &gzipPage{
		head: head.Bytes(), rest: rest.Bytes(),
		headCRC: crc32.ChecksumIEEE(page.head), restCRC: crc32.ChecksumIEEE(page.rest),
		restShift: crc32Shift(int64(len(page.rest))),
		size:      len(page.head) + len(page.rest),
	}
}

// stream returns the gzip stream of the page with script between its head
// and rest, in parts, and its length: once decompressed, the identity
// page byte for byte.
func (g *gzipPage) stream(script []byte) (parts [4][]byte, n int) {
	stored := make([]byte, 0, len(script)+5*(len(script)/maxStored+1)+8)
	for s := script; len(s) > 0; {
		n := min(len(s), maxStored)
		// BFINAL 0, BTYPE 00 and the padding to the byte boundary, then
		// LEN and its one's complement NLEN.
		stored = append(stored, 0)
		stored = binary.LittleEndian.AppendUint16(stored, uint16(n))
		stored = binary.LittleEndian.AppendUint16(stored, ^uint16(n))
		stored = append(stored, s[:n]...)
		s = s[n:]
	}
	crc := crc32Combine(crc32.Update(g.headCRC, crc32.IEEETable, script), g.restCRC, g.restShift)
	trailer := binary.LittleEndian.AppendUint32(stored[len(stored):], crc)
	trailer = binary.LittleEndian.AppendUint32(trailer, uint32(g.size+len(script)))
	return [4][]byte{g.head, stored, g.rest, trailer}, len(g.head) + len(stored) + len(g.rest) + len(trailer)
}

// acceptsGzip reports whether r takes a gzip answer, as Caddy's encode
// handler reads Accept-Encoding (q-values, several lines; a WebSocket
// handshake takes none).
func acceptsGzip(r *http.Request) bool {
	return slices.Contains(encode.AcceptedEncodings(r, nil), "gzip")
}

// crc32Combine returns the CRC-32 (IEEE) of a followed by b from the CRC of
// a, the CRC of b and shift = crc32Shift(len(b)) (zlib's
// crc32_combine_op). CRC-32 is linear over GF(2): appending b to a moves
// a's CRC as appending len(b) zero bytes would, a multiplication by
// x^(8·len(b)) modulo the polynomial, and adds b's.
func crc32Combine(crcA, crcB, shift uint32) uint32 {
	return crc32MulMod(shift, crcA) ^ crcB
}

// crc32Shift returns x^(8n) modulo the CRC-32 polynomial (zlib's
// x2nmodp(n, 3)), by squaring.
func crc32Shift(n int64) uint32 {
	p := uint32(1) << 31  // x^0, in the reflected bit order
	sq := uint32(1) << 30 // x^1
	for range 3 {
		sq = crc32MulMod(sq, sq) // x^8 after three squarings
	}
	for ; n > 0; n >>= 1 {
		if n&1 != 0 {
			p = crc32MulMod(sq, p)
		}
		sq = crc32MulMod(sq, sq)
	}
	return p
}

// crc32MulMod returns a·b modulo the CRC-32 polynomial, in the reflected
// bit order CRC-32 uses (zlib's multmodp).
func crc32MulMod(a, b uint32) uint32 {
	var p uint32
	for m := uint32(1) << 31; m != 0; m >>= 1 {
		if a&m != 0 {
			p ^= b
		}
		if b&1 != 0 {
			b = b>>1 ^ crc32.IEEE
		} else {
			b >>= 1
		}
	}
	return p
}
