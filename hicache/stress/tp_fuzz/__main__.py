"""``python -m hicache.stress.tp_fuzz``: see ``hicache.stress.tp_fuzz.fuzz``."""

import sys

from hicache.stress.tp_fuzz.fuzz import main

sys.exit(main())
