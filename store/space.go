package store

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// ErrDiskFull is returned by a write while the file system holding the
// store has less free space than the store's reserve (spaceReserve).
// Nothing of the write is made; reads go on, and writes are taken again
// by themselves once space is freed (the free space is looked at again
// at most spaceRecheck later).
//
// The reserve exists because Badger cannot fail cleanly on a full disk:
// its memtable logs (*.mem), value logs (*.vlog) and tables (*.sst) are
// files created at their full length without allocating their blocks
// (sparse) and written through memory maps, so a write to a page the
// file system cannot allocate is a SIGBUS in one of Badger's goroutines,
// which kills the process. Badger (v4) has no option to allocate them
// ahead, and they are created inside Badger (a memtable rotating, a flush,
// a compaction), where a fallocate of ours cannot reach them first.
var ErrDiskFull = errors.New("store: the disk holding the store is nearly full; writes are refused until space is freed")

const (
	// spaceRecheck bounds how long the free space read last is trusted.
	spaceRecheck = 100 * time.Millisecond
	// spaceRecheckBytes is how much the store may write on one reading
	// of the free space before it reads it again.
	spaceRecheckBytes = 1 << 20
	// spaceEntryOverhead is counted for each key written on top of its
	// key and value: the header of Badger's memtable-log entry and the
	// store's log op, rounded up.
	spaceEntryOverhead = 32
)

// entryBytes is what the space guard counts for one key written (value
// nil for a delete).
func entryBytes(key, value []byte) uint64 {
	return uint64(len(key) + len(value) + spaceEntryOverhead)
}

// spaceReserve is the free space below which writes are refused, from the
// options Badger is opened with: what Badger may still write on its own
// with what it already holds, once the store writes nothing more:
//
//   - each of its NumMemtables memtables flushed to a table:
//     NumMemtables × MemTableSize;
//   - a compaction merging as much again (it writes its tables before it
//     deletes the ones it merged): NumMemtables × MemTableSize;
//   - value-log GC (gc.go) moving the live values of one value-log file:
//     ValueLogFileSize.
//
// With the options Open uses: 2 × 3 × 16 MiB + 64 MiB = 160 MiB. On top of
// it each commit must leave twice its own bytes and those written since
// the free space was last read (each may land in a memtable's log and in
// the value log). A compaction of a large store's deeper levels can merge
// more than the reserve's share; and space another process takes is seen
// only at the next reading (within spaceRecheck): the reserve does not
// cover a disk filled to its last block by others.
func spaceReserve(o badger.Options) uint64 {
	return uint64(int64(o.NumMemtables)*o.MemTableSize+o.ValueLogFileSize) + compactionBytes(o)
}

// compactionBytes is what the reserve keeps for a compaction of Badger's:
// one merging as much as its memtables hold (see spaceReserve).
func compactionBytes(o badger.Options) uint64 {
	return uint64(int64(o.NumMemtables) * o.MemTableSize)
}

// spaceGuard refuses writes while the store's file system is low on
// space. Its state is read on the committer's leader (one at a time) and
// by the value-log GC, hence the lock.
type spaceGuard struct {
	// dir is the store directory, kept open: reading the free space of
	// its descriptor fd allocates nothing (a path would).
	dir     *os.File
	fd      int
	reserve uint64
	// compaction is compactionBytes of Badger's options, for
	// admitReplay.
	compaction uint64

	mu      sync.Mutex
	free    uint64        // bytes free at the last reading
	written uint64        // bytes let through since then
	next    time.Duration // when (on elapsed) the reading expires
	need    uint64        // the free space the last refused write needed
}

// newSpaceGuard watches the file system of dir; nil (no guard) for one
// that reports no size.
//
// It refuses a file system no bigger than the reserve and a full log
// (walMinSize), counting only what a writer that is not root may use, as
// the free space writes are judged on: there the store could never take
// a write, or stop taking them once its log has grown, and each write's
// ErrDiskFull would blame the space other files take rather than the
// volume's size.
func newSpaceGuard(dir string, o badger.Options) (*spaceGuard, error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("store: opening the store directory: %w", err)
	}
	g := &spaceGuard{dir: d, fd: int(d.Fd()), reserve: spaceReserve(o), compaction: compactionBytes(o)}
	free, size, err := diskSpace(g.fd)
	if err != nil {
		d.Close()
		return nil, fmt.Errorf("store: reading the free space of the store's disk: %w", err)
	}
	if size == 0 {
		// A file system that reports no blocks has no size statfs can
		// tell, nor free space: a tmpfs mounted with size=0, which has
		// no limit but memory. There is nothing to judge a write by, so
		// there is no guard (Open says so).
		d.Close()
		return nil, nil
	}
	if least := g.reserve + walMinSize; size <= least {
		d.Close()
		return nil, fmt.Errorf("store: the volume holding the store is too small: %s in all that the store may use (blocks reserved for root not counted), %s free; the store keeps %s free (writes are refused below it) and its write-ahead log takes %s, so the volume must be larger than %s",
			mib(size), mib(free), mib(g.reserve), mib(walMinSize), mib(least))
	}
	return g, nil
}

// admitReplay lets Open replay n bytes of the write-ahead log into Badger
// (n counted as admit counts a write's) and Badger reload mem bytes of its
// memtable logs (memtableBytes) unless the disk has no room for what that
// writes: twice n, as admit charges (Badger's memtable log and its value
// log), and n more for the table their memtable is flushed into (at Close
// at the latest); mem for the tables Badger flushes the memtables it
// reloads into as it opens (through memory maps, as every table: on a full
// disk a SIGBUS); and, when anything is flushed, a compaction the new
// tables may start, as the reserve counts it (compactionBytes). Unlike a
// write it does not ask for the reserve on top: the log holds
// acknowledged writes Badger may have lost, so the store can neither
// answer a read nor take a write before they are applied, and a store
// that did not open would stop every route in front of it, reads and
// ungated ones included, which a disk below the reserve must not do.
// What it asks is at most some 3 × the log, the memtables' size and the
// compaction's share of the reserve; writes after it are refused as ever
// while the disk is below the reserve.
func (g *spaceGuard) admitReplay(n, mem uint64) error {
	if g == nil || n+mem == 0 {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	free, _, err := diskSpace(g.fd)
	if err != nil {
		return fmt.Errorf("store: reading the free space of the store's disk: %w", err)
	}
	g.free, g.written, g.next = free, n+mem, elapsed()+spaceRecheck
	if need := 3*n + mem + g.compaction; free < need {
		return g.noRoom(fmt.Sprintf("the acknowledged writes in the write-ahead log (%s) and in Badger's memtable logs (%s) must be written into Badger's tables before the store is used", mib(n), mib(mem)), need, free)
	}
	return nil
}

// memtableBytes is what Badger's memtable logs (*.mem) in dir hold: Badger
// reloads them as it opens and flushes each into a table. They are sparse
// files of twice a memtable's size; what they hold is their allocated
// blocks (allocated).
func memtableBytes(dir string) (uint64, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("store: reading the store directory: %w", err)
	}
	var n uint64
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".mem") {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			return 0, fmt.Errorf("store: reading the store directory: %w", err)
		}
		n += allocated(fi)
	}
	return n, nil
}

// noRoom is Open's refusal of a write it must make before the store is
// used (what) on a disk with less than need free: it names the need, the
// free space and the reserve, so the operator knows how much to free
// (Open names the directory).
func (g *spaceGuard) noRoom(what string, need, free uint64) error {
	return fmt.Errorf("store: %s, which takes %s free; the disk has %s free (writes are refused below %s): free space on it and start again",
		what, mib(need), mib(free), mib(g.reserve))
}

// refused is noRoom for the write admit refused last, with what it
// needed and the free space it saw.
func (g *spaceGuard) refused(what string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.noRoom(what, g.need, g.free)
}

// mib renders a size in MiB for an operator.
func mib(n uint64) string {
	if n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// admit lets n more bytes be written, or refuses them with ErrDiskFull
// when they would leave less than the reserve free. It reads the free
// space again when the last reading is older than spaceRecheck or has
// let spaceRecheckBytes through. A file system whose free space cannot
// be read refuses the write (the store holds money-relevant state: it
// fails closed).
func (g *spaceGuard) admit(n uint64) error {
	if g == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if t := elapsed(); t >= g.next || g.written+n > spaceRecheckBytes {
		free, _, err := diskSpace(g.fd)
		if err != nil {
			return fmt.Errorf("store: reading the free space of the store's disk: %w", err)
		}
		g.free, g.written, g.next = free, 0, t+spaceRecheck
	}
	if need := g.reserve + 2*(g.written+n); g.free < need {
		g.need = need
		return ErrDiskFull
	}
	g.written += n
	return nil
}

func (g *spaceGuard) close() error {
	if g == nil {
		return nil
	}
	return g.dir.Close()
}
