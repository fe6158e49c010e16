"""``python -m hicache.replay ...`` is ``hicache replay ...``."""

import sys

from hicache.cli import HelpFormatter, OneLineParser, add_kv_events, add_log_level, setup_logging
from hicache.replay.cli import main
from hicache.replay.options import add_options

parser = OneLineParser(
    prog="python -m hicache.replay",
    formatter_class=HelpFormatter,
    description="Replay a Mooncake-format trace through HiRadixCache and its real pools.",
)
add_options(parser)
add_log_level(parser)
add_kv_events(parser)
args = parser.parse_args(sys.argv[1:])
setup_logging(args.log_level)
sys.exit(main(args))
