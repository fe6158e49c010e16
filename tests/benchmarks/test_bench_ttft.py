"""``benchmarks/bench_ttft.py`` runs end to end on the CPU (tiny geometry, no Mooncake): every
tier has a row per prefix, each hit served the whole prefix from the tier it measures, the
Mooncake row says why it did not run. No timing is asserted: CPU copies are synchronous."""

from __future__ import annotations

import json
from pathlib import Path

from tests.benchmarks.test_bench_overlap import run


def test_bench_ttft_writes_every_tier(tmp_path: Path) -> None:
    out, md = tmp_path / "ttft.json", tmp_path / "ttft.md"
    text = run("bench_ttft.py", "--device", "cpu", "--quick", "--prefixes", "64,128",
               "--repeats", "1", "--no-mooncake", "--keep-page-cache",
               "--json", str(out), "--markdown", str(md))  # fmt: skip
    report = json.loads(out.read_text())
    rows = {(r["tier"], r["prefix"]): r for r in report["rows"]}
    assert set(rows) == {(t, p) for t in ("device", "host", "file", "miss") for p in (64, 128)}
    for (tier, prefix), row in rows.items():
        assert row["ttft_s"] > 0
        if tier == "miss":
            assert row["served_min"] == prefix + 16  # the whole prompt computed
        else:
            assert row["served_min"] == prefix, tier
        assert (row["h2d_gbps"] is not None) == (tier in ("host", "file")), tier
        assert (row["read_gbps"] is not None) == (tier == "file"), tier
    assert report["notes"]["mooncake"].startswith("not run")
    assert md.read_text() in text and "| Mooncake hit | not run" in text
