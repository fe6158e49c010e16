"""Connecting a Mooncake Store client: the lazy import, a fast probe of the master, and
``setup`` under a deadline (Mooncake blocks ~90 s in ``setup`` when the master is gone)."""

from __future__ import annotations

import socket
import threading
from typing import Any

from hicache.backends.mooncake_config import MooncakeConfig

__all__ = ["connect"]


def connect(config: MooncakeConfig) -> Any:
    """A ``MooncakeDistributedStore`` set up with ``config``: ``ImportError`` naming the extra
    without the package, ``ConnectionError`` when the master does not answer a TCP connect in
    ``probe_timeout_s`` or ``setup`` fails or outlasts ``setup_timeout_s``."""
    store = _import_store()
    _probe(config)
    _setup(store, config)
    return store


def _import_store() -> Any:
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as exc:
        raise ImportError(
            "the mooncake storage backend needs Mooncake Store: pip install hicache[mooncake] "
            f"(mooncake-transfer-engine-non-cuda; and apt-get install libibverbs1): {exc}"
        ) from exc
    return MooncakeDistributedStore()


def _probe(config: MooncakeConfig) -> None:
    try:
        with socket.create_connection(config.master, timeout=config.probe_timeout_s):
            pass
    except OSError as exc:
        raise ConnectionError(
            f"mooncake master {config.master_server_address} unreachable: {exc}"
        ) from exc


def _setup(store: Any, config: MooncakeConfig) -> None:
    """``store.setup`` in a daemon thread; ``ConnectionError`` unless it returns 0 in time."""
    result: list[Any] = []

    def run() -> None:
        try:
            result.append(
                store.setup(
                    config.local_hostname,
                    config.metadata_server,
                    config.global_segment_size,
                    config.local_buffer_size,
                    config.protocol,
                    config.device_name,
                    config.master_server_address,
                    None,
                    tenant_id=config.tenant_id,
                )
            )
        except Exception as exc:  # reported below, in the constructing thread
            result.append(exc)

    thread = threading.Thread(target=run, name="mooncake-setup", daemon=True)
    thread.start()
    thread.join(config.setup_timeout_s)
    if not result:
        raise ConnectionError(
            f"mooncake setup with {config.master_server_address} did not finish in "
            f"{config.setup_timeout_s} s"
        )
    if result[0] != 0:
        raise ConnectionError(f"mooncake setup with {config.master_server_address}: {result[0]}")
