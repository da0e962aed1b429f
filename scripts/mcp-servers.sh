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
# A stamp file inside it records the pins of the last successful install, so a
# second run returns at once. Changing a pin below reinstalls; so does
# removing the directory.
#
# Prints the virtualenv's path on its last line (messages go to stderr).
set -euo pipefail

PACKAGES=(
  "mcp==2.3.0"
  "mcp-server-time==2026.10.19"
  "mcp-server-git==2026.10.19"
)

if [[ "$(id -u)" == 0 ]]; then
  default_venv=/opt/agentry/mcp-venv-1
else
  default_venv="${HOME:-/tmp}/.cache/agentry/mcp-venv-1"
fi
venv="${AGENTRY_MCP_VENV:-$default_venv}"
# The interpreter: the system's where there is one, since every identity the
# servers run as can read it (a pyenv or a home-directory Python is closed
# to them).
python="${AGENTRY_MCP_PYTHON:-}"
if [[ -z "$python" ]]; then
  if [[ -x /usr/bin/python3 ]]; then python=/usr/bin/python3; else python=python3; fi
fi
stamp="$venv/.agentry-mcp-stamp"
want="$python ${PACKAGES[*]}"
log() { printf '==> mcp-servers: %s\n' "$*" >&2; }

ready() {
  [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] &&
    [[ -x "$venv/bin/python" && -x "$venv/bin/mcp-server-time" && -x "$venv/bin/mcp-server-git" ]]
}

if ready; then
  echo "$venv"
  exit 0
fi

# The SDK needs Python 3.10 or newer, and a venv module with ensurepip
# (Debian ships that separately, as python3-venv).
need_venv() {
  command -v "$python" >/dev/null 2>&1 || { log "$python is not installed"; exit 1; }
  "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || {
    log "$python is $("$python" --version 2>&1); the mcp SDK needs 3.10 or newer"
    exit 1
  }
  "$python" -c 'import venv, ensurepip' >/dev/null 2>&1 && return
  if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    log "python3 -m venv is unavailable; install python3-venv (Debian/Ubuntu) or the equivalent and run again"
    exit 1
  fi
  log "installing python3-venv"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
  "$python" -c 'import venv, ensurepip' >/dev/null 2>&1 || {
    log "python3 -m venv still does not work after installing python3-venv"
    exit 1
  }
}

need_venv
mkdir -p "$(dirname "$venv")"

# One installer at a time; whoever waited finds the work done.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$venv.lock"
  flock 9
  if ready; then
    echo "$venv"
    exit 0
  fi
fi

# A virtualenv cannot be moved (its scripts name their interpreter by absolute
# path), so it is built in place; the stamp, written last, marks it complete.
log "creating $venv"
rm -rf "$venv"
"$python" -m venv "$venv"
log "installing ${PACKAGES[*]}"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input "${PACKAGES[@]}" >&2 || {
  log "pip install failed"
  exit 1
}

"$venv/bin/mcp-server-time" --help >/dev/null 2>&1 || {
  log "$venv/bin/mcp-server-time --help fails: remove $venv and run again"
  exit 1
}
"$venv/bin/python" -c 'import mcp' || {
  log "$venv/bin/python cannot import mcp: remove $venv and run again"
  exit 1
}
"$venv/bin/python" - "${PACKAGES[@]}" <<'EOF' || { log "installed versions differ from the pins"; exit 1; }
import sys
from importlib.metadata import version
bad = [p for p in sys.argv[1:] if version(p.split("==")[0]) != p.split("==")[1]]
if bad:
    print("not installed as pinned: " + ", ".join(bad), file=sys.stderr)
    sys.exit(1)
EOF
command -v git >/dev/null 2>&1 || log "note: git is not installed; mcp-server-git needs it at run time"

printf '%s' "$want" >"$stamp"
log "ready"
echo "$venv"
