package redisstore

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/aovhq/aov/store"
)

// netOut is the bytes the server has sent to its clients so far.
func netOut(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "stats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(l, "total_net_output_bytes:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no total_net_output_bytes in INFO stats")
	return 0
}

// A value over what the store ever writes, planted in a shared Redis (by
// another deployment without an ACL key pattern, or by hand), is refused
// as a corrupt record, which the gateway answers 503, before any of it is
// sent: a record at the limit is still read.
func TestOversizedRecordsAreRefusedUnsent(t *testing.T) {
	_, rdb := standalone(t)
	ctx := context.Background()
	s, err := New(ctx, rdb, Options{Prefix: "site"})
	if err != nil {
		t.Fatal(err)
	}
	until := time.Now().Add(time.Hour)
	const token = "00112233445566778899aabbccddeeff"
	// refused reports whether op failed as a corrupt record, having sent
	// the client less than the planted value's size.
	refused := func(desc string, planted int, op func() error) {
		t.Helper()
		before := netOut(t, rdb)
		err := op()
		sent := netOut(t, rdb) - before
		var ce *store.ClaimedError
		switch {
		case err == nil, errors.Is(err, store.ErrNotFound), errors.As(err, &ce):
			t.Errorf("%s: %v; want a corrupt record", desc, err)
		case !strings.Contains(err.Error(), "corrupt"):
			t.Errorf("%s: %v; want a corrupt record", desc, err)
		}
		if sent >= int64(planted) {
			t.Errorf("%s: the server sent %d bytes for a planted value of %d", desc, sent, planted)
		}
	}

	// A claim's note over store.MaxHoldNoteBytes, on its first key.
	big := strings.Repeat("x", store.MaxHoldNoteBytes+1)
	first, second := "x402/payload/abc", "x402/auth/base/usdc/0xpayer/0xnonce"
	if err := rdb.HSet(ctx, "site:{c}:"+first, "s", "0", "t", token, "u", until.UnixMilli(), "n", big).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(ctx, "site:{c}:"+second, "s", "0", "t", token, "u", until.UnixMilli(), "r", "site:{c}:"+first).Err(); err != nil {
		t.Fatal(err)
	}
	refused("Lookup of the key with the note", len(big), func() error { _, err := s.Claims().Lookup(ctx, first); return err })
	refused("Lookup of the key naming it", len(big), func() error { _, err := s.Claims().Lookup(ctx, second); return err })
	refused("Claim of the held key", len(big), func() error { _, err := s.Claims().Claim(ctx, []string{first}, until); return err })
	refused("Claim naming it by its other key", len(big), func() error { _, err := s.Claims().Claim(ctx, []string{second}, until); return err })

	// A saved answer over store.MaxPaymentIDAnswerBytes, and a fingerprint
	// over store.MaxPaymentIDFingerprint.
	answer := strings.Repeat("a", store.MaxPaymentIDAnswerBytes+1)
	id := "pay_0123456789abcdef"
	if err := rdb.HSet(ctx, "site:p:"+hex.EncodeToString([]byte(id)), "s", "1", "u", until.UnixMilli(), "f", "ff", "a", answer).Err(); err != nil {
		t.Fatal(err)
	}
	refused("PaymentIDs Lookup", len(answer), func() error { _, err := s.PaymentIDs().Lookup(ctx, id); return err })
	refused("PaymentIDs Bind", len(answer), func() error { _, _, err := s.PaymentIDs().Bind(ctx, id, "ff", until); return err })
	fp := strings.Repeat("f", 1<<20)
	if err := rdb.HSet(ctx, "site:p:"+hex.EncodeToString([]byte(id)), "f", fp, "a", "").Err(); err != nil {
		t.Fatal(err)
	}
	refused("PaymentIDs Lookup of a long fingerprint", len(fp), func() error { _, err := s.PaymentIDs().Lookup(ctx, id); return err })

	// What the store writes at its limits is read back whole.
	cl, err := s.Claims().(store.HeldClaims).ClaimHeld(ctx, []string{"x402/payload/def", "x402/auth/other"}, until, time.Minute,
		func(store.Claim) (string, error) { return big[1:], nil })
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range cl.Keys {
		if st, err := s.Claims().Lookup(ctx, k); err != nil || st.Note != big[1:] {
			t.Errorf("Lookup of %s with a note of store.MaxHoldNoteBytes: %d bytes, %v", k, len(st.Note), err)
		}
	}
	id2 := "pay_fedcba9876543210"
	if _, _, err := s.PaymentIDs().Bind(ctx, id2, "ff", until); err != nil {
		t.Fatal(err)
	}
	if err := s.PaymentIDs().Save(ctx, id2, "ff", []byte(answer[1:]), until); err != nil {
		t.Fatal(err)
	}
	if st, err := s.PaymentIDs().Lookup(ctx, id2); err != nil || len(st.Answer) != store.MaxPaymentIDAnswerBytes {
		t.Errorf("Lookup of an answer of store.MaxPaymentIDAnswerBytes: %d bytes, %v", len(st.Answer), err)
	}
}

// The discovery list, served to anyone who asks the facilitator, sends no
// field over what Record writes: an entry with one planted (an item, a way
// to pay's requirements, a count of ways to pay) keeps its place in the
// page with no item, as a corrupt entry does, its fields unsent, and the
// list's other entries, one at the item limit among them, come back whole,
// unfiltered and filtered.
func TestPlantedDiscoveryFieldsAreNotListed(t *testing.T) {
	_, rdb := standalone(t)
	ctx := context.Background()
	s, err := New(ctx, rdb, Options{Prefix: "site"})
	if err != nil {
		t.Fatal(err)
	}
	lim := store.DiscoveryLimits{}.WithDefaults()
	d := s.Discovery(lim)
	atLimit := `"` + strings.Repeat("i", lim.MaxItemBytes-2) + `"`
	record := func(res, item string) {
		t.Helper()
		e := store.DiscoveryEntry{Resource: res, Type: "http", Item: json.RawMessage(item),
			Accepts: []store.DiscoveryAccept{{Scheme: "exact", Network: "eip155:84532", Asset: "0xa", PayTo: "0xb", Raw: json.RawMessage(`{}`)}}}
		if err := d.Record(ctx, e); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond) // distinct last-seen times: the last recorded is listed first
	}
	big := `"` + strings.Repeat("x", 16<<20) + `"`
	planted := map[string][2]string{ // resource: field, value
		"https://api.example/item": {"\x00i", big},
		"https://api.example/raw":  {"\x00r1", big},
		"https://api.example/n":    {"\x00n", "100000"},
	}
	record("https://api.example/limit", atLimit)
	for res, f := range planted {
		record(res, `{"x":1}`)
		if err := rdb.HSet(ctx, "site:{d}:e", res+f[0], f[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, q := range []store.DiscoveryQuery{{Limit: 10, MaxBytes: 64 << 10}, {Limit: 10, MaxBytes: 64 << 10, Network: "eip155:84532"}} {
		before := netOut(t, rdb)
		page, err := d.List(ctx, q)
		sent := netOut(t, rdb) - before
		if err != nil {
			t.Fatalf("List %+v: %v", q, err)
		}
		if sent > 1<<20 {
			t.Errorf("List %+v: the server sent %d bytes; planted fields were sent", q, sent)
		}
		if page.Total != 4 || len(page.Entries) != 4 {
			t.Fatalf("List %+v: total %d, %d entries; want 4 and 4 (a corrupt entry keeps its place)", q, page.Total, len(page.Entries))
		}
		for _, e := range page.Entries {
			_, bad := planted[e.Resource]
			switch {
			case bad && (e.Item != nil || e.Accepts != nil):
				t.Errorf("List %+v: %s with a planted field came back with %d bytes of item and %d ways to pay", q, e.Resource, len(e.Item), len(e.Accepts))
			case !bad && (string(e.Item) != atLimit || len(e.Accepts) != 1):
				t.Errorf("List %+v: %s, written at the item limit, came back with %d bytes of item and %d ways to pay", q, e.Resource, len(e.Item), len(e.Accepts))
			}
		}
	}
}
