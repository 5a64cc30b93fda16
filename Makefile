.DEFAULT_GOAL := help

# Every target whose line carries "## description" is listed by `make help`.

STATICCHECK_VERSION ?= v0.8.2
TS_CLIENT := testdata/ts-client
# npm ci writes this hidden lockfile; when it is missing or older than
# package-lock.json, node_modules is missing or stale.
TS_CLIENT_INSTALLED := $(TS_CLIENT)/node_modules/.package-lock.json
# The upstream tool server the proxy tests run (TypeScript SDK + better-sqlite3).
TS_UPSTREAM := testdata/ts-upstream
TS_UPSTREAM_INSTALLED := $(TS_UPSTREAM)/node_modules/.package-lock.json
# LangGraph JS with @langchain/mcp-adapters, a client of the interop matrix.
LANGGRAPH_JS := testdata/langgraph-js
LANGGRAPH_JS_INSTALLED := $(LANGGRAPH_JS)/node_modules/.package-lock.json
# The official MCP conformance suite, with the Node 22 it needs.
CONFORMANCE := testdata/conformance
CONFORMANCE_INSTALLED := $(CONFORMANCE)/node_modules/.package-lock.json
# Claude Code's CLI, a client of the interop matrix: npm installs the
# native build for this platform only (an optional dependency).
CLAUDE_CODE := testdata/claude-code
CLAUDE_CODE_INSTALLED := $(CLAUDE_CODE)/node_modules/.package-lock.json
# The authorization server of the OAuth tests (the npm oidc-provider).
OIDC_PROVIDER := testdata/oidc-provider
OIDC_PROVIDER_INSTALLED := $(OIDC_PROVIDER)/node_modules/.package-lock.json
# The official MCP Tasks client (@modelcontextprotocol/ext-tasks with
# @modelcontextprotocol/client 2.x), run by tasks_interop_test.go.
EXT_TASKS := testdata/ext-tasks
EXT_TASKS_INSTALLED := $(EXT_TASKS)/node_modules/.package-lock.json
NPM_INSTALLED := $(TS_CLIENT_INSTALLED) $(TS_UPSTREAM_INSTALLED) $(LANGGRAPH_JS_INSTALLED) $(CONFORMANCE_INSTALLED) $(CLAUDE_CODE_INSTALLED) $(EXT_TASKS_INSTALLED) $(OIDC_PROVIDER_INSTALLED)
# Python clients and the Python upstream run in three virtual environments:
# "seed" pins the versions the seed write-up measured with (mcp 1.29.1,
# langgraph 1.2.11, langchain-mcp-adapters 0.3.2, langchain-core 1.6.1),
# "latest" the newest that install together with LangGraph (whose adapter
# wants mcp < 2), "newest" the newest mcp alone (2.3.0).
PYTHON ?= python3
PY_DIR := testdata/python
PY_ENVS := seed latest newest
PY_INSTALLED := $(foreach e,$(PY_ENVS),$(PY_DIR)/.venv-$(e)/.installed)

.PHONY: help
help: ## Show this list of targets
	@awk 'BEGIN { FS = ":.*## " } /^[a-zA-Z0-9_\/.-]+:.*## / { printf "  %-12s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build bin/mcp-outbox
	go build -buildvcs=auto -o bin/mcp-outbox ./cmd/mcp-outbox

# npm ci in a test program's directory, when its lockfile is newer than
# what is installed.
testdata/%/node_modules/.package-lock.json: testdata/%/package-lock.json testdata/%/package.json
	cd testdata/$* && npm ci --no-audit --no-fund
	@touch $@

# A venv is rebuilt from scratch when its requirements change, so that a
# package dropped from the list does not linger.
$(PY_DIR)/.venv-%/.installed: $(PY_DIR)/requirements-%.txt
	rm -rf $(PY_DIR)/.venv-$*
	$(PYTHON) -m venv $(PY_DIR)/.venv-$*
	$(PY_DIR)/.venv-$*/bin/pip install --quiet --disable-pip-version-check --no-input -r $<
	@touch $@

.PHONY: py
py: $(PY_INSTALLED) ## Create the Python virtual environments the interop tests use
.PHONY: test
test: $(NPM_INSTALLED) $(PY_INSTALLED) ## Run all tests with the race detector (end-to-end: interop matrix, conformance suite, chaos), and the store suites on PostgreSQL
	@# cmd/mcp-outbox/e2e starts processes (serve, proxy, the interop
	@# clients, PostgreSQL) and mostly waits on them: it starts first, in
	@# the background, with E2E_PARALLEL of its tests at once rather than
	@# go test's default of one per CPU. The other packages, then the
	@# store-level suites once more on PostgreSQL (a throwaway cluster the
	@# tests start; MCP_OUTBOX_TEST_POSTGRES=URL uses a running server), run
	@# beside it. Its output is shown when it ends.
	@e2elog=$$(mktemp); \
	MCP_OUTBOX_REQUIRE_INTEROP=1 MCP_OUTBOX_REQUIRE_POSTGRES=1 go test -race -count=1 -parallel $(E2E_PARALLEL) -timeout 30m ./cmd/mcp-outbox/e2e >$$e2elog 2>&1 & e2epid=$$!; \
	echo "go test ./cmd/mcp-outbox/e2e: running beside the rest (its output follows when it ends)"; \
	MCP_OUTBOX_REQUIRE_INTEROP=1 MCP_OUTBOX_REQUIRE_POSTGRES=1 go test -race -count=1 -timeout 30m $$(go list ./... | grep -v '/cmd/mcp-outbox/e2e$$'); rest=$$?; \
	MCP_OUTBOX_REQUIRE_POSTGRES=1 MCP_OUTBOX_TEST_STORE=postgres go test -race -count=1 -timeout 15m ./outbox ./outbox/dispatch ./query ./schema; pg=$$?; \
	wait $$e2epid; e2e=$$?; cat $$e2elog; rm -f $$e2elog; \
	echo "make test: cmd/mcp-outbox/e2e exit $$e2e, the other packages $$rest, the PostgreSQL store suites $$pg"; \
	test $$e2e -eq 0 && test $$rest -eq 0 && test $$pg -eq 0

# How many of cmd/mcp-outbox/e2e's tests run at once under make test. Its
# tests wait on processes more than they compute (alone, the package keeps
# 77 % of one CPU busy), so more than the two CPUs: on a fresh clone the
# package took 557 s at 4 and 494 s at 8, beside the other packages. On a
# machine loaded by other work (load average 20-35 on two cores) 6 was
# already too many: a Python upstream behind the proxy took over the Tasks
# client's 15 s to answer its first request (TestProxyTasksInterop, which
# passes in 21 s on a quiet machine). Lower it on a busy machine.
E2E_PARALLEL ?= 8

.PHONY: test/short
test/short: ## Run the unit and contract tests, quickly (-short, no race detector, without cmd/mcp-outbox/e2e: no interop clients, soaks or chaos)
	go test -short -count=1 $$(go list ./... | grep -v '/cmd/mcp-outbox/e2e$$')

# The chaos soak at full size, on SQLite and then on PostgreSQL (where the
# monkey also kills PostgreSQL); CHAOS_STORE=sqlite or postgres runs one.
# CHAOS_SEED=N replays a run (each run logs its seed). `make test` runs the
# same tests with 500 and 300 calls.
CHAOS_CALLS ?= 10000
CHAOS_STORE ?= sqlite postgres
.PHONY: chaos
chaos: ## Chaos soaks, SQLite then PostgreSQL: 10,000 logical calls each while servers, the downstream and PostgreSQL are SIGKILLed (CHAOS_CALLS=N, CHAOS_SEED=N, CHAOS_STORE=sqlite|postgres)
	@set -e; for store in $(CHAOS_STORE); do \
		case $$store in \
		sqlite) test=TestChaosSoak ;; \
		postgres) test=TestChaosSoakPostgres ;; \
		*) echo "CHAOS_STORE=$$store: want sqlite or postgres"; exit 2 ;; \
		esac; \
		echo "==> $$test, CHAOS_CALLS=$(CHAOS_CALLS)"; \
		CHAOS_CALLS=$(CHAOS_CALLS) MCP_OUTBOX_REQUIRE_POSTGRES=1 go test -count=1 -run "^$$test\$$" -v -timeout 60m ./cmd/mcp-outbox/e2e/; \
	done

# The fault campaign (issue 29) at full size: 3 replicas on PostgreSQL and
# 2 processes on one SQLite file under a seeded nemesis, checked by
# internal/history. Each run prints its seed and a summary table;
# JEPSEN_SEED=N replays a schedule; JEPSEN_ROUNDS=N plays at least N faults
# of every kind. `make test` runs the same tests with about 300 operations
# and one fault of each kind.
JEPSEN_OPS ?= 10000
JEPSEN_ROUNDS ?= 10
JEPSEN_STORE ?= postgres sqlite
.PHONY: jepsen
jepsen: ## Fault campaign: replicas under partitions, slow links, clock skew, pauses, kills and PostgreSQL restarts, histories checked (JEPSEN_OPS=N, JEPSEN_ROUNDS=N, JEPSEN_SEED=N, JEPSEN_STORE=postgres|sqlite)
	@set -e; for store in $(JEPSEN_STORE); do \
		case $$store in \
		postgres) test=TestJepsen_Postgres ;; \
		sqlite) test=TestJepsen_SQLite ;; \
		*) echo "JEPSEN_STORE=$$store: want postgres or sqlite"; exit 2 ;; \
		esac; \
		echo "==> $$test, JEPSEN_OPS=$(JEPSEN_OPS) JEPSEN_ROUNDS=$(JEPSEN_ROUNDS)"; \
		summary=$$(mktemp); \
		MCP_OUTBOX_JEPSEN_OPS=$(JEPSEN_OPS) MCP_OUTBOX_JEPSEN_ROUNDS=$(JEPSEN_ROUNDS) MCP_OUTBOX_JEPSEN_SUMMARY=$$summary $(if $(JEPSEN_SEED),MCP_OUTBOX_JEPSEN_SEED=$(JEPSEN_SEED)) MCP_OUTBOX_REQUIRE_POSTGRES=1 \
			go test -count=1 -run "^$$test\$$" -timeout 120m ./cmd/mcp-outbox/e2e/ || { cat $$summary; rm -f $$summary; exit 1; }; \
		cat $$summary; rm -f $$summary; \
	done

.PHONY: lint
lint: ## Check formatting (gofmt), go vet and staticcheck
	@unformatted=$$(find . -name node_modules -prune -o -name '*.go' -print | xargs gofmt -l); \
	if [ -n "$$unformatted" ]; then echo "gofmt -l: not formatted:"; echo "$$unformatted"; exit 1; fi
	go vet ./...
	go vet -tags failpoints ./...
	go run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...

# Fuzzing: every Fuzz function in a file *fuzz_test.go, found by package.
# Seed corpora live in each package's testdata/fuzz/<FuzzName>/; inputs the
# fuzzer finds interesting stay in go's cache. go test fuzzes one target per
# package per run, so targets run one after another.
FUZZ_PKGS = $(sort $(patsubst %/,./%,$(dir $(shell find . -name node_modules -prune -o -name '*fuzz_test.go' -print | sed 's|^\./||'))))
FUZZTIME ?= 1m
# CI's run is a count, not a duration: Go 1.26's fuzzing coordinator can
# fail a target with a bare "context deadline exceeded" (no input written)
# when a wall-clock -fuzztime ends while a worker is starved of CPU
# (golang/go#75804, fixed in Go 1.27); .ci/run failed so on a fresh clone.
# A count has no deadline to race. 2000 runs take 1-13 s a target here.
# FUZZTIME (make fuzz, by hand) stays a duration and can still meet it.
FUZZTIME_SHORT ?= 2000x
# One worker per target: the machines this runs on have two shared cores.
# A new input is minimized for at most 10 s (go's default is 60 s, which
# the slower targets, whole sessions, spend on every input they find).
FUZZFLAGS ?= -parallel 1 -fuzzminimizetime 10s

.PHONY: fuzz
fuzz: ## Run every fuzz target for FUZZTIME each (default 1m), one after another
	@set -e; for p in $(FUZZ_PKGS); do \
		targets=$$(go test -list '^Fuzz' $$p) || { echo "$$targets"; exit 1; }; \
		for t in $$(echo "$$targets" | grep '^Fuzz'); do \
			echo "==> $$p $$t for $(FUZZTIME)"; \
			go test -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) $(FUZZFLAGS) $$p; \
		done; \
	done

.PHONY: fuzz/short
fuzz/short: ## Run every fuzz target 2000 times (CI); packages side by side, each package's targets in turn
	@dir=$$(mktemp -d); pids=""; \
	for p in $(FUZZ_PKGS); do \
		$(MAKE) --no-print-directory fuzz FUZZ_PKGS=$$p FUZZTIME=$(FUZZTIME_SHORT) >"$$dir/$$(echo $$p | tr ./ __).log" 2>&1 & pids="$$pids $$!"; \
	done; \
	failed=0; for pid in $$pids; do wait $$pid || failed=1; done; \
	cat "$$dir"/*.log; rm -rf "$$dir"; exit $$failed

# sqlc, pinned in a module of its own (examples/sqlc/tools/go.mod, a tool
# directive), so that its dependencies stay out of the library's go.mod.
# Its PostgreSQL parser needs cgo. The first run builds it (about 150 s of
# CPU here); later runs take it from the build cache.
SQLC := cd examples/sqlc/tools && go tool sqlc

.PHONY: sqlc
sqlc: ## Regenerate examples/sqlc's Go code with the pinned sqlc
	$(SQLC) generate -f ../sqlc.yaml

.PHONY: sqlc/check
sqlc/check: ## Check that examples/sqlc's checked-in code is what the pinned sqlc generates
	$(SQLC) diff -f ../sqlc.yaml

.PHONY: bench
bench: ## Measure the targets against their baselines: the in-process table, what tracing costs, then from outside over HTTP and stdio (ARGS for outbox-bench, LOAD_ARGS for outbox-load)
	@go run ./cmd/outbox-bench $(ARGS)
	@# What tracing costs a call: off (no OTEL_* set: the no-op provider)
	@# against no tracing code at all, and a recording SDK for reference.
	@# On stderr: stdout holds the two tables (for JSON alone, run
	@# go run ./cmd/outbox-bench --json).
	@echo "==> tracing overhead (go test -bench 'BenchmarkTracing|BenchmarkTraceMiddleware' ./outbox/)" 1>&2
	@go test -run '^$$' -bench 'BenchmarkTracing|BenchmarkTraceMiddleware' -benchtime 2000x -count 3 -benchmem ./outbox/ 1>&2
	@# From outside, as a user's load arrives: servers as processes, the load
	@# as another, against the limit (nothing kept) and a careful bare server.
	@go run ./cmd/outbox-load $(LOAD_ARGS)

# The PostgreSQL matrix: each server reaches PostgreSQL through a proxy
# that delays each direction by half the RTT and counts round trips.
PG_LOAD_ARGS ?= --rtt 0,1ms --clients 1,32
.PHONY: bench/postgres
bench/postgres: ## From outside over HTTP on PostgreSQL at 0 and 1 ms RTT, 1 and 32 clients: the layer vs the limit, a careful bare server, a pgx one, 3 replicas; round trips and commits per call (ARGS=--help; ARGS=--tasks: a task vs a plain call)
	go run ./cmd/outbox-load --store postgres $(PG_LOAD_ARGS) $(ARGS)

.PHONY: bench/amplify
bench/amplify: ## What one token can make serve spend (issue 37): peak RSS for 16 concurrent 4 MiB calls, CPU for 1 MB nested 990 deep vs flat, 3 runs (ARGS=--help)
	go run ./cmd/outbox-load amplify $(ARGS)

.PHONY: bench/go
bench/go: ## Run the go test benchmarks of the hot paths (compare runs with benchstat)
	go test -run '^$$' -bench . -benchmem ./...

.PHONY: demo
demo: ## Reproduce the duplicate-call scenarios, without and with the layer
	go run ./cmd/mcp-outbox demo

.PHONY: clean
clean: ## Remove bin/, local databases and the TypeScript test programs' node_modules
	rm -rf bin $(TS_CLIENT)/node_modules $(TS_UPSTREAM)/node_modules $(LANGGRAPH_JS)/node_modules $(CONFORMANCE)/node_modules $(CLAUDE_CODE)/node_modules $(OIDC_PROVIDER)/node_modules $(EXT_TASKS)/node_modules $(PY_DIR)/.venv-*
	rm -f mcp-outbox.db mcp-outbox.db-wal mcp-outbox.db-shm
