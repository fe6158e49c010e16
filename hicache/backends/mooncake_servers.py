"""Start and stop a local Mooncake cluster (``mooncake_master`` + a standalone store process)
over loopback, for tests and benchmarks.

Mooncake's clients listen on ``0.0.0.0`` whatever the flags say, so this refuses to run
(:func:`isolation_problem`) unless the process is in a network namespace whose only interface
is ``lo``, e.g. ``unshare --net bash -c 'ip link set lo up && MC_TCP_BIND_ADDRESS=127.0.0.1
...'``. Both servers bind 127.0.0.1 on free ports, use ``P2PHANDSHAKE`` metadata (no HTTP
metadata listener) and TCP, and are stopped by PID (terminate, then kill).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

__all__ = ["MooncakeServers", "isolation_problem", "start_servers"]


def _loopback_works() -> bool:
    with socket.socket() as server, socket.socket() as client:
        try:
            server.bind(("127.0.0.1", 0))
            server.listen(1)
            client.settimeout(1.0)
            client.connect(server.getsockname())
        except OSError:
            return False
    return True


def isolation_problem() -> str | None:
    """Why a local Mooncake cluster must not start here, or ``None`` when it may: the network
    namespace must hold only ``lo`` (up) and ``MC_TCP_BIND_ADDRESS`` must be ``127.0.0.1``.
    (``socket.if_nameindex`` sees this process's namespace; ``/sys/class/net`` may not.)"""
    names = sorted(name for _, name in socket.if_nameindex())
    if names != ["lo"]:
        return (
            f"needs a loopback-only network namespace (interfaces here: {', '.join(names)}); "
            "run under: unshare --net bash -c 'ip link set lo up && "
            "MC_TCP_BIND_ADDRESS=127.0.0.1 ...'"
        )
    if not _loopback_works():
        return "lo is down: run `ip link set lo up` first"
    if os.environ.get("MC_TCP_BIND_ADDRESS") != "127.0.0.1":
        return "MC_TCP_BIND_ADDRESS must be 127.0.0.1"
    return None


def _binary(name: str) -> str:
    """``name`` next to this Python (a venv's bin) or on PATH; ``FileNotFoundError`` else."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} not found: pip install hicache[mooncake]")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=0.5) as reply:
            return str(reply.read().decode())
    except (OSError, urllib.error.URLError):
        return None


def _stop(proc: subprocess.Popen[bytes], timeout_s: float = 5.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class MooncakeServers:
    """A running master and store; ``master_address`` is what ``MooncakeStore`` needs.

    ``stop()`` (idempotent; also on ``with`` exit) ends both by PID; ``kill_master()`` kills
    the master alone (SIGKILL), as a crash would.
    """

    master_address: str
    metrics_url: str
    logs: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def kill_master(self) -> None:
        master = self.procs[0]
        if master.poll() is None:
            master.kill()
            master.wait()

    def stop(self) -> None:
        for proc in reversed(self.procs):
            _stop(proc)

    def __enter__(self) -> MooncakeServers:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _spawn(servers: MooncakeServers, name: str, args: list[str]) -> None:
    with open(servers.logs / f"{name}.log", "wb") as log:  # the child keeps its own copy
        servers.procs.append(subprocess.Popen([_binary(name), *args], stdout=log, stderr=log))


def _wait(servers: MooncakeServers, what: str, ready: str, deadline: float) -> None:
    """Poll ``metrics_url + ready`` until it answers a non-empty body; stop all and raise
    ``RuntimeError`` when a server exits or ``deadline`` passes."""
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in servers.procs):
            break
        if _get(servers.metrics_url + ready):
            return
        time.sleep(0.05)
    servers.stop()
    raise RuntimeError(f"{what} did not become ready; logs in {servers.logs}")


def start_servers(
    logs: Path,
    segment_size: str = "256 MB",
    lease_ttl_ms: int = 2000,
    client_ttl_s: int = 2,
    timeout_s: float = 10.0,
) -> MooncakeServers:
    """Start ``mooncake_master`` and a ``mooncake_client`` store of ``segment_size`` (e.g.
    ``"64 MB"``) on free loopback ports, wait until the store's segment is mounted, and return
    them; their logs go under ``logs``. ``RuntimeError`` with the reason when not isolated
    (:func:`isolation_problem`) or not ready within ``timeout_s``."""
    problem = isolation_problem()
    if problem is not None:
        raise RuntimeError(problem)
    logs.mkdir(parents=True, exist_ok=True)
    rpc, metrics, store = _free_port(), _free_port(), _free_port()
    servers = MooncakeServers(f"127.0.0.1:{rpc}", f"http://127.0.0.1:{metrics}", logs)
    deadline = time.monotonic() + timeout_s
    _spawn(
        servers,
        "mooncake_master",
        [
            "--rpc_address=127.0.0.1",
            f"--rpc_port={rpc}",
            "--metrics_host=127.0.0.1",
            f"--metrics_port={metrics}",
            "--enable_http_metadata_server=false",
            f"--default_kv_lease_ttl={lease_ttl_ms}",
            f"--client_ttl={client_ttl_s}",
        ],
    )
    _wait(servers, "mooncake_master", "/health", deadline)
    _spawn(
        servers,
        "mooncake_client",
        [
            "--host=127.0.0.1",
            f"--port={store}",
            f"--global_segment_size={segment_size}",
            f"--master_server_address={servers.master_address}",
            "--metadata_server=P2PHANDSHAKE",
            "--protocol=tcp",
        ],
    )
    _wait(servers, "mooncake_client", "/get_all_segments", deadline)
    return servers


def main(argv: list[str]) -> int:
    """``python -m hicache.backends.mooncake_servers [--segment "1 GB"] CMD ...``: start a local
    cluster (inside a loopback-only namespace), run ``CMD`` with
    ``HICACHE_MOONCAKE_MASTER_SERVER_ADDRESS`` set to it, stop the cluster; CMD's exit code."""
    segment = "1 GB"
    if argv[:1] == ["--segment"]:
        segment, argv = argv[1], argv[2:]
    if not argv:
        print(main.__doc__, file=sys.stderr)
        return 2
    import tempfile

    with tempfile.TemporaryDirectory() as logs, start_servers(Path(logs), segment) as servers:
        env = {**os.environ, "HICACHE_MOONCAKE_MASTER_SERVER_ADDRESS": servers.master_address}
        return subprocess.call(argv, env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
