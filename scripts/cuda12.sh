#!/usr/bin/env bash
# CUDA 12.4's headers, driver stub and nvcc for a Debian 12 machine,
# without installing anything into the system: Debian trixie's non-free
# CUDA 12.4 packages (its binaries need nothing newer than Debian 12's
# glibc) are downloaded with a private apt index and extracted into a
# cache folder. Debian 12 ships CUDA 11.8, whose headers lack what goep's
# fabric-handle code needs (CU_MEM_HANDLE_TYPE_FABRIC, CUmemFabricHandle,
# CUDA 12.3), so that code compiles only against these.
#
#   scripts/cuda12.sh          fetch and extract (idempotent: a second run
#                              reuses the download and the tree), then print
#                              the variables that build against it
#   scripts/cuda12.sh --plan   print what it would fetch, one line (nothing
#                              when the tree is there), and exit
#   scripts/cuda12.sh --env    print the variables only (the tree must be there)
#
#   GOEP_CUDA12_DIR   the cache folder (default ${XDG_CACHE_HOME:-~/.cache}/goep-cuda12)
#
# The variables it prints (eval them):
#   PATH=<tree>/usr/bin:$PATH  CGO_CFLAGS=-I<tree>/usr/include
#   CGO_LDFLAGS=-L<tree>/usr/lib/x86_64-linux-gnu/stubs
# The versions are pinned to the ones goep is tested with; trixie's mirror
# keeps them while trixie is Debian's stable release.
set -euo pipefail

dir=${GOEP_CUDA12_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/goep-cuda12}
root=$dir/usr-tree
debs=$dir/debs
apt_dir=$dir/apt
stamp=$root/.goep-extracted
pkgs=(nvidia-cuda-toolkit=12.4.131~12.4.1-2 libnvvm4=12.4.131~12.4.1-2
	nvidia-cuda-dev=12.4.127~12.4.1-2 libcu++-dev=2.3.2-2)

# shellcheck source=scripts/private-apt.sh
source "$(dirname "$0")/private-apt.sh"

die() {
	echo "scripts/cuda12.sh: $*" >&2
	exit 1
}

env_lines() {
	echo "export PATH=$root/usr/bin:\$PATH"
	echo "export CGO_CFLAGS=-I$root/usr/include"
	echo "export CGO_LDFLAGS=-L$root/usr/lib/x86_64-linux-gnu/stubs"
}

case "${1:-}" in
--plan)
	if [ ! -e "$stamp" ]; then
		extra=""
		command -v g++-12 >/dev/null || extra=", after apt-get install g++-12 (nvcc 12.4's host compiler)"
		echo "CUDA 12.4: download Debian trixie's nvidia-cuda-toolkit, nvidia-cuda-dev, libnvvm4, libcu++-dev (about 1 GB) into $dir and extract them there (nothing installed into the system)$extra"
	fi
	exit 0
	;;
--env)
	[ -e "$stamp" ] || die "no CUDA 12.4 tree in $root: run scripts/cuda12.sh first"
	env_lines
	exit 0
	;;
"") ;;
*)
	echo "usage: scripts/cuda12.sh [--plan|--env]" >&2
	exit 2
	;;
esac

if [ ! -e "$stamp" ]; then
	# What apt-get and dpkg print goes to stderr: stdout is only the
	# environment lines, which callers eval.
	exec 3>&1 1>&2
	# Host tools from Debian 12: dpkg-deb and xz to unpack, g++-12 as
	# nvcc 12.4's host compiler.
	need=()
	command -v g++-12 >/dev/null || need+=(g++-12)
	command -v dpkg-deb >/dev/null || need+=(dpkg)
	command -v xz >/dev/null || need+=(xz-utils)
	if ((${#need[@]})); then
		[ "$(id -u)" = 0 ] || die "needs ${need[*]} (as root: apt-get install ${need[*]})"
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
	fi

	# A private apt index of trixie (scripts/private-apt.sh): /etc/apt
	# and the system's cache are not touched. The mirror is the one Debian
	# 12's sources name.
	mkdir -p "$debs" "$root"
	private_apt "$apt_dir" "deb MIRROR trixie main contrib non-free" || die "no index of trixie"
	opts=("${apt_opts[@]}")

	cd "$debs"
	for p in "${pkgs[@]}"; do
		name=${p%%=*}
		if deb=$(ls "${name}"_*.deb 2>/dev/null | head -1) && [ -n "$deb" ] && dpkg-deb --info "$deb" >/dev/null 2>&1; then
			continue
		fi
		rm -f "${name}"_*.deb
		apt-get "${opts[@]}" -q download "$p" || die "apt-get download $p failed"
	done

	# Unpack: the toolkit whole; of the 2.6 GB nvidia-cuda-dev only the
	# headers and the driver stub.
	for p in nvidia-cuda-toolkit libnvvm4 libcu++-dev; do
		dpkg -x "$debs"/${p}_*.deb "$root"
	done
	dpkg-deb --fsys-tarfile "$debs"/nvidia-cuda-dev_*.deb | tar -x -C "$root" --wildcards \
		'./usr/include/*' './usr/lib/x86_64-linux-gnu/stubs/libcuda.so'

	# Debian's nvcc finds its tools at fixed /usr paths (its profile is a
	# link to /etc/nvcc.profile): a profile and a wrapper relative to the
	# tree instead.
	bin=$root/usr/lib/nvidia-cuda-toolkit/bin
	rm -f "$bin/nvcc.profile"
	cat >"$bin/nvcc.profile" <<'EOF'
TOP                = $(_HERE_)/../../..
NVVMIR_LIBRARY_DIR = $(_HERE_)/../libdevice
PATH		+= $(_HERE_):$(TOP)/bin:
INCLUDES	+= "-I$(TOP)/include" $(_SPACE_)
LIBRARIES	=+ $(_SPACE_) "-L$(TOP)/lib/x86_64-linux-gnu/stubs" "-L$(TOP)/lib/x86_64-linux-gnu"
EOF
	cat >"$root/usr/bin/nvcc" <<'EOF'
#!/bin/sh
here=$(dirname "$(readlink -f "$0")")
export PATH="$here/../lib/nvidia-cuda-toolkit/bin:$PATH"
exec "$here/../lib/nvidia-cuda-toolkit/bin/nvcc" -ccbin g++-12 "$@"
EOF
	chmod +x "$root/usr/bin/nvcc"
	grep -q CU_MEM_HANDLE_TYPE_FABRIC "$root/usr/include/cuda.h" || die "$root/usr/include/cuda.h has no fabric handles"
	touch "$stamp"
	exec 1>&3 3>&-
fi
echo "scripts/cuda12.sh: CUDA 12.4 in $root ($("$root/usr/bin/nvcc" --version | tail -1)); build against it with:" >&2
env_lines
