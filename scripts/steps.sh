# shellcheck shell=bash disable=SC2154 # out and failed are the caller's
# Sourced by gpu-run.sh and multigpu-run.sh (and copied next to them by
# gpu-build.sh): step NAME SECONDS CMD... runs CMD with a deadline, its
# output in $out/NAME.log, prints one PASS or FAIL line (a failure with the
# log's tail) and counts failures in $failed. The caller sets out and
# failed.
step() {
	local name=$1 secs=$2
	shift 2
	local start=$SECONDS
	timeout --kill-after=10 "$secs" "$@" >"$out/$name.log" 2>&1
	local rc=$?
	local took=$((SECONDS - start))
	if [ $rc = 0 ]; then
		printf 'PASS %-32s %4ds\n' "$name" "$took"
	else
		failed=$((failed + 1))
		[ $rc = 124 ] && echo "(timed out after ${secs}s)" >>"$out/$name.log"
		printf 'FAIL %-32s %4ds  rc=%d  log: %s/%s.log\n' "$name" "$took" "$rc" "$out" "$name"
		tail -n 25 "$out/$name.log" | sed 's/^/    /'
	fi
}
