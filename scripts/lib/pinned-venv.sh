# Sourced by the scripts that provide pinned Python packages from PyPI in a
# virtualenv outside the repository (mcp-servers.sh, protocol-clients.sh).
#
# The caller sets:
#   NAME        what the venv is for, in messages ("mcp-servers")
#   PACKAGES    an array of pins ("mcp==2.3.0" ...)
#   VENV        where the venv lives
#   CHECK       a shell snippet, run after installing, that fails when the
#               venv does not work ("$venv" names it)
#   READY_BINS  an array of programs under $VENV/bin that must exist
# then calls pinned_venv, which prints the venv's path on its last line
# (messages go to stderr). A stamp file inside the venv records the pins of
# the last successful install, so a second run returns at once; changing a
# pin reinstalls, and so does removing the directory.

log() { printf '==> %s: %s\n' "$NAME" "$*" >&2; }

pinned_venv() {
  local venv="$VENV"
  # The interpreter: the system's where there is one, since every identity
  # the venv's programs may run as can read it (a pyenv or a home-directory
  # Python is closed to sandboxed processes).
  local python="${AGENTRY_VENV_PYTHON:-${AGENTRY_MCP_PYTHON:-}}"
  if [[ -z "$python" ]]; then
    if [[ -x /usr/bin/python3 ]]; then python=/usr/bin/python3; else python=python3; fi
  fi
  local stamp="$venv/.agentry-stamp"
  local want="$python ${PACKAGES[*]}"

  ready() {
    [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -x "$venv/bin/python" ]] || return 1
    local bin
    for bin in "${READY_BINS[@]}"; do [[ -x "$venv/bin/$bin" ]] || return 1; done
  }

  if ready; then
    echo "$venv"
    return 0
  fi

  # The SDKs need Python 3.10 or newer, and a venv module with ensurepip
  # (Debian ships that separately, as python3-venv).
  command -v "$python" >/dev/null 2>&1 || { log "$python is not installed"; exit 1; }
  "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || {
    log "$python is $("$python" --version 2>&1); these packages need 3.10 or newer"
    exit 1
  }
  if ! "$python" -c 'import venv, ensurepip' >/dev/null 2>&1; then
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
  fi
  mkdir -p "$(dirname "$venv")"

  # One installer at a time; whoever waited finds the work done.
  if command -v flock >/dev/null 2>&1; then
    exec 9>"$venv.lock"
    flock 9
    if ready; then
      echo "$venv"
      return 0
    fi
  fi

  # A virtualenv cannot be moved (its scripts name their interpreter by
  # absolute path), so it is built in place; the stamp, written last, marks
  # it complete.
  log "creating $venv"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  log "installing ${PACKAGES[*]}"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input "${PACKAGES[@]}" >&2 || {
    log "pip install failed"
    exit 1
  }
  (eval "$CHECK") || {
    log "the new venv does not work ($CHECK): remove $venv and run again"
    exit 1
  }
  "$venv/bin/python" - "${PACKAGES[@]}" <<'PY' || { log "installed versions differ from the pins"; exit 1; }
import sys
from importlib.metadata import version
# "name[extra]==1.0": the version of name.
bad = [p for p in sys.argv[1:] if version(p.split("==")[0].split("[")[0]) != p.split("==")[1]]
if bad:
    print("not installed as pinned: " + ", ".join(bad), file=sys.stderr)
    sys.exit(1)
PY
  printf '%s' "$want" >"$stamp"
  log "ready"
  echo "$venv"
}
