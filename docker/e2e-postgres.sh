#!/usr/bin/env bash
# End-to-end test of Compose's postgres profile, for real: PostgreSQL from
# Debian's package in a locally built image, two orchestrators, two
# schedulers, three tool runners, the test kit's fake model as a container,
# the host's `agentry` CLI talking to both published orchestrator ports.
#
#   1. a turn through each orchestrator, on one session;
#   2. the orchestrator driving the session killed (docker kill) while the
#      model answers: the other takes the session over, the turn finishes
#      there, and every event stored before is still there;
#   3. PostgreSQL restarted: meanwhile the services answer with a clear
#      error; afterwards the next turn works and nothing stored was lost;
#   4. everything torn down, even on failure.
#
# Usage: docker/e2e-postgres.sh   (AGENTRY_PROFILE=release for release binaries)
# Needs: a Docker engine, Compose, cargo, curl, jq. Runs as root (it builds
# the base image with debootstrap).
set -euo pipefail
cd "$(dirname "$0")/.."
source docker/lib.sh

project=agentry-e2e-pg
files=(-f docker-compose.yml -f docker/compose.e2e.yml)
started=$(date +%s)
dc() { compose -p "$project" --env-file docker/postgres.env --profile postgres "${files[@]}" "$@"; }

teardown() {
  local rc=$?
  [[ -n ${slow:-} ]] && kill "$slow" 2>/dev/null || true
  e2e_finish compose-postgres-e2e "$rc"
}

e2e_require "compose postgres e2e"

work=$(mktemp -d)
slow=""
trap teardown EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

log "base image"
docker/base-image.sh
profile=${AGENTRY_PROFILE:-debug}
log "binaries ($profile)"
host_binaries "$profile"

export AGENTRY_DOCKERFILE=docker/Dockerfile.local
export AGENTRY_BASE_IMAGE=${AGENTRY_BASE_IMAGE:-agentry-base:local}
export AGENTRY_TAG=e2e
export AGENTRY_PORT=$(free_port)
export AGENTRY_PORT_2=$(free_port)
export AGENTRY_SCHEDULER_PORT=$(free_port)
export AGENTRY_FAKE_MODEL_PORT=$(free_port)
export AGENTRY_LLM_PROVIDER=openai
export AGENTRY_LLM_BASE_URL=http://fake-model:8080/v1
export AGENTRY_LLM_MODEL=fake-model
export AGENTRY_CONFIG_DIR=$work/config
mkdir -p "$AGENTRY_CONFIG_DIR"
one=http://127.0.0.1:$AGENTRY_PORT
two=http://127.0.0.1:$AGENTRY_PORT_2
model=http://127.0.0.1:$AGENTRY_FAKE_MODEL_PORT
agentry=target/$profile/agentry
via() { # URL, agentry arguments...
  local url=$1
  shift
  AGENTRY_ORCHESTRATOR_URL=$url "$agentry" "$@"
}

dc down -v --remove-orphans --timeout 5 >/dev/null 2>&1 || true
log "building images"
dc build
log "starting PostgreSQL, 2 orchestrators, 2 schedulers, 3 tool runners"
dc up -d postgres
wait_healthy postgres 120
dc up -d --scale tool-runner=3 orchestrator orchestrator-2 scheduler-2 fake-model
wait_healthy orchestrator 120
wait_healthy orchestrator-2 120
wait_healthy scheduler-2 120
for _ in $(seq 60); do
  curl -fsS "$model/_fake/requests" >/dev/null 2>&1 && break
  sleep 0.5
done
AGENTRY_TOKEN=$(dc exec -T orchestrator agentry token)
export AGENTRY_TOKEN
runners=$(dc ps -q tool-runner | wc -l)
schedulers=$(( $(dc ps -q scheduler | wc -l) + $(dc ps -q scheduler-2 | wc -l) ))
((runners == 3 && schedulers == 2)) && pass "3 tool runners and 2 schedulers are up" ||
  fail "tool runners: $runners, schedulers: $schedulers"
dc logs --no-color session-store 2>&1 | grep "session store ready" | grep -q postgres &&
  pass "the session store runs on PostgreSQL" || fail "the session store did not say it runs on PostgreSQL"

# --- 1. a turn through each orchestrator -----------------------------------
log "a turn through each orchestrator"
queue '[{"tool_call": {"id": "w", "name": "write_file", "arguments": {"path": "a.txt", "content": "one\n"}}}, {"text": "First, through one."}]'
via "$one" run --approve always --json "first" >"$work/t1.jsonl"
session=$(jq -r 'select(.session_id != null) | .session_id' "$work/t1.jsonl" | head -1)
has '.type == "model_message" and .text == "First, through one."' "$work/t1.jsonl" &&
  pass "turn 1 through orchestrator 1" || fail "turn 1: $(tail -3 "$work/t1.jsonl")"
queue '[{"text": "Second, through two."}]'
via "$two" run --session "$session" --approve always --json "second" >"$work/t2.jsonl"
has '.type == "model_message" and .text == "Second, through two."' "$work/t2.jsonl" &&
  pass "turn 2 through orchestrator 2 (forwarded to the session's driver)" ||
  fail "turn 2: $(tail -3 "$work/t2.jsonl")"

# --- 2. the driving orchestrator killed mid-turn ---------------------------
log "the driving orchestrator is killed while the model answers"
via "$two" sessions show --json "$session" >"$work/before.jsonl"
before=$(wc -l <"$work/before.jsonl")
queue '[{"text": "never heard", "delay_ms": 60000}, {"text": "Third, after the takeover."}]'
asked=$(curl -fsS "$model/_fake/requests" | jq length)
via "$two" run --session "$session" --approve always --json "third" >"$work/t3.jsonl" &
slow=$!
for _ in $(seq 100); do
  (($(curl -fsS "$model/_fake/requests" | jq length) > asked)) && break
  sleep 0.1
done
docker kill "$(dc ps -q orchestrator)" >/dev/null
killed=$(date +%s)
if wait "$slow"; then
  took=$(($(date +%s) - killed))
  has '.type == "model_message" and .text == "Third, after the takeover."' "$work/t3.jsonl" &&
    pass "the turn finished through orchestrator 2, $took s after the kill" ||
    fail "turn 3: $(tail -3 "$work/t3.jsonl")"
  ((took <= 15)) && pass "taken over within 15 s" || fail "the takeover took $took s"
else
  fail "agentry run through orchestrator 2 failed after the kill: $(tail -3 "$work/t3.jsonl")"
fi
slow=""
via "$two" sessions show --json "$session" >"$work/after.jsonl"
if head -n "$before" "$work/after.jsonl" | cmp -s - "$work/before.jsonl"; then
  pass "all $before events stored before the kill are intact"
else
  fail "events stored before the kill changed"
fi
jq -es '[.[].seq] == [range(1; length + 1)]' "$work/after.jsonl" >/dev/null &&
  pass "the log has no gap" || fail "the log has a gap"

# --- 3. PostgreSQL restarted -----------------------------------------------
log "PostgreSQL stopped, then started again"
dc stop postgres >/dev/null
if out=$(via "$two" sessions list 2>&1); then
  fail "listing sessions without PostgreSQL succeeded: $out"
else
  grep -qi "unavailable" <<<"$out" && pass "without PostgreSQL: a clear error ($(head -1 <<<"$out"))" ||
    fail "without PostgreSQL: $out"
fi
dc start postgres >/dev/null
wait_healthy postgres 120
queue '[{"text": "Back after the database."}]'
ok=""
for _ in $(seq 30); do
  if via "$two" run --session "$session" --approve always --json "fourth" >"$work/t4.jsonl" 2>"$work/t4.err"; then
    ok=1
    break
  fi
  sleep 1
done
[[ -n $ok ]] && has '.type == "model_message" and .text == "Back after the database."' "$work/t4.jsonl" &&
  pass "a turn after PostgreSQL's restart" || fail "after the restart: $(cat "$work/t4.err")"
via "$two" sessions show --json "$session" >"$work/final.jsonl"
if head -n "$(wc -l <"$work/after.jsonl")" "$work/final.jsonl" | cmp -s - "$work/after.jsonl"; then
  pass "nothing stored was lost across PostgreSQL's restart"
else
  fail "the log changed across PostgreSQL's restart"
fi
