#!/usr/bin/env bash
# run.sh runs controller-runtime's own envtest suites (pkg/cache and
# pkg/client of CR_VERSION) direct and with the suite's rest.Config wrapped
# by informerd's wrapconfig.Wrap against an informerd daemon on the same
# control plane, and compares them spec by spec (issue 28).
#
# It takes controller-runtime's source from the Go module proxy, copies it
# to a temporary directory, adds informerdwrap.go.txt to each suite's
# package (zz_informerd_wrap_test.go) and one line to its BeforeSuite,
# `cfg = informerdWrap(cfg)`, which does nothing unless INFORMERD_WRAP=1
# (so direct and wrapped runs use the same test binary), and one to its
# AfterSuite, `informerdStop()` before envtest stops (the API server waits
# for open watches when it shuts down, the daemon's among them), points envtest at
# informerd's cached control plane binaries (test/controlplane/build.sh),
# and replaces github.com/informerd/informerd with this clone.
#
# Environment (all optional):
#   CRSUITES_SUITES   suites, packages under pkg/ (default: "cache client")
#   CRSUITES_MODES    runs, in order (default: "direct wrapped wrapped nowatchlist"):
#                     direct; wrapped; nowatchlist = wrapped with
#                     KUBE_FEATURE_WatchListClient=false (client-go lists, then watches)
#   CRSUITES_OUT      where logs, reports and the summary go (default: _output/crsuites)
#   CRSUITES_TIMEOUT  go test -timeout of one suite run (default: 60m)
#   CR_VERSION        controller-runtime version (default: v0.25.3)
#   CRSUITES_GINKGO   more flags for every suite run, split at spaces, e.g.
#                     -ginkgo.focus=write\sthen\sread (a space in a regexp as \s)
#
# It prints, and writes to $CRSUITES_OUT/summary.txt, each run's
# passed/failed/pending/skipped counts and wall time, what the wrapped
# config served and passed through (informerd_client_wrap_requests_total
# by outcome and reason), and "specs passing only direct: N" with their names.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
here="$repo/hack/crsuites"
cr_version="${CR_VERSION:-v0.25.3}"
suites=(${CRSUITES_SUITES:-cache client})
modes=(${CRSUITES_MODES:-direct wrapped wrapped nowatchlist})
out="${CRSUITES_OUT:-$repo/_output/crsuites}"
timeout="${CRSUITES_TIMEOUT:-60m}"
export GOFLAGS="-mod=mod -buildvcs=false"

command -v jq >/dev/null || { echo "crsuites: jq is needed to read ginkgo's JSON reports (apt-get install jq)" >&2; exit 1; }
mkdir -p "$out"
rm -f "$out"/*.json "$out"/*.log "$out"/*.counts "$out"/*.specs "$out"/*.time "$out/summary.txt"
log() { echo "crsuites: $*" >&2; }

# The control plane: envtest needs kube-apiserver, etcd and kubectl.
assets="$("$repo/test/controlplane/build.sh" 2>/dev/null | tail -n1)"
for b in kube-apiserver etcd kubectl; do
	[[ -x "$assets/$b" ]] || { echo "crsuites: $assets/$b is missing (test/controlplane/build.sh)" >&2; exit 1; }
done
export KUBEBUILDER_ASSETS="$assets"

work="$(mktemp -d "${TMPDIR:-/tmp}/crsuites-XXXXXX")"
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT

log "building informerd"
(cd "$repo" && go build -o "$work/informerd" ./cmd/informerd)

log "fetching sigs.k8s.io/controller-runtime@$cr_version"
dir="$(cd "$work" && GOFLAGS= go mod download -json "sigs.k8s.io/controller-runtime@$cr_version" | jq -r .Dir)"
[[ -d "$dir" ]] || { echo "crsuites: go mod download gave no directory for controller-runtime@$cr_version" >&2; exit 1; }
src="$work/controller-runtime"
cp -R "$dir" "$src"
chmod -R u+w "$src"

for s in "${suites[@]}"; do
	pkgdir="$src/pkg/$s"
	suite="$(grep -l 'cfg, err = testenv.Start()' "$pkgdir"/*_suite_test.go)"
	pkgname="$(sed -n 's/^package \([a-z_]*\)$/\1/p' "$suite" | head -n1)"
	sed "s/^package PACKAGE$/package $pkgname/" "$here/informerdwrap.go.txt" > "$pkgdir/zz_informerd_wrap_test.go"
	# One line after envtest's Start and its check, cfg = informerdWrap(cfg),
	# and one before envtest's Stop, informerdStop().
	awk '
		/cfg, err = testenv.Start\(\)/ { started = 1 }
		/testenv\.Stop\(\)/ { print "\tinformerdStop()"; m++ }
		{ print }
		started && /Expect\(err\)\.NotTo\(HaveOccurred\(\)\)/ { print "\tcfg = informerdWrap(cfg)"; started = 0; n++ }
		END { if (n != 1 || m != 1) exit 1 }
	' "$suite" > "$suite.new" || { echo "crsuites: $suite: could not find where envtest starts and stops" >&2; exit 1; }
	mv "$suite.new" "$suite"
done

log "requiring github.com/informerd/informerd from $repo; go mod tidy"
(cd "$src" && go mod edit -require=github.com/informerd/informerd@v0.0.0 -replace="github.com/informerd/informerd=$repo" && go mod tidy)

for s in "${suites[@]}"; do
	log "compiling pkg/$s's tests"
	(cd "$src" && nice -n 15 go test -c -o "$work/$s.test" "./pkg/$s/")
done

# specs FILE: one line per It of a ginkgo JSON report, "state<TAB>full name",
# a name seen twice numbered (#2, ...).
specs() {
	jq -r '.[].SpecReports[] | select(.LeafNodeType == "It")
		| [.State, ((.ContainerHierarchyTexts // []) + [.LeafNodeText] | join(" "))] | @tsv' "$1" |
		awk -F'\t' '{ n[$2]++; name = $2; if (n[$2] > 1) name = name " #" n[$2]; print $1 "\t" name }' | sort -t$'\t' -k2
}

runs=()
declare -A seen
for m in "${modes[@]}"; do
	seen[$m]=$(( ${seen[$m]:-0} + 1 ))
	run="$m${seen[$m]}"
	runs+=("$run")
	for s in "${suites[@]}"; do
		name="$s-$run"
		env=(INFORMERD_BIN="$work/informerd" INFORMERD_LOG="$out/$name.informerd.log" INFORMERD_WRAP_METRICS="$out/$name.counts")
		case "$m" in
		direct) ;;
		wrapped) env+=(INFORMERD_WRAP=1) ;;
		nowatchlist) env+=(INFORMERD_WRAP=1 KUBE_FEATURE_WatchListClient=false) ;;
		*) echo "crsuites: unknown mode $m (direct, wrapped, nowatchlist)" >&2; exit 2 ;;
		esac
		log "running pkg/$s $run"
		start=$(date +%s)
		rc=0
		(cd "$src/pkg/$s" && env "${env[@]}" nice -n 15 "$work/$s.test" -test.count=1 -test.timeout="$timeout" \
			-ginkgo.v -ginkgo.no-color -ginkgo.json-report="$out/$name.json" ${CRSUITES_GINKGO:-}) > "$out/$name.log" 2>&1 || rc=$?
		echo "$(( $(date +%s) - start )) $rc" > "$out/$name.time"
		if [[ -s "$out/$name.json" ]]; then
			specs "$out/$name.json" > "$out/$name.specs"
		else
			log "pkg/$s $run wrote no report (exit $rc): $out/$name.log"
			: > "$out/$name.specs"
		fi
	done
done

{
	for s in "${suites[@]}"; do
		echo "== pkg/$s (controller-runtime $cr_version)"
		for run in "${runs[@]}"; do
			name="$s-$run"
			read -r secs rc < "$out/$name.time"
			printf '%-14s passed %3d  failed %3d  pending %3d  skipped %3d  of %3d  %4ds (exit %d)\n' "$run" \
				"$(grep -c '^passed' "$out/$name.specs" || true)" "$(grep -c -E '^(failed|panicked|timedout|interrupted|aborted)' "$out/$name.specs" || true)" \
				"$(grep -c '^pending' "$out/$name.specs" || true)" "$(grep -c '^skipped' "$out/$name.specs" || true)" \
				"$(wc -l < "$out/$name.specs")" "$secs" "$rc"
			if [[ -s "$out/$name.counts" ]]; then
				sed 's/^/    /' "$out/$name.counts"
			fi
		done
		direct=()
		for run in "${runs[@]}"; do [[ $run == direct* ]] && direct+=("$run"); done
		[[ ${#direct[@]} -gt 0 ]] || continue
		# Passing direct: in every direct run.
		passdirect="$work/$s.passdirect"
		first=1
		for run in "${direct[@]}"; do
			grep -P '^passed\t' "$out/$s-$run.specs" | cut -f2 | sort > "$work/$s.p"
			if (( first )); then cp "$work/$s.p" "$passdirect"; first=0; else comm -12 "$passdirect" "$work/$s.p" > "$work/$s.q"; mv "$work/$s.q" "$passdirect"; fi
		done
		only="$work/$s.only"
		: > "$only"
		for run in "${runs[@]}"; do
			[[ $run == direct* ]] && continue
			grep -P '^passed\t' "$out/$s-$run.specs" | cut -f2 | sort > "$work/$s.p"
			comm -23 "$passdirect" "$work/$s.p" | sed "s/\$/\t$run/" >> "$only"
		done
		echo "specs passing only direct: $(cut -f1 "$only" | sort -u | grep -c . || true)"
		sort "$only" | awk -F'\t' '{ runs[$1] = runs[$1] (runs[$1] ? "," : "") $2 } END { for (n in runs) print "  " n "  [not in " runs[n] "]" }' | sort
	done
} | tee "$out/summary.txt"
