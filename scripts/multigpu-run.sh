#!/usr/bin/env bash
# The multi-GPU runs of issue 7, on a host with G >= 2 GPUs (one process per
# GPU), over the binaries of scripts/gpu-build.sh in .gpu/ (no Go needed):
#
#	bash .gpu/multigpu-run.sh [G]     (default: every GPU nvidia-smi lists)
#
#	1. the CUDA property tests with each process on its own GPU (1, 2, 4
#	   and 8 processes that fit; spawned, and by mpirun from 4), every output
#	   bit for bit against the host backend
#	2. compute-sanitizer memcheck of the 2-GPU world
#	3. eprun bench on the DeepSeek-V3 decode (128 tokens) and prefill
#	   (4096 tokens) shapes at EP = G: every call, the fused calls and the
#	   chained pair, bf16, blocking and capacity mode, under eprun launch
#	   and under mpirun
#	4. the NCCL baseline (scripts/a2a_baseline.py: all_to_all_single plus a
#	   permute) at the same shapes, with its D2D copy and the GPU 0 -> 1
#	   peer copy (the NVLink ceiling), in the same session
#	5. scripts/multigpu_report.py: every goep row against the peer copy and
#	   NCCL, and issue 7's goals, as text and Markdown
#
# Each step's output goes to $OUT/<step>.log and its JSON to $OUT
# ($OUT: the device tool's output folder, else ./multigpu-out); stdout gets
# one PASS/FAIL line per step. NCCL_NVLS_ENABLE=0, NVSHMEM_DISABLE_NVLS=1
# and TORCH_SYMM_MEM_DISABLE_MULTICAST=1 are set (no NVLink multicast).
set -uo pipefail
here=$(dirname "$0")
# shellcheck source=scripts/steps.sh
source "$here/steps.sh"
cd "$here/.." || exit 2

out=${OUT:-multigpu-out}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export GOEP_TIMEOUT=${GOEP_TIMEOUT:-30s}
bin=.gpu
gpus=${1:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')}
if ! [ "$gpus" -ge 2 ] 2>/dev/null; then
	echo "multigpu-run.sh: need at least 2 GPUs (got ${gpus:-none}); on one GPU use gpu-run.sh" >&2
	exit 2
fi
failed=0


nvidia-smi topo -m >"$out/topo.txt" 2>&1
nvidia-smi -L | head -n 16
echo "# $gpus GPUs, one process each"

step property 900 $bin/executor.test -gpu -gpu.spread "$gpus" -test.run 'TestCUDAMultiProcess' -test.v
GOEP_TIMEOUT=120s step memcheck-2gpu 900 compute-sanitizer --tool memcheck --target-processes all --error-exitcode 99 --print-limit 20 \
	$bin/executor.test -gpu -gpu.spread 2 -test.run 'TestCUDAMultiProcess/ranks=2/spawn' -test.v

calls=dispatch,combine,dispatch-permute,unpermute-combine,dispatch-combine
for shape in decode prefill; do
	step "eprun-$shape-launch" 600 $bin/eprun launch -n "$gpus" -- $bin/eprun bench "deepseek-v3-$shape" \
		--backend cuda --mode blocking,capacity --calls $calls --json "$out/eprun-$shape-launch.json"
	# eprun is built without the mpi tag: under mpirun its ranks meet over
	# TCP (rank and local rank from Open MPI, the address from -x).
	step "eprun-$shape-mpirun" 600 mpirun --allow-run-as-root --oversubscribe -n "$gpus" \
		-x GOEP_MASTER_ADDR=127.0.0.1 -x GOEP_MASTER_PORT=29517 \
		$bin/eprun bench "deepseek-v3-$shape" --backend cuda --mode blocking,capacity --calls $calls \
		--json "$out/eprun-$shape-mpirun.json"
done
step nccl-a2a 900 $bin/eprun launch -n "$gpus" -- python3 scripts/a2a_baseline.py \
	--tokens 128,4096 --hidden 7168 --experts 256 --topk 8 --dtype bf16 --json "$out/nccl-a2a.json"

# Issue 7's table: goep against the peer copy and NCCL.
step report 60 python3 scripts/multigpu_report.py "$out"/eprun-*.json --nccl "$out/nccl-a2a.json"
cat "$out/report.log"
python3 scripts/multigpu_report.py "$out"/eprun-*.json --nccl "$out/nccl-a2a.json" --markdown >"$out/report.md" 2>&1
echo "# $failed step(s) failed; logs and JSON in $out"
exit $failed
