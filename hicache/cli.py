"""What the command lines share: one-line errors, --help with defaults, the log level, and the
KV-event flags of ``hicache bench`` and ``hicache replay`` (``hicache.__main__``,
``python -m hicache.replay``, ``python -m hicache.stress``)."""

from __future__ import annotations

import argparse
import logging
from typing import NoReturn

LOG_LEVELS = ("debug", "info", "warning", "error")


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are a single ``prog: error: message`` line."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help with each option's default, except where there is none to show (None, a flag's
    False) or the help text already names it (a default that depends on the device)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default is None or action.default is False or "default" in text:
            return text
        return super()._get_help_string(action)


def plain(text: str) -> str:
    """``text`` without reST's double backticks, for --help."""
    return text.replace("``", "")


def add_log_level(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default="warning",
        help="what goes to stderr besides the report (info: each phase)",
    )


def setup_logging(level: str) -> None:
    """Log records of ``level`` and above to stderr as ``LEVEL name: message``."""
    logging.basicConfig(
        level=level.upper(), format="%(levelname)s %(name)s: %(message)s", force=True
    )


def add_kv_events(p: argparse.ArgumentParser) -> None:
    """``--kv-events`` and ``--kv-events-replay`` (``hicache.kv_events``)."""
    g = p.add_argument_group(
        "KV events", "publish every tier's KV events over ZMQ in SGLang's format ('[events]' extra)"
    )
    g.add_argument(
        "--kv-events", metavar="ENDPOINT", help="bind a PUB socket here, e.g. tcp://127.0.0.1:5557"
    )
    g.add_argument(
        "--kv-events-replay",
        metavar="ENDPOINT",
        help="bind the replay (ROUTER) socket here, e.g. tcp://127.0.0.1:5558 (default: none)",
    )
