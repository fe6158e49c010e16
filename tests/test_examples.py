"""The scripts in examples/ run as a user would run them and print what they promise."""

from __future__ import annotations

import os
import runpy
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hicache.bench.config import BenchConfig
from hicache.bench.workload import ChatWorkload

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_embed_example_loads_history_back_from_the_host_then_from_storage(capsys) -> None:
    runpy.run_path(str(EXAMPLES / "embed.py"), run_name="__main__")
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 5
    assert lines[0].endswith("{'device': 0, 'host': 0, 'storage': 0, 'computed': 192}")
    assert lines[1].endswith("{'device': 128, 'host': 0, 'storage': 0, 'computed': 64}")
    assert lines[3].endswith("{'device': 128, 'host': 64, 'storage': 0, 'computed': 32}")
    assert lines[4].endswith("{'device': 0, 'host': 0, 'storage': 224, 'computed': 16}")


@pytest.mark.parametrize("script", sorted(p.name for p in EXAMPLES.glob("*.py")))
def test_every_example_has_a_docstring_saying_how_to_run_it(script: str) -> None:
    assert f"python examples/{script}" in (EXAMPLES / script).read_text()


TINY_BENCH = {"users": 3, "rounds": 2, "system_len": 32, "prompt_len": 16, "answer_len": 2}
TINY_BENCH |= {"device_tokens": 128, "layers": 1, "threads": 1, "page_size": 4}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bench(seed: int, pub: str, replay: str, out: Path) -> subprocess.Popen[bytes]:
    args = [f"--{k.replace('_', '-')}={v}" for k, v in TINY_BENCH.items()]
    env = {**os.environ, "PYTHONPATH": str(EXAMPLES.parent)}
    command = [sys.executable, "-m", "hicache", "bench", *args, f"--seed={seed}"]
    command += ["--no-progress", f"--out-dir={out}", f"--kv-events={pub}"]
    command += [f"--kv-events-replay={replay}"]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)


def test_kv_router_finds_the_instance_holding_a_prompt(tmp_path: Path) -> None:
    pytest.importorskip("zmq")
    router_module = runpy.run_path(str(EXAMPLES / "kv_router.py"))
    ends = {
        name: (f"tcp://127.0.0.1:{_free_port()}", f"tcp://127.0.0.1:{_free_port()}")
        for name in ("a", "b")
    }
    router = router_module["KVRouter"](ends)
    procs = [_bench(seed, *ends[name], tmp_path / name) for seed, name in enumerate(ends)]
    try:
        while any(p.poll() is None for p in procs):
            router.poll(100)
        router_module["run"](router, idle_s=1.0, limit_s=10.0)
    finally:
        for p in procs:
            p.kill()
        router.close()
    assert [p.returncode for p in procs] == [0, 0]
    for seed, name in enumerate(ends):
        config = BenchConfig.from_args({**TINY_BENCH, "seed": seed, "device": "cpu"})
        best, other = router.route(ChatWorkload(config).system)
        assert best.instance == name and best.tokens == 32  # its system prompt, every page
        assert best.by_medium["GPU"] + best.by_medium["CPU_PINNED"] == 32
        assert other.tokens == 0
