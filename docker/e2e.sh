#!/usr/bin/env bash
# End-to-end test of the Compose stack, for real: images built on this
# machine, three tool runners, the test kit's fake model as a container,
# the host's `agentry` CLI talking to the published orchestrator port.
#
#   1. a turn whose tool calls are served by at least two distinct runners;
#      a turn given network reaches only the runners' proxy, which refuses
#      private addresses, and a turn without has none;
#   2. a runner killed (docker kill) while it runs a long command: the turn
#      ends cleanly with an error for the model, the session stays intact,
#      and the next turn works on the remaining runners;
#   3. the session store's container restarted: nothing stored is lost;
#   4. a session on a host directory (AGENTRY_PROJECT): it edits the files
#      there, as the directory's owner, from the host CLI and from the cli
#      container;
#   5. everything torn down, even on failure.
#
# Usage: docker/e2e.sh   (AGENTRY_PROFILE=release for release binaries)
# Needs: a Docker engine, Compose, cargo, curl, jq. Runs as root (it builds
# the base image with debootstrap).
set -euo pipefail
cd "$(dirname "$0")/.."
source docker/lib.sh

project=agentry-e2e
files=(-f docker-compose.yml -f docker/compose.e2e.yml)
started=$(date +%s)
dc() { compose -p "$project" "${files[@]}" "$@"; }

teardown() {
  local rc=$?
  [[ -n ${turn2:-} ]] && kill "$turn2" 2>/dev/null || true
  e2e_finish compose-e2e "$rc"
}
# Without what it needs the test is skipped with a visible message, or fails
# under CI (CI=true), where everything must be there.
e2e_require "compose e2e"

work=$(mktemp -d)
turn2=""
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
export AGENTRY_SCHEDULER_PORT=$(free_port)
export AGENTRY_FAKE_MODEL_PORT=$(free_port)
export AGENTRY_CONSOLE_PORT=$(free_port)
export AGENTRY_LLM_PROVIDER=openai
export AGENTRY_LLM_BASE_URL=http://fake-model:8080/v1
export AGENTRY_LLM_MODEL=fake-model
export AGENTRY_ORCHESTRATOR_URL=http://127.0.0.1:$AGENTRY_PORT
export AGENTRY_SCHEDULER_URL=http://127.0.0.1:$AGENTRY_SCHEDULER_PORT
# A host directory sessions may work on, owned by someone who is not root.
export AGENTRY_PROJECT=$work/project
mkdir -p "$AGENTRY_PROJECT"
printf 'version one\n' >"$AGENTRY_PROJECT/README"
chown -R 4242:4242 "$AGENTRY_PROJECT"
chmod 755 "$work"
# The host CLI reads only these; keep it off any config of this checkout.
export AGENTRY_CONFIG_DIR=$work/config
mkdir -p "$AGENTRY_CONFIG_DIR"
model=http://127.0.0.1:$AGENTRY_FAKE_MODEL_PORT
agentry=target/$profile/agentry

dc down -v --remove-orphans --timeout 5 >/dev/null 2>&1 || true

log "building images"
dc build

log "starting the stack with 3 tool runners"
dc up -d --scale tool-runner=3 orchestrator fake-model

wait_healthy orchestrator 120
for _ in $(seq 60); do
  curl -fsS "$model/_fake/requests" >/dev/null 2>&1 && break
  sleep 0.5
done
# The host CLI takes the client token the services created.
AGENTRY_TOKEN=$(dc exec -T orchestrator agentry token)
export AGENTRY_TOKEN
[[ $AGENTRY_TOKEN == agentry_client_* ]] && pass "the client token is available to the host CLI" ||
  fail "agentry token in the orchestrator printed '$AGENTRY_TOKEN'"
layers=$(dc exec -T orchestrator agentry health http://tool-runner:7743 2>&1 || true)
echo "$layers"
grep -q "^  sandbox landlock" <<<"$layers" && grep -q "^  sandbox seccomp" <<<"$layers" &&
  pass "the tool runners report their sandbox layers" ||
  fail "agentry health of a tool runner: $layers"
runners=$(dc ps -q tool-runner | wc -l)
if ((runners == 3)); then pass "3 tool runners are up"; else fail "expected 3 tool runners, found $runners"; fi
"$agentry" health --quiet "$AGENTRY_ORCHESTRATOR_URL" "$AGENTRY_SCHEDULER_URL" &&
  pass "orchestrator and scheduler healthy from the host" ||
  fail "agentry health from the host"

# People: added inside the orchestrator's container (where the people file
# is), a viewer's token reads from the host and is refused a turn.
viewer=$(dc exec -T orchestrator agentry users add vera --role viewer 2>/dev/null || true)
[[ $viewer == agentry_user_* ]] && pass "agentry users add prints a person's token" ||
  fail "agentry users add in the orchestrator printed '$viewer'"
sleep 1.5 # the services read the people file again within a second
AGENTRY_TOKEN=$viewer "$agentry" sessions list >/dev/null 2>&1 &&
  pass "a viewer lists sessions from the host" || fail "a viewer could not list sessions"
if refused=$(AGENTRY_TOKEN=$viewer "$agentry" run --scratch "hello" 2>&1); then
  fail "a viewer ran a turn: $refused"
elif grep -q "vera is a viewer" <<<"$refused"; then
  pass "a viewer is refused a turn, by name and role"
else
  fail "a viewer's turn was refused for another reason: $refused"
fi

# The web console, published on the host's loopback: the page, a login
# with the viewer's token, the sessions as she may see them.
dc up -d --no-deps gateway
console=http://127.0.0.1:$AGENTRY_CONSOLE_PORT
for _ in $(seq 60); do
  curl -fsS "$console/healthz" >/dev/null 2>&1 && break
  sleep 0.5
done
curl -fsS "$console/" | grep -q 'src="/console.js"' &&
  pass "the console's page is served on the host's loopback" || fail "no console page at $console"
cookie=$(curl -fsS -D - -o /dev/null -H 'content-type: application/json' \
  -d "{\"token\": \"$viewer\"}" "$console/api/login" | tr -d '\r' |
  sed -n 's/^[Ss]et-[Cc]ookie: \([^;]*\).*/\1/p')
[[ $cookie == agentry_console=* ]] && pass "a person logs in to the console with their token" ||
  fail "the console login gave no cookie: '$cookie'"
curl -fsS -H "cookie: $cookie" "$console/api/sessions" | jq -e '.sessions' >/dev/null &&
  pass "the console lists sessions for the viewer" || fail "the console's session list"
status=$(curl -s -o /dev/null -w '%{http_code}' -H "cookie: $cookie" \
  -H 'content-type: application/json' -d '{}' "$console/api/sessions")
[[ $status == 403 ]] && pass "a change without the page's token is refused (403)" ||
  fail "a change without the page's token got $status"

# --- 1. a turn spread over the runners ------------------------------------
log "turn 1: six tool calls"
queue '[
  {"tool_call": {"id": "w", "name": "write_file", "arguments": {"path": "notes.txt", "content": "kept across runners\n"}}},
  {"tool_call": {"id": "r1", "name": "read_file", "arguments": {"path": "notes.txt"}}},
  {"tool_call": {"id": "b1", "name": "bash", "arguments": {"command": "cat notes.txt"}}},
  {"tool_call": {"id": "r2", "name": "read_file", "arguments": {"path": "notes.txt"}}},
  {"tool_call": {"id": "b2", "name": "bash", "arguments": {"command": "echo $((6*7))"}}},
  {"tool_call": {"id": "l1", "name": "list_dir", "arguments": {"path": "."}}},
  {"text": "All six calls are done."}
]'
"$agentry" run --approve always --json "use your tools" >"$work/turn1.jsonl"
session=$(jq -r 'select(.session_id != null) | .session_id' "$work/turn1.jsonl" | head -1)
answer=$(jq -r 'select(.type == "model_message") | .text' "$work/turn1.jsonl" | tail -1)
[[ $answer == "All six calls are done." ]] && pass "turn 1 answered" || fail "turn 1 answer: '$answer'"
results=$(jq -c 'select(.type == "tool_result")' "$work/turn1.jsonl")
ok_results=$(jq -s '[.[] | select(.type == "tool_result" and .is_error == false)] | length' "$work/turn1.jsonl")
((ok_results == 6)) && pass "6 tool calls succeeded" || fail "tool results: $results"
distinct=$(jq -rs '[.[] | select(.type == "tool_result") | .runner_id] | unique | length' "$work/turn1.jsonl")
((distinct >= 2)) && pass "tool calls served by $distinct distinct runners" ||
  fail "tool calls served by $distinct runner(s): $(jq -r 'select(.type == "tool_result") | .runner_id' "$work/turn1.jsonl" | tr '\n' ' ')"
has '.type == "tool_result" and .call_id == "b1" and (.output | test("kept across runners"))' \
  "$work/turn1.jsonl" && pass "runners share the workspace" || fail "bash did not see the written file"

# --- network for a turn, in containers -------------------------------------
# No namespaces in the containers: a turn given network reaches the runner's
# proxy on a loopback port Landlock holds it to. The image has no curl, so
# bash speaks HTTP to the proxy itself. The fake model is on a private
# address: the proxy refuses it (403); around the proxy, and in a turn
# without network, the kernel refuses the connection.
log "a turn with network: the proxy, its rules, nothing around it"
via_proxy='p=${http_proxy#http://}; cred=${p%@*}; hp=${p#*@}; hp=${hp%/}; exec 3<>/dev/tcp/${hp%:*}/${hp##*:} && printf "GET http://fake-model:8080/ HTTP/1.1\r\nHost: fake-model\r\nProxy-Authorization: Basic %s\r\nConnection: close\r\n\r\n" "$(printf %s "$cred" | base64 -w0)" >&3 && head -1 <&3'
direct='exec 3<>/dev/tcp/fake-model/8080 && echo CONNECTED'
queue "$(jq -n --arg via "$via_proxy" --arg direct "$direct" '[
  {"tool_call": {"id": "n1", "name": "bash", "arguments": {"command": $via}}},
  {"tool_call": {"id": "n2", "name": "bash", "arguments": {"command": $direct}}},
  {"text": "Checked."}
]')"
"$agentry" run --approve always --network --json "check the network" >"$work/network.jsonl"
has '.type == "tool_result" and .call_id == "n1" and (.output | test("403")) and (.output | test("agentry network: refused 1"))' \
  "$work/network.jsonl" && pass "a private address is refused by the proxy" ||
  fail "through the proxy: $(jq -c 'select(.type == "tool_result" and .call_id == "n1")' "$work/network.jsonl")"
has '.type == "tool_result" and .call_id == "n2" and (.output | test("CONNECTED") | not)' \
  "$work/network.jsonl" && pass "nothing is reached around the proxy" ||
  fail "around the proxy: $(jq -c 'select(.type == "tool_result" and .call_id == "n2")' "$work/network.jsonl")"
queue "$(jq -n --arg direct "$direct" '[
  {"tool_call": {"id": "n3", "name": "bash", "arguments": {"command": ("echo proxy=${http_proxy:-none}; " + $direct)}}},
  {"text": "Checked."}
]')"
"$agentry" run --approve always --json "check again" >"$work/no-network.jsonl"
has '.type == "tool_result" and .call_id == "n3" and (.output | test("proxy=none")) and (.output | test("CONNECTED") | not)' \
  "$work/no-network.jsonl" && pass "a turn without network has none" ||
  fail "without network: $(jq -c 'select(.type == "tool_result" and .call_id == "n3")' "$work/no-network.jsonl")"

# --- 2. a runner killed mid-call ------------------------------------------
log "turn 2: a runner is killed while it runs a long command"
queue '[
  {"tool_call": {"id": "long", "name": "bash", "arguments": {"command": "echo started; sleep 120"}}},
  {"text": "The runner was lost; I will not repeat that."}
]'
t0=$(date +%s)
"$agentry" run --session "$session" --approve always --json "run the long job" >"$work/turn2.jsonl" &
turn2=$!
victim=""
for _ in $(seq 100); do
  for id in $(dc ps -q tool-runner); do
    if docker top "$id" -o pid,args 2>/dev/null | grep -q "sleep 120"; then victim=$id; fi
  done
  [[ -n $victim ]] && break
  sleep 0.2
done
if [[ -z $victim ]]; then
  fail "no runner was seen running the long command"
  kill "$turn2" 2>/dev/null || true
else
  docker kill "$victim" >/dev/null
  killed_at=$(date +%s)
  if wait "$turn2"; then
    pass "turn 2 ended cleanly $(($(date +%s) - killed_at)) s after the kill"
  else
    fail "agentry run failed after the kill"
  fi
  has '.type == "tool_result" and .call_id == "long" and .is_error and (.output | test("may or may not have completed"))' \
    "$work/turn2.jsonl" && pass "the model was told the call was lost" ||
    fail "tool result of the lost call: $(jq -c 'select(.type == "tool_result")' "$work/turn2.jsonl")"
  has '.type == "turn_finished"' "$work/turn2.jsonl" &&
    pass "turn 2 finished" || fail "turn 2 has no turn_finished event"
fi
echo "turn 2 took $(($(date +%s) - t0)) s"

log "turn 3: the remaining runners"
queue '[
  {"tool_call": {"id": "again", "name": "bash", "arguments": {"command": "cat notes.txt"}}},
  {"tool_call": {"id": "again-read", "name": "read_file", "arguments": {"path": "notes.txt"}}},
  {"text": "Still working."}
]'
"$agentry" run --session "$session" --approve always --json "again" >"$work/turn3.jsonl"
has '.type == "tool_result" and .call_id == "again" and (.is_error | not) and (.output | test("kept across runners"))' \
  "$work/turn3.jsonl" && pass "turn 3 ran on a remaining runner" ||
  fail "turn 3: $(jq -c 'select(.type == "tool_result")' "$work/turn3.jsonl")"

# --- 3. the session store restarted ----------------------------------------
log "restarting the session store"
"$agentry" sessions show "$session" --json >"$work/before.jsonl"
before=$(wc -l <"$work/before.jsonl")
dc restart session-store >/dev/null
wait_healthy session-store 60
"$agentry" sessions show "$session" --json >"$work/after.jsonl"
if cmp -s "$work/before.jsonl" "$work/after.jsonl"; then
  pass "all $before events kept across the store's restart"
else
  fail "events changed across the restart ($before before, $(wc -l <"$work/after.jsonl") after)"
fi
queue '[{"text": "The store is back."}]'
printf 'are you there?\n' | "$agentry" chat --session "$session" >"$work/turn4.txt"
grep -qx "The store is back." "$work/turn4.txt" && pass "a chat turn after the restart" ||
  fail "agentry chat after the restart printed: $(cat "$work/turn4.txt")"
"$agentry" sessions show "$session" --json >"$work/final.jsonl"
if head -n "$before" "$work/final.jsonl" | cmp -s - "$work/before.jsonl" &&
  (($(wc -l <"$work/final.jsonl") > before)); then
  pass "the log only grew"
else
  fail "the session log was rewritten"
fi

# --- 4. a session on a host directory ---------------------------------------
log "a session on a host directory (AGENTRY_PROJECT)"
queue '[
  {"tool_call": {"id": "p1", "name": "bash", "arguments": {"command": "id -u; pwd; echo made > made.txt"}}},
  {"tool_call": {"id": "p2", "name": "edit_file", "arguments": {"path": "README", "old_string": "one", "new_string": "two"}}},
  {"text": "Edited."}
]'
checkout=$PWD
(cd "$AGENTRY_PROJECT" && "$checkout/$agentry" run --approve always --json "edit the project") >"$work/project.jsonl"
has ".type == \"tool_result\" and .call_id == \"p1\" and (.output | startswith(\"4242\\n$AGENTRY_PROJECT\\n\"))" \
  "$work/project.jsonl" && pass "a session started in the project runs there, as its owner" ||
  fail "in the project: $(jq -c 'select(.type == "tool_result")' "$work/project.jsonl")"
if [[ $(cat "$AGENTRY_PROJECT/README") == "version two" && $(stat -c %u "$AGENTRY_PROJECT/made.txt") == 4242 &&
  $(stat -c %u "$AGENTRY_PROJECT/README") == 4242 ]]; then
  pass "the project's files are edited and stay its owner's"
else
  fail "project files: $(ls -ln "$AGENTRY_PROJECT"; cat "$AGENTRY_PROJECT/README")"
fi
queue '[
  {"tool_call": {"id": "p3", "name": "bash", "arguments": {"command": "pwd; cat made.txt"}}},
  {"text": "Seen."}
]'
dc run --rm -T cli run --approve always --json "look" >"$work/project-cli.jsonl" 2>"$work/project-cli.err" || true
has ".type == \"tool_result\" and .call_id == \"p3\" and (.output | startswith(\"$AGENTRY_PROJECT\\nmade\\n\"))" \
  "$work/project-cli.jsonl" && pass "the cli container works in AGENTRY_PROJECT" ||
  fail "cli container in the project: $(cat "$work/project-cli.jsonl" "$work/project-cli.err")"

# --- the CLI as a container -------------------------------------------------
if dc run --rm -T cli sessions list >"$work/cli.txt" 2>"$work/cli.err" &&
  grep -q "$session" "$work/cli.txt"; then
  pass "docker compose run --rm cli sees the session"
else
  fail "compose run cli: $(cat "$work/cli.txt" "$work/cli.err")"
fi
