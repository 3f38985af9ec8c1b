#!/usr/bin/env bash
# build.sh builds promtool from the module beside it into
#   ${INFORMERD_CACHE_DIR:-$HOME/.cache/informerd}/monitoring/<hash>/bin
# where <hash> covers this script and the module's go.mod/go.sum: a cache
# hit returns at once, so CI builds it once, outside the clone, as it does
# the control plane. It prints the bin directory on its last line.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${INFORMERD_CACHE_DIR:-$HOME/.cache/informerd}/monitoring"
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
