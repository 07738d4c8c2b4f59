# Sourced by install.sh and install-slurm.sh: install the missing Debian packages, idempotently.
#   apt_install_missing LOG_PREFIX PACKAGE...
# Runs apt-get as root or through sudo; refreshes the package lists only when they are missing
# or older than a day.

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        printf '%s: need root (or sudo) to run: %s\n' "$APT_LOG_PREFIX" "$*" >&2
        return 1
    fi
}

apt_install_missing() {
    APT_LOG_PREFIX="$1"
    shift
    local missing=() pkg status fresh
    for pkg in "$@"; do
        status="$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)"
        if [ "$status" != "install ok installed" ]; then
            missing+=("$pkg")
        fi
    done
    if [ "${#missing[@]}" -eq 0 ]; then
        printf '%s: Debian packages present\n' "$APT_LOG_PREFIX" >&2
        return 0
    fi
    printf '%s: installing Debian packages: %s\n' "$APT_LOG_PREFIX" "${missing[*]}" >&2
    fresh="$(find /var/lib/apt/lists -maxdepth 1 -name '*_Packages*' -mtime -1 2>/dev/null \
        | head -n 1)"
    if [ -z "$fresh" ]; then
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update
    fi
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        "${missing[@]}"
}
