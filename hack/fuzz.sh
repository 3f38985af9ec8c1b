#!/usr/bin/env bash
# fuzz.sh runs each fuzz target named in $FUZZ_TARGETS (package:Target,
# space-separated) for $FUZZTIME, one after another: make fuzz, and make
# test after the unit tests passed (hack/test.sh). Exits at the first
# failure.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
go="${GO:-go}"
for t in ${FUZZ_TARGETS:?}; do
	echo "fuzz ${t#*:} (${t%%:*}) for ${FUZZTIME:?}" >&2
	"$go" test -run '^$' -fuzz "^${t#*:}\$" -fuzztime "$FUZZTIME" "${t%%:*}"
done
