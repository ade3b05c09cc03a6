package store

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
)

// Strings a record's fields may hold: plain ones, hashes and UUIDs (which
// the binary form stores as their bytes) and their near misses, and every
// kind that encoding/json escapes or rewrites.
var recordStrings = []string{
	"", "3f1c2b9e-6f0a-4a7e-9d7c-2f7c1f1e8a11", "seller-7", "test-agent", "pass", "fail",
	"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", "k12", PaymentPending,
	"E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855", "3f1c2b9e-6f0a-4a7e-9d7c-2f7c1f1e8a1",
	"3f1c2b9e_6f0a-4a7e-9d7c-2f7c1f1e8a11", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b85g",
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
// covered (and fails the round trip until the binary form carries it).
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

// Every record comes back as it went in: in the binary form exactly (every
// field, filled by reflection, so a field added to Verification and not to
// stringFields fails here), and a record with a time that is not UTC, in
// JSON, as json.Unmarshal reads what json.Marshal wrote.
func TestRecordRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for i := range 20000 {
		var v Verification
		randomFill(t, r, &v)
		if i%2 == 0 { // mostly records as the store writes them
			v.ID, v.OutputHash, v.VerifiedAt = recordStrings[1], recordStrings[6], recordTimes[i/2%4]
		}
		b, err := encodeRecord(&v)
		if v.VerifiedAt.Location() != time.UTC {
			want, wantErr := json.Marshal(&v)
			if (err != nil) != (wantErr != nil) || !bytes.Equal(b, want) {
				t.Fatalf("%+v: encoded %q (%v), want JSON %s (%v)", v, b, err, want, wantErr)
			}
			if err != nil {
				continue
			}
			var got, want2 Verification
			if err := decodeRecord(b, &got); err != nil || json.Unmarshal(want, &want2) != nil || !reflect.DeepEqual(got, want2) {
				t.Fatalf("%s: decoded %+v (%v), want %+v", b, got, err, want2)
			}
			continue
		}
		if err != nil || len(b) == 0 || b[0] != recordBinary {
			t.Fatalf("%+v: encoded %q (%v), want the binary form", v, b, err)
		}
		var got Verification
		if err := decodeRecord(b, &got); err != nil || !reflect.DeepEqual(got, v) {
			t.Fatalf("%q:\ndecoded %+v (%v)\nwant    %+v", b, got, err, v)
		}
	}
}

// A record earlier builds wrote (JSON) reads as json.Unmarshal reads it.
func TestJSONRecordsStillRead(t *testing.T) {
	v := sampleVerification("3f1c2b9e-6f0a-4a7e-9d7c-2f7c1f1e8a11", "seller-7", recordTimes[0], "pass")
	v.Wallet, v.Authenticated = "0x1111111111111111111111111111111111111111", true
	old, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	got := Verification{TaskID: "left over from a previous read"}
	if err := decodeRecord(old, &got); err != nil || !reflect.DeepEqual(got, v) {
		t.Fatalf("decoded %+v (%v), want %+v", got, err, v)
	}
	if err := decodeRecord([]byte(`{"id":`), &got); err == nil {
		t.Fatal("a torn JSON record decoded")
	}
}

// The binary form keeps hashes and a UUID id as their bytes: the SPEC's
// kind of record takes less than half its JSON, which is what the form is
// for.
func TestRecordIsCompact(t *testing.T) {
	v := sampleVerification("3f1c2b9e-6f0a-4a7e-9d7c-2f7c1f1e8a11", "seller-7", recordTimes[0], "pass")
	v.KeyVersion = "k1"
	b, err := encodeRecord(&v)
	if err != nil {
		t.Fatal(err)
	}
	j, _ := json.Marshal(v)
	// tag, flags, time (5 + 4), id (1 + 16), four hashes (4 × 33),
	// and the short strings with a one-byte header each.
	want := 2 + 5 + 4 + 17 + 4*33 + 1 + len(v.AgentID) + 1 + len(v.TaskID) + 1 + len(v.Result) +
		1 + len(v.KeyVersion) + 1 + len(v.Payment) + 3
	if len(b) != want {
		t.Fatalf("binary record of %d bytes, want %d (JSON: %d)", len(b), want, len(j))
	}
	if 2*len(b) >= len(j) {
		t.Fatalf("binary record of %d bytes against %d in JSON", len(b), len(j))
	}
}

// A damaged binary record is an error, never a panic or a partial record
// taken for whole: every truncation, a byte too many, unknown flags, an
// out-of-range nanosecond, an unknown string header.
func TestMalformedRecordsAreRefused(t *testing.T) {
	v := sampleVerification("3f1c2b9e-6f0a-4a7e-9d7c-2f7c1f1e8a11", "seller-7", recordTimes[0], "pass")
	b, err := encodeRecord(&v)
	if err != nil {
		t.Fatal(err)
	}
	var got Verification
	for n := 1; n < len(b); n++ {
		if err := decodeRecord(b[:n], &got); err == nil {
			t.Fatalf("a record cut to %d of %d bytes decoded: %+v", n, len(b), got)
		}
	}
	bad := map[string][]byte{
		"trailing byte":   append(bytes.Clone(b), 0),
		"unknown flag":    append([]byte{recordBinary, 0x04}, b[2:]...),
		"nanoseconds":     binary.AppendUvarint([]byte{recordBinary, 0, 0}, 1e9),
		"string header 5": append([]byte{recordBinary, 0, 0, 0}, 5),
		"string too long": append([]byte{recordBinary, 0, 0, 0}, 20, 'a'),
	}
	for name, b := range bad {
		if err := decodeRecord(b, &got); err == nil {
			t.Errorf("%s: decoded %+v", name, got)
		}
	}
}

// FuzzDecodeRecord: whatever bytes a record holds, decoding ends in an
// error or a record that encodes to a form decoding to the same record.
func FuzzDecodeRecord(f *testing.F) {
	v := sampleVerification("3f1c2b9e-6f0a-4a7e-9d7c-2f7c1f1e8a11", "seller-7", recordTimes[0], "pass")
	v.Payer, v.Network, v.Authenticated = "0xabc", "eip155:8453", true
	b, _ := encodeRecord(&v)
	f.Add(b)
	j, _ := json.Marshal(v)
	f.Add(j)
	f.Add([]byte{recordBinary, 3, 1, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		var got Verification
		if decodeRecord(b, &got) != nil {
			return
		}
		again, err := encodeRecord(&got)
		if err != nil {
			return // a JSON record json.Marshal cannot write back (a year past 9999 with an offset)
		}
		var back Verification
		if err := decodeRecord(again, &back); err != nil || !reflect.DeepEqual(back, got) && got.VerifiedAt.Location() == time.UTC {
			t.Fatalf("%q decoded to %+v, which encodes to %q, decoding to %+v (%v)", b, got, again, back, err)
		}
	})
}

// Counts come back as they went in: exactly in the binary form, and with a
// time that is not UTC, in JSON, as json.Unmarshal reads what json.Marshal
// wrote. Counts earlier builds wrote (JSON) read as json.Unmarshal reads
// them.
func TestCountsRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		var c Counts
		randomFill(t, r, &c)
		b, err := encodeCounts(&c)
		want := c
		if c.First.Location() != time.UTC || c.Last.Location() != time.UTC {
			j, jerr := json.Marshal(&c)
			if (err != nil) != (jerr != nil) || !bytes.Equal(b, j) {
				t.Fatalf("%+v: encoded %q (%v), want JSON %s (%v)", c, b, err, j, jerr)
			}
			if err != nil {
				continue
			}
			want = Counts{}
			json.Unmarshal(j, &want)
		} else if err != nil || b[0] != countsBinary {
			t.Fatalf("%+v: encoded %q (%v), want the binary form", c, b, err)
		}
		if got, err := decodeCounts(b); err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: decoded %+v (%v), want %+v", b, got, err, want)
		}
	}
	for _, s := range []string{
		`{"pass":1,"fail":2}`, `{"pass":1,"fail":2,"authenticated_pass":1,"paid":1,"first":"2026-12-02T07:05:00.123Z","last":"2026-12-02T07:05:01Z"}`,
		`{"pass":1,"fail":2,"first":"2026-12-02T07:05:00+01:00"}`, `{"pass":1,"fail":2`, `{"pass":"1"}`, ``,
	} {
		var want Counts
		wantErr := json.Unmarshal([]byte(s), &want)
		if got, err := decodeCounts([]byte(s)); (err != nil) != (wantErr != nil) || !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: decoded %+v (%v), json %+v (%v)", s, got, err, want, wantErr)
		}
	}
}

// Damaged binary counts are an error: every truncation, a byte too many.
func TestMalformedCountsAreRefused(t *testing.T) {
	b, err := encodeCounts(&Counts{Pass: 120, Fail: 31, Paid: 7, First: recordTimes[1], Last: recordTimes[0]})
	if err != nil {
		t.Fatal(err)
	}
	for n := 1; n < len(b); n++ {
		if c, err := decodeCounts(b[:n]); err == nil {
			t.Fatalf("counts cut to %d of %d bytes decoded: %+v", n, len(b), c)
		}
	}
	if c, err := decodeCounts(append(b, 0)); err == nil {
		t.Fatalf("counts with a byte too many decoded: %+v", c)
	}
}

// FuzzDecodeCounts: whatever bytes counts hold, decoding ends in an error
// or counts that encode to a form decoding to the same counts.
func FuzzDecodeCounts(f *testing.F) {
	b, _ := encodeCounts(&Counts{Pass: 3, Fail: 1, Paid: 2, First: recordTimes[1], Last: recordTimes[0]})
	f.Add(b)
	f.Add([]byte(`{"pass":3,"fail":1,"first":"2026-12-02T07:05:00.123456Z"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := decodeCounts(b)
		if err != nil {
			return
		}
		again, err := encodeCounts(&c)
		if err != nil {
			return // JSON counts json.Marshal cannot write back (a year past 9999 with an offset)
		}
		if back, err := decodeCounts(again); err != nil || !reflect.DeepEqual(back, c) && c.First.Location() == time.UTC && c.Last.Location() == time.UTC {
			t.Fatalf("%q decoded to %+v, which encodes to %q, decoding to %+v (%v)", b, c, again, back, err)
		}
	})
}

// BenchmarkHistoryEncoding is the encoding work of one recorded
// verification, its record encoded and its agent's counts read and
// rewritten, and of reading the record back (a history page or a score
// reads records), in the binary form and in JSON as earlier builds stored
// them. "bytes" is what one record and one counts value take.
func BenchmarkHistoryEncoding(b *testing.B) {
	v := sampleVerification("3f1c2b9e-6f0a-4a7e-9d7c-2f7c1f1e8a11", "seller-7", recordTimes[0], "fail")
	v.KeyVersion = "k1"
	c := Counts{Pass: 120, Fail: 31, First: recordTimes[1], Last: recordTimes[0]}
	stored := must(encodeCounts(&c))
	storedJSON := must(json.Marshal(c))
	b.Run("binary", func(b *testing.B) {
		b.ReportAllocs()
		var got Verification
		for b.Loop() {
			if err := decodeRecord(must(encodeRecord(&v)), &got); err != nil {
				b.Fatal(err)
			}
			c := must(decodeCounts(stored))
			must(encodeCounts(&c))
		}
		b.ReportMetric(float64(len(must(encodeRecord(&v)))+len(stored)), "bytes")
	})
	b.Run("json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var got Verification
			if err := json.Unmarshal(must(json.Marshal(v)), &got); err != nil {
				b.Fatal(err)
			}
			var c Counts
			if err := json.Unmarshal(storedJSON, &c); err != nil {
				b.Fatal(err)
			}
			must(json.Marshal(c))
		}
		b.ReportMetric(float64(len(must(json.Marshal(v)))+len(storedJSON)), "bytes")
	})
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
