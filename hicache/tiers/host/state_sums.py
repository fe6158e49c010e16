"""StateSums: page integrity (``verify``) for the recurrent states of a hybrid model's host tier.

A host state is one flat row of a ``MambaPoolHost``. Its xxh3 checksum is recorded once its host
copy holds the state (after a backup's copy has landed: a wait on that copy, only with verify
on; or when a storage read filled the row), and is checked before the row is loaded back: every
load under ``"all"``, the first and then one in ``sample_period`` under ``"sample"``, as
``controller.integrity.PageIntegrity`` does for KV pages. A state whose row no longer matches
is corrupt: it is dropped and never served (the node stays, usable for full attention), and
``failures`` counts it. The KV check runs on the device at both ends; this one on the host
bytes, so it catches what changes while the state sits in host memory.
"""

from __future__ import annotations

from typing import Any

import xxhash


class StateSums:
    """Checksums of the host state rows of ``pool`` (a ``MambaPoolHost``) under ``mode``
    (``"sample"`` or ``"all"``), one load in ``sample_period`` checked under ``"sample"``."""

    def __init__(self, pool: Any, mode: str, sample_period: int) -> None:
        self.pool, self.mode, self.sample_period = pool, mode, sample_period
        self.failures = 0
        self._sums: dict[int, int] = {}
        self._loads = 0

    def record(self, slot: int) -> None:
        """Take the checksum of host row ``slot`` (its copy landed)."""
        self._sums[slot] = self._digest(slot)

    def forget(self, slot: int) -> None:
        self._sums.pop(slot, None)

    def intact(self, slot: int) -> bool:
        """Whether host row ``slot`` may be loaded: unchecked this time, or as recorded (a
        row never recorded counts as intact: nothing to compare with). Counts failures."""
        checked = self.mode == "all" or self._loads % self.sample_period == 0
        self._loads += 1
        want = self._sums.get(slot)
        if not checked or want is None or self._digest(slot) == want:
            return True
        self.failures += 1
        return False

    def clear(self) -> None:
        self._sums.clear()

    def _digest(self, slot: int) -> int:
        return xxhash.xxh3_64_intdigest(self.pool.page_bytes(slot).numpy())
