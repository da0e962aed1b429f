#!/usr/bin/env bash
# Runs Agentry's Compose stack where no image can be pulled from a registry:
# builds the Debian base image locally (docker/base-image.sh), builds the
# binaries on this machine, and runs Compose with docker/Dockerfile.local.
#
#   docker/local.sh up -d --build --scale tool-runner=3 orchestrator
#   docker/local.sh ps
#   docker/local.sh down
#
# Arguments are Compose's. Name the services to start (`orchestrator` brings
# its dependencies): the ollama and crawl4ai services use upstream images,
# which such a machine cannot pull; point AGENTRY_LLM_BASE_URL (and
# AGENTRY_LLM_PROVIDER=openai for an OpenAI-compatible /v1 URL) at a model
# server instead. AGENTRY_PROFILE=debug uses a debug build (faster to build).
set -euo pipefail
cd "$(dirname "$0")/.."
source docker/lib.sh

if [[ ${1:-} == -h || ${1:-} == --help || $# -eq 0 ]]; then
  sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi

export AGENTRY_BASE_IMAGE=${AGENTRY_BASE_IMAGE:-agentry-base:local}
export AGENTRY_DOCKERFILE=docker/Dockerfile.local
case " $* " in
  *" up "* | *" build "* | *" run "*)
    docker/base-image.sh
    host_binaries "${AGENTRY_PROFILE:-release}"
    ;;
esac
compose "$@"
