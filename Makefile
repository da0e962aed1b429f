# The few commands everyone runs.
.PHONY: up test check fmt build

# Run every service in one process (needs a model: see README).
up:
	cargo run --release --bin agentry -- up

# The whole test suite: every crate's tests, then the Compose stack end to
# end (skipped with a message where Docker is missing).
test:
	cargo test --workspace
	docker/e2e.sh

# What CI runs: formatting, lints, tests.
check:
	.ci/run

fmt:
	cargo fmt --all

build:
	cargo build --release --bin agentry
