#!/usr/bin/env bash
# Install everything cpumap needs; safe to run again (it only does what is missing).
#   1. Debian packages: compilers, gdb, PAPI, valgrind, llvm-19 (llvm-mca) (apt-get, as root or via sudo)
#   2. .venv with cpumap installed editable, plus the dev tools (pytest, ruff)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

# python3-venv: Debian's python3 cannot create a venv without it.
APT_PACKAGES=(build-essential gcc binutils gdb libpapi-dev papi-tools valgrind python3-venv llvm-19)
VENV="$ROOT/.venv"
STAMP="$VENV/.cpumap-install.stamp"

log() { printf 'install: %s\n' "$*" >&2; }

# --- 1. system packages -------------------------------------------------------
# shellcheck source=apt-lib.sh
source "$ROOT/scripts/apt-lib.sh"
apt_install_missing install "${APT_PACKAGES[@]}"

# --- 2. Python environment ----------------------------------------------------
PYTHON="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
    if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
        log "$PYTHON is older than 3.11; set PYTHON=/path/to/python3.11 or newer"
        exit 1
    fi
    log "creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
have="$(cat "$STAMP" 2>/dev/null || true)"
if [ "$want" = "$have" ] && "$VENV/bin/python" -c 'import cpumap' >/dev/null 2>&1; then
    log "Python environment up to date"
else
    log "installing cpumap and its dependencies into $VENV"
    "$VENV/bin/python" -m pip install --quiet -e '.[dev]'
    printf '%s\n' "$want" >"$STAMP"
fi
