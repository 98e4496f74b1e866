#!/usr/bin/env bash
# The project's test command (README "Quick start"; .ci/run runs it).
#
# On a fresh Debian 12 machine, as root, it installs what the tests need,
# then runs go vet and go test over the whole module, the mpi-tagged tests
# under mpirun (Open MPI), the ucx-tagged tests (UCX), and go test -race.
#
#   GOEP_TEST_RACE=all    (default) race detector over every package, -short
#   GOEP_TEST_RACE=small  race detector over the small packages only
#   GOEP_TEST_RACE=none   no race run
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '== %s\n' "$*" >&2; }

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
if [ ${#APT_PACKAGES[@]} -gt 0 ]; then
	log "apt-get install ${APT_PACKAGES[*]}"
	apt_install "${APT_PACKAGES[@]}"
fi

# Go: the machine's /usr/local/go, else any go on PATH, else Debian's
# golang-go. A go of 1.21 or later fetches the toolchain go.mod asks for
# from the module proxy by itself (GOTOOLCHAIN=auto). Debian 12's go is
# 1.19, which cannot; it downloads the toolchain module with
# `go mod download` instead and runs that.
export PATH="/usr/local/go/bin:$PATH"
if ! command -v go >/dev/null; then
	log "apt-get install golang-go"
	apt_install golang-go ca-certificates
fi
have_go=$(go env GOVERSION 2>/dev/null || go version | awk '{print $3}')
have_go=${have_go#go}
if [ "$(printf '%s\n%s\n' "1.21" "$have_go" | sort -V | head -1)" != "1.21" ]; then
	tc="golang.org/toolchain@v0.0.1-go${want_go}.$(go env GOOS)-$(go env GOARCH)"
	log "go $have_go is older than 1.21: fetching $tc from the module proxy"
	dir=$(cd "$(mktemp -d)" && GOFLAGS=-mod=mod go mod download -json "$tc" | awk -F'"' '$2 == "Dir" { print $4 }')
	chmod -R u+w "$dir" && chmod +x "$dir"/bin/* "$dir"/pkg/tool/*/*
	export PATH="$dir/bin:$PATH" GOROOT="$dir"
fi
export GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"
log "$(go version)"

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
