#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
python -m pytest tests "$@"
