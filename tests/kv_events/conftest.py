"""The KV-event wire tests need the `events` extra (pyzmq, msgspec; the `test` extra has both):
without it the folder is skipped, saying so."""

import pytest

pytest.importorskip("msgspec")
pytest.importorskip("zmq")
