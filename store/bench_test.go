package store

import (
	"context"
	"crypto/sha256"
	"fmt"
	"runtime"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/callers"
)

// The benchmarks run durable (the default: the write-ahead log) and with
// NoSync: the difference is the cost of durability on the machine at hand.
var syncModes = []struct {
	name string
	opts Options
}{
	{"fsync", Options{}},
	{"nosync", Options{NoSync: true}},
}

func BenchmarkReserveCommit(b *testing.B) {
	ctx := context.Background()
	for _, m := range syncModes {
		b.Run(m.name, func(b *testing.B) {
			db, _ := openTemp(b, m.opts)
			al := db.Allowance()
			day := time.Now()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				// A fresh client every 50 calls keeps the pending list
				// and the limit realistic.
				client := strconv.Itoa(i / 50)
				i++
				r, err := al.Reserve(ctx, "verify", client, day, 50)
				if err != nil {
					b.Fatal(err)
				}
				if err := al.Commit(ctx, r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkClaim(b *testing.B) {
	ctx := context.Background()
	for _, m := range syncModes {
		b.Run(m.name, func(b *testing.B) {
			db, _ := openTemp(b, m.opts)
			cl := db.Claims()
			until := time.Now().Add(time.Hour)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i++
				keys := []string{fmt.Sprintf("nonce:0x1234:%d", i), fmt.Sprintf("payload:%064d", i)}
				if _, err := cl.Claim(ctx, keys, until); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkRecordVerification(b *testing.B) {
	ctx := context.Background()
	for _, m := range syncModes {
		b.Run(m.name, func(b *testing.B) {
			db, _ := openTemp(b, m.opts)
			at := time.Now()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i++
				v := sampleVerification(fmt.Sprintf("%08d-0000-4000-8000-000000000000", i), "agent-"+strconv.Itoa(i%100), at.Add(time.Duration(i)), "pass")
				if err := db.RecordVerification(ctx, v); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkVerificationsPage(b *testing.B) {
	ctx := context.Background()
	db, _ := openTemp(b, Options{NoSync: true})
	at := time.Now()
	for i := range 500 {
		db.RecordVerification(ctx, sampleVerification(fmt.Sprintf("p%04d", i), "agent", at.Add(time.Duration(i)), "pass"))
	}
	b.ReportAllocs()
	for b.Loop() {
		if vs, _, err := db.Verifications(ctx, "agent", "", 50); err != nil || len(vs) != 50 {
			b.Fatal(err)
		}
	}
}

// BenchmarkParallelWrites is durable throughput under concurrency: 1, 8
// and 32 writers, durable (the write-ahead log) and NoSync, for each kind
// of write the services make. Group commit makes concurrent writers share
// one commit and one log write, so the durable figures should approach the
// nosync ones; compare them within one run. ns/op is wall time per write
// across all writers (ops/s its inverse); cpu-ns/op is the process's CPU
// per write, which other work on a shared machine inflates less.
// "record-one-agent" has every writer record for the same agent, the case
// where all writes rewrite one counts key.
func BenchmarkParallelWrites(b *testing.B) {
	ctx := context.Background()
	at := time.Now()
	workloads := []struct {
		name  string
		write func(db *DB, i int64) error
	}{
		{"record", func(db *DB, i int64) error {
			return db.RecordVerification(ctx, sampleVerification(fmt.Sprintf("%08d-0000-4000-8000-000000000000", i), "agent-"+strconv.Itoa(int(i%100)), at.Add(time.Duration(i)), "pass"))
		}},
		{"record-one-agent", func(db *DB, i int64) error {
			return db.RecordVerification(ctx, sampleVerification(fmt.Sprintf("%08d-0000-4000-8000-000000000000", i), "agent", at.Add(time.Duration(i)), "pass"))
		}},
		{"reserve-commit", func(db *DB, i int64) error {
			al := db.Allowance()
			r, err := al.Reserve(ctx, "verify", strconv.Itoa(int(i/50)), at, 1<<20)
			if err != nil {
				return err
			}
			return al.Commit(ctx, r)
		}},
		{"claim", func(db *DB, i int64) error {
			_, err := db.Claims().Claim(ctx, []string{fmt.Sprintf("nonce:0x1234:%d", i), fmt.Sprintf("payload:%064d", i)}, at.Add(time.Hour))
			return err
		}},
	}
	for _, w := range workloads {
		for _, clients := range []int{1, 8, 32} {
			for _, m := range syncModes {
				b.Run(fmt.Sprintf("%s/clients=%d/%s", w.name, clients, m.name), func(b *testing.B) {
					db, _ := openTemp(b, m.opts)
					var n atomic.Int64
					b.ReportAllocs()
					cpu, start := processCPU(), time.Now()
					if clients == 1 {
						for b.Loop() {
							if err := w.write(db, n.Add(1)); err != nil {
								b.Fatal(err)
							}
						}
					} else {
						b.SetParallelism((clients + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
						b.RunParallel(func(pb *testing.PB) {
							for pb.Next() {
								if err := w.write(db, n.Add(1)); err != nil {
									b.Error(err)
									return
								}
							}
						})
					}
					b.ReportMetric(float64(processCPU()-cpu)/float64(b.N), "cpu-ns/op")
					b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "ops/s")
				})
			}
		}
	}
}

// BenchmarkDurableRatio is the cost of durability as a service sees it:
// writers that each do a request's worth of CPU outside the store
// (requestWork, about what a verifierd request costs besides its history
// write) and then record a verification for their own agent, 8 and 32 of
// them at once. Each run takes b.N writes on a NoSync store and b.N on a
// durable one, in alternating rounds on the same processors, and reports
// durable/nosync: the durable store's throughput as a share of the NoSync
// one's (1 means durability is free), with each one's wall and CPU time per
// write.
func BenchmarkDurableRatio(b *testing.B) {
	ctx := context.Background()
	at := time.Now()
	for _, clients := range []int{8, 32} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			dbs := [2]*DB{}
			dbs[0], _ = openTemp(b, Options{NoSync: true})
			dbs[1], _ = openTemp(b, Options{})
			var wall, cpu [2]time.Duration
			var id atomic.Int64
			b.ReportAllocs()
			callers.Rounds(b.N, len(dbs), func(kind, n int) {
				db := dbs[kind]
				w, c := runWriters(clients, n, func(agent int) error {
					requestWork()
					i := id.Add(1)
					return db.RecordVerification(ctx, sampleVerification(fmt.Sprintf("%08d-0000-4000-8000-000000000000", i), "agent-"+strconv.Itoa(agent), at.Add(time.Duration(i)), "pass"))
				})
				wall[kind] += w
				cpu[kind] += c
			})
			if b.Failed() {
				return
			}
			b.ReportMetric(float64(wall[0])/float64(wall[1]), "durable/nosync")
			b.ReportMetric(float64(wall[0])/float64(b.N), "nosync-ns/op")
			b.ReportMetric(float64(wall[1])/float64(b.N), "durable-ns/op")
			b.ReportMetric(float64(cpu[0])/float64(b.N), "nosync-cpu-ns/op")
			b.ReportMetric(float64(cpu[1])/float64(b.N), "durable-cpu-ns/op")
		})
	}
}

// runWriters makes n calls of write from clients goroutines (each passing
// its own number) and returns the wall and process CPU time they took.
func runWriters(clients, n int, write func(client int) error) (wall, cpu time.Duration) {
	c0 := processCPU()
	wall, err := callers.Run(clients, n, write)
	if err != nil {
		panic(err)
	}
	return wall, processCPU() - c0
}

// requestWorkBytes is hashed by requestWork: about 150 µs of one core of
// the machines this runs on (SHA-256 at some 1.3 GB/s), close to what a
// verifierd request costs besides its history write.
const requestWorkBytes = 192 << 10

var requestWorkBuf = make([]byte, requestWorkBytes)

// requestWork is a request's CPU outside the store.
func requestWork() { sha256.Sum256(requestWorkBuf) }

// processCPU is the process's CPU time (user and system, Badger's
// goroutines included).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
