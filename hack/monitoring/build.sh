#!/usr/bin/env bash
# build.sh provides promtool in
#   ${INFORMERD_CACHE_DIR:-$HOME/.cache/informerd}/monitoring/<key>/bin
# and prints that directory on its last line. Where apt can fetch Debian's
# prometheus package (CI's machines, after .ci/run's apt-get update), its
# promtool is unpacked from the package, not installed (no service, no
# user): <key> is debian-<version>. Elsewhere it is built from the module
# beside it: <key> hashes this script and the module's go.mod/go.sum. A
# cache hit returns at once. Building costs a cold run about 6 CPU-minutes
# (measured: 178 s wall, 338 CPU-s with the modules downloaded); fetching,
# a second.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${INFORMERD_CACHE_DIR:-$HOME/.cache/informerd}/monitoring"

# from_debian unpacks Debian's promtool into the cache and prints its
# directory; it fails, saying nothing, where apt cannot fetch it.
from_debian() {
	command -v apt-get >/dev/null 2>&1 && command -v dpkg-deb >/dev/null 2>&1 || return 1
	local version dest tmp
	version="$(apt-cache policy prometheus 2>/dev/null | awk '/Candidate:/ {print $2}')"
	[[ -n "$version" && "$version" != "(none)" ]] || return 1
	dest="$cache_root/debian-${version//[^A-Za-z0-9.+-]/_}"
	if [[ -x "$dest/bin/promtool" ]]; then
		echo "$dest/bin"
		return 0
	fi
	mkdir -p "$cache_root"
	tmp="$(mktemp -d "$cache_root/.fetch-XXXXXX")"
	if (cd "$tmp" && apt-get download -qq "prometheus=$version" 2>/dev/null && dpkg-deb -x prometheus_*.deb root) &&
		mkdir -p "$tmp/bin" && mv "$tmp/root/usr/bin/promtool" "$tmp/bin/" && "$tmp/bin/promtool" --version >/dev/null 2>&1; then
		rm -rf "$tmp/root" "$tmp"/*.deb "$dest"
		mv "$tmp" "$dest"
		echo "promtool: Debian's $version, unpacked in $dest" >&2
		echo "$dest/bin"
		return 0
	fi
	rm -rf "$tmp"
	return 1
}
from_debian && exit 0

hash="$(cat "$here/build.sh" "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-16)"
dest="$cache_root/$hash"

if [[ -x "$dest/bin/promtool" ]]; then
	echo "promtool: cached in $dest" >&2
	echo "$dest/bin"
	exit 0
fi

mkdir -p "$cache_root"
tmp="$(mktemp -d "$cache_root/.build-XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
echo "promtool: building (a few minutes, once)" >&2
# remove_all_sd leaves out the service discovery plugins (cloud SDKs),
# which checking and testing rules never use: most of the build.
(cd "$here" && CGO_ENABLED=0 go build -trimpath -tags remove_all_sd -ldflags "-s -w" -o "$tmp/bin/promtool" github.com/prometheus/prometheus/cmd/promtool)
rm -rf "$dest"
mv "$tmp" "$dest"
trap - EXIT
echo "promtool: built in $dest ($((SECONDS - start))s)" >&2
echo "$dest/bin"
