#!/usr/bin/env bash
# Builds, on a machine without a GPU, every binary that the GPU checks
# (scripts/gpu-run.sh) run on a GPU host, into .gpu/ (git-ignored):
#
#	.gpu/internal-cuda.test  go test -c -tags cuda      ./internal/cuda
#	.gpu/device.test         go test -c -tags cuda      ./device
#	.gpu/permute.test        go test -c -tags cuda      ./permute
#	.gpu/executor.test       go test -c -tags cuda      ./executor
#	.gpu/executor-ucx.test   go test -c -tags cuda,ucx  ./executor
#	.gpu/gpu.test            go test -c -tags cuda      ./executor/internal/gpu
#	.gpu/bench.test          go test -c -tags cuda      ./internal/bench
#	.gpu/eprun               go build   -tags cuda,ucx  ./cmd/eprun
#	.gpu/gpu-run.sh          a copy of scripts/gpu-run.sh (one GPU)
#	.gpu/multigpu-run.sh     a copy of scripts/multigpu-run.sh (several GPUs)
#	.gpu/steps.sh            a copy of scripts/steps.sh, which both source
#
# Symbols are stripped (-s -w) so that the folder fits the device tool's
# 64 MiB carry limit. The GPU host needs no Go: it runs the binaries (CUDA driver, Open MPI
# and UCX libraries of the same sonames as here). Needs what
# scripts/cuda-check.sh installs (CUDA 11.8 headers, the stub libcuda.so)
# and libucx-dev. Then, on the GPU host, from the repository root:
#
#	bash .gpu/gpu-run.sh [GROUP...]      (one GPU)
#	bash .gpu/multigpu-run.sh [GPUS]     (several GPUs)
set -euo pipefail
cd "$(dirname "$0")/.."

export PATH="/usr/local/go/bin:$PATH"
stubs=/usr/lib/x86_64-linux-gnu/stubs
export CGO_LDFLAGS="-L$stubs ${CGO_LDFLAGS:-}"

log() { printf '== %s\n' "$*" >&2; }

# quiet drops the warnings that go-nvml's cgo preamble prints on every
# build of a package that succeeded (a failed build prints everything).
quiet() { grep -v -e 'warning:' -e 'nvml' -e '^#' -e 'note:' -e '^\s*|' -e '^\s*[0-9]* |' || true; }

mkdir -p .gpu
build() {
	local out=$1 tags=$2 pkg=$3
	log "$out ($tags) $pkg"
	if ! go test -c -tags "$tags" -ldflags='-s -w' -o ".gpu/$out" "$pkg" >/tmp/gpu-build.$$ 2>&1; then
		cat /tmp/gpu-build.$$ >&2
		echo "scripts/gpu-build.sh: building .gpu/$out failed" >&2
		exit 1
	fi
	quiet </tmp/gpu-build.$$
}
rm -f .gpu/*.test .gpu/eprun
build internal-cuda.test cuda ./internal/cuda
build device.test cuda ./device
build permute.test cuda ./permute
build executor.test cuda ./executor
build executor-ucx.test cuda,ucx ./executor
build gpu.test cuda ./executor/internal/gpu
build bench.test cuda ./internal/bench
log "eprun (cuda,ucx)"
if ! go build -buildvcs=true -tags cuda,ucx -ldflags='-s -w' -o .gpu/eprun ./cmd/eprun >/tmp/gpu-build.$$ 2>&1; then
	cat /tmp/gpu-build.$$ >&2
	echo "scripts/gpu-build.sh: building .gpu/eprun failed" >&2
	exit 1
fi
quiet </tmp/gpu-build.$$
rm -f /tmp/gpu-build.$$
cp scripts/gpu-run.sh scripts/multigpu-run.sh scripts/steps.sh .gpu/
du -sh .gpu >&2
log "built; run them on a GPU host with: bash .gpu/gpu-run.sh [GROUP...]"
