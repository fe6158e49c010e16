#!/usr/bin/env bash
# Create .venv (once) and install hicache with its test extra (HICACHE_EXTRAS: the extras to
# install, comma-separated, default `test`; lint.sh and CI add `dev`). Sourced by the scripts.
# TORCH_SPEC overrides the torch requirement (default: the CPU build 2.13.0, which a CPU-only
# machine finds locally; on a CUDA machine with torch already installed nothing is reinstalled).
# The editable install runs again only when pyproject.toml, setup.py, the C extensions' sources
# (hicache/radix/cpack.c, hicache/backends/cfile.c, compiled by the install) or the extras
# changed (a stamp of their hash in .venv), so a second run starts in about a second.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [ ! -x .venv/bin/python ]; then
  "${PYTHON:-python3}" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
if ! python -c "import torch" 2>/dev/null; then
  python -m pip install -q "${TORCH_SPEC:-torch==2.13.0+cpu}"
fi
if ! python -c "import triton" 2>/dev/null; then
  python -m pip install -q "${TRITON_SPEC:-triton==3.7.1}"
fi
EXTRAS="${HICACHE_EXTRAS:-test}"
STAMP=.venv/.hicache-install
want="$( (cat pyproject.toml setup.py hicache/radix/cpack.c hicache/backends/cfile.c; echo "$EXTRAS $ROOT") | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ] || ! command -v hicache >/dev/null; then
  python -m pip install -q -e ".[${EXTRAS}]"
  echo "$want" > "$STAMP"
fi
