#!/usr/bin/env bash
# build.sh builds helm (v4, pinned in the module beside it) into
#   ${INFORMERD_CACHE_DIR:-$HOME/.cache/informerd}/helm/<hash>/bin
# where <hash> covers this script and the module's go.mod/go.sum: a cache
# hit returns at once, so CI builds it once, outside the clone, as it does
# the control plane and promtool. It prints the bin directory on its last
# line. make test and make test-e2e pass its helm to the tests
# (INFORMERD_HELM): the chart's test renders deploy/helm/informerd, and
# TestDeploy installs it.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${INFORMERD_CACHE_DIR:-$HOME/.cache/informerd}/helm"
hash="$(cat "$here/build.sh" "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-16)"
dest="$cache_root/$hash"

if [[ -x "$dest/bin/helm" ]]; then
	echo "helm: cached in $dest" >&2
	echo "$dest/bin"
	exit 0
fi

mkdir -p "$cache_root"
tmp="$(mktemp -d "$cache_root/.build-XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
echo "helm: building (a few minutes, once)" >&2
# helm version prints the module's version, as a release build's does.
version="$(cd "$here" && go list -m -f '{{.Version}}' helm.sh/helm/v4)"
(cd "$here" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$version" -o "$tmp/bin/helm" helm.sh/helm/v4/cmd/helm)
rm -rf "$dest"
mv "$tmp" "$dest"
trap - EXIT
echo "helm: built in $dest ($((SECONDS - start))s)" >&2
echo "$dest/bin"
