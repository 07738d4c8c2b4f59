#!/usr/bin/env bash
# Install (scripts/install.sh), then run the default pipeline. Extra arguments go to
# snakemake, e.g.  ./scripts/setup.sh --configfile config/full.yaml   or   ./scripts/setup.sh -n
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

bash scripts/install.sh
exec .venv/bin/snakemake --cores 2 "$@"
