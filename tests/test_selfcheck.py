"""The self-check main job round-trips every layout and io_backend and reports mismatches."""

from __future__ import annotations

import pytest

from hicache import selfcheck


def test_selfcheck_passes_every_pair(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    staged: list[int] = []
    real = selfcheck.BackupStaging.backup

    def counted(self, host_pool, device_pool, host_indices, device_indices) -> None:
        staged.append(host_indices.numel())
        real(self, host_pool, device_pool, host_indices, device_indices)

    monkeypatch.setattr(selfcheck.BackupStaging, "backup", counted)
    assert selfcheck.main(["--tokens", "256", "--layers", "2", "--page-size", "16"]) == 0
    assert staged.count(128) == 5  # each staged row's timed backup went through its buffer
    out = capsys.readouterr().out
    # 5 MHA + 4 MLA pairs, auto for each model, and staged backups (3 MHA + 2 MLA layouts)
    assert "16 passed, 0 failed" in out
    assert out.count(" ok") == 16
    assert out.count(" staged ") == 5


def test_selfcheck_detects_a_mismatch(monkeypatch: pytest.MonkeyPatch) -> None:
    original = selfcheck.MHATokenToKVPoolHost.load_to_device_per_layer

    def skip_last_layer(self, device_pool, host_idx, dev_idx, layer_id, io_backend):
        if layer_id < device_pool.layer_num - 1:
            original(self, device_pool, host_idx, dev_idx, layer_id, io_backend)

    monkeypatch.setattr(selfcheck.MHATokenToKVPoolHost, "load_to_device_per_layer", skip_last_layer)
    assert selfcheck.main(["--tokens", "256", "--layers", "2", "--page-size", "16"]) == 1


def test_selfcheck_rejects_bad_arguments() -> None:
    with pytest.raises(SystemExit) as exc:
        selfcheck.main(["--tokens", "0"])
    assert exc.value.code == 2
