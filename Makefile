.DEFAULT_GOAL := help

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

demo: ## the order system end to end on an embedded NATS server (PostgreSQL: DATABASE_URL, the server on :5432, or a private cluster)
	go run ./cmd/outbox demo

demo-kafka: ## the same on Kafka (franz-go's in-process kfake cluster)
	go run ./cmd/outbox demo --destination kafka

demo-webhook: ## the same on webhooks (the relay POSTs to the consumer's HTTP server)
	go run ./cmd/outbox demo --destination webhook

demo-amqp: ## the same on the machine's RabbitMQ (127.0.0.1:5672, guest/guest)
	go run ./cmd/outbox demo --destination amqp

demo-sql: ## the same with the order API writing its events by plain SQL calls of outbox.enqueue, as from any language
	go run ./cmd/outbox demo --writer sql

demo-cdc: ## the same with the relay reading the WAL (needs wal_level=logical: a private cluster unless DATABASE_URL is set)
	go run ./cmd/outbox demo --mode cdc

setup: ## install and start what the tests need, leaving alone what answers (.ci/setup)
	bash .ci/setup

setup-dry-run: ## what setup would install and start, doing nothing
	bash .ci/setup --dry-run

services: ## PostgreSQL, NATS and RabbitMQ in containers instead (docker compose up -d --wait)
	docker compose up -d --wait

test: ## run every test against the local PostgreSQL, NATS and RabbitMQ (after setup or services)
	go test -race -count=1 -timeout 20m ./...

ci: ## what CI runs: setup, the tests, the browser test's screenshots, fuzzing, the benchmark's smoke run
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

bench-fleet: ## the many-outboxes figures: 200 idle sources' queries/s, a backlog's effect on another source, RSS (BENCHMARKS.md; minutes)
	go test -tags fleetfigures -count=1 -timeout 60m -run 'TestFleetFigure' -v ./outboxfleet/ | grep -E 'FIGURE|^(ok|FAIL|---)'

.PHONY: help demo demo-kafka demo-webhook demo-amqp demo-sql demo-cdc setup setup-dry-run services test ci lint build bench bench-quick bench-fleet
