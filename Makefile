# The few commands everyone runs.
.PHONY: up test check fmt build

# Run every service in one process (needs a model: see README).
up:
	cargo run --release --bin agentry -- up

# The whole test suite.
test:
	cargo test --workspace

# What CI runs: formatting, lints, tests.
check:
	.ci/run

fmt:
	cargo fmt --all

build:
	cargo build --release --bin agentry
