package caddymodule

import (
	"net/http"
	"testing"
	"time"

	"github.com/aovhq/aov/store"
)

// The three Free-Allowance-* values share one array (setHeaders): a
// handler that adds a value to one of them afterwards must not write over
// the next header's value.
func TestFreeAllowanceHeadersStayApartWhenOneIsAddedTo(t *testing.T) {
	f := &FreeAllowance{PerDay: 100}
	f.provision()
	h := http.Header{}
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	f.setHeaders(h, store.Reservation{Remaining: 7}, at)
	h.Add(HeaderFreeRemaining, "added")
	h.Add(HeaderFreeLimit, "added")
	for k, want := range map[string][]string{
		HeaderFreeRemaining: {"7", "added"},
		HeaderFreeLimit:     {"100", "added"},
		HeaderFreeResets:    {"2026-03-02T00:00:00Z"},
	} {
		if got := h.Values(k); len(got) != len(want) || got[0] != want[0] || got[len(got)-1] != want[len(want)-1] {
			t.Errorf("%s: %q, want %q", k, got, want)
		}
	}
}
