# shellcheck shell=bash
# Sourced by gpu-run.sh and multigpu-run.sh (and copied next to them by
# gpu-build.sh): steps_begin DIR sets them up, step NAME SECONDS CMD...
# runs CMD with a deadline, its output in $out/NAME.log, prints one PASS
# or FAIL line (a failure with the log's tail) and counts failures in
# $failed. GOEP_STEPS (an extended regular expression, unset: every step)
# picks the steps to run by name, so that a group too long for one device
# call can be split: a step whose name does not match prints SKIP. An
# invalid expression stops the script at once (exit 2); steps_end says
# when it picked no step at all, which fails the run.
if [ -n "${GOEP_STEPS:-}" ]; then
	[[ "" =~ ^(${GOEP_STEPS})$ ]]
	if [ $? = 2 ]; then
		echo "GOEP_STEPS=$GOEP_STEPS: not a valid extended regular expression" >&2
		exit 2
	fi
fi
ran=0 # steps run (not skipped)

# steps_begin DIR starts a run of steps: out (the logs' folder) is $OUT,
# the device tool's output folder, else DIR; no step has failed yet. The
# GPU hosts run as root, where Open MPI's mpirun must be allowed to, and
# every GPU run keeps NCCL off NVLink multicast.
steps_begin() {
	out=${OUT:-$1}
	mkdir -p "$out"
	failed=0
	export NCCL_NVLS_ENABLE=0
	export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
}

# wanted NAME: whether GOEP_STEPS picks step NAME.
wanted() { [ -z "${GOEP_STEPS:-}" ] || [[ $1 =~ ^(${GOEP_STEPS})$ ]]; }

# steps_end counts a run in which GOEP_STEPS picked no step as a failed
# step: a run that checked nothing must not read as a pass.
steps_end() {
	if [ "$ran" = 0 ] && [ -n "${GOEP_STEPS:-}" ]; then
		echo "FAIL GOEP_STEPS=$GOEP_STEPS picked none of the steps of the groups run"
		failed=$((failed + 1))
	fi
}

step() {
	local name=$1 secs=$2
	shift 2
	if ! wanted "$name"; then
		printf 'SKIP %-32s (GOEP_STEPS=%s)\n' "$name" "$GOEP_STEPS"
		return
	fi
	ran=$((ran + 1))
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

# sanitize_children NAME SECONDS CMD... is step for a test that spawns its
# ranks as processes (executor.test's multi-process tests): every child
# runs under compute-sanitizer's SANITIZER_TOOL (default memcheck;
# GOEP_MP_WRAP; the sanitizer's
# --target-processes all does not follow a Go program's children, whose
# exec bypasses the C library it hooks) and writes its own report,
# $out/NAME.PID.log. A child whose report has errors exits 99 and fails
# the test, and so the step; each report's summary line is printed.
sanitize_children() {
	local name=$1 secs=$2
	shift 2
	if ! wanted "$name"; then
		step "$name" "$secs" # prints the SKIP line
		return
	fi
	GOEP_TIMEOUT=${GOEP_SANITIZER_TIMEOUT:-120s} \
		GOEP_MP_WRAP="compute-sanitizer --tool ${SANITIZER_TOOL:-memcheck} --error-exitcode 99 --print-limit ${PRINT_LIMIT:-20} --show-backtrace device --log-file $out/$name.%p.log" \
		step "$name" "$secs" "$@"
	grep -H 'SUMMARY' "$out/$name".*.log || echo "    $name: no child's report (no child ran under the sanitizer)"
}
