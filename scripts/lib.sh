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
