#!/usr/bin/env bash
# Install a one-machine Slurm for tests/test_slurm.py; safe to run again (only what is missing).
#   Debian packages slurmctld, slurmd, slurm-client and munge (apt-get, as root or via sudo).
# Nothing is configured or started here: the test writes its own slurm.conf and munge key in a
# temporary directory, starts munged, slurmctld and slurmd, and stops them when it is done.
# The Snakemake side (snakemake-executor-plugin-slurm) is a Python dependency of .venv.
set -euo pipefail

# Without an init system the packages' service scripts cannot start anything; that is fine,
# the test starts the daemons itself.
# shellcheck source=apt-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/apt-lib.sh"
apt_install_missing install-slurm slurmctld slurmd slurm-client munge
