#!/usr/bin/env bash
# Provides real MCP (Model Context Protocol) servers for the MCP client tests:
# a Python virtualenv holding the official Python SDK and two reference
# servers, all pinned and from PyPI:
#   mcp==2.3.0                    the SDK; runs crates/fakes/mcp/fixture_server.py
#   mcp-server-time==2026.10.19   bin/mcp-server-time (stdio)
#   mcp-server-git==2026.10.19    bin/mcp-server-git --repository PATH (stdio; needs git)
#
# The virtualenv lives outside the repository and is made once per machine:
#   $AGENTRY_MCP_VENV (default ~/.cache/agentry/mcp-venv-1; for root
#   /opt/agentry/mcp-venv-1, because stdio servers run as the sessions'
#   unprivileged identities, which cannot enter root's home)
# A second run returns at once; changing a pin below reinstalls, and so does
# removing the directory (scripts/lib/pinned-venv.sh).
#
# Prints the virtualenv's path on its last line (messages go to stderr).
set -euo pipefail

NAME=mcp-servers
PACKAGES=(
  "mcp==2.3.0"
  "mcp-server-time==2026.10.19"
  "mcp-server-git==2026.10.19"
)
READY_BINS=(mcp-server-time mcp-server-git)
if [[ "$(id -u)" == 0 ]]; then
  VENV="${AGENTRY_MCP_VENV:-/opt/agentry/mcp-venv-1}"
else
  VENV="${AGENTRY_MCP_VENV:-${HOME:-/tmp}/.cache/agentry/mcp-venv-1}"
fi
CHECK='"$venv/bin/mcp-server-time" --help >/dev/null 2>&1 && "$venv/bin/python" -c "import mcp"'

source "$(dirname "$0")/lib/pinned-venv.sh"
command -v git >/dev/null 2>&1 || log "note: git is not installed; mcp-server-git needs it at run time"
pinned_venv
