#!/usr/bin/env bash
# load.sh runs the load generator (go run ./load) against the stack that
# `make run` serves. When nothing answers on the service's port it starts a
# stack of its own first, with a throw-away data folder, and stops it after.
# Load requests are unpaid: against your own make run, start it with a
# large free allowance (AOV_FREE_PER_DAY=1000000000 make run), or the
# gateway answers 402 once the day's free calls are used.
#
#   scripts/load.sh                 # defaults: 8 connections, 10 s per target
#   scripts/load.sh -c 16 -d 20s    # options go to the load generator
#
# Environment: AOV_HTTP_PORT (8080), AOV_VERIFIERD_ADDR (127.0.0.1:8081), GO.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
GO="${GO:-go}"
port="${AOV_HTTP_PORT:-8080}"
verifierd="${AOV_VERIFIERD_ADDR:-127.0.0.1:8081}"
base="http://127.0.0.1:$port"

say() { printf '\033[1mload:\033[0m %s\n' "$*" >&2; }

# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if ! http_ok "$base/health"; then
	tmp="$(mktemp -d)"
	say "nothing answers on $base: starting a stack of its own (data in $tmp, log in $tmp/run.log)"
	# Every load request is an unpaid verification: give the throw-away
	# stack an allowance that does not run out.
	AOV_DATA="$tmp/data" AOV_FREE_PER_DAY=1000000000 setsid scripts/run.sh >"$tmp/run.log" 2>&1 &
	runpid=$!
	stop() {
		say "stopping the stack it started"
		kill -TERM "$runpid" 2>/dev/null || true
		wait "$runpid" 2>/dev/null || true
		rm -rf "$tmp"
	}
	trap stop EXIT
	trap 'exit 130' INT TERM
	# The first build of Caddy can take minutes.
	for _ in $(seq 1 1200); do
		http_ok "$base/health" && break
		kill -0 "$runpid" 2>/dev/null || { cat "$tmp/run.log" >&2; say "the stack did not start"; exit 1; }
		sleep 0.5
	done
	http_ok "$base/health" || { cat "$tmp/run.log" >&2; say "the stack did not come up"; exit 1; }
fi

"$GO" run ./load -via-caddy "$base" -direct "http://$verifierd" "$@"
