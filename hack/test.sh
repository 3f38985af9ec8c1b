#!/usr/bin/env bash
# test.sh is make test's test run: every package's tests with -race, the e2e
# package's split over E2E_SHARDS processes (default 2), each with a control
# plane of its own, all of them at once. The e2e tests mostly wait (on the
# API server, on controllers, on timeouts; one process keeps about 40% of
# two cores busy), so the shards share the machine well; a control plane
# each keeps the tests that count what the API server sees (audit log,
# apiserver_request_total) or restart it as alone as they are in one
# process. Tests go to shards round-robin in the order `go test -list`
# names them (file by file), which spreads each file's slow tests.
# TEST_FLAGS is passed to every go test. Exits nonzero if any run failed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

go="${GO:-go}"
shards="${E2E_SHARDS:-2}"
[[ "$shards" =~ ^[1-9][0-9]*$ ]] || { echo "test.sh: E2E_SHARDS=$shards: want a positive number" >&2; exit 2; }
# Shards attached to one cluster would see each other's requests.
[[ -z "${INFORMERD_E2E_KUBECONFIG:-}" ]] || shards=1
read -ra extra <<<"${TEST_FLAGS:-}"
flags=(-race -count=1 -timeout=30m "${extra[@]}")

# First, at once, the two builds everything below shares, so that the runs
# do not each compile the same packages beside one another: the e2e test
# binary (listing its tests compiles it, and with it most of the module's
# packages with -race), and the commands and examples the e2e tests build
# and run, built as they build them (static: test/e2e's goBuild). On a cold
# build cache, the first e2e test of each shard otherwise waits minutes
# for its daemon's build.
list="$(mktemp)"
trap 'rm -f "$list"' EXIT
"$go" test -race -list '^Test' ./test/e2e >"$list" & listing=$!
CGO_ENABLED=0 "$go" build -trimpath ./cmd/... ./examples/... & building=$!
wait "$listing" || { cat "$list" >&2; exit 1; }
wait "$building"
mapfile -t tests < <(grep '^Test' "$list")
[[ ${#tests[@]} -gt 0 ]] || { echo "test.sh: go test -list named no e2e tests" >&2; exit 1; }

pids=()
mapfile -t others < <("$go" list ./... | grep -v '/test/e2e$')
"$go" test "${flags[@]}" "${others[@]}" & pids+=($!)
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
