# make test: what CI runs (.ci/run). It installs redis-server, redis-sentinel and chromium
# with apt-get when missing, fetches staticcheck (and the modules go.mod
# lists) through the Go module proxy, then vets, lints and runs every test
# with the race detector. The tests start and stop their own redis-server
# processes on free loopback ports, and a headless chromium for the
# dashboard's test.
GO ?= go
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
# Helm renders and lints deploy/helm/sluice (chart). It is built from its
# own module at this version, as staticcheck is run, never a dependency of
# go.mod; its first build takes minutes on two cores, so the binary is
# kept under GOPATH/bin in a directory named by the version and built
# only when missing.
HELM_VERSION = v4.3.2
HELM_DIR = $(shell $(GO) env GOPATH)/bin/helm-$(HELM_VERSION)
HELM = $(HELM_DIR)/helm

# vet, lint and bench-check compile with the Dockerfile's settings, so
# that the binaries the deploy and CLI tests build (CGO_ENABLED=0,
# -trimpath) share their compiled packages (test runs them beside unit,
# so a package may be compiled by whichever asks first): the tree is
# compiled twice (this way and with -race for unit), not three times. No package of the module uses cgo, so nothing goes unchecked.
STATIC = CGO_ENABLED=0 GOFLAGS=-trimpath

.PHONY: test deps fmt vet lint unit unit-norace bench bench-check chart fuzz screenshot proto build image

# build builds bin/sluice (BIN) stamped with its version and commit, which
# sluice version prints however the tree is checked out (a CI checkout or a
# container context may carry no .git for go build's own stamps): VERSION
# is git describe's (a tag, else the short commit), COMMIT the full commit,
# MODIFIED whether the tree had uncommitted changes. image builds the
# container with the same stamps.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)
MODIFIED ?= $(shell git rev-parse HEAD >/dev/null 2>&1 && { test -z "$$(git status --porcelain)" && echo false || echo true; })
BIN ?= bin/sluice

build:
	$(STATIC) $(GO) build -ldflags "-X main.version=$(VERSION) -X main.commit=$(COMMIT) -X main.modified=$(MODIFIED)" -o $(BIN) ./cmd/sluice

image:
	docker build -f deploy/Dockerfile --build-arg VERSION=$(VERSION) --build-arg REVISION=$(COMMIT) -t sluice:$(VERSION) .

# deps installs redis-sentinel: the Sentinel failover tests, which skip
# without it elsewhere, must run here.
export REDISTEST_REQUIRE_SENTINEL = 1

# After deps and fmt, the checks and the tests run side by side (-j,
# each target's output kept together by -O): the race-detector run's long
# pole, redisstore (~3 min), mostly waits on Redis and on timeouts, which
# vet and lint's CPU fills. One after the other they took 6m03s on two
# loaded cores; CPU alone is about 6.5 min of one core.
test: deps fmt
	@$(MAKE) --no-print-directory -j4 -O vet lint bench-check unit unit-norace chart

deps:
	@command -v redis-server >/dev/null 2>&1 || { \
	  echo "installing redis-server"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }
	@redis-server --version
	@command -v redis-sentinel >/dev/null 2>&1 || { \
	  echo "installing redis-sentinel"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-sentinel >/dev/null; }
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing chromium"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
	@chromium --version 2>/dev/null
	@command -v protoc >/dev/null 2>&1 || { \
	  echo "installing protobuf-compiler"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq protobuf-compiler >/dev/null; }
	@protoc --version

fmt:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

vet:
	$(STATIC) $(GO) vet ./...

lint:
	$(STATIC) $(GO) run $(STATICCHECK) ./...

# unit runs every test, the long process tests too (SLUICE_LONG; a plain
# go test ./... skips them: see redistest.Long in
# internal/testkit). The packages with the longest tests are named first, so
# that go test starts them first rather than last beside idle cores.
unit:
	SLUICE_LONG=1 $(GO) test -race -shuffle=on -count=1 -timeout 20m ./redisstore ./cmd/sluice ./internal/server ./...

# The tests that prove numbers, not concurrency, at sizes that take
# minutes under the race detector: unit runs them smaller (or skips
# them) with -race, and here whole without it. ACCURACY.md's local-quota
# table is regenerated and compared here (internal/simulate's
# race_on_test.go says what runs smaller under -race).
unit-norace:
	$(GO) test -shuffle=on -count=1 -run '^(TestSimulateLocalQuotaBound|TestAccuracyDocLocalQuota)$$' ./internal/simulate/

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

# The comparison harness is a module of its own (bench/go.mod): ./... above
# does not reach it, so vet and build it here. BENCHMARKS.md says how to run it.
bench-check:
	cd bench && $(STATIC) $(GO) vet ./... && $(STATIC) $(GO) build -o /dev/null . && $(STATIC) $(GO) test -count=1 -run '^TestHot$$' .

# chart lints the Helm chart (defaults, and with every optional part on)
# and has TestHelmChart render it for each store mode and check what it
# renders (the readiness probe is /readyz, never /readyz/store),
# TestHelmChartRefuses the values the schema refuses, TestHelmChartNotes
# what helm install prints.
chart:
	@test -x $(HELM) || { echo "building helm $(HELM_VERSION) into $(HELM_DIR)"; GOBIN=$(HELM_DIR) $(GO) install helm.sh/helm/v4/cmd/helm@$(HELM_VERSION); }
	$(HELM) lint --strict deploy/helm/sluice
	$(HELM) lint --strict deploy/helm/sluice -f deploy/testdata/helm-everything.yaml --set store.type=sentinel --set 'store.redis.addrs={sentinel-0:26379}' --set tls.enabled=true --set tls.secretName=sluice-tls --set serviceMonitor.enabled=true
	SLUICE_HELM=$(HELM) $(GO) test -count=1 -run '^TestHelmChart(Refuses|Notes)?$$' ./deploy

fuzz:
	@for t in $$($(GO) test -list '^Fuzz' ./internal/engine/algorithm | grep ^Fuzz); do \
	  $(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime 30s ./internal/engine/algorithm || exit 1; done

# The dashboard screenshot in docs/observability.md (docs/dashboard.png), taken by the
# dashboard's browser test in a real headless chromium.
screenshot:
	SLUICE_LONG=1 SLUICE_SCREENSHOT=docs $(GO) test -count=1 -run '^TestDashboardInBrowser$$' ./cmd/sluice

# proto regenerates internal/checkpb, the Go code of the gRPC check
# service, from proto/sluice/v1/check.proto, with protoc (deps installs
# it), protoc-gen-go at go.mod's version and protoc-gen-go-grpc at
# PROTOC_GEN_GO_GRPC, built into a temporary directory. The generated code
# is committed; it is not part of test, whose TestGenerated
# (internal/checkpb) fails when it no longer matches the .proto.
PROTOC_GEN_GO_GRPC = google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
proto:
	@bin=$$(mktemp -d) && trap 'rm -rf "$$bin"' EXIT && \
	  GOBIN=$$bin $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go && \
	  GOBIN=$$bin $(GO) install $(PROTOC_GEN_GO_GRPC) && \
	  protoc -I proto --plugin=protoc-gen-go=$$bin/protoc-gen-go --plugin=protoc-gen-go-grpc=$$bin/protoc-gen-go-grpc \
	    --go_out=. --go_opt=module=github.com/sluicehq/sluice \
	    --go-grpc_out=. --go-grpc_opt=module=github.com/sluicehq/sluice \
	    proto/sluice/v1/check.proto
