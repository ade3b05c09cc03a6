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

import "go.uber.org/zap"

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
