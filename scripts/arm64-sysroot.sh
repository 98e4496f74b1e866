#!/usr/bin/env bash
# Debian 12's arm64 (Grace) libraries that goep's cgo code links against,
# for a cross build on an amd64 Debian 12 machine, without installing
# anything into the system: Open MPI's and UCX's development packages,
# the shared libraries they need, and the NVIDIA driver's libcuda for the
# cuda tag, downloaded with a private apt index and extracted into a
# cache folder. (Installing them with dpkg's arm64 architecture is not an
# option: libopenmpi-dev:arm64 needs openmpi-bin:arm64, which replaces the
# machine's own Open MPI.) The cross compiler is Debian's
# gcc-aarch64-linux-gnu, which scripts/test.sh installs. The CUDA headers
# are the machine's (/usr/include/cuda.h from nvidia-cuda-dev, the same
# for every architecture), copied into the tree on every run.
#
#   scripts/arm64-sysroot.sh          fetch and extract (idempotent), then
#                                     print the variables of a cross build
#   scripts/arm64-sysroot.sh --plan   print what it would fetch, one line
#                                     (nothing when the tree is there), and exit
#
#   GOEP_ARM64_DIR   the cache folder (default ${XDG_CACHE_HOME:-~/.cache}/goep-arm64)
#
# The variables it prints (eval them): GOARCH=arm64 CGO_ENABLED=1
# CC=aarch64-linux-gnu-gcc, CGO_CFLAGS and CGO_LDFLAGS into the tree, and
# pkg-config's PKG_CONFIG_LIBDIR and PKG_CONFIG_SYSROOT_DIR; and
# GOEP_ARM64_LD_LIBRARY_PATH, the tree's library folders, with which an
# arm64 binary built so runs under qemu-user
# (QEMU_LD_PREFIX=/usr/aarch64-linux-gnu
# LD_LIBRARY_PATH=$GOEP_ARM64_LD_LIBRARY_PATH qemu-aarch64-static BINARY).
# Without /usr/include/cuda.h the tree has no CUDA, and the variables say
# so (GOEP_ARM64_CUDA=0).
set -euo pipefail

dir=${GOEP_ARM64_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/goep-arm64}
root=$dir/root
debs=$dir/debs
apt_dir=$dir/apt
stamp=$root/.goep-extracted
# The packages asked for; the shared libraries they depend on come along.
want=(libopenmpi-dev libucx-dev)
# Of their closure, the libraries (and libibverbs' providers), but for
# the C and C++ runtime and toolchain libraries, which the cross toolchain
# has its own of (an arm64 libc6-dev in the tree would shadow them).
keep='^(lib.*|zlib1g.*|ibverbs-providers|ocl-icd-libopencl1)$'
skip='^(libc6.*|libc-dev-bin|libcrypt-dev|libnsl-dev|libtirpc-dev|libgcc.*|libstdc\+\+.*|libasan.*|liblsan.*|libtsan.*|libubsan.*|libhwasan.*|libitm.*|libgomp.*|libatomic.*|libcc1.*|libgfortran.*|libgprofng.*|libbinutils|libctf.*|libisl.*|libmpc.*|libmpfr.*|libgmp.*|libjansson.*|libperl.*|libgdbm.*|libjs-.*)$'

# shellcheck source=scripts/private-apt.sh
source "$(dirname "$0")/private-apt.sh"

die() {
	echo "scripts/arm64-sysroot.sh: $*" >&2
	exit 1
}

env_lines() {
	local lib=$root/usr/lib/aarch64-linux-gnu
	local cuda=1
	[ -e "$root/usr/include/cuda.h" ] || cuda=0
	echo "export GOARCH=arm64 CGO_ENABLED=1 CC=aarch64-linux-gnu-gcc GOEP_ARM64_CUDA=$cuda"
	echo "export CGO_CFLAGS='-I$root/usr/include -I$root/usr/include/aarch64-linux-gnu'"
	echo "export CGO_LDFLAGS='-L$lib -L$lib/nvidia/current -Wl,-rpath-link,$lib -Wl,-rpath-link,$root/lib/aarch64-linux-gnu'"
	echo "export PKG_CONFIG_SYSROOT_DIR=$root"
	echo "export PKG_CONFIG_LIBDIR=$lib/pkgconfig:$lib/openmpi/lib/pkgconfig:$root/usr/share/pkgconfig"
	echo "export GOEP_ARM64_LD_LIBRARY_PATH=$lib:$lib/nvidia/current:$root/lib/aarch64-linux-gnu"
}

case "${1:-}" in
--plan)
	if [ ! -e "$stamp" ]; then
		echo "arm64 libraries: download Debian 12's arm64 ${want[*]}, libcuda1 and the libraries they need (about 30 MB) into $dir and extract them there (nothing installed into the system)"
	fi
	exit 0
	;;
"") ;;
*)
	echo "usage: scripts/arm64-sysroot.sh [--plan]" >&2
	exit 2
	;;
esac

if [ ! -e "$stamp" ]; then
	# stdout is only the environment lines, which callers eval.
	exec 3>&1 1>&2
	command -v dpkg-deb >/dev/null || die "needs dpkg-deb"

	# A private apt index of Debian 12 for arm64: /etc/apt, dpkg's
	# architectures and the system's cache are not touched. The mirror is
	# the one the machine's sources name; the closure is computed against
	# an empty package status, so that nothing of the machine counts as
	# already there
	# (scripts/private-apt.sh).
	rm -rf "$root"
	mkdir -p "$apt_dir" "$debs" "$root"
	: >"$apt_dir/status"
	private_apt "$apt_dir" "deb [arch=arm64] MIRROR bookworm main contrib non-free" \
		-o Dir::State::status="$apt_dir/status" -o APT::Architecture=arm64 -o APT::Architectures::=arm64 ||
		die "no index of Debian 12 for arm64"
	opts=("${apt_opts[@]}")
	# The closure of the packages asked for, as an install into an empty
	# system would fetch it; the driver's libcuda1 alone (its own
	# dependencies are the driver's packaging, not libraries).
	mapfile -t pkgs < <(apt-get "${opts[@]}" install -s --no-install-recommends "${want[@]}" |
		awk '$1 == "Inst" {print $2}' | grep -E "$keep" | grep -Ev "$skip")
	pkgs+=(libcuda1)
	cd "$debs"
	missing=()
	for p in "${pkgs[@]}"; do
		if deb=$(ls "${p}"_*.deb 2>/dev/null | head -1) && [ -n "$deb" ] && dpkg-deb --info "$deb" >/dev/null 2>&1; then
			continue
		fi
		rm -f "${p}"_*.deb
		missing+=("$p:arm64")
	done
	if ((${#missing[@]})); then
		apt-get "${opts[@]}" -qq download "${missing[@]}" || die "apt-get download ${missing[*]} failed"
	fi
	for p in "${pkgs[@]}"; do
		dpkg -x "$(ls "${p}"_*.deb | head -1)" "$root"
	done

	# The linker's libcuda.so is the driver's, in its own folder.
	[ -e "$root/usr/lib/aarch64-linux-gnu/nvidia/current/libcuda.so" ] || die "no libcuda.so in libcuda1:arm64"
	[ -e "$root/usr/lib/aarch64-linux-gnu/openmpi/lib/pkgconfig/ompi.pc" ] || die "no ompi.pc in the tree"
	touch "$stamp"
	exec 1>&3 3>&-
fi
# The CUDA headers, whenever the machine has them (they may come after
# the tree: scripts/cuda-check.sh installs them).
if [ -e /usr/include/cuda.h ]; then
	cp -u /usr/include/cuda.h "$root/usr/include/"
fi
echo "scripts/arm64-sysroot.sh: Debian 12's arm64 libraries in $root; cross-build against them with:" >&2
env_lines
