"""Skip reasons shared by the ports of SGLang's tests."""

from __future__ import annotations

import pytest

EVENTS = pytest.mark.skip(
    reason="KV cache events and page hashes (enable_kv_cache_events, take_events, "
    "TreeNode.hash_value): the events part of issue #18, not on this branch"
)
NEWER = pytest.mark.skip(
    reason="newer than SGLang 0.5.9 (RadixKey.hash_page, MatchResult.prefix_len)"
)
