package store

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestSharedRefusesOtherNoSync: a second handle on an open folder that
// asks for the other NoSync is refused with an error naming the folder,
// the option, both values and the way out, and the first handle's database
// is as it was: same mode, same data, and closing it still unlocks the
// folder (the refusal took no reference).
func TestSharedRefusesOtherNoSync(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "db")
	first, err := Shared(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := first.RecordVerification(ctx, sampleVerification("v1", "agent", time.Now(), "pass")); err != nil {
		t.Fatal(err)
	}

	second, err := Shared(filepath.Join(dir, "..", "db"), Options{NoSync: true})
	if second != nil {
		t.Fatal("a handle asking for NoSync was given out on a durable database")
	}
	var conflict *OptionsConflictError
	if !errors.As(err, &conflict) {
		t.Fatalf("Shared with another NoSync = %v, want an *OptionsConflictError", err)
	}
	want := OptionsConflictError{Dir: dir, Option: "NoSync", Open: false, Asked: true}
	if *conflict != want {
		t.Fatalf("conflict = %+v, want %+v", *conflict, want)
	}
	msg := err.Error()
	for _, part := range []string{dir, "NoSync false", "NoSync true", "same NoSync", "restart"} {
		if !strings.Contains(msg, part) {
			t.Errorf("error %q does not say %q", msg, part)
		}
	}

	if first.opts.NoSync || first.commits.log == nil {
		t.Fatal("the refused handle changed the open database's durability")
	}
	if err := first.RecordVerification(ctx, sampleVerification("v2", "agent", time.Now(), "pass")); err != nil {
		t.Fatalf("the first handle after the refusal: %v", err)
	}
	for _, id := range []string{"v1", "v2"} {
		if _, err := first.Verification(ctx, id); err != nil {
			t.Fatalf("the first handle lost %s: %v", id, err)
		}
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	// The last reference is gone: the folder opens afresh with the other
	// NoSync, which is what a restart does.
	again, err := Shared(dir, Options{NoSync: true})
	if err != nil {
		t.Fatalf("Shared with NoSync after every handle closed: %v", err)
	}
	defer again.Close()
	if !again.opts.NoSync || again.commits.log != nil {
		t.Fatal("the reopened database is not NoSync")
	}
	if _, err := again.Verification(ctx, "v2"); err != nil {
		t.Fatalf("the reopened database lost v2: %v", err)
	}
}

// TestSharedOptionsThatMayDiffer: handles asking alike (ReservationTTL's
// zero is its default) share the database; the allowance flush and the
// logger may differ per handle; InMemory and ReservationTTL may not.
func TestSharedOptionsThatMayDiffer(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	first, err := Shared(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	for _, opts := range []Options{
		{ReservationTTL: DefaultReservationTTL},
		{AllowanceFlush: time.Hour, AllowanceFlushUnits: 10},
		{Logger: slog.New(slog.DiscardHandler)},
	} {
		h, err := Shared(dir, opts)
		if err != nil {
			t.Fatalf("Shared(%+v) on a default database: %v", opts, err)
		}
		if h.bdb != first.bdb {
			t.Fatalf("Shared(%+v) did not share the open database", opts)
		}
		if err := h.Close(); err != nil {
			t.Fatal(err)
		}
	}
	for opts, option := range map[*Options]string{
		{InMemory: true}:              "InMemory",
		{ReservationTTL: time.Minute}: "ReservationTTL",
	} {
		_, err := Shared(dir, *opts)
		var conflict *OptionsConflictError
		if !errors.As(err, &conflict) || conflict.Option != option {
			t.Errorf("Shared(%+v) = %v, want a conflict on %s", *opts, err, option)
		}
	}
}

// TestSharedOptionsAllDecided fails when Options gains a field that neither
// mustAgree nor perHandle names: each new option needs a decision whether
// Shared handles may differ in it.
func TestSharedOptionsAllDecided(t *testing.T) {
	decided := map[string]int{}
	for _, o := range mustAgree(Options{}) {
		decided[o.name]++
	}
	for _, name := range perHandle {
		decided[name]++
	}
	typ := reflect.TypeFor[Options]()
	for i := range typ.NumField() {
		name := typ.Field(i).Name
		switch decided[name] {
		case 0:
			t.Errorf("Options.%s: decide in shared.go whether Shared handles must agree on it (mustAgree) or may differ (perHandle)", name)
		case 1:
		default:
			t.Errorf("Options.%s is both in mustAgree and in perHandle", name)
		}
		delete(decided, name)
	}
	for name := range decided {
		t.Errorf("shared.go decides about %s, which Options does not have", name)
	}
}

// TestSharedAsOpenJoinsAsOpened: a SharedAsOpen handle joins the database
// open in its folder with the fixed options it was opened with (here
// NoSync, which it did not ask for), and opens a folder none holds with the
// options it asks for.
func TestSharedAsOpenJoinsAsOpened(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	first, err := Shared(dir, Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	joined, err := SharedAsOpen(dir, Options{AllowanceFlush: time.Second})
	if err != nil {
		t.Fatalf("SharedAsOpen on a database open with NoSync: %v", err)
	}
	defer joined.Close()
	if !joined.opts.NoSync {
		t.Fatalf("joined options = %+v; want the open NoSync", joined.opts)
	}
	// Shared still refuses the other NoSync: only SharedAsOpen follows.
	if _, err := Shared(dir, Options{}); err == nil {
		t.Fatal("Shared without NoSync joined a database open with it")
	}

	other := filepath.Join(t.TempDir(), "other")
	opened, err := SharedAsOpen(other, Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer opened.Close()
	if !opened.opts.NoSync {
		t.Fatal("SharedAsOpen on a folder none holds did not open it with the options asked")
	}
}
