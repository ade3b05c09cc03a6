package store

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkWALAppend is one durable group record (the size of a history
// record's group) appended to the write-ahead log: "odirect" is the
// store's way (one aligned pwrite of the record's blocks on a descriptor
// opened O_DIRECT|O_DSYNC), "odsync" its fallback where direct I/O is
// refused (one pwrite of the record on a file opened O_DSYNC), "fdatasync"
// a plain pwrite followed by fdatasync, the alternative O_DSYNC was chosen
// over.
func BenchmarkWALAppend(b *testing.B) {
	for _, mode := range []string{"odirect", "odsync", "fdatasync"} {
		b.Run(mode, func(b *testing.B) {
			if mode != "fdatasync" && walOpenFlags == 0 {
				b.Skip("O_DSYNC is not used on this system")
			}
			dir := b.TempDir()
			w, _, err := openWAL(dir, walMinSize, mode == "odirect", func() error { return nil }, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer func() { w.close() }()
			if mode == "odirect" && !w.direct() {
				b.Skip("the file system refuses O_DIRECT")
			}
			if mode == "fdatasync" {
				w.f.Close()
				if w.f, err = os.OpenFile(filepath.Join(dir, walFile), os.O_RDWR, 0); err != nil {
					b.Fatal(err)
				}
				w.recf, w.dsync = w.f, false
			}
			value := make([]byte, 1400)
			b.ReportAllocs()
			b.SetBytes(int64(len(value)))
			cpu, start := processCPU(), time.Now()
			for b.Loop() {
				w.rec.reset()
				w.rec.set([]byte("record/0000"), value, 0, 0)
				if err := w.append(&w.rec); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(processCPU()-cpu)/float64(b.N), "cpu-ns/op")
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "ops/s")
		})
	}
}
