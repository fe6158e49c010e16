#!/usr/bin/env bash
# The stress harness's stamp, .ci/stress.sha256: one hash over hicache/stress and tests/stress.
# Run after `bash scripts/test.sh -m slow` passed to record it; `--check` (CI) exits 1, saying
# so, when the harness differs from the stamp, i.e. the slow suite has not run on it yet.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
STAMP=.ci/stress.sha256
current=$(find hicache/stress tests/stress -type f -name '*.py' | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -d' ' -f1)
if [ "${1:-}" = "--check" ]; then
  recorded=$(cat "$STAMP" 2>/dev/null || echo none)
  if [ "$current" != "$recorded" ]; then
    echo "stress harness changed: hicache/stress + tests/stress hash $current, $STAMP has $recorded"
    exit 1
  fi
  echo "stress harness unchanged since the slow suite last passed ($STAMP)"
else
  echo "$current" > "$STAMP"
  echo "wrote $STAMP: $current"
fi
