#!/usr/bin/env bash
# load.sh is `make load`: it runs the load generator (go run ./load) against
# the stack `make run` serves, next to a plain Caddy reverse_proxy to the
# same verifierd (load/baseline.Caddyfile: the gateway's site minus our
# modules, the baseline the gateway is compared with) and a pair of
# verifierds on empty throw-away histories, one of them with -no-sync (what
# synced history writes cost), and tells the generator the process ids of
# Caddy, verifierd, certd and the baselines so the report splits CPU time
# per request by process.
#
# When nothing answers on the service's port it starts a stack of its own
# first, with a throw-away data folder, and stops it after. Load requests
# are unpaid except in the paid scenarios (paid on the EVM devnet,
# paid-solana on the local Solana chain, whose wallet file
# $data/solana-chain.json it passes on): against your own make run, start it
# with a large free allowance and gate rate limit (AOV_FREE_PER_DAY=1000000000
# AOV_GATE_RATE=1000000000 make run), or the gateway answers 402 once the
# day's free calls are used, or 429 once they pass the rate limit.
#
#   scripts/load.sh                      # defaults: 8 and 32 connections, 5 s per phase
#   scripts/load.sh -c 16 -d 20s         # options go to the load generator
#   scripts/load.sh -scenarios free,baseline,direct
#   AOV_ALLOWANCE_FLUSH=off scripts/load.sh     # every allowance count synced
#                                        # (applies to the stack it starts)
#
# On a machine shared with other work, read the CPU per request columns
# (and the stack's sum) rather than req/s: they do not depend on what else
# runs.
#
# Environment: AOV_SIGNER (inprocess or certd, for a stack it starts, as in
# scripts/run.sh), AOV_FACILITATOR (remote: the facilitator and the devnet
# in a process of their own, the default for a stack it starts, so Caddy's
# CPU per paid call is the gateway's alone; devnet: inside Caddy, as make
# run's default), AOV_FACILITATOR_ADDR (127.0.0.1:8546), AOV_HTTP_PORT
# (8080), AOV_SOLANA_RPC_ADDR (127.0.0.1:8899, the local Solana chain of
# the paid-solana scenario; its wallets are read from
# $AOV_DATA/solana-chain.json), AOV_VERIFIERD_ADDR (127.0.0.1:8081), AOV_CERTD_PUBLIC_ADDR
# (127.0.0.1:8082), AOV_BASELINE_PORT (8090), AOV_DURABLE_VERIFIERD_ADDR and
# AOV_NOSYNC_VERIFIERD_ADDR (127.0.0.1:8091 and 8092, the durability pair),
# AOV_DATA (./data, for the gateway token), AOV_BIN (./bin), AOV_ADMIN_ADDR
# (localhost:2019, to read the allowance mode), AOV_ALLOWANCE_FLUSH (100ms; off for durable counts), GO.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
GO="${GO:-go}"
port="${AOV_HTTP_PORT:-8080}"
verifierd="${AOV_VERIFIERD_ADDR:-127.0.0.1:8081}"
certd="${AOV_CERTD_PUBLIC_ADDR:-127.0.0.1:8082}"
baseline_port="${AOV_BASELINE_PORT:-8090}"
durable="${AOV_DURABLE_VERIFIERD_ADDR:-127.0.0.1:8091}"
nosync="${AOV_NOSYNC_VERIFIERD_ADDR:-127.0.0.1:8092}"
facilitator="${AOV_FACILITATOR_ADDR:-127.0.0.1:8546}"
facilitator_mode="${AOV_FACILITATOR:-remote}"
solana="${AOV_SOLANA_RPC_ADDR:-127.0.0.1:8899}"
bindir="${AOV_BIN:-$root/bin}"
data="${AOV_DATA:-$root/data}"
base="http://127.0.0.1:$port"

say() { printf '\033[1mload:\033[0m %s\n' "$*" >&2; }

# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

tmp="$(mktemp -d)"
runpid=""
basepid=""
pairpids=""
stop() {
	for pid in $basepid $pairpids; do
		kill -TERM "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	if [ -n "$runpid" ]; then
		say "stopping the stack it started"
		kill -TERM "$runpid" 2>/dev/null || true
		wait "$runpid" 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap stop EXIT
trap 'exit 130' INT TERM

if ! http_ok "$base/health"; then
	say "nothing answers on $base: starting a stack of its own (data in $tmp/data, log in $tmp/run.log; verifierd signs ${AOV_SIGNER:-inprocess}, AOV_SIGNER=certd|inprocess; the facilitator runs ${facilitator_mode}, AOV_FACILITATOR=remote|devnet)"
	data="$tmp/data"
	# Every free-path load request is an unpaid verification: give the
	# throw-away stack an allowance that does not run out, and a rate limit
	# its free calls do not reach (each counts against it). The facilitator
	# (and the devnet) run in a process of their own unless asked
	# otherwise, so Caddy's CPU per paid call is the gateway's alone. The
	# facilitator scenario sends all its requests from one client.
	AOV_DATA="$data" AOV_BIN="$bindir" AOV_FREE_PER_DAY=1000000000 AOV_GATE_RATE=1000000000 AOV_FACILITATOR="$facilitator_mode" \
		setsid scripts/run.sh >"$tmp/run.log" 2>&1 &
	runpid=$!
	# The first build of Caddy can take minutes.
	for _ in $(seq 1 1200); do
		http_ok "$base/health" && break
		kill -0 "$runpid" 2>/dev/null || { cat "$tmp/run.log" >&2; say "the stack did not start"; exit 1; }
		sleep 0.5
	done
	http_ok "$base/health" || { cat "$tmp/run.log" >&2; say "the stack did not come up"; exit 1; }
fi

# The baseline: the same Caddy binary serving load/baseline.Caddyfile, the
# gateway's site without our modules (same timeouts, access log and upstream
# deadlines), its access log in the throw-away folder.
[ -x "$bindir/caddy" ] || "$GO" build -o "$bindir/" ./cmd/caddy
mkdir -p "$tmp/caddy" "$tmp/baseline-logs"
AOV_GATEWAY_TOKEN="$(cat "$data/gateway-token" 2>/dev/null || true)" XDG_DATA_HOME="$tmp/caddy" XDG_CONFIG_HOME="$tmp/caddy" \
	AOV_BASELINE_PORT="$baseline_port" AOV_VERIFIERD_ADDR="$verifierd" AOV_LOG_DIR="$tmp/baseline-logs" \
	"$bindir/caddy" run --config load/baseline.Caddyfile --adapter caddyfile >"$tmp/baseline.log" 2>&1 &
basepid=$!
for _ in $(seq 1 100); do
	http_ok "http://127.0.0.1:$baseline_port/health" && break
	kill -0 "$basepid" 2>/dev/null || { cat "$tmp/baseline.log" >&2; say "the baseline Caddy did not start"; exit 1; }
	sleep 0.1
done

# The durability pair: two verifierds like the stack's (same binary and
# signing keys, in process or through certd's socket as AOV_SIGNER says),
# each on an empty history in the throw-away folder, the second with
# -no-sync. The durable scenario's rate as a share of nosync's is what the
# fsync per group of history writes costs, with nothing else different
# (the stack's own verifierd has the history of the scenarios before it,
# and whatever make run kept). Skipped, with the reason, when the stack's
# keys are not where make run keeps them.
case "${AOV_SIGNER:-inprocess}" in
certd) signer_args=(-signer-socket "$data/certd/sign.sock") ;;
*) signer_args=(-signer-keys "$data/keys") ;;
esac
pair=()
if [ -d "$data/keys" ] || [ -S "$data/certd/sign.sock" ]; then
	[ -x "$bindir/verifierd" ] || "$GO" build -o "$bindir/" ./verifierd
	for v in "durable=$durable" "nosync=$nosync"; do
		name="${v%%=*}" addr="${v#*=}"
		flags=()
		[ "$name" = nosync ] && flags=(-no-sync)
		mkdir -p "$tmp/$name"
		"$bindir/verifierd" -listen "$addr" -admin-listen "" -data "$tmp/$name" "${flags[@]}" "${signer_args[@]}" \
			-public-base-url "$base" >"$tmp/$name.log" 2>&1 &
		pairpids="$pairpids $!"
		for _ in $(seq 1 100); do
			http_ok "http://$addr/health" && break
			kill -0 "$!" 2>/dev/null || break
			sleep 0.1
		done
		if http_ok "http://$addr/health"; then
			pair+=(-"$name" "http://$addr")
		else
			cat "$tmp/$name.log" >&2
			say "the $name verifierd did not start on $addr: the $name scenario is skipped"
		fi
	done
else
	say "no signing keys in $data/keys (AOV_DATA): the durable and nosync scenarios are skipped"
fi

# listener_pid PORT: the process listening on a local TCP port; nothing
# (and success: set -o pipefail would otherwise end the script without a
# word) when none listens, as the facilitator's port with make run's default.
listener_pid() { { ss -Htlnp "sport = :$1" 2>/dev/null | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2; } || true; }
pids=()
for p in "caddy=$port" "verifierd=${verifierd##*:}" "certd=${certd##*:}" "baseline=$baseline_port" "verifierd-durable=${durable##*:}" "verifierd-nosync=${nosync##*:}" "solana-chain=${solana##*:}"; do
	pid="$(listener_pid "${p#*=}")"
	if [ -n "$pid" ]; then
		pids+=(-pid "${p%%=*}=$pid")
	else
		say "no process found listening on port ${p#*=} (${p%%=*}): its CPU column stays empty"
	fi
done
# A facilitator in its own process (AOV_FACILITATOR=remote) gets a column of
# its own; without one it runs inside the gateway's Caddy.
pid="$(listener_pid "${facilitator##*:}")"
if [ -n "$pid" ] && [ "$pid" != "$(listener_pid "$port")" ]; then
	pids+=(-pid "facilitator=$pid")
	say "facilitator: its own process on $facilitator (pid $pid)"
else
	say "facilitator: inside the gateway's Caddy (its settlement is part of Caddy's CPU per paid call)"
fi

# The free allowance's mode, read from the gateway's loaded config (the
# admin API) so the report names what was measured, not what was asked for.
mode=""
if command -v curl >/dev/null 2>&1; then
	flush="$(curl -fs --max-time 5 "http://${AOV_ADMIN_ADDR:-localhost:2019}/config/" 2>/dev/null | grep -o '"allowance_flush":[0-9]*' | head -1 | cut -d: -f2 || true)"
	if [ -n "$flush" ]; then
		mode="batched, allowance_flush $((flush / 1000000))ms"
	elif curl -fs -o /dev/null --max-time 5 "http://${AOV_ADMIN_ADDR:-localhost:2019}/config/"; then
		mode="durable, every count synced before its answer"
	fi
fi
if [ -z "$mode" ] && [ -n "$runpid" ]; then
	case "${AOV_ALLOWANCE_FLUSH:-100ms}" in
	off) mode="durable, every count synced before its answer" ;;
	*) mode="batched, allowance_flush ${AOV_ALLOWANCE_FLUSH}" ;;
	esac
fi
say "free allowance: ${mode:-unknown (no admin API)}"

say "machine: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg) before the run"
"$GO" run ./load -gateway "$base" -baseline "http://127.0.0.1:$baseline_port" -direct "http://$verifierd" "${pair[@]}" -allowance-mode "${mode:-unknown}" \
	-solana-chain "$data/solana-chain.json" "${pids[@]}" "$@"
say "load average $(cut -d' ' -f1-3 /proc/loadavg) after the run"
