#!/usr/bin/env bash
# run.sh builds and runs the whole service on this machine (what `make run`
# does): certd (signing keys, agent card), verifierd (verification service)
# and Caddy (the gateway, configured by Caddyfile.example), with every piece
# of state under one data folder. A process that dies is restarted with a
# backoff while the others keep serving; Ctrl-C (or SIGTERM) stops all three.
#
# Environment (all optional):
#   AOV_DATA              data folder                       (default ./data)
#   AOV_BIN               where the binaries are built      (default ./bin)
#   AOV_HTTP_PORT         Caddy's port                      (default 8080)
#   AOV_VERIFIERD_ADDR    verifierd's loopback address      (default 127.0.0.1:8081)
#   AOV_CERTD_PUBLIC_ADDR certd's agent-card listener       (default 127.0.0.1:8082)
#   AOV_ADMIN_ADDR        Caddy's admin API                 (default localhost:2019)
#   AOV_VERIFIERD_METRICS_ADDR verifierd's /metrics         (default 127.0.0.1:9091)
#   AOV_DEVNET_RPC_ADDR   the devnet chain's JSON-RPC       (default 127.0.0.1:8545)
#   AOV_SOLANA_RPC_ADDR   the local Solana chain's JSON-RPC (default 127.0.0.1:8899)
#   AOV_SOLANA            on: start the local Solana chain and offer it, when
#                         interop's npm peers are installed; off: neither
#                                                           (default on)
#   AOV_FREE_PER_DAY      free verification calls per client and day (default 100)
#   AOV_FREE_RATE         requests per client and minute to the free routes
#                         and unpriced MCP messages (default 600)
#   AOV_FACILITATOR_RATE  requests per client and minute to /facilitator/*
#                         (default 60)
#   AOV_GATE_RATE         unpaid answers (402s, refusals, free calls) per
#                         client and minute from the priced routes (default 120)
#   AOV_PAY_TO            address paid on the devnet        (default dev account 9)
#   AOV_FACILITATOR       devnet: the facilitator and the devnet run inside
#                         Caddy (default); remote: they run as a fourth
#                         supervised process (examples/facilitator/Caddyfile)
#                         that the gateway reaches over the x402 API
#   AOV_FACILITATOR_ADDR  that process's address             (default 127.0.0.1:8546)
#   AOV_FACILITATOR_ADMIN_ADDR that process's Caddy admin API (default localhost:2020)
#   AOV_SIGNER            inprocess: verifierd signs with certd's keys itself;
#                         certd: it asks certd over the socket (default inprocess)
#   GO                    go command                        (default go)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

GO="${GO:-go}"
export AOV_HTTP_PORT="${AOV_HTTP_PORT:-8080}"
export AOV_VERIFIERD_ADDR="${AOV_VERIFIERD_ADDR:-127.0.0.1:8081}"
export AOV_CERTD_PUBLIC_ADDR="${AOV_CERTD_PUBLIC_ADDR:-127.0.0.1:8082}"
export AOV_ADMIN_ADDR="${AOV_ADMIN_ADDR:-localhost:2019}"
AOV_VERIFIERD_METRICS_ADDR="${AOV_VERIFIERD_METRICS_ADDR:-127.0.0.1:9091}"
export AOV_DEVNET_RPC_ADDR="${AOV_DEVNET_RPC_ADDR:-127.0.0.1:8545}"
export AOV_SOLANA_RPC_ADDR="${AOV_SOLANA_RPC_ADDR:-127.0.0.1:8899}"
export AOV_FREE_PER_DAY="${AOV_FREE_PER_DAY:-100}"
data="${AOV_DATA:-$root/data}"
bindir="${AOV_BIN:-$root/bin}"
mkdir -p "$data"
chmod 700 "$data" # it holds the signing keys and the gateway token
data="$(cd "$data" && pwd)"
base="http://localhost:$AOV_HTTP_PORT"
# The devnet chain (inside Caddy) keeps its state here across restarts.
export AOV_DEVNET_DIR="$data/devnet"
export AOV_PUBLIC_BASE_URL="$base"

say() { printf '\033[1mrun:\033[0m %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# 0. Every address this run listens on must be free. A port already served
#    (another make run, most often) would answer this run's start-up checks
#    for it, and a Caddy (the gateway's, or the facilitator's with its
#    admin API) would join the port (SO_REUSEPORT), the kernel splitting
#    buyers, or `caddy reload`, between two stacks with different keys,
#    tokens, allowances and chains. Checked before anything is built or
#    started. listen_vars is the one list of them: every listener started
#    below takes its address from one of these variables.
export AOV_FACILITATOR="${AOV_FACILITATOR:-devnet}"
case "${AOV_SOLANA:=on}" in
on | off) ;;
*)
	printf 'AOV_SOLANA=%q: must be on or off\n' "$AOV_SOLANA" >&2
	exit 2
	;;
esac
[ "$AOV_SOLANA" = on ] && [ ! -d interop/node_modules/litesvm ] && AOV_SOLANA=off solana_missing=1
listen_vars=(AOV_HTTP_PORT AOV_VERIFIERD_ADDR AOV_CERTD_PUBLIC_ADDR AOV_ADMIN_ADDR AOV_VERIFIERD_METRICS_ADDR AOV_DEVNET_RPC_ADDR)
[ "$AOV_SOLANA" = on ] && listen_vars+=(AOV_SOLANA_RPC_ADDR)
if [ "$AOV_FACILITATOR" = remote ]; then
	export AOV_FACILITATOR_ADDR="${AOV_FACILITATOR_ADDR:-127.0.0.1:8546}"
	export AOV_FACILITATOR_ADMIN_ADDR="${AOV_FACILITATOR_ADMIN_ADDR:-localhost:2020}"
	listen_vars+=(AOV_FACILITATOR_ADDR AOV_FACILITATOR_ADMIN_ADDR)
fi
#    Two runs started together would both find every address free (nothing
#    listens before step 5), then both start their stacks on them and die.
#    So a run holds a lock (one per user and machine) from this check until
#    its stack answers or it stops: a run started meanwhile waits for it
#    (at most 10 minutes: a first build of Caddy takes a few), then checks
#    and finds its addresses in use. flock is util-linux's (Debian, Ubuntu,
#    Fedora have it); without it runs are not serialised.
#    The lock is in a directory only this user can write: $XDG_RUNTIME_DIR,
#    else aov-run-<uid> of $TMPDIR or /tmp, made mode 0700. A lock file
#    directly in a shared /tmp could be another user's symlink, which this
#    run (root, often, in a container) would follow and create a file
#    where it points, or another user's file, held to block every run. A
#    directory that is a symlink, someone else's, or writable by others is
#    refused.
run_lock_wait=600
if command -v flock >/dev/null 2>&1; then
	if [ -n "${XDG_RUNTIME_DIR:-}" ]; then
		run_lock_dir="$XDG_RUNTIME_DIR"
	else
		run_lock_dir="${TMPDIR:-/tmp}/aov-run-$(id -u)"
		[ -e "$run_lock_dir" ] || [ -L "$run_lock_dir" ] || mkdir -m 700 "$run_lock_dir" 2>/dev/null || true
	fi
	if [ -L "$run_lock_dir" ] || [ ! -d "$run_lock_dir" ] || [ ! -O "$run_lock_dir" ] ||
		[ -n "$(find "$run_lock_dir" -maxdepth 0 -perm /022 2>/dev/null)" ]; then
		die "the start-up lock's directory $run_lock_dir is not a directory of yours that only you can write (a symlink, another user's, or open to others); remove it, or set XDG_RUNTIME_DIR to such a directory"
	fi
	run_lock="$run_lock_dir/aov-run.lock"
	exec {run_lock_fd}>>"$run_lock"
	if ! flock -n "$run_lock_fd"; then
		say "another make run is starting (it holds $run_lock); waiting for it, at most $run_lock_wait s"
		flock -w "$run_lock_wait" "$run_lock_fd" ||
			die "another make run has been starting for $run_lock_wait s (it holds $run_lock); try again once it has started or stopped"
	fi
else
	say "flock is not installed: a make run started while this one starts is not refused"
fi
for v in "${listen_vars[@]}"; do
	addr="${!v}"
	[ "$v" = AOV_HTTP_PORT ] && addr="${AOV_BIND:-127.0.0.1}:$AOV_HTTP_PORT"
	if addr_answers "$addr"; then
		die "$v: $addr is already in use (another make run?); stop what listens there or set $v to a free one"
	fi
done

# 1. Build. cmd/caddy is Caddy plus this repository's modules, pinned by
#    go.sum, so this works offline once the module cache is filled. (For a
#    Caddy with extra third-party plugins, see xcaddy.sh.)
say "building caddy, certd, verifierd and aov into $bindir"
mkdir -p "$bindir"
# -buildvcs=auto stamps the module version or commit into verifier_version and
# the agent card's version, even where GOFLAGS says -buildvcs=false.
"$GO" build -buildvcs=auto -o "$bindir/" ./cmd/caddy ./certd ./verifierd ./cmd/aov

# 2. Data folder. Everything the service keeps lives here:
#      keys/            certd's Ed25519 keys and their history (0700)
#      certd/           certd's signing socket (0700; only verifierd uses it)
#      verifierd/       verifierd's Badger database (verification history)
#      caddy/           Caddy's own data and autosaved config (XDG dirs),
#                       with the gateway's Badger store (allowance, payment
#                       claims) in caddy/data/caddy/x402
#      devnet/          the devnet chain: blocks, balances, nonces
#      logs/            Caddy's access log
#      gateway-token    secret Caddy sends to verifierd (0600)
umask 077
mkdir -p "$data/keys" "$data/certd" "$data/verifierd" "$data/caddy/data" "$data/caddy/config" "$data/logs"
socket="$data/certd/sign.sock"

# 3. A development signing key, made once. Production keys are generated
#    and rotated by the operator (bin/certd rotate, bin/certd keys); -dev makes
#    certd create the first key when the directory has none.
certd_dev=()
if [ ! -s "$data/keys/index.json" ]; then
	say "no signing key in $data/keys yet: certd -dev will generate one (development only)"
	certd_dev=(-dev)
fi

# 4. The gateway token: the shared secret by which verifierd recognises
#    requests that came through Caddy. Made once, readable by this user only.
if [ ! -s "$data/gateway-token" ]; then
	say "generating $data/gateway-token"
	(umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$data/gateway-token")
fi
chmod 600 "$data/gateway-token"
# Caddy reads it at request time ({env.AOV_GATEWAY_TOKEN}), so it never shows
# in Caddy's loaded config.
AOV_GATEWAY_TOKEN="$(cat "$data/gateway-token")"
export AOV_GATEWAY_TOKEN

# 5. Start the three processes, supervised (scripts/lib.sh): each runs in
#    its own process group; one that exits on its own is restarted with a
#    backoff while the others keep serving (a request meanwhile is a 503,
#    never a hang). Stopping is explicit and ordered: Caddy first (no new
#    requests), then verifierd, then certd.
trap 'stop_all; exit 130' INT TERM
trap 'stop_all' EXIT

say "starting certd (agent card on $AOV_CERTD_PUBLIC_ADDR, signing socket $socket)"
supervise certd "$bindir/certd" serve "${certd_dev[@]}" \
	-keys "$data/keys" \
	-sign-socket "$socket" \
	-public-listen "$AOV_CERTD_PUBLIC_ADDR" \
	-public-base-url "$base"

# verifierd signs in its own process with the keys certd manages (certd
# still makes, rotates and publishes them): here both run as you, so the
# socket would isolate nothing, and the round trip to certd costs more CPU
# than the signature. AOV_SIGNER=certd asks certd over its socket, as an
# install with certd under its own user does.
case "${AOV_SIGNER:-inprocess}" in
inprocess) signer_args=(-signer-keys "$data/keys") ;;
certd) signer_args=(-signer-socket "$socket") ;;
*) die "AOV_SIGNER is ${AOV_SIGNER}: want inprocess or certd" ;;
esac
say "starting verifierd on $AOV_VERIFIERD_ADDR"
supervise verifierd "$bindir/verifierd" \
	-listen "$AOV_VERIFIERD_ADDR" \
	-admin-listen "$AOV_VERIFIERD_METRICS_ADDR" \
	-data "$data/verifierd" \
	"${signer_args[@]}" \
	-gateway-token-file "$data/gateway-token" \
	-public-base-url "$base"

# The local Solana chain (litesvm in Node, from interop/; in memory only:
# reset on every start). Its funded test wallets, keys included, are in
# $data/solana-chain.json. The chain writes them to a file of this run's
# own, moved into place only once the whole service answers (step 6): a
# run refused because another one uses this data folder (certd sees its
# live socket) must not touch the file the running stack's users read.
# Without the chain the priced routes offer no Solana payment
# (AOV_SOLANA=off, Caddyfile.example's solana_offer_off): nothing could
# settle one, and a buyer would sign it for nothing.
solana_new=""
solana_banner=""
export AOV_SOLANA
if [ "$AOV_SOLANA" = on ]; then
	solana_banner="    Solana RPC    http://$AOV_SOLANA_RPC_ADDR   (solana-devnet on litesvm; test wallets in $data/solana-chain.json)
"
	solana_new="$data/solana-chain.json.$$"
	trap 'stop_all; rm -f "$solana_new"' EXIT
	say "starting the local Solana chain on $AOV_SOLANA_RPC_ADDR (state is reset on restart)"
	supervise solana-chain env HOST="${AOV_SOLANA_RPC_ADDR%:*}" PORT="${AOV_SOLANA_RPC_ADDR##*:}" \
		bash -c 'exec node interop/solana-chain.mjs >"$0"' "$solana_new"
elif [ -n "${solana_missing:-}" ]; then
	say "interop/node_modules is missing (run: make interop-deps): no local Solana chain, so the priced routes offer devnet payments only"
else
	say "AOV_SOLANA=off: no local Solana chain, so the priced routes offer devnet payments only"
fi

# The facilitator as its own process (AOV_FACILITATOR=remote), with the
# devnet inside it. It starts before Caddy: the gateway reads its
# /supported when it loads its config.
if [ "$AOV_FACILITATOR" = remote ]; then
	mkdir -p "$data/facilitator/data" "$data/facilitator/config"
	say "starting the facilitator on $AOV_FACILITATOR_ADDR (devnet JSON-RPC on $AOV_DEVNET_RPC_ADDR, admin API on $AOV_FACILITATOR_ADMIN_ADDR)"
	supervise facilitator env XDG_DATA_HOME="$data/facilitator/data" XDG_CONFIG_HOME="$data/facilitator/config" \
		AOV_FACILITATOR_PORT="${AOV_FACILITATOR_ADDR##*:}" AOV_BIND="${AOV_FACILITATOR_ADDR%:*}" \
		"$bindir/caddy" run --config examples/facilitator/Caddyfile --adapter caddyfile
	for _ in $(seq 1 300); do
		http_ok "http://$AOV_FACILITATOR_ADDR/supported" && break
		sleep 0.2
	done
fi

say "starting caddy on $base"
supervise caddy env XDG_DATA_HOME="$data/caddy/data" XDG_CONFIG_HOME="$data/caddy/config" AOV_LOG_DIR="$data/logs" \
	"$bindir/caddy" run --config Caddyfile.example --adapter caddyfile

# 6. Wait until the whole chain answers through Caddy.
ok=0
for _ in $(seq 1 300); do
	for i in "${!sup_pids[@]}"; do
		kill -0 "${sup_pids[$i]}" 2>/dev/null || die "${sup_names[$i]} exited during start-up; see its output above"
	done
	# The chain writes its one line when it is ready.
	if http_ok "$base/health" && http_ok "$base/.well-known/agent-card.json" &&
		http_ok "$base/facilitator/supported" && { [ -z "$solana_new" ] || [ -s "$solana_new" ]; }; then
		ok=1
		break
	fi
	sleep 0.2
done
[ "$ok" = 1 ] || die "the service did not answer on $base/health within 60 s"
# This run owns the data folder now (its certd holds the socket).
[ -z "$solana_new" ] || mv -f "$solana_new" "$data/solana-chain.json"
# Every address answers now: a run started from here on is refused by the
# check, so the lock is let go.
if [ -n "${run_lock_fd:-}" ]; then
	flock -u "$run_lock_fd"
	exec {run_lock_fd}>&-
	run_lock_fd=""
fi

cat >&2 <<EOF

  aov is running.

    service       $base                     (POST /verify/schema, GET /reputation/{agent_id}, ...)
    health        $base/health
    API docs      $base/docs   ($base/llms.txt, $base/openapi.json)
    agent card    $base/.well-known/agent-card.json
    x402 manifest $base/.well-known/x402   (payments: USDC on the devnet; $AOV_FREE_PER_DAY free verification calls per client and day)
    facilitator   $base/facilitator/supported   (x402 facilitator on the devnet)
    devnet RPC    http://$AOV_DEVNET_RPC_ADDR   (chain id 1337, test USDC, "test test ... junk" accounts)
${solana_banner}    data          $data
    access log    $data/logs/access.log
    metrics       http://$AOV_VERIFIERD_METRICS_ADDR/metrics (verifierd), http://$AOV_ADMIN_ADDR/metrics (Caddy)

  Try the worked example (it fails: the line totals do not add up to the total):

    curl -s $base/verify/schema -H 'Content-Type: application/json' \\
      --data @scripts/examples/invoice-draft.json | jq '{result, summary, errors}'

  The corrected invoice passes; keep its receipt and check it offline:

    curl -s $base/verify/schema -H 'Content-Type: application/json' \\
      --data @scripts/examples/invoice-fixed.json >receipt.json
    ${bindir#"$root"/}/aov receipt verify --card $base/.well-known/agent-card.json receipt.json

  After $AOV_FREE_PER_DAY free calls a day, verification answers 402 with PAYMENT-REQUIRED:
  pay with any x402 v2 client from devnet accounts 1-9 (keys of the public
  "test test ... junk" mnemonic; they hold test USDC).

  Load: make load (with nothing running it starts its own stack; against this
  one, start it with AOV_FREE_PER_DAY=1000000000 AOV_GATE_RATE=1000000000).
  Stop: Ctrl-C.

EOF

# Stay until Ctrl-C or SIGTERM, restarting whichever process exits.
supervise_forever
