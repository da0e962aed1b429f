#!/usr/bin/env bash
# Provides the official SDKs of the protocols Agentry speaks to editors and
# other agents, for the tests that drive Agentry with an implementation
# nobody in this project wrote: a Python virtualenv, pinned, from PyPI:
#   agent-client-protocol==0.12.1   ACP (the editor side drives `agentry acp`)
#   a2a-sdk[http-server]==1.3.0     A2A: a calling agent, against the gateway; and
#                                   a remote agent (crates/fakes/a2a) for delegate
#   uvicorn==0.54.0                 serves that remote agent
#   ag-ui-protocol==1.0.0           AG-UI's types (a frontend's run, checked event by event)
#   ag-ui-validate==0.4.0           bin/ag-ui-validate, AG-UI's conformance checker
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
  "a2a-sdk[http-server]==1.3.0"
  "uvicorn==0.54.0"
  "ag-ui-protocol==1.0.0"
  "ag-ui-validate==0.4.0"
)
READY_BINS=(ag-ui-validate)
VENV="${AGENTRY_PROTOCOL_VENV:-${HOME:-/tmp}/.cache/agentry/protocol-venv-1}"
CHECK='"$venv/bin/python" -c "import acp, a2a.client, ag_ui.core" && "$venv/bin/ag-ui-validate" --help >/dev/null'

source "$(dirname "$0")/lib/pinned-venv.sh"
pinned_venv
