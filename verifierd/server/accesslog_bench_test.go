package server

import (
	"io"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"
)

// BenchmarkAccessLog is one access log line of a verification, to a JSON
// handler that discards it: "logattrs" the way it was written before
// (Logger.LogAttrs with a slice of attributes), "record" as logRequest
// writes it.
func BenchmarkAccessLog(b *testing.B) {
	s := &Server{log: slog.New(slog.NewJSONHandler(io.Discard, nil))}
	r := httptest.NewRequest("POST", "/verify/schema", nil)
	rec := &requestLog{route: "verify_schema", status: 200, verificationID: "3f1c2b9e-6f0a-4a7e-9d7c-2f7c1f1e8a11", result: "fail", payment: "free"}
	b.Run("logattrs", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			attrs := []slog.Attr{
				slog.String("method", r.Method),
				slog.String("route", rec.route),
				slog.Int("status", rec.status),
				slog.Float64("duration_ms", float64((1234*time.Microsecond).Microseconds())/1000),
				slog.String("remote", r.RemoteAddr),
			}
			attrs = append(attrs, slog.String("verification_id", rec.verificationID),
				slog.String("result", rec.result), slog.String("payment", rec.payment))
			s.log.LogAttrs(r.Context(), slog.LevelInfo, "request", attrs...)
		}
	})
	b.Run("record", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			s.logRequest(r, rec, 1234*time.Microsecond)
		}
	})
}
