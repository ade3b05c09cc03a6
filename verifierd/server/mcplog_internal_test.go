package server

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
)

// TestWarnAndAbove: the SDK's log keeps its warnings and errors (with
// their attributes and groups) and drops its info and debug lines, even
// when the service logs at debug.
func TestWarnAndAbove(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(warnAndAbove{slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})})
	log.Debug("debug line")
	log.Info("server session connected")
	log.With("a", 1).WithGroup("g").Warn("warn line", "b", 2)
	log.Error("error line")
	got := buf.String()
	for _, no := range []string{"debug line", "server session connected"} {
		if strings.Contains(got, no) {
			t.Errorf("log has %q:\n%s", no, got)
		}
	}
	for _, want := range []string{"msg=\"warn line\" a=1 g.b=2", "msg=\"error line\""} {
		if !strings.Contains(got, want) {
			t.Errorf("log lacks %q:\n%s", want, got)
		}
	}
	if (warnAndAbove{slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelError})}).Enabled(context.Background(), slog.LevelWarn) {
		t.Error("a warning passes a handler set to errors only")
	}
}
