#!/usr/bin/env bash
# build.sh builds the tests' tools: the control plane (kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl, etcd), kwok and helm,
# from the one module that pins them (tools/), into
#   ${INFORMERD_CACHE_DIR:-$HOME/.cache/informerd}/controlplane/<hash>/bin
# where <hash> covers tools/ and this script. A cache hit returns at once.
# It prints the bin directory on its last line.
#
# One go build compiles every package the binaries share once. The tests'
# static builds of informerd's commands (hack/test.sh, test/e2e's goBuild)
# reuse from the build cache what they share with it while the modules
# informerd's go.mod shares with tools/go.mod are at one version each, which
# TestToolsShareInformerdsVersions checks.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${INFORMERD_CACHE_DIR:-$HOME/.cache/informerd}/controlplane"

k8s_version="v1.37.2"
hash="$(cat "$here"/build.sh "$here"/tools/go.mod "$here"/tools/go.sum "$here"/tools/etcd/main.go | sha256sum | cut -c1-16)"
dest="$cache_root/$hash"

if [[ -x "$dest/bin/kube-apiserver" && -f "$dest/.complete" ]]; then
	echo "control plane: cached in $dest" >&2
	echo "$dest/bin"
	exit 0
fi

mkdir -p "$cache_root"
tmp="$(mktemp -d "$cache_root/.build-XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin"

start=$SECONDS
log() { echo "control plane: $* ($((SECONDS - start))s)" >&2; }

major="${k8s_version#v}"; major="${major%%.*}"
minor="${k8s_version#v*.}"; minor="${minor%%.*}"
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
	ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

# helm version prints the module's version, as a release build's does; -X
# names a variable of one binary each, and the linker ignores the others.
helm_version="$(cd "$here/tools" && go list -m -f '{{.Version}}' helm.sh/helm/v4)"
ldflags+=" -X helm.sh/helm/v4/internal/version.version=$helm_version"

# CGO is off so the binaries do not depend on the host's libc; -trimpath keeps
# the outputs independent of where the clone lives.
log "building kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, etcd, kwok and helm"
(cd "$here/tools" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$tmp/bin/" \
	tool ./etcd)
log "built the binaries"

# kwok's stage configs (what makes a fake pod Running with an IP) ship in the
# kwok module itself; take them from there rather than keeping a copy.
kwok_dir="$(cd "$here/tools" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
mkdir -p "$tmp/stage"
# The set is kwok's own "fast" kustomization: node/fast, node/heartbeat-with-lease, pod/fast.
for f in "$kwok_dir"/kustomize/stage/{node/fast,node/heartbeat-with-lease,pod/fast}/*.yaml; do
	[[ "$(basename "$f")" == kustomization.yaml ]] && continue
	{ cat "$f"; echo "---"; } >> "$tmp/stage/kwok-stages.yaml"
done
[[ -s "$tmp/stage/kwok-stages.yaml" ]] || { echo "control plane: no stage YAMLs found under $kwok_dir/kustomize/stage" >&2; exit 1; }

touch "$tmp/.complete"
rm -rf "$dest"
mv "$tmp" "$dest"
trap - EXIT
log "done: $dest"
echo "$dest/bin"
