#!/usr/bin/env bash
# Provides the official SDKs of the protocols Agentry speaks to editors and
# other agents, for the tests that drive Agentry with an implementation
# nobody in this project wrote: a Python virtualenv, pinned, from PyPI:
#   agent-client-protocol==0.12.1   ACP (the editor side drives `agentry acp`)
#   a2a-sdk==1.3.0                  A2A (a calling agent, against the gateway)
#
# The virtualenv lives outside the repository and is made once per machine:
#   $AGENTRY_PROTOCOL_VENV (default ~/.cache/agentry/protocol-venv-1)
# A second run returns at once; changing a pin below reinstalls, and so does
# removing the directory (scripts/lib/pinned-venv.sh).
#
# Prints the virtualenv's path on its last line (messages go to stderr).
set -euo pipefail

NAME=protocol-clients
PACKAGES=(
  "agent-client-protocol==0.12.1"
  "a2a-sdk==1.3.0"
)
READY_BINS=()
VENV="${AGENTRY_PROTOCOL_VENV:-${HOME:-/tmp}/.cache/agentry/protocol-venv-1}"
CHECK='"$venv/bin/python" -c "import acp, a2a.client"'

source "$(dirname "$0")/lib/pinned-venv.sh"
pinned_venv
