"""The Triton page-checksum kernel (launched by :mod:`hicache.kernels.checksum_launch`).

It computes :mod:`hicache.kernels.checksum`'s hash, the same values as
:func:`hicache.kernels.checksum_reference.reference_checksums`. The bodies are untyped on purpose
(Triton values and ``tl.constexpr``; see ``[tool.mypy]``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from hicache.kernels.checksum_reference import A1, A2, B1, B2, KEY_ADD, KEY_MUL

# Compiled kernels read globals only as constexpr (the interpreter is laxer).
_TL_KEY_MUL, _TL_KEY_ADD = tl.constexpr(KEY_MUL), tl.constexpr(KEY_ADD)
_TL_A1, _TL_B1 = tl.constexpr(A1), tl.constexpr(B1)
_TL_A2, _TL_B2 = tl.constexpr(A2), tl.constexpr(B2)


@triton.jit
def _tl_mix(x, A: tl.constexpr, B: tl.constexpr):
    x = x ^ (x >> 16)
    x = x * A
    x = x ^ (x >> 15)
    x = x * B
    return x ^ (x >> 16)


@triton.jit(do_not_specialize=["n_pages", "num_slots", "store_addr"])
def checksum_kernel(
    slots_ptr,
    rows_ptr,
    table_ptr,
    flags_ptr,
    store_addr,
    store_stride,
    n_pages,
    num_layers,
    num_slots,
    NUM_KV: tl.constexpr,
    PAGE: tl.constexpr,
    WORDS: tl.constexpr,
    ITEM_BYTES: tl.constexpr,
    WORD_TY: tl.constexpr,
    UWORD_TY: tl.constexpr,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
    VERIFY: tl.constexpr,
    SKIP_PAD: tl.constexpr,
):
    """Work item ``w`` is (page ``w // num_layers``, layer ``w % num_layers``); records its
    checksum at ``store[rows[page], layer]`` (row stride ``store_stride``) or, with VERIFY,
    writes ``flags[w] = differs``. With SKIP_PAD a page holding slot 0 records ``NO_SUM`` (-1) and
    is never flagged.

    Tile rows are (part, position) pairs ``r = kv * PAGE + t``, so K and V of a small page load
    together; columns are words of an item.
    """
    r_in = tl.arange(0, ROWS)[:, None]
    j_in = tl.arange(0, COLS)[None, :]
    store = store_addr.to(tl.int64).to(tl.pointer_type(tl.int64))
    for w in range(tl.program_id(0), n_pages * num_layers, tl.num_programs(0)):
        page = w // num_layers
        layer = w - page * num_layers
        acc1 = tl.zeros([ROWS, COLS], dtype=tl.int64)
        acc2 = tl.zeros([ROWS, COLS], dtype=tl.int64)
        pads = 0
        for r0 in range(0, NUM_KV * PAGE, ROWS):
            r = r0 + r_in
            live = r < NUM_KV * PAGE
            kv = r // PAGE
            slot = tl.load(slots_ptr + page * PAGE + (r - kv * PAGE), mask=live, other=0)
            base = tl.load(table_ptr + kv * num_layers + layer, mask=live, other=0)
            s_ok = live & (slot >= 0) & (slot < num_slots)
            pads += tl.sum((live & (slot == 0)).to(tl.int32))
            row = (base + tl.where(s_ok, slot, 0) * ITEM_BYTES).to(tl.pointer_type(WORD_TY))
            for j0 in range(0, WORDS, COLS):
                j = j0 + j_in
                ok = s_ok & (j < WORDS)
                word = tl.load(row + j, mask=ok, other=0).to(UWORD_TY, bitcast=True)
                word = word.to(tl.uint32)
                key = (r * WORDS + j).to(tl.uint32) * _TL_KEY_MUL
                h1 = _tl_mix(word ^ key, _TL_A1, _TL_B1)
                h2 = _tl_mix(word ^ (key + _TL_KEY_ADD), _TL_A2, _TL_B2)
                acc1 += tl.where(ok, h1, 0).to(tl.int64)
                acc2 += tl.where(ok, h2, 0).to(tl.int64)
        value = tl.sum(acc1) % 4294967296 + (tl.sum(acc2) % 2147483648) * 4294967296
        target = store + tl.load(rows_ptr + page) * store_stride + layer
        if VERIFY:
            differs = value != tl.load(target)
            if SKIP_PAD:
                differs = differs & (pads == 0)
            tl.store(flags_ptr + w, differs.to(tl.int8))
        else:
            if SKIP_PAD:
                value = tl.where(pads > 0, -1, value)
            tl.store(target, value)
