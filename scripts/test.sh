#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the test suite. Extra arguments go to pytest.
# 1. The regular suite: every test but the `slow` and `mooncake` ones (an `-m` of yours wins),
#    after checking that the install built the C extensions `hicache.radix.cpack` and
#    `hicache.backends.cfile` where a C compiler is present (their pure-Python fallbacks are
#    slower: long token lists, file-store reads).
# 2. Unless you passed `-m`: the `mooncake` tests (of your paths, default tests/storage_mooncake),
#    which start real Mooncake servers, in a network namespace with only loopback (`unshare
#    --net`; Mooncake's clients listen on 0.0.0.0) and MC_TCP_BIND_ADDRESS=127.0.0.1. Skipped,
#    saying so, when Mooncake Store is not installed (HICACHE_EXTRAS=test,mooncake installs it).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
if command -v cc >/dev/null && ! python -c "import hicache.radix.cpack, hicache.backends.cfile" 2>/dev/null; then
  echo "scripts/test.sh: a C compiler is here but the install did not build hicache.radix.cpack or hicache.backends.cfile"
  exit 1
fi
python -m pytest -m "not slow and not mooncake" "$@"
paths=0
for arg in "$@"; do
  case "$arg" in
    -m | -m*) exit 0 ;;  # a marker selection of yours: that run was all of it
  esac
  if [ -e "${arg%%::*}" ]; then paths=1; fi
done
if ! python -c "import mooncake.store" 2>/dev/null; then
  echo "scripts/test.sh: Mooncake Store not installed (hicache[mooncake]): mooncake tests skipped"
  exit 0
fi
[ "$paths" = 1 ] || set -- "$@" tests/storage_mooncake
as_root=()
[ "$(id -u)" = 0 ] || as_root=(--map-root-user)
echo "scripts/test.sh: the mooncake tests, in a loopback-only network namespace"
rc=0
unshare --net "${as_root[@]}" bash -c \
  'ip link set lo up && MC_TCP_BIND_ADDRESS=127.0.0.1 exec python -m pytest -m mooncake "$@"' \
  bash "$@" || rc=$?
[ "$rc" = 5 ] && rc=0  # your paths held no mooncake test
exit "$rc"
