# Types of the C extension hicache/radix/cpack.c.
import numpy as np

def pack_ids(seq: list[object] | tuple[object, ...], out: np.ndarray, /) -> int: ...
