#!/usr/bin/env bash
# Compile-and-vet check of the cuda build (DESIGN.md section 5, CI), on a
# machine without a GPU.
#
# As root on Debian 12 it installs CUDA's headers, the stub libcuda.so and
# nvcc from Debian's contrib/non-free components (CUDA 11.8), then runs
#
#	go vet   -tags cuda ./...  (and -tags cuda,ucx)
#	go build -tags cuda ./...
#	go test  -tags cuda -count=1 ./internal/cuda/... ./device ./permute ./nvlink
#	go test  -tags cuda -short ./executor/...
#	go test -c -tags cuda ./internal/cuda ./device ./permute ./executor ./executor/internal/gpu   (the binaries a GPU host runs)
#
# and checks that the PTX files match their CUDA sources (go generate runs
# nvcc again; the PTX must not change): internal/cuda/testdata/kernels.ptx
# permute/kernels/permute.ptx, nvlink/kernels/flags.ptx,
# executor/internal/gpu/kernels/ep.ptx and
# executor/internal/gpu/kernels/layout.ptx at least; and that ptxas places
# the one-launch kernels (executor/internal/gpu/kernels/onelaunch.ptx) for
# sm_90 without spills.
#
# The tests skip, with the reason, when cuInit fails or no GPU is present.
# Linking uses the driver stub (libcuda.so in Debian's stubs directory); on a
# GPU host the loader finds the real libcuda.so.1 at run time.
#
# Every step is idempotent: a machine that already has nvcc and cuda.h skips
# apt entirely. Set GOEP_CUDA_SKIP_APT=1 to never touch apt. Before it
# changes apt's sources or installs anything it prints what it will do
# (about 5 GB of packages); on a terminal it then waits 10 s, so Ctrl-C
# stops it first. It never asks (CI runs it unattended).
#
#   scripts/cuda-check.sh --plan   print what it would install, one line
#                                  each (nothing when nothing), and exit
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '== %s\n' "$*" >&2; }

plan_only=
case "${1:-}" in
--plan) plan_only=1 ;;
"") ;;
*)
	echo "usage: scripts/cuda-check.sh [--plan]" >&2
	exit 2
	;;
esac

export PATH="/usr/local/go/bin:$PATH"

have_cuda() {
	command -v nvcc >/dev/null && [ -e /usr/include/cuda.h ] &&
		dpkg -s nvidia-cuda-dev >/dev/null 2>&1
}

# apt_sources sets src, pat and first: Debian's apt source file, the awk
# pattern of its lines that name components, and their first component
# field: the deb822 file (Debian 12's default), else a one-line-style
# sources.list.
apt_sources() {
	if [ -f /etc/apt/sources.list.d/debian.sources ]; then
		src=/etc/apt/sources.list.d/debian.sources pat='^Components:' first=2
	elif [ -f /etc/apt/sources.list ]; then
		src=/etc/apt/sources.list pat='^deb(-src)? ' first=4
	else
		echo "scripts/cuda-check.sh: no Debian apt sources found" >&2
		exit 1
	fi
}

# with_components FILE PATTERN FIRST prints FILE with contrib and non-free
# appended, where missing, to the lines that match PATTERN (an awk regex),
# whose components start at field FIRST.
with_components() {
	awk -v pat="$2" -v first="$3" '
		$0 ~ pat {
			have_c = 0; have_n = 0
			for (i = first; i <= NF; i++) {
				if ($i == "contrib") have_c = 1
				if ($i == "non-free") have_n = 1
			}
			if (!have_c) $0 = $0 " contrib"
			if (!have_n) $0 = $0 " non-free"
		}
		{ print }
	' "$1"
}

# enable_contrib_nonfree adds contrib and non-free where missing; the file
# is rewritten only if it changes.
enable_contrib_nonfree() {
	with_components "$src" "$pat" "$first" >"$src.goep-tmp"
	if cmp -s "$src" "$src.goep-tmp"; then
		rm -f "$src.goep-tmp"
	else
		mv "$src.goep-tmp" "$src"
		log "enabled contrib non-free in $src"
	fi
}

cuda_packages="nvidia-cuda-dev nvidia-cuda-toolkit"
if ! have_cuda && [ "${GOEP_CUDA_SKIP_APT:-0}" != 1 ]; then
	# What it will do, before it does it: one line each, on stdout for
	# --plan (scripts/test.sh lists them with its own), else logged.
	plan=()
	apt_sources
	if ! with_components "$src" "$pat" "$first" | cmp -s "$src" -; then
		plan+=("add the contrib and non-free components to $src (apt's sources; Debian's CUDA packages live there)")
	fi
	plan+=("apt-get install $cuda_packages (Debian's CUDA 11.8 toolkit: nvcc, headers, the driver stub; about 5 GB with their dependencies)")
	if [ -n "$plan_only" ]; then
		printf 'CUDA check: %s\n' "${plan[@]}"
		exit 0
	fi
	log "scripts/cuda-check.sh will (GOEP_CUDA_SKIP_APT=1 never touches apt):"
	for p in "${plan[@]}"; do
		log "  - $p"
	done
	if [ "$(id -u)" != 0 ]; then
		echo "scripts/cuda-check.sh: need root to install the CUDA toolkit with apt-get" >&2
		exit 1
	fi
	if [ -z "${GOEP_INSTALL_PLAN_SHOWN:-}" ] && [ -t 0 ] && [ -t 2 ]; then
		log "starting in 10 s (Ctrl-C stops it)"
		sleep 10
	fi
	start=$SECONDS
	enable_contrib_nonfree
	log "apt-get update"
	apt-get update -qq
	log "apt-get install $cuda_packages"
	# shellcheck disable=SC2086 # the package list splits on purpose
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $cuda_packages >/dev/null
	log "CUDA toolkit installed in $((SECONDS - start)) s"
fi
[ -z "$plan_only" ] || exit 0
command -v gcc >/dev/null || { echo "scripts/cuda-check.sh: cgo needs gcc" >&2; exit 1; }

# The driver stub: Debian's nvidia-cuda-dev ships libcuda.so under a stubs
# directory (not on the linker's default path, so that it is never loaded
# instead of the real driver). internal/cuda names the usual places in its
# #cgo LDFLAGS; CGO_LDFLAGS adds the one dpkg reports, in case it moved.
stub=$(dpkg -L nvidia-cuda-dev 2>/dev/null | grep -E '/stubs/libcuda\.so$' | head -1 || true)
if [ -z "$stub" ]; then
	stub=$(find /usr/lib /usr/local/cuda* -path '*stubs/libcuda.so' 2>/dev/null | head -1 || true)
fi
if [ -z "$stub" ]; then
	echo "scripts/cuda-check.sh: libcuda.so stub not found (dpkg -L nvidia-cuda-dev)" >&2
	exit 1
fi
export CGO_LDFLAGS="${CGO_LDFLAGS:-} -L$(dirname "$stub")"
export CGO_ENABLED=1
log "$(nvcc --version | tail -1); stub $stub"
log "$(go version)"

log "go vet -tags cuda ./..."
go vet -tags cuda ./...
# The CUDA and UCX parts together (the GPU tests across emulated domains,
# the eprun binary the GPU host runs).
log "go vet -tags cuda,ucx ./..."
go vet -tags cuda,ucx ./...

log "go build -tags cuda ./..."
go build -tags cuda ./...

log "go test -tags cuda ./internal/cuda/... ./device ./permute ./nvlink"
go test -tags cuda -count=1 ./internal/cuda/... ./device ./permute ./nvlink
# The executor's tests with the CUDA data path compiled in (the host
# backend's; the GPU ones skip without -gpu).
log "go test -tags cuda -short ./executor/..."
go test -tags cuda -short -count=1 ./executor/...

log "go test -c -tags cuda ./internal/cuda ./device ./permute ./executor ./executor/internal/gpu"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go test -c -tags cuda -o "$tmp/cuda.test" ./internal/cuda
go test -c -tags cuda -o "$tmp/device.test" ./device
go test -c -tags cuda -o "$tmp/permute.test" ./permute
go test -c -tags cuda -o "$tmp/executor.test" ./executor
go test -c -tags cuda -o "$tmp/gpu.test" ./executor/internal/gpu

# Generated PTX: regenerate every file (go generate runs nvcc through the
# directives that mention it) and compare with what was there before.
log "PTX matches its CUDA source (go generate, diff)"
mapfile -t ptx < <(find . -name '*.ptx' -not -path './.git/*' -not -path './.gpu/*' | sort)
for want in ./internal/cuda/testdata/kernels.ptx ./permute/kernels/permute.ptx ./nvlink/kernels/flags.ptx \
	./executor/internal/gpu/kernels/ep.ptx ./executor/internal/gpu/kernels/layout.ptx; do
	if ! printf '%s\n' "${ptx[@]}" | grep -qxF "$want"; then
		echo "scripts/cuda-check.sh: $want is missing (run go generate)" >&2
		exit 1
	fi
done
for f in "${ptx[@]}"; do
	mkdir -p "$tmp/before/$(dirname "$f")" && cp "$f" "$tmp/before/$f"
done
go generate -run ptxgen ./...
stale=0
for f in "${ptx[@]}"; do
	if ! diff -u "$tmp/before/$f" "$f" >"$tmp/diff"; then
		head -40 "$tmp/diff" >&2
		echo "scripts/cuda-check.sh: $f was stale (regenerated now: review and commit it)" >&2
		stale=1
	fi
done
[ "$stale" = 0 ] || exit 1

# The one-launch kernels' register budget (executor/internal/gpu/kernels/
# onelaunch.cu, GOEP_ONE_LAUNCH_BOUNDS): one block of 512 threads an SM
# leaves them 128 registers a thread, and a kernel that spills its loads
# in flight to local memory loses what its pipelining buys. ptxas must
# place both for sm_90 without a spill (the driver's JIT compiles the PTX
# on the GPU host and may differ; Nsight Compute shows what it chose).
log "one-launch kernels without spills (ptxas -arch=sm_90 -v)"
ptxas -arch=sm_90 -v -o "$tmp/onelaunch.cubin" executor/internal/gpu/kernels/onelaunch.ptx 2>"$tmp/ptxas.log"
if ! awk '
	/Compiling entry function/ { fn = $7; gsub(/\047/, "", fn) }
	/bytes spill stores/ && fn != "" {
		if ($5 != 0 || $9 != 0) { printf "%s: %s bytes spill stores, %s bytes spill loads\n", fn, $5, $9; bad = 1 }
		seen[fn] = 1
	}
	END { if (!seen["goep_ep_dispatch"] || !seen["goep_ep_combine"]) { print "ptxas -v did not report both one-launch kernels"; bad = 1 }; exit bad }
' "$tmp/ptxas.log" >&2; then
	cat "$tmp/ptxas.log" >&2
	echo "scripts/cuda-check.sh: a one-launch kernel spills registers (see above)" >&2
	exit 1
fi
grep -E "Compiling entry|Used [0-9]+ registers" "$tmp/ptxas.log" | sed 's/^ptxas info *: /  /' >&2

log "cuda check passed"
