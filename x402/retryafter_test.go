package x402

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// The Retry-After a facilitator behind refuses /settle with, as
// HTTPFacilitator reads it and as the front facilitator relays it to its
// own clients: RFC 9110 allows an HTTP-date; a huge number is the
// remote's to send, and is passed on bounded as the gate bounds it.
// (Before: seconds only, an HTTP-date read as none, 18446744074 wrapped
// to 290 ms, and "86400" relayed unchanged.)
func TestRetryAfterFromBehindIsReadPerRFC9110AndBounded(t *testing.T) {
	var whole map[string]json.RawMessage
	json.Unmarshal([]byte(validPayloadJSON), &whole)
	var accepted PaymentRequirements
	json.Unmarshal(whole["accepted"], &accepted)
	for _, c := range []struct {
		name, sent  string
		maxRelayed  string // the longest wait a relay should pass on
		wantAtLeast time.Duration
	}{
		{"a day, in seconds", "86400", "60", 0},
		{"past int64 nanoseconds", "18446744074", "60", 60 * time.Second},
		{"an HTTP-date 30 s ahead", time.Now().Add(30 * time.Second).UTC().Format(http.TimeFormat), "60", 20 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Retry-After", c.sent)
				http.Error(w, `{"error":"rate_limited"}`, http.StatusTooManyRequests)
			}))
			defer upstream.Close()
			behind := NewHTTPFacilitator(HTTPFacilitatorConfig{URL: upstream.URL})
			_, err := behind.Settle(context.Background(), PaymentPayload{X402Version: 2, Accepted: accepted, Payload: whole["payload"]}, accepted)
			var fe *FacilitatorError
			if !errors.As(err, &fe) {
				t.Fatalf("settle = %v; want *FacilitatorError", err)
			}
			t.Logf("Retry-After %q read as %v", c.sent, fe.RetryAfter)
			if fe.RetryAfter < c.wantAtLeast {
				t.Errorf("Retry-After %q read as %v; want at least %v (the remote asked to wait that long)", c.sent, fe.RetryAfter, c.wantAtLeast)
			}
			front := httptest.NewServer(NewFacilitatorHandler(behind))
			defer front.Close()
			p := `{"x402Version":2,"paymentPayload":` + validPayloadJSON + `,"paymentRequirements":` + string(whole["accepted"]) + `}`
			resp, err := http.Post(front.URL+"/settle", "application/json", strings.NewReader(p))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			got := resp.Header.Get("Retry-After")
			t.Logf("front relays Retry-After %q", got)
			if len(got) > len(c.maxRelayed) || (len(got) == len(c.maxRelayed) && got > c.maxRelayed) {
				t.Errorf("front relayed Retry-After %q from the remote's %q; want it bounded (the gate caps at %s)", got, c.sent, c.maxRelayed)
			}
		})
	}
}

// Retry-After is read one way (ParseRetryAfter), both forms RFC 9110
// allows, and bounded: what no reading can tell is no wait, and a wait
// too long for a time.Duration is the bound, never a wrapped one.
func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		v    string
		want time.Duration
	}{
		{"", 0},
		{"0", 0},
		{"7", 7 * time.Second},
		{" 7 ", 7 * time.Second},
		{"60", MaxRetryAfter},
		{"86400", MaxRetryAfter},
		{"18446744074", MaxRetryAfter},
		{"99999999999999999999999999", MaxRetryAfter},
		{"-5", 0},
		{"+5", 0},
		{"1.5", 0},
		{"soon", 0},
		{now.Add(30 * time.Second).Format(http.TimeFormat), 30 * time.Second},
		{now.Add(30 * time.Second).Format(time.RFC850), 30 * time.Second},
		{now.Add(30 * time.Second).Format(time.ANSIC), 30 * time.Second},
		{now.Add(time.Hour).Format(http.TimeFormat), MaxRetryAfter},
		{now.Add(-time.Minute).Format(http.TimeFormat), 0},
	} {
		if got := ParseRetryAfter(c.v, now); got != c.want {
			t.Errorf("ParseRetryAfter(%q) = %v; want %v", c.v, got, c.want)
		}
	}
	for d, want := range map[time.Duration]int{0: 0, time.Millisecond: 1, 29500 * time.Millisecond: 30, time.Hour: 60} {
		if got := RetryAfterSeconds(d); got != want {
			t.Errorf("RetryAfterSeconds(%v) = %d; want %d", d, got, want)
		}
	}
}
