#!/usr/bin/env bash
# The multi-GPU checks and benchmarks, on a host with G >= 2 GPUs (one process per
# GPU), over the binaries of scripts/gpu-build.sh in .gpu/ (no Go needed):
#
#	bash .gpu/multigpu-run.sh [G [GROUP...]]
#
# G is the number of GPUs (default, or "all": every GPU nvidia-smi lists).
# The groups (default: all five, in this order; a device call of at most
# 10 minutes may need them split):
#
#	1. property: the CUDA property tests with each process on its own GPU (1,
#	   2, 4 and 8 processes that fit), and 2G processes, two on each GPU, when
#	   at most 8; spawned, and by mpirun from 4; every output bit for bit
#	   against the host backend
#	2. memcheck: compute-sanitizer memcheck of the 2-process world (a
#	   GPU each) and of 4 processes on 2 GPUs
#	3. bench: eprun bench on the DeepSeek-V3 decode (128 tokens) and prefill
#	   (4096 tokens) shapes at EP = G: every call, the fused calls and the
#	   chained pair, bf16, blocking and capacity mode, under eprun launch
#	   and under mpirun; and TestCUDABenchmark, G processes on G GPUs:
#	   every call launched from the host (eager) and as a CUDA graph (no
#	   host gaps), beside a device-to-device copy
#	4. nccl: the NCCL baseline (scripts/a2a_baseline.py: all_to_all_single plus a
#	   permute) at the same shapes, with its D2D copy and the GPU 0 -> 1
#	   peer copy (the NVLink ceiling), in the same run
#	5. report: scripts/multigpu_report.py: every goep row against the peer copy and
#	   NCCL, and the bandwidth and latency targets, as text and Markdown
#
# Each step's output goes to $OUT/<step>.log and its JSON to $OUT
# ($OUT: the device tool's output folder, else ./multigpu-out); stdout gets
# one PASS/FAIL line per step; GOEP_STEPS=REGEX runs only the steps whose
# names match (scripts/steps.sh). NCCL_NVLS_ENABLE=0, NVSHMEM_DISABLE_NVLS=1
# and TORCH_SYMM_MEM_DISABLE_MULTICAST=1 are set (no NVLink multicast).
set -uo pipefail
here=$(dirname "$0")
# shellcheck source=scripts/steps.sh
source "$here/steps.sh"
cd "$here/.." || exit 2

steps_begin multigpu-out
export NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export GOEP_TIMEOUT=${GOEP_TIMEOUT:-30s}
bin=.gpu
gpus=${1:-all}
[ "$gpus" = all ] && gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
shift || true
groups=${*:-property memcheck bench nccl report}
for g in $groups; do
	case $g in
	property | memcheck | bench | nccl | report) ;;
	*)
		echo "multigpu-run.sh: unknown group $g (want property, memcheck, bench, nccl or report)" >&2
		exit 2
		;;
	esac
done
# want GROUP says whether GROUP was asked for.
want() { [[ " $groups " == *" $1 "* ]]; }
if ! [ "$gpus" -ge 2 ] 2>/dev/null; then
	echo "multigpu-run.sh: need at least 2 GPUs (got ${gpus:-none}); on one GPU use gpu-run.sh" >&2
	exit 2
fi


nvidia-smi topo -m >"$out/topo.txt" 2>&1
cat "$out/topo.txt"
nvidia-smi -L | head -n 16
echo "# $gpus GPUs, one process each"

want property && step property 900 $bin/executor.test -gpu -gpu.spread "$gpus" -test.run 'TestCUDAMultiProcess' -test.v
# A Do of one GPU inside another's (internal/cuda).
want property && step driver-2gpu 60 $bin/internal-cuda.test -gpu -test.run 'TestDoOtherDevice' -test.v
# Every rank under the sanitizer, with its own report (sanitize_children).
want memcheck && sanitize_children memcheck-2gpu 900 \
	$bin/executor.test -gpu -gpu.spread 2 -test.run 'TestCUDAMultiProcess/ranks=(2|4)/spawn' -test.v

calls=dispatch,combine,dispatch-permute,unpermute-combine,dispatch-combine
want bench && step bench-eager-graph 600 $bin/executor.test -gpu -gpu.bench -gpu.spread "$gpus" -test.run 'TestCUDABenchmark' -test.v
want bench && for shape in decode prefill; do
	step "eprun-$shape-launch" 600 $bin/eprun launch -n "$gpus" -- $bin/eprun bench "deepseek-v3-$shape" \
		--backend cuda --mode blocking,capacity --calls $calls --json "$out/eprun-$shape-launch.json"
	# eprun is built without the mpi tag: under mpirun its ranks meet over
	# TCP (rank and local rank from Open MPI, the address from -x).
	step "eprun-$shape-mpirun" 600 mpirun --allow-run-as-root --oversubscribe -n "$gpus" \
		-x GOEP_MASTER_ADDR=127.0.0.1 -x GOEP_MASTER_PORT=29517 \
		$bin/eprun bench "deepseek-v3-$shape" --backend cuda --mode blocking,capacity --calls $calls \
		--json "$out/eprun-$shape-mpirun.json"
done
want nccl && step nccl-a2a 900 $bin/eprun launch -n "$gpus" -- python3 scripts/a2a_baseline.py \
	--tokens 128,4096 --hidden 7168 --experts 256 --topk 8 --dtype bf16 --json "$out/nccl-a2a.json"

# The report: goep against the peer copy and NCCL.
if want report && wanted report; then
	step report 60 python3 scripts/multigpu_report.py "$out"/eprun-*.json --nccl "$out/nccl-a2a.json"
	cat "$out/report.log"
	python3 scripts/multigpu_report.py "$out"/eprun-*.json --nccl "$out/nccl-a2a.json" --markdown >"$out/report.md" 2>&1
fi
steps_end
echo "# $failed step(s) failed; logs and JSON in $out"
exit $failed
