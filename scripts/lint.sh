#!/usr/bin/env bash
# Set up (scripts/setup.sh, with the dev extra) and lint: `ruff check` and `ruff format --check`
# over hicache, tests, benchmarks and examples, then `mypy` over hicache (configured in pyproject.toml).
set -euo pipefail
export HICACHE_EXTRAS="${HICACHE_EXTRAS:-test,dev}"
. "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
ruff check hicache tests benchmarks examples
ruff format --check hicache tests benchmarks examples
mypy
