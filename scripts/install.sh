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

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        log "need root (or sudo) to run: $*"
        return 1
    fi
}

# --- 1. system packages -------------------------------------------------------
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    status="$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)"
    if [ "$status" != "install ok installed" ]; then
        missing+=("$pkg")
    fi
done
if [ "${#missing[@]}" -gt 0 ]; then
    log "installing Debian packages: ${missing[*]}"
    # Refresh the package lists only when they are missing or older than a day.
    fresh="$(find /var/lib/apt/lists -maxdepth 1 -name '*_Packages*' -mtime -1 2>/dev/null | head -n 1)"
    if [ -z "$fresh" ]; then
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update
    fi
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        "${missing[@]}"
else
    log "Debian packages present"
fi

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
