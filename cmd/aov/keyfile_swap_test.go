package main

import (
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// A key file swapped for a named pipe while it is being read is refused at
// once, never waited on: the file is opened without blocking and checked
// as opened. A check of the path before opening it leaves a window in
// which the path can become a FIFO, whose open waits for a writer that
// never comes; a swapper renaming a regular file and a FIFO onto the path
// in a loop finds that window within a few thousand reads.
func TestKeyFileSwappedForAPipeIsNotWaitedOn(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "wallet.hex")
	var stop atomic.Bool
	swapped := make(chan struct{})
	go func() {
		defer close(swapped)
		for i := 0; !stop.Load(); i++ {
			tmp := filepath.Join(dir, "next")
			if i%2 == 0 {
				os.WriteFile(tmp, []byte(walletKeyHex+"\n"), 0o600)
			} else if syscall.Mkfifo(tmp, 0o600) != nil {
				continue
			}
			os.Rename(tmp, path)
		}
	}()
	defer func() {
		stop.Store(true)
		<-swapped
	}()
	deadline := time.Now().Add(5 * time.Second)
	for n := 0; time.Now().Before(deadline); n++ {
		done := make(chan struct{})
		go func() {
			defer close(done)
			readKeyFile(path, io.Discard)
		}()
		select {
		case <-done:
		case <-time.After(2 * time.Second):
			// The blocked read stays blocked until the test binary exits.
			t.Fatalf("read %d waited on a named pipe swapped in after the check", n)
		}
	}
}
