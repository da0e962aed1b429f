#!/usr/bin/env bash
# Agentry against a LangGraph ReAct agent, the same turn on the same fake
# model, in one run on this machine: user message → read_file of a small
# file → result → final answer. Prints both sides and the ratios.
#
#   bench/compare.sh            (TURNS=500 by default)
#
# Agentry: every event durable (SQLite, WAL, synchronous=FULL), services as
# separate processes talking gRPC, one turn at a time in a fresh session.
# LangGraph: bench/peers/run.sh, once without persistence and once with
# SqliteSaver, one thread per turn. Figures land in bench/results/.
set -euo pipefail
cd "$(dirname "$0")/.."
turns=${TURNS:-500}
mkdir -p bench/results

echo "==> building release binaries"
cargo build --release --locked --bin agentry --bin agentry-bench --bin agentry-fake-model

echo "==> Agentry"
target/release/agentry-bench --scenarios turns --sessions 10 --turns "$turns" \
  --json bench/results/agentry-turns.json

echo "==> LangGraph"
FAKE_MODEL_BIN=target/release/agentry-fake-model TURNS=$turns bench/peers/run.sh

python3 - <<'PY'
import json
ours = json.load(open("bench/results/agentry-turns.json"))["turns"]["runs"]
fresh = next(r for r in ours if r["mode"].startswith("sequential"))
peers = {p: json.load(open(f"bench/peers/results/langgraph-{p}.json")) for p in ("none", "sqlite")}
print("\nsame turn, one at a time (turns/s, p50 ms):")
print(f"  Agentry, every event durable   {fresh['turns_per_sec']:8.1f}  {fresh['p50_ms']:7.2f}")
for p, label in (("none", "LangGraph, no persistence    "), ("sqlite", "LangGraph + SqliteSaver      ")):
    r = peers[p]
    print(f"  {label} {r['turns_per_sec']:8.1f}  {r['p50_ms']:7.2f}")
print("ratios (Agentry / LangGraph):")
ratios = {p: fresh["turns_per_sec"] / peers[p]["turns_per_sec"] for p in ("none", "sqlite")}
for p in ("none", "sqlite"):
    print(f"  vs {p:7} {ratios[p]:5.2f}x")
goal = 5.0
print(f"goal: at least {goal:.0f}x LangGraph without persistence: "
      f"{'met' if ratios['none'] >= goal else 'not met'}")
json.dump({
    "agentry_turns_per_sec": fresh["turns_per_sec"], "agentry_p50_ms": fresh["p50_ms"],
    "langgraph_none_turns_per_sec": peers["none"]["turns_per_sec"],
    "langgraph_sqlite_turns_per_sec": peers["sqlite"]["turns_per_sec"],
    "ratio_vs_none": ratios["none"], "ratio_vs_sqlite": ratios["sqlite"],
    "goal_vs_none": goal, "met": ratios["none"] >= goal,
}, open("bench/results/compare.json", "w"), indent=2)
print("figures written to bench/results/compare.json")
PY
