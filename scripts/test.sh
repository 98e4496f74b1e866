#!/usr/bin/env bash
# The project's test command (README "Quick start"; .ci/run runs it).
#
# On a fresh Debian 12 machine, as root, it installs what the tests need,
# then runs go vet and go test over the whole module, the mpi-tagged tests
# under mpirun (Open MPI), the ucx-tagged tests (UCX), and go test -race.
# Before it changes anything it prints what it will install: Debian
# packages, a Go toolchain (go.mod's version, into the module cache, for
# its own run), for the CUDA check contrib and non-free in apt's sources
# and Debian's CUDA toolkit (about 5 GB), and CUDA 12.4's headers and nvcc
# from Debian trixie, extracted into a cache folder (scripts/cuda12.sh,
# about 1 GB; nothing installed into the system), and Debian 12's arm64
# libraries for the arm64 cgo builds, the same way
# (scripts/arm64-sysroot.sh, about 30 MB). It never asks (CI runs
# it unattended); on a terminal it waits 10 s after the list, so Ctrl-C
# stops it before anything is installed.
#
#   ./scripts/test.sh --plan   print what it would install, and exit
#
#   GOEP_TEST_RACE=all    (default) race detector over every package, -short
#   GOEP_TEST_RACE=small  race detector over the small packages only
#   GOEP_TEST_RACE=none   no race run
#   GOEP_TEST_CUDA=none   skip scripts/cuda-check.sh (and its install)
#   GOEP_TEST_CUDA12=none skip the build against CUDA 12.4 (and its download)
#   GOEP_TEST_ARM64=none  skip the builds without cgo and for arm64, the
#                         arm64 tests under qemu-user, and the arm64 cgo
#                         builds (scripts/arm64-sysroot.sh: Debian 12's arm64
#                         Open MPI, UCX and libcuda, about 30 MB, extracted
#                         into a cache folder)
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '== %s\n' "$*" >&2; }

plan_only=
case "${1:-}" in
--plan) plan_only=1 ;;
"") ;;
*)
	echo "usage: scripts/test.sh [--plan]" >&2
	exit 2
	;;
esac

# want_go is the Go version go.mod asks for.
want_go=$(awk '$1 == "go" { print $2; exit }' go.mod)

# apt_install installs Debian packages, running apt-get update once.
apt_updated=
apt_install() {
	if [ "$(id -u)" != 0 ]; then
		echo "scripts/test.sh: need root to install $* with apt-get" >&2
		exit 1
	fi
	if [ -z "$apt_updated" ]; then
		apt-get update -qq
		apt_updated=1
	fi
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# Debian packages the tests need: a C compiler (for -race and cgo),
# Open MPI with pkg-config for the mpi tag (internal/mpi, comm.NewMPI), and
# UCX for the ucx tag (internal/ucx, rdma.NewUCX).
APT_PACKAGES=()
command -v gcc >/dev/null || APT_PACKAGES+=(gcc libc6-dev)
command -v git >/dev/null || APT_PACKAGES+=(git)
command -v mpirun >/dev/null || APT_PACKAGES+=(openmpi-bin)
command -v pkg-config >/dev/null || APT_PACKAGES+=(pkg-config)
pkg-config --exists ompi 2>/dev/null || APT_PACKAGES+=(libopenmpi-dev)
pkg-config --exists ucx 2>/dev/null || APT_PACKAGES+=(libucx-dev)
# qemu-user runs the arm64 test binaries, and Debian's cross compiler
# builds the cgo code for arm64 (GOEP_TEST_ARM64).
if [ "${GOEP_TEST_ARM64:-all}" != none ]; then
	command -v qemu-aarch64-static >/dev/null || APT_PACKAGES+=(qemu-user-static)
	command -v aarch64-linux-gnu-gcc >/dev/null || APT_PACKAGES+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
fi

# Go: the machine's /usr/local/go, else any go on PATH, else Debian's
# golang-go. A go of 1.21 or later fetches the toolchain go.mod asks for
# from the module proxy by itself (GOTOOLCHAIN=auto). Debian 12's go is
# 1.19, which cannot; it downloads the toolchain module with
# `go mod download` instead and runs that.
user_go=$(command -v go || true) # the go of the caller's PATH
export PATH="/usr/local/go/bin:$PATH"
need_golang_go=
command -v go >/dev/null || need_golang_go=1
# go_version is the go on PATH's own version, asked outside the module so
# that a go of 1.21 or later does not fetch go.mod's toolchain to answer.
go_version() { (cd / && GOTOOLCHAIN=local go version) | awk '{print $3}'; }
older() { [ "$1" != "$2" ] && [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -1)" = "$1" ]; }
toolchain="golang.org/toolchain@v0.0.1-go${want_go}.linux-$(uname -m | sed 's/x86_64/amd64/; s/aarch64/arm64/')"

# What this run will install, before it installs anything.
plan=()
if [ ${#APT_PACKAGES[@]} -gt 0 ] || [ -n "$need_golang_go" ]; then
	pk=("${APT_PACKAGES[@]}")
	[ -z "$need_golang_go" ] || pk+=(golang-go ca-certificates)
	plan+=("apt-get install ${pk[*]} (Debian 12's main archive; up to about 0.5 GB with their dependencies)")
fi
if [ -n "$need_golang_go" ]; then
	plan+=("Go $want_go: Debian 12's go (1.19) is too old for go.mod; fetch $toolchain (about 270 MB) from the Go module proxy into the module cache, and put it on this run's PATH (at the end it says how to put it on yours)")
else
	have=$(go_version)
	have=${have#go}
	if older "$have" 1.21; then
		plan+=("Go $want_go: go $have is too old for go.mod; fetch $toolchain (about 270 MB) from the Go module proxy into the module cache, and put it on this run's PATH (at the end it says how to put it on yours)")
	elif older "$have" "$want_go"; then
		plan+=("Go $want_go: go $have fetches it itself (GOTOOLCHAIN=auto) from the Go module proxy into the module cache (about 270 MB)")
	fi
fi
if [ "${GOEP_TEST_CUDA:-all}" = all ]; then
	while IFS= read -r line; do
		plan+=("$line")
	done < <(bash scripts/cuda-check.sh --plan)
fi
if [ "${GOEP_TEST_CUDA12:-all}" = all ]; then
	while IFS= read -r line; do
		plan+=("$line")
	done < <(bash scripts/cuda12.sh --plan)
fi
if [ "${GOEP_TEST_ARM64:-all}" = all ]; then
	while IFS= read -r line; do
		plan+=("$line")
	done < <(bash scripts/arm64-sysroot.sh --plan)
fi
if [ ${#plan[@]} -gt 0 ]; then
	log "scripts/test.sh will install (GOEP_TEST_CUDA=none leaves out the CUDA toolkit):"
	for p in "${plan[@]}"; do
		log "  - $p"
	done
elif [ -n "$plan_only" ]; then
	log "scripts/test.sh has nothing to install"
fi
[ -z "$plan_only" ] || exit 0
if [ ${#plan[@]} -gt 0 ] && [ -t 0 ] && [ -t 2 ]; then
	log "starting in 10 s (Ctrl-C stops it; ./scripts/test.sh --plan prints this list alone)"
	sleep 10
fi
export GOEP_INSTALL_PLAN_SHOWN=1 # cuda-check.sh need not wait again

if [ ${#APT_PACKAGES[@]} -gt 0 ]; then
	log "apt-get install ${APT_PACKAGES[*]}"
	apt_install "${APT_PACKAGES[@]}"
fi
if [ -n "$need_golang_go" ]; then
	log "apt-get install golang-go"
	apt_install golang-go ca-certificates
fi
have_go=$(go_version)
have_go=${have_go#go}
if older "$have_go" 1.21; then
	toolchain="golang.org/toolchain@v0.0.1-go${want_go}.$(go env GOOS)-$(go env GOARCH)"
	log "go $have_go is older than 1.21: fetching $toolchain from the module proxy"
	dir=$(cd "$(mktemp -d)" && GOFLAGS=-mod=mod go mod download -json "$toolchain" | awk -F'"' '$2 == "Dir" { print $4 }')
	chmod -R u+w "$dir" && chmod +x "$dir"/bin/* "$dir"/pkg/tool/*/*
	export PATH="$dir/bin:$PATH" GOROOT="$dir"
fi
export GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"
log "$(go version)"
# go_hint says how to run this go from the caller's shell, when the
# caller's PATH does not lead to it (a fetched toolchain, /usr/local/go
# off their PATH): the README's commands need it.
go_hint=
run_go=$(command -v go)
if [ "$run_go" != "$user_go" ]; then
	go_hint="this run's go ($(go env GOVERSION)) is $run_go; for the README's commands in your shell: export PATH=\"$(dirname "$run_go"):\$PATH\""
	log "$go_hint"
fi

# Open MPI: CI runs as root in a container. mpirun refuses root unless
# told, and 4 ranks oversubscribe 2 cores. Unless the caller set them, the
# MCA settings keep Open MPI to one machine's transports, which is all the
# tests use: pml ob1 with the self and vader (shared memory) BTLs, so that
# it neither probes network interfaces and InfiniBand nor warns that none
# is found, and no single-copy (CMA) transfers, which need ptrace rights
# that containers often withhold (where CMA fails, Open MPI aborts the job
# at the first large message).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_pml="${OMPI_MCA_pml:-ob1}"
export OMPI_MCA_btl="${OMPI_MCA_btl:-self,vader}"
export OMPI_MCA_btl_vader_single_copy_mechanism="${OMPI_MCA_btl_vader_single_copy_mechanism:-none}"

log "go vet ./..."
go vet ./...
log "go vet -tags mpi ./..."
go vet -tags mpi ./...
log "go vet -tags ucx ./..."
go vet -tags ucx ./...

# The full-size random draws and large messages (internal/testenv): plain
# go test runs a smaller draw of the same checks.
export GOEP_TEST_FULL="${GOEP_TEST_FULL:-1}"
log "go test ./... (GOEP_TEST_FULL=$GOEP_TEST_FULL)"
go test -count=1 ./...

log "go test -tags mpi ./internal/mpi/... ./comm/... (under mpirun)"
go test -tags mpi -count=1 ./internal/mpi/... ./comm/...

# The hand-written C MPI dispatch that eprun's a2a baseline is measured
# against (scripts/a2a_mpi.c): built with mpicc, run under mpirun, its own
# check of every row passing and its routing eprun's; and the bench over
# comm.NewMPI, its a2a baseline on MPI_Ialltoallv, every row checked.
log "go test -tags mpi -run 'CMPIDispatch|A2AOverMPI' ./internal/bench (scripts/a2a_mpi.c and the bench under mpirun)"
go test -tags mpi -count=1 -run 'CMPIDispatch|A2AOverMPI' ./internal/bench

# The engine across processes with the MPI bootstrap (the untagged run
# above bootstraps its mpirun children over TCP).
log "go test -tags mpi -run MultiProcess ./executor (under mpirun)"
go test -tags mpi -count=1 -run MultiProcess ./executor

# The UCX transport: the binding over loopback (shared memory and TCP in
# one process) and its device list, then rdma across processes
# (launcher.Spawn) over TCP and shared memory, with a rank killed and a
# timeout; eprun topo's rdma section from a ucx build.
log "go test -tags ucx ./internal/ucx ./rdma; -run Topo ./cmd/eprun"
go test -tags ucx -count=1 ./internal/ucx ./rdma
go test -tags ucx -count=1 -run Topo ./cmd/eprun

# The hierarchical engine across processes: 2 emulated domains x 2 and
# x 4 ranks, the rail over UCX on TCP and on shared memory, launched like
# eprun launch and by mpirun, bit for bit against in-process worlds; and a
# rank killed mid-dispatch.
log "go test -tags ucx -run MultiProcessDomains ./executor"
go test -tags ucx -count=1 -run MultiProcessDomains ./executor

# The CUDA build: installs Debian's CUDA 11.8 headers, stub libcuda and
# nvcc (contrib, non-free), vets and builds with -tags cuda, runs the tests
# that need no GPU, and checks that the committed PTX matches its source.
# GOEP_TEST_CUDA=none skips it (for a machine without Debian's archive).
case "${GOEP_TEST_CUDA:-all}" in
all)
	log "scripts/cuda-check.sh"
	bash scripts/cuda-check.sh
	;;
none) ;;
*)
	echo "scripts/test.sh: GOEP_TEST_CUDA=$GOEP_TEST_CUDA: want all or none" >&2
	exit 2
	;;
esac

# The pure-Go build (no cgo: the host backend, in-process and TCP
# bootstrap, DESIGN.md's build without tags) vetted and its tests
# compiled, and the same for arm64 (Grace), whose test binaries run under
# qemu-user (the row kernels' NEON assembly against their Go reference
# loops among them), but for the tests that start processes: qemu-user
# runs one arm64 process, and the child it would exec is not one (a
# machine without binfmt_misc cannot start it).
case "${GOEP_TEST_ARM64:-all}" in
all)
	log "CGO_ENABLED=0 go vet ./... (amd64, arm64); arm64 tests under qemu-user"
	CGO_ENABLED=0 go vet ./...
	CGO_ENABLED=0 go test -count=1 -run '^$' ./... >/dev/null
	GOARCH=arm64 CGO_ENABLED=0 go vet ./...
	arm=$(mktemp -d)
	# Every package with tests, the tests that start processes skipped
	# (PACKAGE:SKIP, a -test.skip expression).
	for spec in ./comm ./nvlink ./permute ./device:'^TestShareAcrossProcesses$' ./rdma \
		./launcher:'^Test(Spawn|BootstrapSpawned$|BootstrapAbort$)' ./executor:'^TestMultiProcess' \
		./executor/internal/plan ./executor/internal/gpu ./executor/internal/rail ./internal/bench \
		./internal/cuda ./internal/poll ./internal/reference ./internal/view ./cmd/eprun; do
		pkg=${spec%%:*} skip=
		[ "$spec" = "$pkg" ] || skip=${spec#*:}
		GOARCH=arm64 CGO_ENABLED=0 go test -c -o "$arm/pkg.test" "$pkg"
		(cd "$pkg" && qemu-aarch64-static "$arm/pkg.test" -test.short -test.count=1 ${skip:+-test.skip "$skip"} >"$arm/log" 2>&1) || {
			cat "$arm/log" >&2
			echo "scripts/test.sh: arm64 tests of $pkg failed under qemu" >&2
			exit 1
		}
		log "arm64 $pkg: $(tail -1 "$arm/log")${skip:+ (skipped: $skip)}"
	done
	# The cgo code for arm64, every combination of the cuda, mpi and ucx
	# tags vetted and built (cgo links each package's C part) against
	# Debian 12's arm64 Open MPI, UCX and driver libcuda
	# (scripts/arm64-sysroot.sh: downloaded and extracted, not installed);
	# then eprun with every tag, run under qemu-user on those libraries:
	# the default bench and its check on the host backend, and the cuda
	# backend's refusal without a GPU.
	log "arm64 cgo: every tag set vetted and built (scripts/arm64-sysroot.sh); eprun of every tag under qemu-user"
	(
		eval "$(bash scripts/arm64-sysroot.sh)"
		sets=("" mpi ucx mpi,ucx)
		if [ "$GOEP_ARM64_CUDA" = 1 ]; then
			sets+=(cuda cuda,mpi cuda,ucx cuda,mpi,ucx)
		else
			log "arm64 cgo: no /usr/include/cuda.h (GOEP_TEST_CUDA=none): the cuda tag sets left out"
		fi
		for tags in "${sets[@]}"; do
			go vet -tags "$tags" ./...
			go build -tags "$tags" ./...
		done
		all=${sets[${#sets[@]} - 1]}
		go build -tags "$all" -o "$arm/eprun" ./cmd/eprun
		export QEMU_LD_PREFIX=/usr/aarch64-linux-gnu LD_LIBRARY_PATH=$GOEP_ARM64_LD_LIBRARY_PATH
		qemu-aarch64-static "$arm/eprun" bench tiny >"$arm/log" 2>&1 || {
			cat "$arm/log" >&2
			echo "scripts/test.sh: the arm64 eprun ($all) failed its bench under qemu" >&2
			exit 1
		}
		log "arm64 eprun ($all): $(grep '^# check' "$arm/log")"
		if [ "$GOEP_ARM64_CUDA" = 1 ]; then
			if qemu-aarch64-static "$arm/eprun" bench tiny --backend cuda >"$arm/log" 2>&1 ||
				! grep -q 'CUDA backend for GPU 0' "$arm/log"; then
				cat "$arm/log" >&2
				echo "scripts/test.sh: the arm64 eprun's cuda backend did not refuse cleanly without a GPU" >&2
				exit 1
			fi
			log "arm64 eprun --backend cuda, no GPU: $(tail -1 "$arm/log")"
		fi
	)
	rm -rf "$arm"
	;;
none) ;;
*)
	echo "scripts/test.sh: GOEP_TEST_ARM64=$GOEP_TEST_ARM64: want all or none" >&2
	exit 2
	;;
esac

# The cuda build against CUDA 12.4's headers (scripts/cuda12.sh: Debian
# trixie's packages, extracted into a cache folder), where the code that
# needs CUDA 12 compiles in (fabric handles, CUDA 12.3): vet, build, the
# tests that need no GPU, the GPU test binaries. The committed PTX stays
# nvcc 11.8's, which cuda-check.sh checks.
case "${GOEP_TEST_CUDA12:-all}" in
all)
	log "the cuda build against CUDA 12.4 (scripts/cuda12.sh)"
	(
		eval "$(bash scripts/cuda12.sh)"
		go vet -tags cuda ./...
		go vet -tags cuda,ucx ./...
		go build -tags cuda ./...
		go test -tags cuda -count=1 ./internal/cuda/... ./device ./permute ./nvlink
		for pkg in ./internal/cuda ./device ./permute ./executor ./executor/internal/gpu; do
			go test -c -tags cuda -o /dev/null "$pkg"
		done
	)
	;;
none) ;;
*)
	echo "scripts/test.sh: GOEP_TEST_CUDA12=$GOEP_TEST_CUDA12: want all or none" >&2
	exit 2
	;;
esac

case "${GOEP_TEST_RACE:-all}" in
all)
	log "go test -race -short ./..."
	go test -race -short -count=1 ./...
	;;
small)
	log "go test -race (small packages)"
	go test -race -short -count=1 ./comm/... ./device/... ./nvlink/... ./permute/... ./internal/... ./cmd/...
	;;
none) ;;
*)
	echo "scripts/test.sh: GOEP_TEST_RACE=$GOEP_TEST_RACE: want all, small or none" >&2
	exit 2
	;;
esac
log "all tests passed"
[ -z "$go_hint" ] || log "$go_hint"
