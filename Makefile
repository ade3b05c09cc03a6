# One command builds and runs the service (make run); one runs every test
# (make test). Both work from a clean checkout.

GO        ?= go
BIN       := bin
GOTEST    ?= $(GO) test -count=1 -timeout 25m
FUZZTIME  ?= 5s

.PHONY: all build run test vet gotest fuzz-short bench interop-deps clean

all: build

build:
	$(GO) build -o $(BIN)/ ./cmd/...

run:
	@echo "nothing to run yet: the daemons arrive with verifierd and certd"

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

# Every FuzzXxx function in the module, FUZZTIME each.
fuzz-short:
	@for pkg in $$($(GO) list ./...); do \
	  dir=$$($(GO) list -f '{{.Dir}}' $$pkg); \
	  for f in $$(grep -ho '^func Fuzz[A-Za-z0-9_]*' $$dir/*_test.go 2>/dev/null | sed 's/func //'); do \
	    echo "fuzz $$pkg $$f"; \
	    $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	  done; \
	done

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

clean:
	rm -rf $(BIN)
