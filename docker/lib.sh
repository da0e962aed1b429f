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
  cargo build --locked "${flag[@]}" --bin agentry --bin agentry-fake-model
  mkdir -p .docker-bin
  cp "target/$profile/agentry" "target/$profile/agentry-fake-model" .docker-bin/
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
