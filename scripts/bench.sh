#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the main job. Arguments go to `hicache` (default: bench).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
case "${1:-}" in ""|-*) set -- bench "$@" ;; esac  # default subcommand: bench
hicache "$@"
