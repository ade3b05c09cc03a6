package store

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

// TestSharedCloseHoldsUpNoOtherFolder: the last handle on a folder closes
// Badger outside the registry's lock. A close that takes long (here, held
// up by a write in progress, which it lets finish) must not hold up a
// Shared of another folder, as it did when it ran under the lock (and
// hung a whole test suite behind a folder removed under an open
// database); a Shared of the same folder waits for it and then opens the
// folder again.
func TestSharedCloseHoldsUpNoOtherFolder(t *testing.T) {
	dirA, dirB := filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")
	a, err := Shared(dirA, Options{})
	if err != nil {
		t.Fatal(err)
	}
	writing, unblock := make(chan struct{}), make(chan struct{})
	wrote := make(chan error, 1)
	go func() {
		wrote <- a.update(context.Background(), func(*tx) error {
			close(writing)
			<-unblock
			return nil
		})
	}()
	<-writing
	closed := make(chan error, 1)
	go func() { closed <- a.Close() }() // the last handle: closes Badger after the write
	// Wait until the close has reached the committer, where it waits for
	// the write; Shared of the same folder waits for it in turn.
	for {
		a.commits.mu.Lock()
		closing := a.commits.closed
		a.commits.mu.Unlock()
		if closing {
			break
		}
		time.Sleep(time.Millisecond)
	}
	reopened := make(chan error, 1)
	go func() {
		db, err := Shared(dirA, Options{})
		if err == nil {
			err = db.Close()
		}
		reopened <- err
	}()

	opened := make(chan error, 1)
	go func() {
		db, err := Shared(dirB, Options{})
		if err == nil {
			err = db.Close()
		}
		opened <- err
	}()
	select {
	case err := <-opened:
		if err != nil {
			t.Fatalf("another folder: %v", err)
		}
	case <-time.After(10 * time.Second): // a deadlock bound, not a speed
		close(unblock)
		t.Fatal("a close in progress held up the opening of another folder")
	}

	close(unblock)
	if err := <-wrote; err != nil {
		t.Fatalf("the write in progress at the close: %v", err)
	}
	if err := <-closed; err != nil {
		t.Fatalf("closing: %v", err)
	}
	if err := <-reopened; err != nil {
		t.Fatalf("the same folder, opened while it was closing: %v", err)
	}
}
