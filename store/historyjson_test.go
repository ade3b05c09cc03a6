package store

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
)

// Strings a record's fields may hold: plain ones, and every kind that
// encoding/json escapes or rewrites (so the hand-written path must leave it
// to json.Marshal).
var recordStrings = []string{
	"", "3f1c2b9e-6f0a-4a7e-9d7c-2f7c1f1e8a11", "seller-7", "test-agent", "pass", "fail",
	"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", "k12", PaymentPending,
	"eip155:8453", "0x1111111111111111111111111111111111111111", "a b~", "\x7f",
	`quote"d`, `back\slash`, "tab\t", "nl\n", "\x00", "<script>", "a&b", "é", "✓", "\u2028", "\u2029",
	"\xff", "bad\xc3", "😀",
}

var recordTimes = []time.Time{
	time.Date(2026, 12, 2, 7, 5, 0, 123456000, time.UTC),
	time.Date(2026, 12, 2, 7, 5, 0, 0, time.UTC),
	time.Date(1, 1, 1, 0, 0, 0, 1, time.UTC),
	time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC),
	time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), // json.Marshal refuses it
	time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC),
	time.Date(2026, 12, 2, 8, 5, 0, 5, time.FixedZone("CET", 3600)),
	{},
}

// randomFill sets every field of the struct v points to from the samples
// above, by reflection, so that a field added to Verification or Counts is
// covered (and fails the comparison until the hand-written encoder writes
// it).
func randomFill(t *testing.T, r *rand.Rand, v any) {
	rv := reflect.ValueOf(v).Elem()
	for i := range rv.NumField() {
		f := rv.Field(i)
		switch f.Interface().(type) {
		case string:
			f.SetString(recordStrings[r.IntN(len(recordStrings))])
		case bool:
			f.SetBool(r.IntN(2) == 0)
		case int64:
			switch r.IntN(4) {
			case 0:
				f.SetInt(0)
			case 1:
				f.SetInt(r.Int64())
			case 2:
				f.SetInt(-r.Int64N(1000))
			default:
				f.SetInt(r.Int64N(1000))
			}
		case time.Time:
			f.Set(reflect.ValueOf(recordTimes[r.IntN(len(recordTimes))]))
		default:
			t.Fatalf("field %s of %T has a type the test does not fill", rv.Type().Field(i).Name, v)
		}
	}
}

// The hand-written encoders write exactly what json.Marshal writes, and
// fail where it fails: records and counts written before them, by them, or
// by any older build read back the same.
func TestHistoryEncodingIsJSONMarshal(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 20000 {
		var v Verification
		randomFill(t, r, &v)
		if i%2 == 0 { // mostly plain records, as recorded
			v.OutputHash, v.AgentID, v.Wallet = recordStrings[6], "seller-7", ""
			v.VerifiedAt = recordTimes[i/2%2]
		}
		compareEncoding(t, &v, encodeRecord)
		var c Counts
		randomFill(t, r, &c)
		compareEncoding(t, &c, encodeCounts)
	}
}

func compareEncoding[T any](t *testing.T, v *T, encode func(*T) ([]byte, error)) {
	t.Helper()
	want, wantErr := json.Marshal(v)
	got, err := encode(v)
	if (err != nil) != (wantErr != nil) || !bytes.Equal(got, want) {
		t.Fatalf("%+v:\nencoded %s (%v)\njson    %s (%v)", *v, got, err, want, wantErr)
	}
}

// Counts read back as json.Unmarshal reads them, whether the fast reader
// takes them (what this store writes) or leaves them to encoding/json.
func TestDecodeCountsIsJSONUnmarshal(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 20000 {
		var c Counts
		randomFill(t, r, &c)
		b, err := json.Marshal(c)
		if err != nil {
			continue
		}
		if _, ok := parseCounts(b); !ok && plainTime(c.First) && plainTime(c.Last) && c.Pass >= 0 && c.Fail >= 0 &&
			c.AuthenticatedPass >= 0 && c.AuthenticatedFail >= 0 && c.Paid >= 0 {
			t.Fatalf("the fast reader refused what the store writes: %s", b)
		}
		compareDecoding(t, b)
	}
	for _, s := range []string{
		`{"pass":1,"fail":2}`, `{"fail":2,"pass":1}`, `{"pass":01,"fail":2}`, `{"pass":-1,"fail":2}`,
		`{"pass":1,"fail":2,"paid":0}`, `{"pass":1e2,"fail":2}`, `{"pass":1,"fail":2} `, ` {"pass":1,"fail":2}`,
		`{"pass":1,"fail":2,"first":"2026-12-02T07:05:00.000Z"}`, `{"pass":1,"fail":2,"first":"2026-12-02T07:05:00+01:00"}`,
		`{"pass":1,"fail":2,"first":"2026-12-02T07:05:00Z","last":"2026-12-02T07:05:01Z"}`,
		`{"pass":1,"fail":2,"first":"2026-12-02T07:05:00Z"`, `{"pass":99999999999999999999,"fail":2}`,
		`{"pass":1,"fail":2,"last":"x"}`, `{"pass":1,"fail":2,"first":null}`, `{}`, `null`, ``,
	} {
		compareDecoding(t, []byte(s))
	}
}

func compareDecoding(t *testing.T, b []byte) {
	t.Helper()
	var want Counts
	wantErr := json.Unmarshal(b, &want)
	got, err := decodeCounts(b)
	if (err != nil) != (wantErr != nil) || (err == nil && !reflect.DeepEqual(got, want)) {
		t.Fatalf("%s: decoded %+v (%v), json %+v (%v)", b, got, err, want, wantErr)
	}
}

// FuzzHistoryEncoding: any record, as the fields come from requests and the
// gateway, is encoded as json.Marshal encodes it; any counts value decodes
// as json.Unmarshal decodes it.
func FuzzHistoryEncoding(f *testing.F) {
	f.Add("seller-7", "invoice-7731", "0xabc", int64(3), []byte(`{"pass":3,"fail":1,"first":"2026-12-02T07:05:00.123456Z"}`))
	f.Add("<é>", "\u2028", "\xff", int64(-1), []byte(`{"pass":1,"fail":2,"paid":0}`))
	f.Fuzz(func(t *testing.T, agent, task, payer string, n int64, counts []byte) {
		v := Verification{ID: "id", VerifiedAt: recordTimes[0], AgentID: agent, TaskID: task, Result: "pass",
			Payment: PaymentPaid, Payer: payer, Authenticated: n%2 == 0}
		compareEncoding(t, &v, encodeRecord)
		c := Counts{Pass: n, Fail: n / 3, Paid: n % 5, Last: recordTimes[n&3]}
		compareEncoding(t, &c, encodeCounts)
		compareDecoding(t, counts)
	})
}

// BenchmarkHistoryEncoding is the encoding work of one recorded
// verification (its record and its agent's counts, read and rewritten),
// by hand and by encoding/json.
func BenchmarkHistoryEncoding(b *testing.B) {
	v := sampleVerification("3f1c2b9e-6f0a-4a7e-9d7c-2f7c1f1e8a11", "seller-7", recordTimes[0], "fail")
	v.KeyVersion = "k1"
	c := Counts{Pass: 120, Fail: 31, First: recordTimes[1], Last: recordTimes[0]}
	stored, _ := json.Marshal(c)
	b.Run("hand", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := encodeRecord(&v); err != nil {
				b.Fatal(err)
			}
			c, err := decodeCounts(stored)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := encodeCounts(&c); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(v); err != nil {
				b.Fatal(err)
			}
			var c Counts
			if err := json.Unmarshal(stored, &c); err != nil {
				b.Fatal(err)
			}
			if _, err := json.Marshal(c); err != nil {
				b.Fatal(err)
			}
		}
	})
}
