"""MooncakeConfig and MooncakeStore construction failures (no cluster; runs everywhere)."""

from __future__ import annotations

import sys
import time

import pytest

from hicache.backends.factory import create_storage_backend
from hicache.backends.mooncake_config import MooncakeConfig


def test_arguments_then_env_then_defaults() -> None:
    env = {"master_server_address": "10.0.0.1:1", "protocol": "rdma", "local_buffer_size": "32mb",
           "setup_timeout_s": "2.5", "global_segment_size": "1073741824"}  # fmt: skip
    config = MooncakeConfig.resolve({"master_server_address": "h:50051", "protocol": None}, env)
    assert config.master == ("h", 50051) and config.protocol == "rdma"
    assert config.local_buffer_size == 32 << 20 and config.global_segment_size == 1 << 30
    assert config.setup_timeout_s == 2.5 and config.metadata_server == "P2PHANDSHAKE"
    assert MooncakeConfig.resolve({}, {"master_server_address": "x:1"}).protocol == "tcp"


@pytest.mark.parametrize(
    ("given", "env", "error", "match"),
    [
        ({}, {}, ValueError, "master_server_address is required"),
        ({"master_server_address": "nohost"}, {}, ValueError, "host:port"),
        ({"master_server_address": "h:1", "protocol": "udp"}, {}, ValueError, "protocol"),
        ({"master_server_address": "h:1", "local_buffer_size": -1}, {}, ValueError, "local_buf"),
        ({"master_server_address": "h:1", "device_name": 3}, {}, TypeError, "device_name"),
        ({"master_server_address": "h:1", "setup_timeout_s": 0}, {}, ValueError, "setup_tim"),
        ({"master_server_address": "h:1"}, {"global_segment_size": "4 lots"}, ValueError,
         "HICACHE_MOONCAKE_GLOBAL_SEGMENT_SIZE"),
        ({"master_server_address": "h:1"}, {"probe_timeout_s": "soon"}, ValueError,
         "HICACHE_MOONCAKE_PROBE_TIMEOUT_S"),
    ],
)  # fmt: skip
def test_bad_settings_name_themselves(given, env, error, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match=match):
        MooncakeConfig.resolve(given, env)


def test_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mooncake.store", None)
    with pytest.raises(ImportError, match=r"pip install hicache\[mooncake\]"):
        create_storage_backend("mooncake", {"master_server_address": "127.0.0.1:1"})


def test_dead_master_fails_construction_fast() -> None:
    pytest.importorskip("mooncake.store", reason="Mooncake Store not installed: hicache[mooncake]")
    start = time.monotonic()
    with pytest.raises(ConnectionError, match="127.0.0.1:1 unreachable"):
        create_storage_backend("mooncake", {"master_server_address": "127.0.0.1:1"})
    assert time.monotonic() - start < 5.0
