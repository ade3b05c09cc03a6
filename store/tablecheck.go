package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/pb"
	"github.com/dgraph-io/badger/v4/table"
	"github.com/dgraph-io/badger/v4/y"
	"google.golang.org/protobuf/proto"
)

// checkTables refuses a store one of whose tables (those its manifest
// lists) is missing or damaged at its end, as a file cut short is. Badger
// opens each table in a goroutine of its own and reads its footer (index
// and checksum lengths) without checking them against the file's size: a
// table cut short panics there, which no caller can recover, and the
// process dies with a stack trace instead of an error.
//
// The check reads each listed table's footer as Badger does, bounds it by
// the file's size and verifies the index's checksum. Badger then reads the
// same bytes. It runs under the directory's lock (checkFiles), so that a
// store open in another process, which may be rewriting its tables, is
// never judged damaged.
func checkTables(dir string, bo badger.Options) error {
	mf, err := os.Open(filepath.Join(dir, badger.ManifestFilename))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("store: reading the manifest: %w", err)
	}
	defer mf.Close()
	m, _, err := badger.ReplayManifestFile(mf, bo.ExternalMagicVersion, bo)
	if err != nil {
		return nil // a damaged manifest: Badger's Open says so
	}
	for id := range m.Tables {
		name := table.NewFilename(id, dir)
		if err := checkTable(name); err != nil {
			return fmt.Errorf("store in %s: table %s is damaged (%v): Badger would fail on it. "+
				"Stop every process using it and restore the whole directory from a backup", dir, filepath.Base(name), err)
		}
	}
	return nil
}

// checkTable reads a table's footer, from its end: the checksum's length
// (4 bytes, big endian) and the checksum (a pb.Checksum) before it, then
// the index's length and the index, whose checksum it verifies.
func checkTable(name string) error {
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	size := st.Size()
	readLen := func(end int64) (int64, error) {
		var b [4]byte
		if end < 4 {
			return 0, errors.New("cut short")
		}
		if _, err := f.ReadAt(b[:], end-4); err != nil {
			return 0, err
		}
		n := int64(binary.BigEndian.Uint32(b[:]))
		if n > end-4 {
			return 0, errors.New("cut short")
		}
		return n, nil
	}
	chkLen, err := readLen(size)
	if err != nil {
		return err
	}
	buf := make([]byte, chkLen)
	if _, err := f.ReadAt(buf, size-4-chkLen); err != nil {
		return err
	}
	var chk pb.Checksum
	if err := proto.Unmarshal(buf, &chk); err != nil {
		return errors.New("unreadable checksum")
	}
	idxEnd := size - 4 - chkLen
	idxLen, err := readLen(idxEnd)
	if err != nil {
		return err
	}
	idx := make([]byte, idxLen)
	if _, err := f.ReadAt(idx, idxEnd-4-idxLen); err != nil {
		return err
	}
	if y.VerifyChecksum(idx, &chk) != nil {
		return errors.New("index checksum mismatch")
	}
	return nil
}
