package keystore

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fifo replaces path by a named pipe.
func fifo(t *testing.T, path string) {
	t.Helper()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
}

// within runs f and fails the test unless it returns within 3 s; opening a
// named pipe for reading waits for a writer, so a test that would hang
// opens one to let it go.
func within(t *testing.T, pipe string, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(3 * time.Second):
		t.Errorf("still waiting after 3 s on the named pipe %s", pipe)
		if w, err := os.OpenFile(pipe, os.O_WRONLY, 0); err == nil {
			w.Close()
		}
		return <-done
	}
}

// A key file or an index that is a named pipe (or any file but a regular
// one) is refused at once as not a regular file: opening one for reading
// waits for a writer, which would hang certd's start, or hold the store's
// lock, and every signature and card request with it, in a reload.
func TestANamedPipeIsRefusedAsNotARegularFile(t *testing.T) {
	t.Run("key file at start", func(t *testing.T) {
		dir := t.TempDir()
		if _, err := open(t, dir, newClock()).Generate(); err != nil {
			t.Fatal(err)
		}
		k1 := filepath.Join(dir, "k1.key")
		fifo(t, k1)
		err := within(t, k1, func() error {
			s, err := Open(dir, Options{CurrentOnly: true})
			if err != nil {
				return err
			}
			defer s.Close()
			_, err = s.Current()
			return err
		})
		if kf, ok := errors.AsType[*KeyFileError](err); !ok || kf.Version != "k1" || !strings.Contains(err.Error(), k1+" is not a regular file") {
			t.Errorf("Open with k1.key a named pipe: %v; want a KeyFileError saying it is not a regular file", err)
		}
	})
	t.Run("key file in a reload", func(t *testing.T) {
		dir := t.TempDir()
		c := newClock()
		if _, err := open(t, dir, c).Generate(); err != nil {
			t.Fatal(err)
		}
		serving := serve(t, dir, c)
		c.Add(time.Minute)
		if _, err := open(t, dir, c).Rotate(); err != nil {
			t.Fatal(err)
		}
		k2 := filepath.Join(dir, "k2.key")
		fifo(t, k2)
		err := within(t, k2, func() error { _, err := serving.Refresh(); return err })
		if _, ok := errors.AsType[*KeyFileError](err); !ok || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("Refresh with k2.key a named pipe: %v; want a KeyFileError saying it is not a regular file", err)
		}
	})
	t.Run("index", func(t *testing.T) {
		dir := t.TempDir()
		if _, err := open(t, dir, newClock()).Generate(); err != nil {
			t.Fatal(err)
		}
		idx := filepath.Join(dir, IndexFile)
		fifo(t, idx)
		err := within(t, idx, func() error {
			s, err := Open(dir, Options{CurrentOnly: true})
			if err == nil {
				s.Close()
			}
			return err
		})
		if err == nil || !strings.Contains(err.Error(), idx+" is not a regular file") {
			t.Errorf("Open with index.json a named pipe: %v; want it refused as not a regular file", err)
		}
	})
}
