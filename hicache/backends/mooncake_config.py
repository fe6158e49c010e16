"""MooncakeConfig: the validated settings of the Mooncake Store backend.

Each setting comes from the argument when given, else ``HICACHE_MOONCAKE_<NAME>`` (read by
``hicache.env``), else its default; only ``master_server_address`` has none.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from hicache.checks import check_choice, check_int
from hicache.env import mooncake_settings

__all__ = ["MooncakeConfig"]

_UNITS = {"": 1, "b": 1, "kb": 1 << 10, "mb": 1 << 20, "gb": 1 << 30, "tb": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?b?)\s*$", re.IGNORECASE)


def _env_value(name: str, raw: str, kind: type) -> Any:
    """``raw`` (the value of ``HICACHE_MOONCAKE_<NAME>``) as ``kind``; ``ValueError`` naming
    the variable when it does not parse."""
    var = f"HICACHE_MOONCAKE_{name.upper()}"
    if kind is str:
        return raw
    if kind is int:
        match = _SIZE.match(raw)
        if match is None:
            raise ValueError(f"{var}={raw!r} must be a byte count such as 1073741824 or '4gb'")
        return int(match.group(1)) * _UNITS[match.group(2).lower()]
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{var}={raw!r} must be a number of seconds") from None


@dataclass(frozen=True)
class MooncakeConfig:
    """Settings of one ``MooncakeStore`` client.

    Attributes
    ----------
    master_server_address : ``host:port`` of ``mooncake_master``'s RPC service.
    metadata_server : transfer-engine metadata: ``P2PHANDSHAKE`` (no server), an
        ``http://.../metadata`` URL or etcd; every process of a cluster must use the same.
    protocol : ``tcp`` or ``rdma``.
    device_name : RDMA device(s) (``""`` for TCP).
    local_hostname : the address this client advertises (set ``MC_TCP_BIND_ADDRESS`` on hosts
        with several NICs).
    global_segment_size : bytes this process contributes to the store; 0 (default) keeps no
        pages here, so they outlive it in a standalone ``mooncake_client`` store.
    local_buffer_size : bytes of the client's transfer buffer (zero-copy calls barely use it).
    tenant_id : Mooncake tenant (its own quotas and isolation).
    probe_timeout_s : the TCP probe of the master before setup (a dead master fails here).
    setup_timeout_s : deadline of ``setup`` (which blocks ~90 s without a master).
    """

    master_server_address: str
    metadata_server: str = "P2PHANDSHAKE"
    protocol: str = "tcp"
    device_name: str = ""
    local_hostname: str = "127.0.0.1"
    global_segment_size: int = 0
    local_buffer_size: int = 16 << 20
    tenant_id: str = "default"
    probe_timeout_s: float = 1.0
    setup_timeout_s: float = 20.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "str" and not isinstance(value, str):
                raise TypeError(f"{f.name} must be a str, got {type(value).__name__}")
            if f.type == "int":
                check_int(f.name, value)
            if f.type == "float":
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise TypeError(f"{f.name} must be a number, got {type(value).__name__}")
                if not (math.isfinite(value) and value > 0):
                    raise ValueError(f"{f.name} must be finite and > 0, got {value}")
        check_choice("protocol", self.protocol, ("tcp", "rdma"))
        host, _, port = self.master_server_address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(
                f"master_server_address must be 'host:port', got {self.master_server_address!r}"
            )

    @property
    def master(self) -> tuple[str, int]:
        """``(host, port)`` of the master."""
        host, _, port = self.master_server_address.rpartition(":")
        return host, int(port)

    @classmethod
    def resolve(
        cls, given: Mapping[str, Any], env: Mapping[str, str] | None = None
    ) -> MooncakeConfig:
        """The config from ``given`` (``None`` values are not given), then ``env`` (default:
        the ``HICACHE_MOONCAKE_*`` variables), then the defaults. ``ValueError`` without a
        master address or on an unparsable variable."""
        env = mooncake_settings() if env is None else env
        kinds = {f.name: {"str": str, "int": int, "float": float}[str(f.type)] for f in fields(cls)}
        values: dict[str, Any] = {}
        for name, kind in kinds.items():
            if given.get(name) is not None:
                values[name] = given[name]
            elif name in env:
                values[name] = _env_value(name, env[name], kind)
        if "master_server_address" not in values:
            raise ValueError(
                "master_server_address is required (or set HICACHE_MOONCAKE_MASTER_SERVER_ADDRESS)"
            )
        return cls(**values)
