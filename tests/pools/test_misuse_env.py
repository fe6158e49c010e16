"""Issue 12, bad environment variables: importing never fails; using the setting names it."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hicache import env
from hicache.pools import MHATokenToKVPool, MHATokenToKVPoolHost, host_layouts

RESERVE = "HICACHE_HOST_RAM_RESERVE_GB"
ROOT = Path(__file__).resolve().parents[2]


def host_pool() -> MHATokenToKVPoolHost:
    device = MHATokenToKVPool(8, 1, torch.float16, 2, 4, 2, "cpu")
    return MHATokenToKVPoolHost(device, 2.0, 0, 1, "layer_first")


def test_bad_reserve_does_not_break_import_and_is_named_on_use():
    script = (
        "import hicache.radix, hicache.engine, hicache.stress\n"
        "from tests.pools.test_misuse_env import host_pool\n"
        "try:\n    host_pool()\nexcept ValueError as e:\n    print('ValueError', e)\n"
    )
    run_env = {**os.environ, RESERVE: "two", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", script],
        env=run_env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert f"ValueError {RESERVE}='two'" in out.stdout


@pytest.mark.parametrize("raw", ["abc", "-1", "inf", "-inf", "nan", "", "1e400"])
def test_bad_reserve_is_rejected_when_a_host_pool_is_built(monkeypatch, raw):
    monkeypatch.setenv(RESERVE, raw)
    settings = env.Env.read()
    assert isinstance(settings.host_ram_reserve_gb, env.Invalid)
    monkeypatch.setattr(host_layouts, "ENV", settings)
    with pytest.raises(ValueError, match=RESERVE):
        host_pool()


@pytest.mark.parametrize("raw, gb", [("0", 0.0), (" 0.5 ", 0.5), ("3", 3.0)])
def test_good_reserve_is_read(monkeypatch, raw, gb):
    monkeypatch.setenv(RESERVE, raw)
    settings = env.Env.read()
    assert settings.host_ram_reserve_gb == gb
    monkeypatch.setattr(host_layouts, "ENV", dataclasses.replace(settings, host_ram_reserve_gb=0))
    assert host_pool().size == 16


def test_unrecognised_flag_is_named_when_consulted(monkeypatch):
    """``HICACHE_CHECK_DEVICE_INDICES=ture`` was silently off; now it is an error on use."""
    monkeypatch.setenv("HICACHE_CHECK_DEVICE_INDICES", "ture")
    monkeypatch.setattr(env, "ENV", env.Env.read())
    with pytest.raises(ValueError, match="HICACHE_CHECK_DEVICE_INDICES='ture'"):
        env.device_indices_checked()
    for raw, want in (("1", True), ("off", False), ("", False), ("YES", True)):
        monkeypatch.setenv("HICACHE_CHECK_DEVICE_INDICES", raw)
        monkeypatch.setattr(env, "ENV", env.Env.read())
        assert env.device_indices_checked() is want
