# The few commands everyone runs.
.PHONY: up test check fmt build

# Run every service in one process (needs a model: see README).
up:
	cargo run --release --bin agentry -- up

# The whole test suite: every crate's tests (with a real model server:
# llama.cpp built once into ~/.cache/agentry, about 8 minutes the first
# time; the MCP servers and the protocol SDKs in virtualenvs from PyPI),
# a 2-minute soak under faults on each layout (docs/reliability.md), a
# brief fuzzing of every RPC (docs/fuzzing.md), then
# the Compose stack end to end (skipped with a message where
# Docker is missing).
test:
	AGENTRY_LLAMA_DIR="$$(scripts/llama-server.sh | tail -n 1)" \
	AGENTRY_MCP_VENV="$$(scripts/mcp-servers.sh | tail -n 1)" \
	AGENTRY_PROTOCOL_VENV="$$(scripts/protocol-clients.sh | tail -n 1)" \
	cargo test --workspace
	target/debug/agentry-bench --scenarios chaos --layout sqlite,postgres --minutes 2 \
	  --chaos-sessions 50 --seed $${AGENTRY_CHAOS_SEED:-20261128}
	target/debug/agentry-fuzz --inputs 200 --config-inputs 2500 \
	  --seed $${AGENTRY_FUZZ_SEED:-20261129}
	docker/e2e.sh

# What CI runs: formatting, lints, tests.
check:
	.ci/run

fmt:
	cargo fmt --all

build:
	cargo build --release --bin agentry
