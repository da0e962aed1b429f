# Shared by the docker/ scripts; source it.

# Runs Compose: the `docker compose` plugin when present, else the
# `docker-compose` program.
compose() {
  if docker compose version >/dev/null 2>&1; then
    docker compose "$@"
  elif command -v docker-compose >/dev/null 2>&1; then
    docker-compose "$@"
  else
    echo "neither 'docker compose' nor 'docker-compose' is installed" >&2
    return 127
  fi
}

# Builds the agentry binaries on the host (profile: debug or release) and
# puts them where docker/Dockerfile.local finds them.
host_binaries() {
  local profile=$1 flag=()
  [[ $profile == release ]] && flag=(--release)
  cargo build --locked "${flag[@]}" --bin agentry --bin agentry-sandbox --bin agentry-fake-model
  mkdir -p .docker-bin
  cp "target/$profile/agentry" "target/$profile/agentry-sandbox" "target/$profile/agentry-fake-model" .docker-bin/
}

# --- Helpers of the end-to-end scripts (they define dc() and $model) --------

passed=0
failed=0
log() { printf '\n==> %s\n' "$*"; }
pass() {
  passed=$((passed + 1))
  printf 'ok: %s\n' "$*"
}
fail() {
  failed=$((failed + 1))
  printf 'FAILED: %s\n' "$*" >&2
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# wait_healthy SERVICE SECONDS: every container of SERVICE reports healthy.
wait_healthy() {
  local service=$1 deadline=$(($(date +%s) + $2)) id state
  for id in $(dc ps -q "$service"); do
    while :; do
      state=$(docker inspect --format '{{.State.Health.Status}}' "$id" 2>/dev/null || echo gone)
      [[ $state == healthy ]] && break
      if (($(date +%s) > deadline)); then
        echo "$service ($id) is $state after $2 s" >&2
        return 1
      fi
      sleep 1
    done
  done
}

# has FILTER FILE: whether any event of the JSON-lines FILE matches FILTER.
has() { jq -es "any(.[]; $1)" "$2" >/dev/null; }

# queue JSON: queues replies (a JSON array) on the fake model at $model.
queue() {
  curl -fsS -X POST -H 'content-type: application/json' --data "$1" "$model/_fake/replies" >/dev/null
}

# e2e_missing: what an end-to-end script lacks on this machine (empty: none).
e2e_missing() {
  local missing="" tool
  for tool in docker cargo curl jq python3; do
    command -v "$tool" >/dev/null || missing+=" $tool"
  done
  if [[ -z $missing ]] && ! docker info >/dev/null 2>&1; then
    missing+=" a-running-docker-engine"
  fi
  if [[ -z $missing ]] && ! docker compose version >/dev/null 2>&1 &&
    ! command -v docker-compose >/dev/null; then
    missing+=" compose"
  fi
  if [[ -z $missing ]] && ((EUID != 0)) && ! docker image inspect "${AGENTRY_BASE_IMAGE:-agentry-base:local}" >/dev/null 2>&1; then
    missing+=" root(to-build-the-base-image)"
  fi
  printf '%s' "$missing"
}

# e2e_require LABEL: skips the script (exit 0) with a visible message when
# the machine lacks what it needs, or fails under CI (CI=true).
e2e_require() {
  local missing
  missing=$(e2e_missing)
  [[ -z $missing ]] && return 0
  if [[ ${CI:-} == true ]]; then
    echo "$1: FAILED: missing:$missing" >&2
    exit 1
  fi
  echo "$1: SKIPPED: missing:$missing"
  exit 0
}

# e2e_finish LABEL RC: the end of an e2e script (its EXIT trap, with the
# exit status): the stack's logs on failure, the stack torn down (unless
# E2E_KEEP=1), $work kept on failure, then the summary line. Uses dc(),
# $project, $work, $started, $passed and $failed.
e2e_finish() {
  local label=$1 rc=$2
  if ((rc != 0 || failed != 0)); then
    log "logs of the stack (last 60 lines per service)"
    dc logs --no-color --tail 60 2>&1 || true
  fi
  log "tearing down"
  if [[ ${E2E_KEEP:-} == 1 ]]; then
    log "E2E_KEEP=1: leaving the stack up (project $project); outputs in $work"
  else
    dc down -v --remove-orphans --timeout 5 >/dev/null 2>&1 || true
  fi
  if ((rc != 0 || failed != 0)); then
    echo "the turns' outputs are kept in $work"
  elif [[ ${E2E_KEEP:-} != 1 ]]; then
    rm -rf "$work"
  fi
  log "$label finished in $(($(date +%s) - started)) s"
  if ((rc == 0 && failed == 0)); then
    printf '%s: %d passed, %d failed\n' "$label" "$passed" "$failed"
  else
    printf '%s: %d passed, %d failed\n' "$label" "$passed" "$((failed > 0 ? failed : 1))"
    exit 1
  fi
}
