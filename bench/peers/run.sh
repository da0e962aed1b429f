#!/usr/bin/env bash
# The LangGraph side of the turn-overhead comparison: starts agentry-fake-model
# with the two-reply script (a read_file tool call, then "done"), runs
# langgraph_turns.py without persistence and with SqliteSaver, writes
# results/langgraph-none.json and results/langgraph-sqlite.json and prints a
# table. See README.md.
#
# Environment:
#   FAKE_MODEL_BIN  the agentry-fake-model binary (default: target/release, else target/debug)
#   TURNS           measured turns per mode (default 500)
#   WARMUP          unmeasured turns before them (default 50)
#   MODES           persistence modes to run (default "none sqlite")
#   PYTHON          the Python that creates the venv (default python3)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="$here/.venv"
results="$here/results"
turns="${TURNS:-500}"
warmup="${WARMUP:-50}"
modes="${MODES:-none sqlite}"
python="${PYTHON:-python3}"

die() {
    echo "run.sh: $*" >&2
    exit 1
}

[[ "$turns" =~ ^[1-9][0-9]*$ ]] || die "TURNS must be a positive number, got '$turns'"
[[ "$warmup" =~ ^[0-9]+$ ]] || die "WARMUP must be a number, got '$warmup'"
for mode in $modes; do
    [[ "$mode" == none || "$mode" == sqlite ]] || die "MODES may hold 'none' and 'sqlite', got '$mode'"
done

# --- the fake model --------------------------------------------------------
build_hint="build it with: cargo build --release -p agentry-testkit --bin agentry-fake-model (or point FAKE_MODEL_BIN at one)"
if [[ -n "${FAKE_MODEL_BIN:-}" ]]; then
    fake_bin="$FAKE_MODEL_BIN"
    [[ -f "$fake_bin" && -x "$fake_bin" ]] || die "FAKE_MODEL_BIN=$fake_bin is not an executable file"
    fake_build="FAKE_MODEL_BIN"
elif [[ -x "$repo/target/release/agentry-fake-model" ]]; then
    fake_bin="$repo/target/release/agentry-fake-model"
    fake_build="release"
elif [[ -x "$repo/target/debug/agentry-fake-model" ]]; then
    fake_bin="$repo/target/debug/agentry-fake-model"
    fake_build="debug"
    echo "run.sh: note: using the debug build of agentry-fake-model; for figures to compare, $build_hint" >&2
else
    die "agentry-fake-model is not built (looked in target/release and target/debug); $build_hint"
fi

# --- the Python environment ------------------------------------------------
command -v "$python" >/dev/null || die "$python not found; set PYTHON to a Python 3.10 or newer"
if [[ ! -x "$venv/bin/python" ]]; then
    echo "run.sh: creating $venv" >&2
    "$python" -m venv "$venv" || die "cannot create a venv with $python (on Debian: apt-get install python3-venv)"
fi
stamp="$venv/.installed-requirements.txt"
if ! cmp -s "$here/requirements.txt" "$stamp" 2>/dev/null; then
    echo "run.sh: installing requirements.txt into $venv" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$here/requirements.txt" ||
        die "pip could not install requirements.txt"
    cp "$here/requirements.txt" "$stamp"
fi

# --- start the fake model --------------------------------------------------
work="$(mktemp -d "${TMPDIR:-/tmp}/agentry-peers.XXXXXX")"
fake_pid=""
cleanup() {
    if [[ -n "$fake_pid" ]]; then
        kill "$fake_pid" 2>/dev/null || true
        wait "$fake_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

cat >"$work/script.json" <<'JSON'
[{"tool_call": {"name": "read_file", "arguments": {"path": "small.txt"}}}, {"text": "done"}]
JSON

# Port 0: the fake model picks a free port and says which.
"$fake_bin" --listen 127.0.0.1:0 --script "$work/script.json" >"$work/fake.out" 2>"$work/fake.err" &
fake_pid=$!
base_url=""
for _ in $(seq 100); do
    base_url="$(grep -m1 -o 'http://[^ ]*/v1' "$work/fake.out" 2>/dev/null || true)"
    [[ -n "$base_url" ]] && break
    if ! kill -0 "$fake_pid" 2>/dev/null; then
        die "agentry-fake-model ($fake_bin) exited at start: $(cat "$work/fake.err")"
    fi
    sleep 0.1
done
[[ -n "$base_url" ]] || die "agentry-fake-model did not report its address within 10 s"
echo "run.sh: fake model ($fake_build build) at $base_url" >&2

# --- run -------------------------------------------------------------------
mkdir -p "$results"
status=0
files=()
for mode in $modes; do
    out="$results/langgraph-$mode.json"
    rm -f "$out"
    "$venv/bin/python" "$here/langgraph_turns.py" --base-url "$base_url" --persistence "$mode" \
        --turns "$turns" --warmup "$warmup" --fake-model "$fake_build" --json "$out" || status=1
    [[ -f "$out" ]] && files+=("$out")
    echo
done

if ((${#files[@]})); then
    "$venv/bin/python" - "${files[@]}" <<'PY'
import json, sys
rows = [json.load(open(path)) for path in sys.argv[1:]]
print(f"{'system':<18} {'persistence':<12} {'turns':>6} {'turns/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'errors':>7}")
def num(value, width, digits):
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"
for r in rows:
    name = f"{r['system']} {r['version']}"
    print(f"{name:<18} {r['persistence']:<12} {r['turns']:>6} {num(r['turns_per_sec'], 9, 1)} "
          f"{num(r['p50_ms'], 8, 2)} {num(r['p99_ms'], 8, 2)} {num(r['max_ms'], 8, 2)} {r['errors']:>7}")
print(f"fake model: {rows[0].get('fake_model')} build; results in bench/peers/results/")
PY
fi
((status == 0)) || die "a run reported errors or problems (see above)"
