# outboxd — make targets. `make demo` and `make test` are the two that matter.
SHELL := /bin/bash
GO ?= go
VERSION ?= $(shell git describe --tags --match 'v[0-9]*' --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse --short HEAD 2>/dev/null)
LDFLAGS := -s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)

.PHONY: build demo test test-matrix unit lint bench bench-report bench-micro chaos release testbed-up testbed-down fmt vet

build: ## build bin/outboxd (static)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/outboxd ./cmd/outboxd

demo: build ## start Postgres and Kafka, run outboxd, write sample events, show them arrive
	scripts/demo

test: ## every test against real Postgres and Kafka on Postgres 17 (OUTBOXD_TESTBED_PG_VERSION), then the core subset on 14, 15, 16 and 18
	scripts/test

test-matrix: ## the end-to-end, start-up and fault tests on every supported Postgres (14-18)
	scripts/test --matrix

# The integration suite (package test, in the module of its own under test/,
# which keeps testcontainers-go out of the root module's requirements) needs
# Postgres and Kafka; every other package skips its service tests without them.
unit: ## the tests that need no services: every package of both modules but the integration suite
	$(GO) test -race -count=1 ./...
	cd test && $(GO) test -race -count=1 $$($(GO) list ./... | grep -v '/test$$')

lint: ## staticcheck, and the libraries (outbox, consumer) on the oldest Go that go.mod allows
	scripts/lint

bench: ## outboxd vs Debezium vs the physical limits (BENCH_SIZE=full for 1M events); see BENCHMARKS.md
	bench/run $(BENCH_SIZE)

bench-report: ## print the targets and render BENCHMARKS.md and README.md from bench/results/latest, without running anything
	bench/run report

bench-micro: ## micro-benchmarks of the hot path
	$(GO) test -run '^$$' -bench . -benchmem ./wal ./router ./checkpoint ./sink
	$(GO) test -run '^$$' -bench Write -benchmem ./outbox

chaos: ## the long fault suite; writes test/results/chaos.md and RELIABILITY.md's figures
	scripts/chaos

release: ## static linux/amd64 and linux/arm64 binaries in dist/ with SHA256SUMS
	VERSION=$(VERSION) COMMIT=$(COMMIT) scripts/release

testbed-up: ## start the throwaway Postgres and Kafka used by tests and the demo
	scripts/testbed/pg-start
	scripts/testbed/kafka-start

testbed-down:
	scripts/testbed/kafka-stop
	scripts/testbed/pg-stop

fmt:
	gofmt -w $$(git ls-files '*.go')

vet:
	$(GO) vet ./...
	cd test && $(GO) vet ./...
