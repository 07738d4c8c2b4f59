#!/usr/bin/env bash
# Install (scripts/install.sh), lint, then run the tests. Extra arguments go to pytest.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

bash scripts/install.sh
bash scripts/install-slurm.sh  # Debian slurmctld/slurmd/munge for tests/test_slurm.py
.venv/bin/ruff check src tests workflow benchmarks
exec .venv/bin/pytest -q "$@"
