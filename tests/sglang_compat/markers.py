"""Skip reasons shared by the ports of SGLang's tests."""

from __future__ import annotations

import pytest

NEWER = pytest.mark.skip(
    reason="newer than SGLang 0.5.9 (RadixKey.hash_page, MatchResult.prefix_len)"
)
