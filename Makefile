.DEFAULT_GOAL := help

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

demo: ## run the order system end to end on an embedded NATS server
	go run ./cmd/outbox demo

demo-kafka: ## the same on Kafka (franz-go's in-process kfake cluster)
	go run ./cmd/outbox demo --destination kafka

demo-webhook: ## the same on webhooks (the relay POSTs to the consumer's HTTP server)
	go run ./cmd/outbox demo --destination webhook

test: ## run every test against the local PostgreSQL and NATS (as CI does)
	go test -race -count=1 -timeout 20m ./...

ci: ## what CI runs: start missing services, then the tests
	bash .ci/run

lint: ## go vet and gofmt
	go vet ./...
	@test -z "$$(gofmt -l .)" || (gofmt -l . && false)

build: ## build the outbox and orders binaries into bin/
	go build -o bin/outbox ./cmd/outbox
	go build -o bin/orders ./examples/orders

bench: ## run the benchmark against the local PostgreSQL and NATS (BENCHMARKS.md; about 10 min)
	cd bench && go run .

bench-quick: ## the benchmark at smoke sizes (under a minute)
	cd bench && go run . --quick

.PHONY: help demo demo-kafka demo-webhook test ci lint build bench bench-quick
