// Package secretopt warns about a secret written into a Caddy config.
//
// Caddy keeps the loaded config as JSON and hands it out: `caddy adapt`
// prints it, the admin API's GET /config/ serves it, and persist_config
// saves it to autosave.json. Like Caddy's own modules (a DNS provider's
// api_token, for one), the gateway's accept a secret written inline, but
// only a placeholder Caddy expands when the module is provisioned,
// {env.NAME} or {file.PATH} (the file's contents), keeps the secret out of
// that JSON. The Caddyfile's {$NAME} does not: it is expanded when the
// Caddyfile is adapted, so its value is in the JSON like a literal.
package secretopt

import (
	"strings"

	"go.uber.org/zap"
)

// WarnIfLiteral logs a warning naming option when its configured value
// raw is a literal secret: not empty, and left as it was by the global
// replacer (expanded, what the module uses, is raw itself: it holds no
// {env.*}, {file.*} or other known placeholder). The value itself is never
// logged. Every secret option of the gateway's modules goes through it,
// so they warn alike.
func WarnIfLiteral(log *zap.Logger, option, raw, expanded string) {
	if raw == "" || raw != expanded || log == nil {
		return
	}
	log.Warn("a secret is written in the config as it is: the loaded JSON config keeps it, and `caddy adapt`, the admin API's GET /config/ and autosave.json show it; give it as {env.NAME} or {file.PATH} instead",
		zap.String("option", option))
}

// WarnIfURLCredentials is WarnIfLiteral for the credentials a URL option
// carries in its userinfo (https://user:key@host/, redis://:password@host,
// user:password@host:port): a chain endpoint's API key, a verifier's or a
// Redis server's password is as much in the loaded JSON as a secret
// option's value. It warns when raw has userinfo that the replacer left
// as it was; a URL given whole as a placeholder, or whose userinfo holds
// one, is not warned about. Neither the URL nor its userinfo is logged.
func WarnIfURLCredentials(log *zap.Logger, option, raw, expanded string) {
	WarnIfLiteral(log, option+" (its user:password)", userinfo(raw), userinfo(expanded))
}

// userinfo is what precedes the last "@" of u's authority (after any
// "scheme://", before the path, query or fragment), "" without one. Read
// by hand, not by url.Parse, which refuses a userinfo holding a
// placeholder's braces and a scheme-less host:port.
func userinfo(u string) string {
	if _, rest, ok := strings.Cut(u, "://"); ok {
		u = rest
	}
	if i := strings.IndexAny(u, "/?#"); i >= 0 {
		u = u[:i]
	}
	if i := strings.LastIndexByte(u, '@'); i >= 0 {
		return u[:i]
	}
	return ""
}

// Scrub returns err with every copy of the credentials of the URL u taken
// out of its message, for an error a library made while using u (a URL
// parse error repeats the whole URL; net/http masks a password but not a
// key given as the user name). Its message is then safe to log and to
// return from Provision.
func Scrub(err error, u string) error {
	info := userinfo(u)
	if err == nil || info == "" || !strings.Contains(err.Error(), info) {
		return err
	}
	return scrubbed{err, strings.ReplaceAll(err.Error(), info, "xxxxx")}
}

// scrubbed is an error whose message had credentials taken out; it still
// unwraps to the original, for errors.Is.
type scrubbed struct {
	err error
	msg string
}

func (s scrubbed) Error() string { return s.msg }
func (s scrubbed) Unwrap() error { return s.err }
