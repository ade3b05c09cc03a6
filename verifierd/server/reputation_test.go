package server_test

import (
	"bytes"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/aovhq/aov/store"
)

func TestReputation(t *testing.T) {
	f := newFixture(t, fixtureOpts{noSync: true})
	withAgent := func(agent, total string) []byte {
		return bytes.Replace(invoice(total, ""), []byte(`"seller-7"`), []byte(strconv.Quote(agent)), 1)
	}
	// seller-7: 3 passes and 2 fails, newest last; another agent in between.
	var ids []string
	for i, total := range []string{"129.5", "135.0", "129.5", "135.0", "129.5"} {
		w := f.do(http.MethodPost, "/verify/schema", withAgent("seller-7", total), nil)
		if w.Code != 200 {
			t.Fatalf("setup %d: %d", i, w.Code)
		}
		ids = append([]string{decode(t, w)["verification_id"].(string)}, ids...) // newest first
		f.do(http.MethodPost, "/verify/schema", withAgent("seller-8", "129.5"), nil)
	}
	f.do(http.MethodPost, "/verify/schema", withAgent("test-demo", "129.5"), nil)
	f.do(http.MethodPost, "/verify/schema", withAgent("a/b c", "135.0"), nil)

	t.Run("the history pages newest first with exact counts and no content", func(t *testing.T) {
		var got []string
		cursor := ""
		for page := 0; ; page++ {
			path := "/reputation/seller-7?limit=2"
			if cursor != "" {
				path += "&cursor=" + url.QueryEscape(cursor)
			}
			w := f.do(http.MethodGet, path, nil, nil)
			if w.Code != 200 {
				t.Fatalf("page %d: %d %s", page, w.Code, w.Body)
			}
			if strings.Contains(w.Body.String(), "invoice-7731") || strings.Contains(w.Body.String(), "task_id") {
				t.Fatalf("the history shows task ids: %s", w.Body)
			}
			doc := decode(t, w)
			c := doc["counts"].(map[string]any)
			if c["pass"] != 3.0 || c["fail"] != 2.0 || c["total"] != 5.0 || c["pass_ratio"] != 0.6 {
				t.Fatalf("counts %v, want 3 pass, 2 fail, ratio 0.6", c)
			}
			if doc["agent_id"] != "seller-7" || doc["test_agent"] != false || doc["first_verified_at"] == nil {
				t.Fatalf("header fields %v", doc)
			}
			for _, e := range doc["verifications"].([]any) {
				m := e.(map[string]any)
				if len(m["output_hash"].(string)) != 64 || len(m["request_hash"].(string)) != 64 {
					t.Fatalf("entry without hashes: %v", m)
				}
				got = append(got, m["verification_id"].(string))
			}
			if doc["next_cursor"] == nil {
				break
			}
			cursor = doc["next_cursor"].(string)
		}
		if strings.Join(got, ",") != strings.Join(ids, ",") {
			t.Fatalf("paged ids\n %v\nwant\n %v", got, ids)
		}
	})

	for _, c := range []struct {
		desc   string
		path   string
		agent  string
		total  float64
		test   bool
		status int
		field  string
	}{
		{"a test- agent's history is served and flagged", "/reputation/test-demo", "test-demo", 1, true, 200, ""},
		{"an agent never seen has an empty history", "/reputation/nobody", "nobody", 0, false, 200, ""},
		{"an agent id with a slash and a space is URL-encoded in the path", "/reputation/a%2Fb%20c", "a/b c", 1, false, 200, ""},
		{"a limit over the maximum is refused", "/reputation/seller-7?limit=1000", "", 0, false, 422, "limit"},
		{"a limit that is not a number is refused", "/reputation/seller-7?limit=ten", "", 0, false, 422, "limit"},
		{"a cursor the service did not hand out is refused", "/reputation/seller-7?cursor=forged", "", 0, false, 422, "cursor"},
		{"an empty agent id is refused", "/reputation/", "", 0, false, 422, "agent_id"},
		{"an agent id over 200 characters is refused", "/reputation/" + strings.Repeat("a", 201), "", 0, false, 422, "agent_id"},
	} {
		t.Run(c.desc, func(t *testing.T) {
			w := f.do(http.MethodGet, c.path, nil, nil)
			if w.Code != c.status {
				t.Fatalf("status %d, want %d: %s", w.Code, c.status, w.Body)
			}
			doc := decode(t, w)
			if c.status != 200 {
				fields := doc["fields"].([]any)
				if fields[0].(map[string]any)["field"] != c.field {
					t.Fatalf("fields %v, want %s", fields, c.field)
				}
				return
			}
			if doc["agent_id"] != c.agent || doc["test_agent"] != c.test || doc["counts"].(map[string]any)["total"] != c.total {
				t.Fatalf("answer %v", doc)
			}
			// None of these ids has an owner: every record counts toward
			// the score, except a test- agent's, which is never scored.
			if doc["owned"] != false {
				t.Fatalf("owned %v", doc["owned"])
			}
			for _, e := range doc["verifications"].([]any) {
				if counts := e.(map[string]any)["counts_toward_score"]; counts != !c.test {
					t.Fatalf("counts_toward_score %v for %s", counts, c.agent)
				}
			}
			if c.total == 0 && (doc["first_verified_at"] != nil || doc["next_cursor"] != nil || len(doc["verifications"].([]any)) != 0) {
				t.Fatalf("empty history answer %v", doc)
			}
		})
	}

	t.Run("POST on a reputation path is 405 with Allow: GET, HEAD", func(t *testing.T) {
		w := f.do(http.MethodPost, "/reputation/seller-7", []byte(`{}`), nil)
		if w.Code != 405 || w.Header().Get("Allow") != "GET, HEAD" {
			t.Fatalf("%d Allow %q", w.Code, w.Header().Get("Allow"))
		}
	})
	t.Run("HEAD answers without a body", func(t *testing.T) {
		w := f.do(http.MethodHead, "/reputation/seller-7", nil, nil)
		if w.Code != 200 || w.Body.Len() != 0 {
			t.Fatalf("%d, %d body bytes", w.Code, w.Body.Len())
		}
	})
}

// Each record's counts_toward_score says whether the score counts it: a
// paid call whose payment is still pending, or was reported unpaid (its
// answer never delivered), is listed but never evidence, under an id with
// an owner or without; reported paid, it counts. Before, the flag said
// every record of an unowned id, and every one of an owner's, counted.
func TestReputationUndeliveredCallsDoNotCountTowardScore(t *testing.T) {
	f := newFixture(t, fixtureOpts{noSync: true, localSigner: true})
	for _, c := range []struct {
		desc   string
		agent  string
		wallet string
	}{
		{"an id without an owner", "seller-8", ""},
		{"an owned id, its owner's own calls", wallet, wallet},
	} {
		t.Run(c.desc, func(t *testing.T) {
			hdr := map[string]string{"X-Aov-Gateway-Token": gatewayToken, "X-Aov-Payment": "paid", "X-Aov-Settlement": "pending", "X-Aov-Wallet": c.wallet}
			call := func() string {
				t.Helper()
				code, doc := f.verifyCall(c.agent, "129.5", hdr)
				if code != http.StatusOK {
					t.Fatalf("verification: %d %v", code, doc)
				}
				return doc["verification_id"].(string)
			}
			report := func(id, payment string) {
				t.Helper()
				body := []byte(`{"verification_id":"` + id + `","payment":"` + payment + `"}`)
				if w := f.do(http.MethodPost, "/v1/gateway/settlement", body, map[string]string{"X-Aov-Gateway-Token": gatewayToken}); w.Code != http.StatusNoContent {
					t.Fatalf("report %s: %d %s", payment, w.Code, w.Body)
				}
			}
			paid, unpaid, pending := call(), call(), call()
			report(paid, store.PaymentPaid)
			report(unpaid, store.PaymentUnpaid)

			w := f.do(http.MethodGet, "/reputation/"+c.agent, nil, nil)
			if w.Code != http.StatusOK {
				t.Fatalf("reputation: %d %s", w.Code, w.Body)
			}
			counts := map[string]any{}
			for _, e := range decode(t, w)["verifications"].([]any) {
				m := e.(map[string]any)
				counts[m["verification_id"].(string)] = m["counts_toward_score"]
			}
			want := map[string]any{paid: true, unpaid: false, pending: false}
			if !reflect.DeepEqual(counts, want) {
				t.Fatalf("counts_toward_score by id %v, want %v (paid, unpaid, pending)", counts, want)
			}
			s := f.do(http.MethodGet, "/score/"+c.agent, nil, viaGateway)
			if win := decode(t, s)["inputs"].(map[string]any)["window"].(map[string]any); win["records"] != 1.0 {
				t.Fatalf("the score's window %v; want the one paid call as its only evidence", win)
			}
		})
	}
}
