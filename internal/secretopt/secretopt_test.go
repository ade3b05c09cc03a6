package secretopt

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
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

// TestWarnIfURLCredentials: a URL option whose userinfo is written as it
// is (https://user:key@host/, redis://:password@host) is warned about by
// option name, never with the URL or the credentials; a URL without
// userinfo, or whose userinfo (or whole value) is a placeholder, is not.
func TestWarnIfURLCredentials(t *testing.T) {
	for _, tc := range []struct {
		desc, raw, expanded string
		warn                bool
	}{
		{"user and key", "https://user:s3cret@rpc.example.com/v1", "https://user:s3cret@rpc.example.com/v1", true},
		{"a key as the user", "wss://s3cret@rpc.example.com", "wss://s3cret@rpc.example.com", true},
		{"a redis password", "redis://:s3cret@10.0.0.1:6379/0", "redis://:s3cret@10.0.0.1:6379/0", true},
		{"no scheme", "user:s3cret@10.0.0.1:6379", "user:s3cret@10.0.0.1:6379", true},
		{"an @ in the path is no userinfo", "https://rpc.example.com/a@b?c=d@e", "https://rpc.example.com/a@b?c=d@e", false},
		{"an @ in the query is no userinfo", "https://rpc.example.com?x=a@b", "https://rpc.example.com?x=a@b", false},
		{"no userinfo", "https://rpc.example.com/v1", "https://rpc.example.com/v1", false},
		{"a host and port", "10.0.0.1:6379", "10.0.0.1:6379", false},
		{"the whole URL a placeholder", "{env.RPC_URL}", "https://user:s3cret@rpc.example.com", false},
		{"the key a placeholder", "https://user:{env.RPC_KEY}@rpc.example.com", "https://user:s3cret@rpc.example.com", false},
		{"not set", "", "", false},
	} {
		core, logs := observer.New(zapcore.WarnLevel)
		WarnIfURLCredentials(zap.New(core), "rpc_url", tc.raw, tc.expanded)
		if got := logs.Len() == 1; got != tc.warn {
			t.Errorf("%s: warned %v, want %v", tc.desc, got, tc.warn)
			continue
		}
		for _, e := range logs.All() {
			if e.ContextMap()["option"] != "rpc_url (its user:password)" || len(e.Context) != 1 || strings.Contains(e.Message, "s3cret") {
				t.Errorf("%s: logged %q %v, want the option's name alone", tc.desc, e.Message, e.ContextMap())
			}
		}
	}
}

// A library's error that repeats a URL with credentials (url.Parse's does,
// whole) loses them, and still unwraps to the original.
func TestScrub(t *testing.T) {
	const raw = "https://user:s3cr^t@rpc.example/v1"
	_, perr := url.Parse(raw)
	err := Scrub(fmt.Errorf("dialing: %w", perr), raw)
	if strings.Contains(err.Error(), "s3cr") || !strings.Contains(err.Error(), "xxxxx@rpc.example") || !errors.Is(err, perr) {
		t.Fatalf("%v", err)
	}
	if plain := errors.New("refused"); Scrub(plain, raw) != plain || Scrub(perr, "https://rpc.example/") != perr {
		t.Fatal("an error without the credentials, or a URL without any, changed")
	}
}
