"""``python -m hicache.replay ...`` is ``hicache replay ...``."""

import sys

from hicache.__main__ import main

sys.exit(main(["replay", *sys.argv[1:]]))
