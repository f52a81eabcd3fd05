# Sluice: the targets a developer and CI use. `make test` is the whole suite.
GO          ?= go
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: run build test lint bench

## run: serve on the memory backend with the example rules (gRPC :8081, HTTP :8080)
run:
	$(GO) run ./cmd/sluice serve --config-dir examples/config

## build: the sluice binary in bin/
build:
	CGO_ENABLED=0 $(GO) build -trimpath -o bin/sluice ./cmd/sluice
	CGO_ENABLED=0 $(GO) build -trimpath -o bin/sluice-bench ./cmd/sluice-bench

## test: vet, then every test with the race detector
test:
	$(GO) vet ./...
	$(GO) test -race -count=1 ./...

## lint: formatting, vet and staticcheck
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

## bench: Sluice (memory) against a do-nothing server, side by side
bench:
	$(GO) run ./cmd/sluice-bench
	$(GO) test -run '^$$' -bench . -benchmem -count 5 ./bench/
