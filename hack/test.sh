#!/usr/bin/env bash
# test.sh is make test: every package's tests with -race, the e2e package's
# split over E2E_SHARDS processes (default 2), each with a control plane of
# its own, then each fuzz target briefly; and the tools the tests run
# beside the code (the control plane, promtool, helm: cached outside the
# clone, built if missing). Everything runs as soon as what it needs is
# there, so that on a cold machine the tests' compiles fill the cores that
# the tools' single-threaded links leave idle:
#
#   at once:         the control plane, promtool and helm builds; the
#                    shared builds (below)
#   after those two: the unit tests but docs' and deploy's
#   after promtool
#   and helm:        docs' and deploy's tests
#   after all tools: the e2e shards
#   after the unit
#   tests passed:    the fuzz targets (hack/fuzz.sh), beside the shards
#
# The e2e tests mostly wait (on the API server, on controllers, on
# timeouts; one process keeps about 40% of two cores busy), so the shards
# share the machine well; a control plane each keeps the tests that count
# what the API server sees (audit log, apiserver_request_total) or restart
# it as alone as they are in one process. Tests go to shards round-robin in
# the order `go test -list` names them (file by file), which spreads each
# file's slow tests. TEST_FLAGS is passed to every go test; FUZZ_TARGETS
# and FUZZTIME to hack/fuzz.sh (empty FUZZ_TARGETS: no fuzzing). Exits
# nonzero if anything failed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

go="${GO:-go}"
shards="${E2E_SHARDS:-2}"
[[ "$shards" =~ ^[1-9][0-9]*$ ]] || { echo "test.sh: E2E_SHARDS=$shards: want a positive number" >&2; exit 2; }
# Shards attached to one cluster would see each other's requests.
[[ -z "${INFORMERD_E2E_KUBECONFIG:-}" ]] || shards=1
read -ra extra <<<"${TEST_FLAGS:-}"
flags=(-race -count=1 -timeout=30m "${extra[@]}")

tmp="$(mktemp -d)"
# On a failure, nothing started here outlives the script.
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
# tool NAME SCRIPT builds a tool in the background; its bin directory
# (the script's last line) goes to $tmp/NAME.
declare -A tools
tool() { "$2" >"$tmp/$1" & tools[$1]=$!; }
tool controlplane test/controlplane/build.sh
tool promtool hack/monitoring/build.sh
tool helm hack/helm/build.sh
# bin NAME waits for a tool's build and sets $dir to its bin directory.
bin() {
	wait "${tools[$1]}" || { echo "test.sh: building $1 failed" >&2; exit 1; }
	dir="$(tail -n1 "$tmp/$1")"
}

# The two builds everything below shares, so that the runs do not each
# compile the same packages beside one another: the e2e test binary
# (listing its tests compiles it, and with it most of the module's
# packages with -race), and the commands and examples the e2e tests build
# and run, built as they build them (static: test/e2e's goBuild). On a
# cold build cache, the first e2e test of each shard otherwise waits
# minutes for its daemon's build.
"$go" test -race -list '^Test' ./test/e2e >"$tmp/list" & listing=$!
CGO_ENABLED=0 "$go" build -trimpath ./cmd/... ./examples/... & building=$!
wait "$listing" || { cat "$tmp/list" >&2; exit 1; }
wait "$building"
mapfile -t tests < <(grep '^Test' "$tmp/list")
[[ ${#tests[@]} -gt 0 ]] || { echo "test.sh: go test -list named no e2e tests" >&2; exit 1; }

pids=()
# The unit tests; docs' and deploy's run promtool and helm.
mapfile -t units < <("$go" list ./... | grep -v -e '/test/e2e$' -e '/docs$' -e '/deploy$')
(
	"$go" test "${flags[@]}" "${units[@]}"
	(cd hack/plot && "$go" test "${flags[@]}" ./...)
	if [[ -n "${FUZZ_TARGETS:-}" ]]; then GO="$go" hack/fuzz.sh; fi
) & pids+=($!)
bin promtool
export INFORMERD_PROMTOOL="$dir/promtool"
bin helm
export INFORMERD_HELM="$dir/helm"
"$go" test "${flags[@]}" ./docs ./deploy & pids+=($!)
bin controlplane
export INFORMERD_CONTROLPLANE_BIN="$dir"
for ((i = 0; i < shards; i++)); do
	shard=()
	for ((j = i; j < ${#tests[@]}; j += shards)); do shard+=("${tests[j]}"); done
	[[ ${#shard[@]} -gt 0 ]] || continue
	run="^($(IFS='|'; echo "${shard[*]}"))\$"
	echo "e2e shard $((i + 1))/$shards: ${#shard[@]} tests" >&2
	"$go" test "${flags[@]}" -run "$run" ./test/e2e & pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
exit "$rc"
