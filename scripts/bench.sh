#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the main job. Extra arguments go to `hicache`.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
if [ "$#" -eq 0 ]; then set -- bench; fi
hicache "$@"
