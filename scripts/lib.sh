# Shared by scripts/run.sh and scripts/load.sh (sourced, not run).

# http_ok URL: true when a GET of URL (http://127.0.0.1 or localhost) answers
# 200. Uses curl when installed, else bash's /dev/tcp, so nothing beyond
# bash is required.
http_ok() {
	if command -v curl >/dev/null 2>&1; then
		curl -fs -o /dev/null --max-time 5 "$1"
		return
	fi
	local rest="${1#http://}" hostport path status
	hostport="${rest%%/*}"
	path="/${rest#*/}"
	[ "$rest" = "$hostport" ] && path=/
	local host="${hostport%:*}" port="${hostport##*:}"
	[ "$host" = localhost ] && host=127.0.0.1
	exec 3<>"/dev/tcp/$host/$port" 2>/dev/null || return 1
	printf 'GET %s HTTP/1.0\r\nHost: %s\r\nConnection: close\r\n\r\n' "$path" "$hostport" >&3
	read -r -t 5 _ status _ <&3 || status=""
	exec 3<&- 3>&-
	[ "$status" = 200 ]
}

# addr_answers HOST:PORT: true when something accepts a TCP connection on
# HOST:PORT (localhost and the any-address are asked on 127.0.0.1). A
# connection, not a trial bind: Caddy listens with SO_REUSEPORT, so a
# second Caddy binds a port the first one serves, and the kernel then
# splits the clients between the two.
addr_answers() {
	local host="${1%:*}" port="${1##*:}"
	host="${host#[}"
	host="${host%]}"
	case "$host" in '' | localhost | 0.0.0.0 | ::) host=127.0.0.1 ;; esac
	(exec 3<>"/dev/tcp/$host/$port") 2>/dev/null
}

# seconds NAME DEFAULT MIN prints the environment variable NAME (DEFAULT
# when unset) as whole seconds, or fails with a message naming it and the
# form it wants. Every number of seconds the scripts read goes through it,
# and each is checked below, when the script sources this file, before
# anything starts: in bash arithmetic a value with a unit ("2m", "30s") is
# an error or 0, found only when it is used: in stop_all an immediate
# SIGKILL of a gateway still finishing its paid calls, in
# supervise_forever the end of the supervision loop (and so of the whole
# service) the first time a daemon dies.
seconds() {
	local name="$1" g="${!1:-$2}" min="$3"
	case "$g" in
	'' | *[!0-9]* | ???????*) g=-1 ;;
	*) g=$((10#$g)) ;; # a leading zero is not octal
	esac
	if ((g < min || g > 86400)); then
		printf '%s=%q: must be a whole number of seconds, from %d to 86400 (for example %d for two minutes)\n' "$name" "${!1}" "$min" 120 >&2
		return 1
	fi
	echo "$g"
}
stop_grace() { seconds AOV_STOP_GRACE 120 0; }
stop_grace >/dev/null || exit 2
seconds AOV_RESTART_MAX_BACKOFF 30 1 >/dev/null || exit 2
seconds AOV_RESTART_RESET 30 0 >/dev/null || exit 2

# Supervision, for run.sh: `supervise NAME CMD...` starts CMD in a process
# group of its own and remembers how to start it again; `supervise_forever`
# restarts any supervised process that exits on its own, after a backoff
# (1 s, doubling up to AOV_RESTART_MAX_BACKOFF seconds, default 30; back to 1 s
# once a process has run AOV_RESTART_RESET seconds, default 30; whole seconds
# only, as every variable read by `seconds`), with a line in the
# log each time, while the others keep running; `stop_all` stops them in
# reverse order of start (each gets SIGTERM and AOV_STOP_GRACE seconds,
# default 120, whole seconds only (stop_grace), then SIGKILL). The grace covers the longest paid call the
# gateway may be finishing: verify (30 s) + upstream_timeout (30 s by
# default, 15 s in Caddyfile.example) + settlement (30 s), with a margin. A
# gateway killed mid-settlement loses nothing (the payment's record is
# written before settling, and resolved from the chain after the restart),
# but its buyer waits for that resolution instead of getting the answer. The
# caller defines `say` and traps INT, TERM and EXIT to stop_all.
sup_names=()    # NAME of each supervised process, in start order
sup_cmds=()     # its command, shell-quoted, for restarts
sup_pids=()     # its current pid (= its process group)
sup_started=()  # $SECONDS at its last start
sup_backoff=()  # seconds to wait before its next restart
sup_due=()      # $SECONDS when it is due to restart; "" while it runs
sup_restarts=() # how many times it was restarted
sup_stopping=0

sup_spawn() {
	local i="$1"
	# A process started never holds run.sh's start-up lock (run_lock_fd):
	# one left running by a killed run.sh would keep later runs waiting.
	eval "setsid ${sup_cmds[$i]} ${run_lock_fd:+$run_lock_fd>&-} &"
	sup_pids[i]=$!
	sup_started[i]=$SECONDS
	say "${sup_names[$i]} started (pid ${sup_pids[$i]})"
}

supervise() {
	local name="$1" i="${#sup_names[@]}"
	shift
	sup_names[i]="$name"
	sup_cmds[i]="$(printf '%q ' "$@")"
	sup_backoff[i]=1
	sup_due[i]=""
	sup_restarts[i]=0
	sup_spawn "$i"
}

supervise_forever() {
	local i status ran max reset
	max="$(seconds AOV_RESTART_MAX_BACKOFF 30 1)" || return # refused at start
	reset="$(seconds AOV_RESTART_RESET 30 0)" || return
	while [ "$sup_stopping" = 0 ]; do
		for i in "${!sup_names[@]}"; do
			if [ -z "${sup_due[$i]}" ]; then
				kill -0 "${sup_pids[$i]}" 2>/dev/null && continue
				status=0
				wait "${sup_pids[$i]}" 2>/dev/null || status=$?
				ran=$((SECONDS - sup_started[i]))
				[ "$ran" -ge "$reset" ] && sup_backoff[i]=1
				sup_due[i]=$((SECONDS + sup_backoff[i]))
				say "${sup_names[$i]} exited (status $status) after $ran s; restarting it in ${sup_backoff[$i]} s, the others keep serving"
				sup_backoff[i]=$((sup_backoff[i] * 2 > max ? max : sup_backoff[i] * 2))
			elif [ "$SECONDS" -ge "${sup_due[$i]}" ]; then
				sup_restarts[i]=$((sup_restarts[i] + 1))
				say "restarting ${sup_names[$i]} (restart ${sup_restarts[$i]})"
				sup_due[i]=""
				sup_spawn "$i"
			fi
		done
		sleep 0.5
	done
}

stop_all() {
	[ "$sup_stopping" = 1 ] && return
	sup_stopping=1
	trap '' INT TERM
	say "stopping"
	local i grace
	grace="$(stop_grace)" || grace=120 # refused at start; never reached
	for ((i = ${#sup_pids[@]} - 1; i >= 0; i--)); do
		kill -TERM -- "-${sup_pids[$i]}" 2>/dev/null || true
		kill -CONT -- "-${sup_pids[$i]}" 2>/dev/null || true # a stopped one must see it
		# Give each its grace period, then insist.
		for _ in $(seq 1 $((grace * 10))); do
			kill -0 "${sup_pids[$i]}" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL -- "-${sup_pids[$i]}" 2>/dev/null || true
		wait "${sup_pids[$i]}" 2>/dev/null || true
		say "${sup_names[$i]} stopped"
	done
}
