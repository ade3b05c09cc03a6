#!/usr/bin/env bash
# Runs every FuzzXxx target of the module for a fixed number of inputs
# (FUZZTIME, default 2000x: a count, not a duration, so the run does not
# depend on the machine's speed) over its checked-in corpus plus new inputs.
#
# A real finding fails at once, with the input written under
# testdata/fuzz/. Go's fuzzer can also stop with "context deadline exceeded"
# when a worker is slow to wind down (no input is at fault, none is
# written); such a run is tried once more before it counts as a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
fuzztime="${FUZZTIME:-2000x}"
go="${GO:-go}"

for pkg in $($go list ./...); do
	dir=$($go list -f '{{.Dir}}' "$pkg")
	for f in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/func //'); do
		echo "fuzz $pkg $f"
		for try in 1 2; do
			out=$($go test -run '^$' -fuzz "^$f\$" -fuzztime "$fuzztime" "$pkg" 2>&1)
			status=$?
			echo "$out" | tail -n 4
			[ $status -eq 0 ] && break
			if [ $try -eq 1 ] && grep -q 'context deadline exceeded' <<<"$out" && ! grep -q 'Failing input written' <<<"$out"; then
				echo "fuzz $pkg $f: the fuzzer stopped on a deadline with no failing input; trying once more"
				continue
			fi
			echo "$out"
			exit 1
		done
	done
done
