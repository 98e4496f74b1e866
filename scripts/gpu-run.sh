#!/usr/bin/env bash
# Runs the GPU checks on a GPU host, over the binaries that
# scripts/gpu-build.sh built into .gpu/ (no Go needed there). From the
# repository root:
#
#	bash .gpu/gpu-run.sh [GROUP...]     (default: tests memcheck bench experiments)
#
# Groups:
#
#	tests     eprun topo (GPUs, NVLink, UCX devices), every -gpu test: internal/cuda, device, permute, internal/bench,
#	          executor (TestCUDA*: 1, 2, 4 processes, graphs, faults,
#	          lifetime poisoning, interop, several domains in-process,
#	          GPU-fed and host-staged rail) and executor over UCX
#	          (TestCUDADomainsProcesses on shared memory and TCP;
#	          TestCUDADomainsFaults; TestCUDAFaultMatrix: hang, die, slow
#	          and reject in 1, 2 and 4 domains)
#	memcheck  compute-sanitizer memcheck of the executor's one-domain and
#	          several-domain worlds as processes (every rank checked),
#	          graph, lifetime-poison, one-rank layout and interop tests and of
#	          the permute tests, racecheck of the permute tests
#	memcheck-ranks  (not in the default) memcheck of the same worlds as
#	          goroutine ranks in one process: often inconclusive (GPU wait
#	          timeouts under the sanitizer's serialization; see there)
#	bench     permute vs device copy, TestCUDABenchmark (4 goroutine
#	          ranks), layout times on the GPU and the host
#	          (TestCUDALayoutKernels), eprun bench on the DeepSeek-V3 decode
#	          and prefill shapes, with 2 domains of 2 (GPU-fed and
#	          host-staged rail) and a sweep of the tuning knobs
#	experiments  standalone CUDA experiments compiled there with the
#	          host's nvcc (scripts/experiments: permute shapes, bulk TMA
#	          copies among them, which Debian's nvcc 11.8 cannot build;
#	          top-8, then top-4, 2 and 1)
#	profile   (not in the default) Nsight Compute's DRAM and L2 counters
#	          of one launch of each diagnostic kernel of the permute
#	          experiment (after experiments, which builds it), clocks
#	          left alone (--clock-control none), caches not flushed
#	          (--cache-control none: the staged variant's L2 contents)
#
# Each step's whole output goes to $OUT/<step>.log ($OUT: the device
# tool's output folder, else ./gpu-out); stdout gets one line per step
# (PASS or FAIL, seconds) and the tail of a failing step's log. The exit
# status is the number of failed steps (0: all passed). GOEP_TIMEOUT is 20 s
# unless set. GOEP_STEPS='memcheck-(graph|interop)|.*permute' (a regular
# expression matched against whole step names) runs only those steps of
# the groups named: a group longer than one 10-minute device call is run
# in parts.
set -uo pipefail
here=$(dirname "$0")
# shellcheck source=scripts/steps.sh
source "$here/steps.sh"
cd "$here/.." || exit 2

steps_begin gpu-out
export GOEP_TIMEOUT=${GOEP_TIMEOUT:-20s}
bin=.gpu


# sanitize NAME SECONDS TOOL CMD... is step under compute-sanitizer; a
# report with errors fails the step even when the test passed.
sanitize() {
	local name=$1 secs=$2 tool=$3
	shift 3
	# The sanitizer slows kernels (and so the ranks' waits) many times.
	# shellcheck disable=SC2086 # SANITIZER_FLAGS holds several flags
	GOEP_TIMEOUT=${GOEP_SANITIZER_TIMEOUT:-120s} step "$name" "$secs" compute-sanitizer --tool "$tool" --error-exitcode 99 --print-limit "${PRINT_LIMIT:-20}" \
		--show-backtrace device ${SANITIZER_FLAGS:-} "$@"
}

# sanitize_ranks NAME SECONDS CMD... is sanitize with memcheck for tests
# of goroutine ranks sharing the GPU in one process. The sanitizer
# serializes kernels, so a rank's wait kernel can hold the GPU while the
# peer it waits for cannot run: the wait times out (GOEP_TIMEOUT, 30 s
# here, so that such a run ends well within the step's deadline), the
# test fails naming the rank, and memcheck has found nothing. Such a run
# says nothing either way, so it runs again, up to 3 times in all; a
# report with errors, or any other failure, fails the step at once.
sanitize_ranks() {
	local name=$1 secs=$2 attempt before
	shift 2
	for attempt in 1 2 3; do
		before=$failed
		GOEP_SANITIZER_TIMEOUT=30s sanitize "$name" "$secs" memcheck "$@"
		[ "$failed" = "$before" ] && return
		if [ $attempt -lt 3 ] && grep -q 'timed out waiting for rank' "$out/$name.log" &&
			grep -q 'ERROR SUMMARY: 0 errors' "$out/$name.log"; then
			failed=$before
			cp "$out/$name.log" "$out/$name.attempt$attempt.log"
			echo "    (attempt $attempt: GPU wait timeouts under the sanitizer's serialization, 0 memcheck errors; again)"
			continue
		fi
		return
	done
}

tests() {
	# What the host offers (NVML, UCX's transports: RDMA devices, CUDA
	# support), for the notes.
	step topo 60 $bin/eprun topo
	step internal-cuda 120 $bin/internal-cuda.test -gpu -test.v
	step device 120 $bin/device.test -gpu -test.v
	step permute 180 $bin/permute.test -gpu -test.v
	step bench 180 $bin/bench.test -gpu -test.run CUDA -test.v
	step executor-domains 120 $bin/executor.test -gpu -test.run 'TestCUDADomains$' -test.v
	# The rail's dispatch rows staged through a download of x (the path
	# before the GPU-fed rail).
	step executor-domains-staging 120 env GOEP_RAIL_HOST_STAGING=1 $bin/executor.test -gpu -test.run 'TestCUDADomains$' -test.v
	step executor-cuda 420 $bin/executor.test -gpu -test.run 'TestCUDA' -test.skip 'TestCUDA(Benchmark|Domains)' -test.v
	# The kernel sequences that the one-launch Dispatch and Combine
	# replace in one domain, kept for comparisons: still the host's bits.
	step executor-multi-kernel 240 env GOEP_GPU_MULTI_KERNEL=1 $bin/executor.test -gpu -test.run 'TestCUDA(MultiProcess|Graph|Faults)$' -test.v
	# The GPU layout kernels against the host layout (the GPU data path's
	# own package).
	step gpu-layout 300 $bin/gpu.test -gpu -test.v
	step executor-ucx-shm 180 $bin/executor-ucx.test -gpu -test.run 'TestCUDADomainsProcesses/shm=true' -test.v
	# A rejected combine reported across domains by GPU-written rail headers.
	step executor-ucx-faults 180 $bin/executor-ucx.test -gpu -test.run 'TestCUDADomainsFaults' -test.v
	# Every rank's error class, names and time under a hang, a death, a
	# slow rank and a rejection, in one domain and across domains.
	step executor-ucx-fault-matrix 400 $bin/executor-ucx.test -gpu -test.run 'TestCUDAFaultMatrix' -test.v
	# The GPU host's UCX has no atomics over TCP in its v2 protocols.
	step executor-ucx-tcp 180 env UCX_PROTO_ENABLE=n $bin/executor-ucx.test -gpu -test.run 'TestCUDADomainsProcesses/shm=false' -test.v
}

memcheck() {
	# One domain of 2 and 4 processes sharing the GPU (the GPU layout,
	# IPC-mapped windows), every child checked.
	sanitize_children memcheck-multiprocess 300 \
		$bin/executor.test -gpu -test.run 'TestCUDAMultiProcess/ranks=(2|4)/spawn' -test.v
	# The one-launch kernels' shared memory (the received rows' offsets by
	# source, the peers heard from) under racecheck, every child checked.
	SANITIZER_TOOL=racecheck sanitize_children racecheck-multiprocess 300 \
		$bin/executor.test -gpu -test.run 'TestCUDAMultiProcess/ranks=(2|4)/spawn' -test.v
	# Several domains as processes (UCX over shared memory), every child
	# checked. GOEP_LOG_LEVEL=debug: every engine logs its domain's window
	# addresses ("GPU windows"), to read a report's addresses against.
	GOEP_LOG_LEVEL=debug sanitize_children memcheck-domains-processes 300 \
		$bin/executor-ucx.test -gpu -test.run 'TestCUDADomainsProcesses/shm=true' -test.v
	# Graphs: the pipeline's GPU worlds (1 and 2 ranks) are spawned
	# processes, every child checked. The lifetime poisoning (calls queued
	# behind a long kernel, their handle, inputs and intermediates dropped,
	# garbage collected, fresh pinned and device memory scribbled over: the
	# queued results must be unchanged) and the GPU layout of one rank run
	# in the test process itself.
	sanitize_children memcheck-graph 300 $bin/executor.test -gpu -test.run 'TestCUDAGraph' -test.v
	# GPU windows as VMM allocations shared by file descriptor, in one
	# domain and in one domain across two emulated hosts (no host
	# exchange), every child checked.
	sanitize_children memcheck-share-vmm 300 $bin/executor.test -gpu -test.run 'TestCUDA(ShareKinds|FabricDomain)/fd' -test.v
	sanitize memcheck-lifetime 300 memcheck $bin/executor.test -gpu -test.run 'TestCUDALifetimePoison' -test.v
	sanitize memcheck-layout 300 memcheck $bin/gpu.test -gpu -test.run 'TestCUDALayoutKernels/R=1/' -test.v
	# TestCUDAInterop hands the engine a host address on purpose: the
	# refusal under test is cuPointerGetAttribute's CUDA_ERROR_INVALID_VALUE,
	# which memcheck would report as an API error.
	SANITIZER_FLAGS="--report-api-errors no" sanitize memcheck-interop 300 memcheck $bin/executor.test -gpu -test.run 'TestCUDAInterop' -test.v
	sanitize memcheck-permute 300 memcheck $bin/permute.test -gpu -test.v
	sanitize racecheck-permute 300 racecheck $bin/permute.test -gpu -test.v
}

# memcheck-ranks (not in the default) is memcheck of the worlds of
# goroutine ranks sharing the GPU in one process: each rank's windows are
# then the same process's allocations and its aliases of the peers' (the
# path where a rank that closes early must not free memory a peer still
# writes into). The sanitizer serializes a process's kernels, so one
# rank's spinning wait kernel can hold the GPU while the peer's signal it
# waits for queues behind it: such a run ends in GPU wait timeouts
# (GOEP_TIMEOUT 30 s here) or runs into the step's deadline, and says
# nothing either way (often so: docs/results/gpu-checks.md; sanitize_ranks
# runs it again, up to 3 times). -test.timeout
# makes a run that hangs print every goroutine's stack before the step's
# deadline. The default group's process worlds check the same kernels
# reliably, each process under its own sanitizer.
memcheck-ranks() {
	local level=${GOEP_LOG_LEVEL-}
	export GOEP_LOG_LEVEL=debug
	sanitize_ranks memcheck-one-domain 300 $bin/executor.test -gpu -test.run 'TestCUDADomains$/D=4' -test.timeout 240s -test.v
	sanitize_ranks memcheck-domains 300 $bin/executor.test -gpu -test.run 'TestCUDADomains$/D=(2|1)' -test.timeout 240s -test.v
	# Seed 4 alone (rank 1 has no tokens), every error printed: the world
	# that exposed goep_ep_signal writing into a timed-out peer's freed
	# flags.
	PRINT_LIMIT=0 sanitize_ranks memcheck-domains-seed4 300 $bin/executor.test -gpu -mp.seed=4 \
		-test.run 'TestCUDADomains$/D=2' -test.timeout 240s -test.v
	if [ -n "$level" ]; then export GOEP_LOG_LEVEL=$level; else unset GOEP_LOG_LEVEL; fi
	sanitize_ranks memcheck-layout-ranks 300 $bin/gpu.test -gpu -test.run 'TestCUDALayoutKernels/R=(3|4)/' -test.timeout 240s -test.v
}

bench() {
	step bench-permute 300 $bin/permute.test -gpu -test.run '^$' -test.bench CUDA -test.benchtime 50x -test.v
	step bench-executor 300 $bin/executor.test -gpu -gpu.bench -test.run 'TestCUDABenchmark/goroutines' -test.v
	step bench-layout 300 $bin/gpu.test -gpu -gpu.bench -test.run 'TestCUDALayoutKernels' -test.v
	step eprun-decode 300 $bin/eprun bench deepseek-v3-decode --backend cuda --ranks 4 -q --json "$out/decode.json"
	step eprun-prefill 300 $bin/eprun bench deepseek-v3-prefill --backend cuda --ranks 4 -q --json "$out/prefill.json"
	# Two domains of 2 ranks: the GPU-fed rail, then host staging (its
	# baseline in the same run).
	step eprun-domains 300 $bin/eprun bench deepseek-v3-decode --backend cuda --ranks 4 --ranks-per-domain 2 -q --json "$out/domains.json"
	step eprun-domains-staging 300 env GOEP_RAIL_HOST_STAGING=1 $bin/eprun bench deepseek-v3-decode --backend cuda --ranks 4 --ranks-per-domain 2 -q \
		--json "$out/domains-staging.json"
	step eprun-knobs 300 $bin/eprun bench deepseek-v3-decode --backend cuda --ranks 4 -q \
		--sms 0,8,32 --chunk-rows 0,4 --json "$out/knobs.json"
}

experiments() {
	step build-permute-tma 180 nvcc -O3 -std=c++17 -arch=sm_90 -o "$out/permute_tma" scripts/experiments/permute_tma.cu
	step permute-tma 120 "$out/permute_tma"
	# Fewer slots a token (more reads per write): the shapes a rank's
	# permute sees after a dispatch.
	local k
	for k in 4 2 1; do
		step "permute-tma-topk$k" 120 "$out/permute_tma" 4096 7168 "$k" 64
	done
}

profile() {
	# NAME SKIP KERNEL: the launch after SKIP launches of KERNEL (each
	# variant runs 35: 5 warm-up, 30 timed; see permute_tma.cu's table
	# for which variant launches which kernel, in order).
	local metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum
	metrics+=,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_write.sum
	metrics+=,lts__t_sector_op_read_hit_rate.pct,sm__warps_active.avg.pct_of_peak_sustained_active
	local launch name skip kernel
	for launch in "kcopy 5 kcopy" "kset 5 kset" "fanconst 5 fan" "fanl2 40 fan" "seqfan 5 scatter" \
		"scatter 40 scatter" "exact 5 exact" "usum 5 usum" "uread 40 usum" \
		"staged-scatter 5 hint"; do
		read -r name skip kernel <<<"$launch"
		step "ncu-$name" 120 ncu --clock-control none --cache-control none --kernel-name-base function -k "regex:^$kernel\$" \
			-s "$skip" -c 1 --metrics "$metrics" "$out/permute_tma"
	done
}

groups=("$@")
[ ${#groups[@]} = 0 ] && groups=(tests memcheck bench experiments)
nvidia-smi -L 2>&1 | head -n 8
for g in "${groups[@]}"; do
	case $g in
	tests | memcheck | memcheck-ranks | bench | experiments | profile) echo "# $g"; "$g" ;;
	*) echo "gpu-run.sh: unknown group $g (want tests, memcheck, memcheck-ranks, bench, experiments or profile)" >&2; exit 2 ;;
	esac
done
steps_end
echo "# $failed step(s) failed; logs in $out"
exit $failed
