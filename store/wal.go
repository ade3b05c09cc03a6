package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"unsafe"

	"github.com/dgraph-io/badger/v4"
)

// The write-ahead log makes a durable store cheap: Badger runs without
// syncing its own files, and each commit group (commit.go) is made durable
// by one write to this log before its Badger transaction commits. A synced
// Badger commit flushes two memory-mapped files (its value log and its
// memtable's log), each a flush of its own with a journal commit for the
// file's metadata; one write to a preallocated file opened O_DSYNC (and
// O_DIRECT where the file system takes it, see writeRecord) is a single
// data write.
//
// Since groups are committed one at a time, the log's order is the commit
// order, and everything Badger shows is already in the log (or, before the
// last checkpoint, synced in Badger's own files). After a crash, Open
// replays the log into Badger: the writes Badger's unsynced files lost
// come back, in order.
//
// The file (walFile in the store directory; Badger reads only the files it
// names, so it leaves this one alone) is:
//
//	header   [8]magic [8]epoch (little endian) [4]CRC-32C of the 16 bytes
//	         before, alone in the first walHeaderSize bytes
//	records  from walHeaderSize on, back to back:
//	         [4]length of payload [4]CRC-32C of (epoch, length, payload)
//	         payload: ops, each
//	           walSet    key (uvarint length, bytes), value (same),
//	                     expiresAt (uvarint), user meta (1 byte)
//	           walDelete key (uvarint length, bytes)
//
// The log is read from the start to the first record that is short,
// zero-length or fails its CRC: a record torn by a crash was never
// acknowledged, so the log ends there.
//
// When the next record does not fit, the log checkpoints: it makes every
// Badger file durable (syncBadger), writes a header with the next epoch, and
// starts again at walHeaderSize, over the old records. Those carry the old
// epoch in their CRC, so none can be read as a record of the new one: the
// first stale record ends the log. A checkpoint writes its header only after
// Badger is durable, so a header that fails its CRC (a crash during that
// write, or during the file's creation) means nothing needs replaying.
const walFile = "aov.wal"

const (
	// walBlock is the unit of a direct write: its offset, length and
	// buffer address are multiples of it.
	walBlock        = 4096
	walHeaderSize   = walBlock
	walRecordHeader = 8
	// walChunk is how far ahead of the last record the file is filled
	// with zeros: a record then overwrites allocated blocks, which takes
	// no journal commit for the file's metadata, while a new store does
	// not write its whole log at once.
	walChunk = 1 << 20
	// walMinSize is the smallest capacity of the log before it wraps.
	walMinSize = 16 << 20
	// walMaxRecord bounds one group's record (tx turns a bigger one into
	// badger.ErrTxnTooBig, which splits the group): above the largest
	// single write the store takes, a saved answer of
	// MaxPaymentIDAnswerBytes.
	walMaxRecord = 32 << 20
)

const (
	walSet    byte = 1
	walDelete byte = 2
)

var walMagic = [8]byte{'a', 'o', 'v', 'w', 'a', 'l', 0, 1}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errWALCorrupt reports a record whose CRC holds but whose payload does not
// decode: not a torn write (those fail their CRC) but a bug or damage, so
// Open refuses to go on rather than drop the records after it.
var errWALCorrupt = errors.New("store: corrupt write-ahead log record")

// walRecord is one group's writes, encoded as they are made.
type walRecord struct {
	buf []byte // record header (filled by seal), then the payload
	ops int
}

func (r *walRecord) reset() {
	if cap(r.buf) > walChunk {
		r.buf = nil // one big group does not pin its buffer
	}
	r.buf = append(r.buf[:0], make([]byte, walRecordHeader)...)
	r.ops = 0
}

func (r *walRecord) set(key, value []byte, expiresAt uint64, meta byte) {
	r.buf = append(r.buf, walSet)
	r.buf = binary.AppendUvarint(r.buf, uint64(len(key)))
	r.buf = append(r.buf, key...)
	r.buf = binary.AppendUvarint(r.buf, uint64(len(value)))
	r.buf = append(r.buf, value...)
	r.buf = binary.AppendUvarint(r.buf, expiresAt)
	r.buf = append(r.buf, meta)
	r.ops++
}

func (r *walRecord) delete(key []byte) {
	r.buf = append(r.buf, walDelete)
	r.buf = binary.AppendUvarint(r.buf, uint64(len(key)))
	r.buf = append(r.buf, key...)
	r.ops++
}

// full reports whether the record outgrew walMaxRecord.
func (r *walRecord) full() bool { return len(r.buf) > walMaxRecord }

// seal fills the record's header for epoch.
func (r *walRecord) seal(epoch uint64) {
	payload := r.buf[walRecordHeader:]
	binary.LittleEndian.PutUint32(r.buf, uint32(len(payload)))
	binary.LittleEndian.PutUint32(r.buf[4:], recordCRC(epoch, payload))
}

func recordCRC(epoch uint64, payload []byte) uint32 {
	var h [12]byte
	binary.LittleEndian.PutUint64(h[:], epoch)
	binary.LittleEndian.PutUint32(h[8:], uint32(len(payload)))
	return crc32.Update(crc32.Checksum(h[:], castagnoli), castagnoli, payload)
}

// walOp is one decoded write. Its slices point into the payload.
type walOp struct {
	kind       byte
	key, value []byte
	expiresAt  uint64
	meta       byte
}

// decodeWALPayload calls fn with each op of payload, in order. A payload
// that does not decode exactly (an unknown kind, a length past the end, an
// empty key, no op at all) is errWALCorrupt.
func decodeWALPayload(payload []byte, fn func(walOp) error) error {
	if len(payload) == 0 {
		return errWALCorrupt
	}
	bytesAt := func(p []byte) ([]byte, []byte, bool) {
		n, w := binary.Uvarint(p)
		if w <= 0 || n > uint64(len(p)-w) {
			return nil, nil, false
		}
		return p[w : w+int(n)], p[w+int(n):], true
	}
	for p := payload; len(p) > 0; {
		op := walOp{kind: p[0]}
		var ok bool
		if op.key, p, ok = bytesAt(p[1:]); !ok || len(op.key) == 0 {
			return errWALCorrupt
		}
		switch op.kind {
		case walSet:
			if op.value, p, ok = bytesAt(p); !ok {
				return errWALCorrupt
			}
			var w int
			if op.expiresAt, w = binary.Uvarint(p); w <= 0 || len(p) < w+1 {
				return errWALCorrupt
			}
			op.meta, p = p[w], p[w+1:]
		case walDelete:
		default:
			return errWALCorrupt
		}
		if err := fn(op); err != nil {
			return err
		}
	}
	return nil
}

// scanWAL calls fn with the payload of each record of epoch in r, in order,
// from walHeaderSize up to size, and returns the offset after the last one.
// It stops at the first record that is zero-length, short or fails its CRC
// (a torn write, zeros never written over, or a record of an older epoch).
// fn's payload is valid until fn returns.
func scanWAL(r io.ReaderAt, size int64, epoch uint64, fn func(payload []byte) error) (int64, error) {
	off := int64(walHeaderSize)
	var h [walRecordHeader]byte
	var buf []byte
	for off+walRecordHeader <= size {
		if _, err := r.ReadAt(h[:], off); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return off, fmt.Errorf("store: reading the write-ahead log: %w", err)
		}
		n := int64(binary.LittleEndian.Uint32(h[:]))
		if n == 0 || n > size-off-walRecordHeader {
			break
		}
		if int64(cap(buf)) < n {
			buf = make([]byte, n)
		}
		buf = buf[:n]
		if _, err := r.ReadAt(buf, off+walRecordHeader); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return off, fmt.Errorf("store: reading the write-ahead log: %w", err)
		}
		if recordCRC(epoch, buf) != binary.LittleEndian.Uint32(h[4:]) {
			break
		}
		if err := fn(buf); err != nil {
			return off, err
		}
		off += walRecordHeader + n
	}
	return off, nil
}

func encodeWALHeader(epoch uint64) []byte {
	b := append(walMagic[:0:0], walMagic[:]...)
	b = binary.LittleEndian.AppendUint64(b, epoch)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// decodeWALHeader returns the epoch of a header, or false for one that is
// not whole (a crash during its write) or not a header at all.
func decodeWALHeader(b []byte) (uint64, bool) {
	if len(b) < 20 || [8]byte(b[:8]) != walMagic || crc32.Checksum(b[:16], castagnoli) != binary.LittleEndian.Uint32(b[16:]) {
		return 0, false
	}
	return binary.LittleEndian.Uint64(b[8:]), true
}

// readWALHeader returns the epoch of the log f, or false when its header
// is not whole (see decodeWALHeader).
func readWALHeader(f *os.File) (uint64, bool) {
	h := make([]byte, 20)
	n, _ := f.ReadAt(h, 0)
	return decodeWALHeader(h[:n])
}

// walReplayBytes is what Open's replay of the log in dir writes to Badger,
// counted as a write's bytes are (entryBytes): 0 without a log or with
// nothing to replay. It reads the log alone, so that Open can refuse a
// replay the disk has no room for before Badger is opened: Badger's Close
// on that error path would flush what it holds to a table, on a disk
// without room for it. A record that does not decode is refused here too.
func walReplayBytes(dir string) (uint64, error) {
	f, err := os.Open(filepath.Join(dir, walFile))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("store: opening the write-ahead log: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("store: opening the write-ahead log: %w", err)
	}
	epoch, ok := readWALHeader(f)
	if !ok {
		return 0, nil
	}
	var n uint64
	_, err = scanWAL(f, st.Size(), epoch, func(p []byte) error {
		err := decodeWALPayload(p, func(op walOp) error {
			n += entryBytes(op.key, op.value)
			return nil
		})
		if err != nil {
			return fmt.Errorf("store: replaying the write-ahead log: %w", err)
		}
		return nil
	})
	return n, err
}

// wal is an open write-ahead log. Only the committer's leader uses it, one
// group at a time, so it needs no lock of its own.
type wal struct {
	f     *os.File
	dsync bool // f was opened O_DSYNC: a write is durable when it returns
	// recf is what records are written with: a second descriptor of the
	// file opened O_DIRECT as well (see writeRecord), or f where the file
	// system refuses direct I/O. f writes the header and the zeros ahead
	// and reads the log at open.
	recf *os.File
	// blk is the aligned buffer of direct writes; its first off%walBlock
	// bytes are the records already in the block the next one starts in.
	blk   []byte
	epoch uint64
	off   int64 // where the next record goes
	// filled is how much of the file is written (zeros at least); size is
	// the capacity the log wraps at.
	filled, size int64
	rec          walRecord
	// syncBadger makes everything written to Badger durable: the first
	// step of a checkpoint.
	syncBadger func() error
	// reset is set by openWAL when it found a log whose header failed
	// its CRC, and started afresh.
	reset bool
}

// openWAL opens the log in dir (creating it), replays the records of its
// current epoch through apply, and checkpoints: on return the log is empty,
// at a new epoch. size is the capacity the log wraps at.
//
// With direct, records are written with O_DIRECT where the file system
// takes it (see writeRecord); the header and the zeros ahead never are.
func openWAL(dir string, size int64, direct bool, syncBadger func() error, apply func(payload []byte) error) (_ *wal, replayed int, err error) {
	path := filepath.Join(dir, walFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|walOpenFlags, 0o600)
	if err != nil {
		return nil, 0, fmt.Errorf("store: opening the write-ahead log: %w", err)
	}
	// w, not the result: an error return has set that to nil before the
	// deferred close runs.
	w := &wal{f: f, recf: f, dsync: walOpenFlags != 0, size: size, syncBadger: syncBadger}
	defer func() {
		if err != nil {
			w.close()
		}
	}()
	st, err := f.Stat()
	if err != nil {
		return nil, 0, fmt.Errorf("store: opening the write-ahead log: %w", err)
	}
	w.filled = st.Size()
	epoch, ok := readWALHeader(f)
	if ok {
		w.off, err = scanWAL(f, w.filled, epoch, func(p []byte) error {
			replayed++
			return apply(p)
		})
		if err != nil {
			return nil, 0, err
		}
	} else {
		// Never a header (a new log, or a crash while creating it), or a
		// crash while a checkpoint wrote it: Badger was durable before
		// that write began, so nothing is lost by starting afresh. The
		// records still in the file may be of any epoch: cut them off,
		// so that no epoch chosen now can read one.
		if st.Size() > 0 {
			if err := f.Truncate(0); err != nil {
				return nil, 0, fmt.Errorf("store: resetting the write-ahead log: %w", err)
			}
			if err := f.Sync(); err != nil {
				return nil, 0, fmt.Errorf("store: resetting the write-ahead log: %w", err)
			}
			w.reset = true
		} else if err := syncDir(dir); err != nil { // a new file's name
			return nil, 0, err
		}
		w.filled, epoch = 0, 0
	}
	w.size = max(w.size, w.filled)
	w.epoch = epoch
	if err := w.checkpoint(); err != nil {
		return nil, 0, err
	}
	if direct && walDirectFlag != 0 && w.dsync {
		if err := w.openDirect(path); err != nil {
			return nil, 0, err
		}
	}
	return w, replayed, nil
}

// openDirect makes records go through a descriptor opened O_DIRECT (and
// O_DSYNC), unless the file system refuses direct I/O (EINVAL at the open
// or at the first aligned write): then they stay on f. The first write
// covers the first record block, which the checkpoint before it left
// holding nothing of the current epoch.
func (w *wal) openDirect(path string) error {
	df, err := os.OpenFile(path, os.O_RDWR|walOpenFlags|walDirectFlag, 0)
	if errors.Is(err, syscall.EINVAL) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("store: opening the write-ahead log: %w", err)
	}
	w.blk = alignedBlock(walBlock)
	if _, err := df.WriteAt(w.blk, w.off); err != nil {
		df.Close()
		w.blk = nil
		if errors.Is(err, syscall.EINVAL) {
			return nil
		}
		return fmt.Errorf("store: writing the write-ahead log: %w", err)
	}
	w.recf = df
	return nil
}

// alignedBlock returns n zero bytes (a multiple of walBlock) at an address
// aligned to walBlock, as O_DIRECT wants.
func alignedBlock(n int) []byte {
	b := make([]byte, n+walBlock)
	skip := (walBlock - int(uintptr(unsafe.Pointer(unsafe.SliceData(b)))%walBlock)) % walBlock
	return b[skip : skip+n : skip+n]
}

// direct reports whether records are written with O_DIRECT.
func (w *wal) direct() bool { return w.recf != w.f }

// writeRecord writes b durably at w.off. Without O_DIRECT it is one
// synced write of b. With it, the write must start and end on a block
// boundary, so it covers the whole blocks b touches: the block b starts in
// is written again with the records before it in that block (kept in
// w.blk, identical bytes), and the block b ends in is zero padded after
// it, which readers take for the end of the log. A direct write skips the
// copy into the page cache and its writeback: into blocks already
// allocated, it measured about a quarter less time and CPU per record
// than the buffered synced write (BenchmarkWALAppend).
func (w *wal) writeRecord(b []byte) error {
	if !w.direct() {
		return w.write(b, w.off)
	}
	start := w.off &^ (walBlock - 1)
	head := int(w.off - start)
	end := head + len(b)
	n := (end + walBlock - 1) &^ (walBlock - 1)
	if n > len(w.blk) {
		blk := alignedBlock(n)
		copy(blk, w.blk[:head])
		w.blk = blk
	}
	copy(w.blk[head:], b)
	clear(w.blk[end:n])
	if _, err := w.recf.WriteAt(w.blk[:n], start); err != nil {
		return err
	}
	// Keep the bytes of the new tail block at the front for the next one.
	tail := w.blk[end-end%walBlock : end]
	if len(w.blk) > walChunk {
		blk := alignedBlock(walBlock) // one big group does not pin its buffer
		copy(blk, tail)
		w.blk = blk
	} else {
		copy(w.blk, tail)
	}
	return nil
}

// append makes r durable as the next record, checkpointing first when it
// does not fit. On error the log's state on disk is unknown (a failed
// synced write may have reached the disk in part, or not at all, and the
// kernel may have dropped the pages it could not write): the committer
// takes no more writes (see committer.fail).
func (w *wal) append(r *walRecord) error {
	n := int64(len(r.buf))
	if w.off+n > w.size {
		// A record bigger than the whole log grows it to fit.
		w.size = max(w.size, walHeaderSize+n)
		if err := w.checkpoint(); err != nil {
			return err
		}
	}
	end := w.off + n
	if w.direct() {
		end = (end + walBlock - 1) &^ (walBlock - 1)
	}
	if err := w.fill(end); err != nil {
		return err
	}
	r.seal(w.epoch)
	if err := w.writeRecord(r.buf); err != nil {
		return fmt.Errorf("store: writing the write-ahead log: %w", err)
	}
	w.off += n
	return nil
}

// checkpoint makes Badger durable, then starts the log afresh at the next
// epoch (durable when it returns). A log that holds no record covers
// nothing, so Badger is synced only when there is one.
func (w *wal) checkpoint() error {
	if w.off > walHeaderSize {
		if err := w.syncBadger(); err != nil {
			return err
		}
	}
	if err := w.fill(walHeaderSize + walRecordHeader); err != nil {
		return err
	}
	if err := w.write(encodeWALHeader(w.epoch+1), 0); err != nil {
		return fmt.Errorf("store: writing the write-ahead log's header: %w", err)
	}
	w.epoch++
	w.off = walHeaderSize
	return nil
}

// fill writes zeros from the end of what is written to at least end (in
// whole chunks, up to the log's size), durably.
func (w *wal) fill(end int64) error {
	if end <= w.filled {
		return nil
	}
	to := min(max(w.size, end), (end+walChunk-1)/walChunk*walChunk)
	zeros := make([]byte, min(to-w.filled, walChunk))
	for w.filled < to {
		n := min(to-w.filled, int64(len(zeros)))
		if err := w.write(zeros[:n], w.filled); err != nil {
			return fmt.Errorf("store: growing the write-ahead log: %w", err)
		}
		w.filled += n
	}
	return nil
}

func (w *wal) write(b []byte, off int64) error {
	if _, err := w.f.WriteAt(b, off); err != nil {
		return err
	}
	if w.dsync {
		return nil
	}
	return w.f.Sync()
}

func (w *wal) close() error {
	if w.direct() {
		w.recf.Close()
	}
	return w.f.Close()
}

// empty reports whether the log holds no record since its last checkpoint.
func (w *wal) empty() bool { return w.off == walHeaderSize }

// replayRecord applies one record's payload to bdb, in order, in as few
// transactions as Badger allows (a record holds one group's writes, which
// fitted in one transaction when they were made; replay does not depend on
// it). Replaying a record twice ends in the same state, so a crash during
// replay only means replaying again.
func replayRecord(vers *versions, payload []byte) error {
	txn := vers.write()
	defer func() { txn.Discard() }()
	err := decodeWALPayload(payload, func(op walOp) error {
		for {
			var err error
			if op.kind == walSet {
				e := badger.NewEntry(op.key, op.value)
				e.ExpiresAt, e.UserMeta = op.expiresAt, op.meta
				err = txn.SetEntry(e)
			} else {
				err = txn.Delete(op.key)
			}
			if !errors.Is(err, badger.ErrTxnTooBig) {
				return err
			}
			if err := vers.commit(txn); err != nil {
				return err
			}
			txn = vers.write()
		}
	})
	if err != nil {
		return fmt.Errorf("store: replaying the write-ahead log: %w", err)
	}
	if err := vers.commit(txn); err != nil {
		return fmt.Errorf("store: replaying the write-ahead log: %w", err)
	}
	return nil
}

// syncBadger makes everything written to the Badger database in dir
// durable. bdb.Sync flushes the value log and the active memtable's log,
// but not the logs of memtables that are full and wait for their flush to
// a table (Badger flushes them unsynced when it runs without SyncWrites):
// so every file of the directory is synced, and the directory itself.
func syncBadger(bdb *badger.DB, dir string) error {
	if err := bdb.Sync(); err != nil {
		return fmt.Errorf("store: syncing: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("store: syncing: %w", err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() || e.Name() == walFile {
			continue
		}
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if errors.Is(err, os.ErrNotExist) {
			continue // a memtable's log deleted after its flush
		}
		if err != nil {
			return fmt.Errorf("store: syncing: %w", err)
		}
		err = f.Sync()
		f.Close()
		if err != nil {
			return fmt.Errorf("store: syncing %s: %w", e.Name(), err)
		}
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("store: syncing: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("store: syncing the directory: %w", err)
	}
	return nil
}
