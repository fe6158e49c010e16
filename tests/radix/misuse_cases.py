"""The misuse catalogue of the state machine: bad values for each argument it attacks.

Each table maps a label (it appears in a failure message) to the bad value or to a function of
the rig building it from the current state; a built value of None means the case does not apply
in that state (except for the row "None", whose bad value is None itself).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from tests.radix.misuse_rig import Rig

BAD_ROWS: dict[str, Callable[[Rig], Any]] = {
    "None": lambda rig: None,
    "-1": lambda rig: -1,
    "a row no request holds": Rig.free_row,
    "out of range (== size)": lambda rig: rig.rows.size,
    "out of range (size + 7)": lambda rig: rig.rows.size + 7,
}


def _straddle(rig: Rig, fresh: torch.Tensor, n: int) -> torch.Tensor | None:
    return fresh[1 : n + 1] if rig.page > 1 else None


def _tree_owned(rig: Rig, fresh: torch.Tensor, n: int) -> torch.Tensor | None:
    tree = rig.tree_slots()
    return tree[:n] if len(tree) >= n else None


# insert values for a new key of n = 2 pages; ``fresh`` is 3 pages the caller owns.
BAD_SLOTS: dict[str, Callable[[Rig, torch.Tensor, int], Any]] = {
    "out of range": lambda rig, f, n: torch.arange(n) + rig.allocator.size + rig.page,
    "negative": lambda rig, f, n: torch.arange(-n, 0),
    "the reserved slot 0": lambda rig, f, n: torch.cat([torch.arange(rig.page), f[rig.page : n]]),
    "a repeated page": lambda rig, f, n: torch.cat([f[: rig.page], f[: rig.page]]),
    "straddling pages": _straddle,
    "owned by a tree node": _tree_owned,
    "float dtype": lambda rig, f, n: f[:n].double(),
    "bool dtype": lambda rig, f, n: torch.ones(n, dtype=torch.bool),
    "a list": lambda rig, f, n: f[:n].tolist(),
    "2-D": lambda rig, f, n: f[:n].view(2, -1),
}

BAD_KEYS: dict[str, Any] = {
    "bools": [True, False, True, False],
    "bools among ids": [1, True, 2, 3],
    "floats": [1.0, 2.0, 3.0, 4.0],
    "a float array": np.array([1.5, 2.5]),
    "a string": "1234",
    "strings": ["1", "2"],
    "a 2-D array": np.array([[1, 2], [3, 4]]),
    "a (0, 3) array": np.zeros((0, 3), dtype=np.int64),
    "a 2-D tensor": torch.tensor([[1, 2], [3, 4]]),
}
BAD_EXTRA_KEYS: dict[str, Any] = {
    "a list": [1],
    "a float": 1.5,
    "a bool": True,
    "NaN": float("nan"),
}
BAD_COUNTS: dict[str, Any] = {"-1": -1, "1.5": 1.5, "True": True, "'2'": "2", "None": None}
