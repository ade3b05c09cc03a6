package secretopt

import (
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestWarnIfLiteral: only a secret left as written by the replacer is
// warned about, by option name, never with its value.
func TestWarnIfLiteral(t *testing.T) {
	for _, tc := range []struct {
		desc, raw, expanded string
		warn                bool
	}{
		{"a literal", "s3cret-value", "s3cret-value", true},
		{"an env placeholder", "{env.REDIS_PASSWORD}", "s3cret-value", false},
		{"an unset env placeholder", "{env.REDIS_PASSWORD}", "", false},
		{"a file placeholder inside a value", "Bearer {file./run/secrets/t}", "Bearer s3cret-value", false},
		{"an unknown placeholder is a literal", "{s3cret}", "{s3cret}", true},
		{"not set", "", "", false},
	} {
		core, logs := observer.New(zapcore.WarnLevel)
		WarnIfLiteral(zap.New(core), "sentinel_password", tc.raw, tc.expanded)
		if got := logs.Len() == 1; got != tc.warn {
			t.Errorf("%s: warned %v, want %v", tc.desc, got, tc.warn)
			continue
		}
		for _, e := range logs.All() {
			if e.ContextMap()["option"] != "sentinel_password" || len(e.Context) != 1 {
				t.Errorf("%s: logged %v, want the option's name alone", tc.desc, e.ContextMap())
			}
		}
	}
}
