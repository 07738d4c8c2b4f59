#!/usr/bin/env bash
# Install a one-machine Slurm for tests/test_slurm.py; safe to run again (only what is missing).
#   Debian packages slurmctld, slurmd, slurm-client and munge (apt-get, as root or via sudo).
# Nothing is configured or started here: the test writes its own slurm.conf and munge key in a
# temporary directory, starts munged, slurmctld and slurmd, and stops them when it is done.
# The Snakemake side (snakemake-executor-plugin-slurm) is a Python dependency of .venv.
set -euo pipefail

APT_PACKAGES=(slurmctld slurmd slurm-client munge)

log() { printf 'install-slurm: %s\n' "$*" >&2; }

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

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    status="$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)"
    if [ "$status" != "install ok installed" ]; then
        missing+=("$pkg")
    fi
done
if [ "${#missing[@]}" -eq 0 ]; then
    log "Slurm packages present"
    exit 0
fi
log "installing Debian packages: ${missing[*]}"
fresh="$(find /var/lib/apt/lists -maxdepth 1 -name '*_Packages*' -mtime -1 2>/dev/null | head -n 1)"
if [ -z "$fresh" ]; then
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update
fi
# Without an init system the packages' service scripts cannot start anything; that is fine,
# the test starts the daemons itself.
as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
    "${missing[@]}"
