# One command builds and runs the service (make run); one runs every test
# (make test). Both work from a clean checkout.

GO        ?= go
BIN       := bin
GOTEST    ?= $(GO) test -count=1 -timeout 25m
FUZZTIME  ?= 2000x

.PHONY: all build run test vet gotest fuzz-short bench interop-deps clean

all: build

build:
	$(GO) build -buildvcs=auto -o $(BIN)/ ./cmd/...

# make run: build Caddy (cmd/caddy, offline) and the daemons, then run
# certd, verifierd and Caddy with Caddyfile.example on http://localhost:8080,
# state under ./data. Ctrl-C stops all three.
run:
	./scripts/run.sh

.PHONY: build-caddy load

# The Caddy that make run uses: standard modules plus ours, pinned by go.sum.
# For extra third-party plugins use ./xcaddy.sh (needs the module proxy).
build-caddy:
	$(GO) build -buildvcs=auto -o $(BIN)/caddy ./cmd/caddy

# make load: req/s, p50/p90/p99 and CPU per request of Caddy, verifierd and
# certd for the free, paid (devnet) and MCP paths at 8 and 32 connections,
# against a plain Caddy reverse_proxy to the same verifierd, with a running
# make run (or a stack of its own if none is up). Pass options with
# LOAD_ARGS="-c 16 -d 20s".
load:
	./scripts/load.sh $(LOAD_ARGS)

# make test: formatting, vet, every Go test (including the real-peer interop
# tests, which install their npm peers first), then a short run of every fuzz
# target over its checked-in corpus plus new inputs.
test: vet interop-deps gotest fuzz-short

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...

gotest:
	$(GOTEST) ./...

interop-deps:
	@if [ -f interop/package.json ]; then cd interop && npm ci --no-audit --no-fund; fi

# Every FuzzXxx function in the module, FUZZTIME inputs each (default 2000x).
fuzz-short:
	FUZZTIME=$(FUZZTIME) GO=$(GO) ./scripts/fuzz-short.sh

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

clean:
	rm -rf $(BIN)
