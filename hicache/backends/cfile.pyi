# Types of the C extension hicache/backends/cfile.c.
from typing import Any

def read_pages(
    paths: list[str], buffers: list[Any], stored: int, parts: int, stale_ns: int, /
) -> list[tuple[int, int, int]]: ...
