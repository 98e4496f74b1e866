# shellcheck shell=bash
# Sourced by scripts/cuda12.sh and scripts/arm64-sysroot.sh: an apt index
# of their own, so that they download Debian packages without touching
# /etc/apt, dpkg's architectures or the system's apt cache.
#
# private_apt DIR SUITE-LINE [APT-OPTION...] sets the array apt_opts to
# apt-get options that read the sources from DIR/sources.list (one line:
# SUITE-LINE, in which MIRROR is replaced by the Debian mirror the
# machine's apt sources name, or $DEBIAN_MIRROR) and keep the lists and
# cache under DIR, with APT-OPTIONs added; then it fetches the index. It
# returns non-zero, with a message on stderr, when there is no mirror or
# the index cannot be fetched.
private_apt() {
	local dir=$1 line=$2
	shift 2
	local mirror=${DEBIAN_MIRROR:-$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)}
	[ -n "$mirror" ] || mirror=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list 2>/dev/null)
	if [ -z "$mirror" ]; then
		echo "no Debian mirror in apt's sources; set DEBIAN_MIRROR" >&2
		return 1
	fi
	mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial"
	echo "${line//MIRROR/$mirror}" >"$dir/sources.list"
	apt_opts=(-o Dir::Etc::sourcelist="$dir/sources.list" -o Dir::Etc::sourceparts=-
		-o Dir::State::Lists="$dir/lists" -o Dir::Cache="$dir/cache"
		-o APT::Sandbox::User=root -o Debug::NoLocking=1 "$@")
	if ! apt-get "${apt_opts[@]}" -qq update; then
		echo "cannot fetch the package index of '${line//MIRROR/$mirror}'" >&2
		return 1
	fi
}
