package store

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// walDirs are the directories the log's write paths are tested in: the
// test's temporary directory, and tmpfs where there is one (a file system
// that keeps no blocks of its own under the page cache).
func walDirs(t *testing.T) map[string]string {
	dirs := map[string]string{"tempdir": t.TempDir()}
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		d, err := os.MkdirTemp("/dev/shm", "waltest")
		if err == nil {
			t.Cleanup(func() { os.RemoveAll(d) })
			dirs["shm"] = d
		}
	}
	return dirs
}

// recordOfSize returns a record of exactly n bytes on disk (header
// included, n ≥ 14): one set of key "k" with a value sized to fit, its
// bytes marked with i so that records differ.
func recordOfSize(t *testing.T, n, i int) *walRecord {
	t.Helper()
	// header 8, kind 1, key 1+1, value uvarint+len, expiresAt 1, meta 1
	vl := n - 13 - 1
	if vl >= 128 {
		vl--
	}
	r := &walRecord{}
	r.reset()
	r.set([]byte("k"), bytes.Repeat([]byte{byte(i%250) + 1}, vl), 0, 0)
	if len(r.buf) != n {
		t.Fatalf("record of %d bytes, want %d", len(r.buf), n)
	}
	return r
}

// TestWALDirectWritesKeepTheLog: records written whole-block (O_DIRECT)
// and as they are (the fallback) leave the same log: after every append
// the file holds exactly the records of the current epoch back to back
// from walHeaderSize, scanning it returns them, and a direct write pads
// the rest of its last block with zeros. The sizes cover a record within
// a block, one that ends exactly on a block boundary, one exactly a block
// long starting on one, records spanning two and several blocks, and
// enough of them to wrap the log twice (a checkpoint in the middle of a
// block's records, then records over stale ones).
func TestWALDirectWritesKeepTheLog(t *testing.T) {
	sizes := []int{100, walBlock - walHeaderSize%walBlock - 100, walBlock, 9000, 14, 4000, 200, 3 * walBlock, 5000}
	for name, base := range walDirs(t) {
		for _, direct := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/direct=%v", name, direct), func(t *testing.T) {
				dir := filepath.Join(base, fmt.Sprint(direct))
				if err := os.MkdirAll(dir, 0o700); err != nil {
					t.Fatal(err)
				}
				const size = 64 << 10
				w, _, err := openWAL(dir, size, direct, func() error { return nil }, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer func() { w.close() }()
				if w.direct() != (direct && walDirectFlag != 0) {
					t.Skipf("direct I/O: %v, want %v (refused by the file system?)", w.direct(), direct)
				}
				var model [][]byte
				epoch, wraps := w.epoch, 0
				for i := 0; wraps < 2 || len(model) < 3; i++ {
					r := recordOfSize(t, sizes[i%len(sizes)], i)
					if err := w.append(r); err != nil {
						t.Fatal(err)
					}
					if w.epoch != epoch {
						epoch, wraps, model = w.epoch, wraps+1, nil
					}
					model = append(model, bytes.Clone(r.buf))
					b, err := os.ReadFile(filepath.Join(dir, walFile))
					if err != nil {
						t.Fatal(err)
					}
					want := bytes.Join(model, nil)
					if got := b[walHeaderSize : walHeaderSize+len(want)]; !bytes.Equal(got, want) {
						t.Fatalf("append %d (%d bytes): the log does not hold the epoch's records back to back", i, len(r.buf))
					}
					if int64(walHeaderSize+len(want)) != w.off {
						t.Fatalf("append %d: off = %d, want %d", i, w.off, walHeaderSize+len(want))
					}
					if direct {
						end := (w.off + walBlock - 1) &^ (walBlock - 1)
						if pad := b[w.off:end]; !bytes.Equal(pad, make([]byte, len(pad))) {
							t.Fatalf("append %d: the last block is not zero padded after the record", i)
						}
					}
					var scanned [][]byte
					n, err := scanWAL(bytes.NewReader(b), int64(len(b)), w.epoch, func(p []byte) error {
						scanned = append(scanned, bytes.Clone(p))
						return nil
					})
					if err != nil || n != w.off || len(scanned) != len(model) {
						t.Fatalf("append %d: scan ended at %d with %d records (%v), want %d with %d", i, n, len(scanned), err, w.off, len(model))
					}
					for j, p := range scanned {
						if !bytes.Equal(p, model[j][walRecordHeader:]) {
							t.Fatalf("append %d: record %d scanned differs", i, j)
						}
					}
				}
				if w.filled%walBlock != 0 && direct {
					t.Errorf("filled = %d, not whole blocks", w.filled)
				}
			})
		}
	}
}

// TestWALDirectReplaysAfterACrash: a store's records written either way
// (O_DIRECT, or the fallback forced) come back from the log alone after a
// simulated power loss, among them records spanning blocks and sharing
// them, and the open that replays them reads the file without O_DIRECT.
func TestWALDirectReplaysAfterACrash(t *testing.T) {
	for _, direct := range []bool{true, false} {
		t.Run(fmt.Sprintf("direct=%v", direct), func(t *testing.T) {
			opts := Options{walBuffered: !direct}
			dir := openClosed(t, opts, func(*DB) {})
			_, crash := lostBadger(t, dir)
			db, err := Open(dir, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			if db.commits.log.direct() != (direct && walDirectFlag != 0) {
				t.Skipf("direct I/O: %v, want %v (refused by the file system?)", db.commits.log.direct(), direct)
			}
			want := map[string]string{}
			for i := range 40 {
				k, v := fmt.Sprintf("test/%02d", i), string(bytes.Repeat([]byte{'a' + byte(i%26)}, []int{10, 3000, 5000, 100, 4096}[i%5]))
				if err := setKey(db, k, v); err != nil {
					t.Fatal(err)
				}
				want[k] = v
			}
			got := crash(nil)
			for k, v := range want {
				if g, ok := getKey(t, got, k); !ok || g != v {
					t.Fatalf("%s: %d bytes (found %v) after the replay, want %d", k, len(g), ok, len(v))
				}
			}
		})
	}
}
