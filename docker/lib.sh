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
