# informerd — run `make help` for the targets.

SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

GO        ?= go
BIN       := $(CURDIR)/_output/bin
CLUSTER   := $(CURDIR)/_output/cluster
# E2E_RUN selects e2e tests by name, e.g. make test-e2e E2E_RUN=TestSmoke.
E2E_RUN   ?= .
TEST_FLAGS ?=
# VERSION is stamped into the binaries (informerd -version) and the image.
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
LDFLAGS   := -X github.com/informerd/informerd/internal/version.Version=$(VERSION)

.PHONY: help
help: ## List the targets.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build informerd's binaries into _output/bin.
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/...

# PLATFORMS is what `make image` builds: os/arch[,os/arch...]; more than one
# makes a multi-arch index. IMAGE_DIR is the OCI image layout it writes.
PLATFORMS ?= linux/amd64
IMAGE_DIR ?= $(CURDIR)/_output/image
# The image's files and creation time: the last commit's time, so the same
# commit gives the same digests.
export SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)

.PHONY: image
image: ## Build the static, non-root OCI image (no Docker) into _output/image (VERSION, PLATFORMS).
	$(GO) -C hack/image run . -go='$(GO)' -root='$(CURDIR)' -out='$(IMAGE_DIR)' -version='$(VERSION)' \
		-platforms='$(PLATFORMS)' -revision='$(shell git rev-parse HEAD 2>/dev/null)'

.PHONY: controlplane
controlplane: ## Build the test control plane, kwok and helm (cached outside the clone; ~15 min cold).
	@test/controlplane/build.sh >/dev/null

.PHONY: promtool
promtool: ## Fetch Debian's promtool, or build it, which checks and unit-tests the alerts (cached outside the clone).
	@hack/monitoring/build.sh >/dev/null

.PHONY: helm
helm: ## Build helm (v4, with the control plane), which renders and installs the chart in the tests; prints its path.
	@echo "$$(test/controlplane/build.sh)/helm"

# test-tools builds what the tests run beside the code, at once (promtool
# is mostly a download). A failure of either stops make test.
.PHONY: test-tools
test-tools:
	@pids=(); for b in test/controlplane/build.sh hack/monitoring/build.sh; do \
		"$$b" >/dev/null & pids+=($$!); \
	done; for p in "$${pids[@]}"; do wait "$$p"; done

# E2E_SHARDS is how many processes make test splits the e2e tests over,
# each with a control plane of its own (hack/test.sh).
E2E_SHARDS ?= 2

.PHONY: test
test: test-tools ## Run every test (unit and e2e, in E2E_SHARDS processes) with -race, then each fuzz target briefly; builds the control plane, promtool and helm if needed.
	INFORMERD_PROMTOOL="$$(hack/monitoring/build.sh 2>/dev/null)/promtool" INFORMERD_HELM="$$(test/controlplane/build.sh 2>/dev/null)/helm" \
		GO='$(GO)' E2E_SHARDS='$(E2E_SHARDS)' TEST_FLAGS='$(TEST_FLAGS)' hack/test.sh
	cd hack/plot && $(GO) test -race -count=1 ./...
	$(MAKE) --no-print-directory fuzz

# CHAOS_DURATION is how long `make chaos` injects faults; CHAOS_SEED repeats a run.
CHAOS_DURATION ?= 10m
CHAOS_SEED ?=

.PHONY: chaos
chaos: controlplane ## A long seeded chaos run (faults + mutations; CHAOS_DURATION, CHAOS_SEED).
	INFORMERD_CHAOS_DURATION=$(CHAOS_DURATION) INFORMERD_CHAOS_SEED=$(CHAOS_SEED) \
		$(GO) test -race -count=1 -timeout=0 -run '^TestChaos$$' -v ./test/e2e/

# FUZZTIME is how long `make fuzz` runs each fuzz target: a count of
# executions (about 10 s each here), or a duration such as 1m. The default
# is a count because Go 1.26's fuzz coordinator can fail a duration-bound
# run at its deadline with "context deadline exceeded" and no crasher when
# the machine is loaded (go.dev/issue/75804, fixed in Go 1.27); a count has
# no deadline to race.
FUZZTIME ?= 10000x
FUZZ_TARGETS := ./auth:FuzzBearerToken ./cache:FuzzDecodeObject ./cache:FuzzDecodeProtoObject ./cache:FuzzWatchStream ./cache:FuzzShareManagedFields ./daemon:FuzzValidateWatch ./daemon:FuzzValidateWatchAddress ./daemon:FuzzValidateWatchStatus ./client:FuzzWatcherApply

.PHONY: fuzz
fuzz: ## Run each fuzz target for FUZZTIME (default 10000x: 10,000 executions).
	@for t in $(FUZZ_TARGETS); do \
		echo "fuzz $${t#*:} ($${t%%:*}) for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$${t#*:}$$" -fuzztime $(FUZZTIME) "$${t%%:*}" || exit 1; \
	done

.PHONY: test-unit
test-unit: ## Run the unit tests only (no control plane).
	$(GO) test -race -count=1 $(TEST_FLAGS) $$($(GO) list ./... | grep -v /test/e2e)

.PHONY: test-e2e
test-e2e: controlplane ## Run the e2e tests matching E2E_RUN against a fresh control plane.
	INFORMERD_HELM="$$(test/controlplane/build.sh 2>/dev/null)/helm" $(GO) test -race -count=1 -timeout=30m -run '$(E2E_RUN)' -v $(TEST_FLAGS) ./test/e2e/...

# CLUSTER_FLAGS, e.g. CLUSTER_FLAGS="-apiserver-port 6443".
CLUSTER_FLAGS ?=

.PHONY: cluster-up
cluster-up: controlplane ## Start a detached local control plane; prints its kubeconfig.
	$(GO) run ./test/controlplane/cluster up -dir $(CLUSTER) $(CLUSTER_FLAGS)

.PHONY: cluster-down
cluster-down: ## Stop the control plane cluster-up started.
	$(GO) run ./test/controlplane/cluster down -dir $(CLUSTER)

# DEMO_FLAGS, e.g. DEMO_FLAGS="-clients 10 -wait".
DEMO_FLAGS ?=

.PHONY: demo
demo: controlplane build ## Control plane + informerd + 5 informerctl clients sharing one informer; prints a table.
	$(GO) run ./test/demo -bin $(BIN) $(DEMO_FLAGS)

# BENCH_QUICK=1 runs the short form of `make bench`; BENCH_FLAGS go to the
# harness (e.g. BENCH_FLAGS="-clients 1,10 -modes direct,shared-nostore").
BENCH_QUICK ?=
BENCH_FLAGS ?=
# BENCH_GO selects the Go benchmarks `make bench-go` runs; BENCH_TIME is
# go test's -benchtime (e.g. 2000x); BENCH_COUNT repeats them.
BENCH_GO ?= .
BENCH_TIME ?= 1s
BENCH_COUNT ?= 1

.PHONY: bench
bench: controlplane build ## Direct client-go informers vs informerd, side by side on the local control plane (BENCH_QUICK=1: a few minutes).
	$(GO) build -o $(BIN)/bench ./test/bench
	BENCH_QUICK=$(BENCH_QUICK) $(BIN)/bench -bin $(BIN) $(BENCH_FLAGS)
	$(MAKE) --no-print-directory plot

.PHONY: plot
plot: ## Draw _output/bench/results.json (make bench's) as SVG plots beside it (hack/plot).
	cd hack/plot && $(GO) run . -in $(CURDIR)/_output/bench/results.json

# BENCH_STATUS_FLAGS go to `bench status` (e.g. BENCH_STATUS_FLAGS="-deployments 1000 -appliers 1";
# "-appliers= -rollout 1000": only the rollout of a 1,000-replica Deployment;
# "-deployments 5000 -appliers 1 -modes informerd" is one applier of 5,000 Deployments, beyond one 64 KiB request).
BENCH_STATUS_FLAGS ?=

.PHONY: bench-status
bench-status: controlplane build ## cli-utils appliers waiting through informerd's WatchStatus vs DefaultStatusWatcher (default 200 Deployments per applier, 1 then 5 appliers).
	$(GO) build -o $(BIN)/bench ./test/bench
	$(BIN)/bench status -bin $(BIN) $(BENCH_STATUS_FLAGS)

# BENCH_IDLE_FLAGS go to `bench idle` (e.g. BENCH_IDLE_FLAGS="-streams 100 -window 20s -kinds baseline,status").
BENCH_IDLE_FLAGS ?=

.PHONY: bench-idle
bench-idle: controlplane build ## Daemon CPU, goroutines and memory of 1,000 idle Watch, WatchStatus and WatchAddress streams (each, and none) over a 60 s window.
	$(GO) build -o $(BIN)/bench ./test/bench
	$(BIN)/bench idle -bin $(BIN) $(BENCH_IDLE_FLAGS)

# BENCH_FLEET_FLAGS go to `bench fleet` (e.g. BENCH_FLEET_FLAGS="-k 100 -modes informerd,informerd-norecovery",
# or "-profile mesh -k 10,50": a proxy per Pod of each node).
# BENCH_QUICK=1: K = 10 only, shorter windows (a few minutes).
BENCH_FLEET_FLAGS ?=

.PHONY: bench-fleet
bench-fleet: controlplane build ## K simulated nodes (10, 50, 100), each an informerd with 5 consumers (-profile mesh: a proxy per Pod), vs the same consumers direct: API server cost, events against the floor, rolling upgrade, upgrade while the API server is down, API server restart (docs/scale.md).
	$(GO) build -o $(BIN)/bench ./test/bench
	BENCH_QUICK=$(BENCH_QUICK) $(BIN)/bench fleet -bin $(BIN) $(BENCH_FLEET_FLAGS)

# BENCH_MEMORY_FLAGS go to `bench memory` (e.g. BENCH_MEMORY_FLAGS="-pods 5000 -encodings json,protobuf");
# -configmaps N sets the ConfigMaps (0: none), -heap-profiles DIR keeps the daemons' heap profiles;
# BENCH_QUICK=1 runs 2,000 Pods and 2,000 ConfigMaps.
BENCH_MEMORY_FLAGS ?=

.PHONY: bench-memory
bench-memory: controlplane build ## Daemon heap and RSS per stored object at 10,000 and 30,000 Pods and 10,000 1 KiB ConfigMaps (JSON, protobuf, metadata view), the address view, vs client-go informers (BENCH_QUICK=1: 2,000 of each).
	$(GO) build -o $(BIN)/bench ./test/bench
	BENCH_QUICK=$(BENCH_QUICK) $(BIN)/bench memory -bin $(BIN) $(BENCH_MEMORY_FLAGS)

.PHONY: bench-go
bench-go: ## The Go benchmarks (fan-out over Unix sockets vs the raw baseline, the cache, address answers, status per Pod event) with -benchmem.
	$(GO) test -run '^$$' -bench '$(BENCH_GO)' -benchmem -benchtime $(BENCH_TIME) -count $(BENCH_COUNT) ./daemon ./cache ./client ./address ./status

# CRSUITES_SUITES and CRSUITES_MODES choose what `make crsuites` runs (see
# hack/crsuites/run.sh), e.g. CRSUITES_SUITES=client CRSUITES_MODES="direct wrapped".
CRSUITES_SUITES ?= cache client
CRSUITES_MODES ?= direct wrapped wrapped nowatchlist

.PHONY: crsuites
crsuites: controlplane ## controller-runtime's own envtest suites (pkg/cache, pkg/client) direct vs through wrapconfig.Wrap, spec by spec (about 20 min; not part of make test).
	CRSUITES_SUITES='$(CRSUITES_SUITES)' CRSUITES_MODES='$(CRSUITES_MODES)' hack/crsuites/run.sh

$(BIN)/buf $(BIN)/golangci-lint: hack/tools/go.mod hack/tools/go.sum
	cd hack/tools && $(GO) build -o $(BIN)/ github.com/bufbuild/buf/cmd/buf github.com/golangci/golangci-lint/v2/cmd/golangci-lint

.PHONY: tools
tools: $(BIN)/buf $(BIN)/golangci-lint ## Build the pinned developer tools (buf, golangci-lint).

.PHONY: generate
generate: $(BIN)/buf ## Regenerate the Go code for proto/.
	$(BIN)/buf generate

.PHONY: check-generate
check-generate: generate ## Fail if regeneration changes anything in git.
	@git add -N proto && git diff --exit-code -- proto || { echo "generated code is stale: run make generate and commit" >&2; exit 1; }

.PHONY: lint
lint: $(BIN)/buf $(BIN)/golangci-lint ## buf lint, buf format and golangci-lint (hack/image too).
	$(BIN)/buf lint
	$(BIN)/buf format --diff --exit-code
	$(BIN)/golangci-lint run ./...
	cd hack/image && $(BIN)/golangci-lint run --config ../../.golangci.yml ./...

.PHONY: breaking
breaking: $(BIN)/buf ## Check proto/ for breaking changes against main.
	$(BIN)/buf breaking --against '.git#branch=main'

.PHONY: clean
clean: ## Remove _output (not the control-plane cache).
	rm -rf _output
