"""Page checksums: the reference against the documented formula, what they detect, record/verify
against a store, the Triton kernel against the reference (interpreter on CPU, CUDA on a GPU), and
bad arguments rejected before anything is written. Data is random bytes, never zeros."""

from __future__ import annotations

import pytest
import torch

from hicache import env
from hicache.kernels import checksum as C
from hicache.kernels.checksum import page_checksums, record_page_checksums, verify_page_checksums
from tests.kernels.cases import random_bytes

CUDA = torch.cuda.is_available()
INTERPRET = pytest.mark.skipif(
    CUDA or not env.ENV.triton_interpret, reason="interpreter tests run on CPU-only machines"
)
POISON = -0x5A5A5A5A5A5A5A5B


def make_layers(
    parts: int,
    layers: int,
    slots: int,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    seed: int = 0,
    device: str = "cpu",
) -> list[list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [
        [random_bytes((slots, *shape), dtype, gen).to(device) for _ in range(layers)]
        for _ in range(parts)
    ]


def slots_of(n: int, slots: int, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randperm(slots, generator=gen)[:n]


def oracle(layers, indices: torch.Tensor, page_size: int) -> list[list[int]]:
    """The module docstring's formula, one word at a time in plain Python."""
    m32 = (1 << 32) - 1

    def mix(x: int, a: int, b: int) -> int:
        x ^= x >> 16
        x = (x * a) & m32
        x ^= x >> 15
        x = (x * b) & m32
        return x ^ (x >> 16)

    item = layers[0][0][0].numel() * layers[0][0].element_size()
    word = 4 if item % 4 == 0 else 2 if item % 2 == 0 else 1
    out = []
    for p in range(indices.numel() // page_size):
        row = []
        for layer in range(len(layers[0])):
            s1 = s2 = 0
            for k, part in enumerate(layers):
                for t in range(page_size):
                    raw = part[layer][int(indices[p * page_size + t])].contiguous()
                    data = raw.view(torch.uint8).reshape(-1).tolist()
                    for j in range(item // word):
                        w = int.from_bytes(bytes(data[j * word : (j + 1) * word]), "little")
                        key = ((k * page_size + t) * (item // word) + j) * C.KEY_MUL & m32
                        s1 += mix(w ^ key, C.A1, C.B1)
                        s2 += mix(w ^ ((key + C.KEY_ADD) & m32), C.A2, C.B2)
            row.append((s1 & m32) + ((s2 & 0x7FFFFFFF) << 32))
        out.append(row)
    return out


GEOMETRIES = [  # (parts, per-slot shape, dtype, page_size): 4-, 2- and 1-byte words
    (2, (2, 4), torch.float32, 2),
    (1, (1, 6), torch.bfloat16, 1),
    (2, (1, 3), torch.float16, 4),
    (1, (1, 3), torch.uint8, 2),
]


@pytest.mark.parametrize(("parts", "shape", "dtype", "page_size"), GEOMETRIES)
def test_reference_is_the_documented_formula(parts, shape, dtype, page_size) -> None:
    layers = make_layers(parts, 2, 12, shape, dtype)
    idx = slots_of(2 * page_size, 12)
    assert page_checksums(layers, idx, page_size).tolist() == oracle(layers, idx, page_size)


def test_every_single_bit_flip_changes_only_its_page_and_layer() -> None:
    layers = make_layers(2, 2, 8, (1, 2), torch.float32)  # 2 words per item
    idx = torch.tensor([5, 2, 7, 1])
    base = page_checksums(layers, idx, 2)
    for part in range(2):
        for layer in range(2):
            for byte in range(8):
                for bit in range(8):
                    raw = layers[part][layer][7].view(torch.uint8).view(-1)
                    raw[byte] ^= 1 << bit
                    got = page_checksums(layers, idx, 2)
                    raw[byte] ^= 1 << bit
                    changed = (got != base).nonzero().tolist()
                    assert changed == [[1, layer]], (part, layer, byte, bit)


def test_swaps_shifts_and_zeros_are_detected_but_placement_is_not() -> None:
    layers = make_layers(2, 1, 16, (2, 4), torch.bfloat16)
    idx = torch.tensor([3, 9, 4, 12])
    base = page_checksums(layers, idx, 4)
    assert not torch.equal(page_checksums(layers, idx[[1, 0, 2, 3]], 4), base)  # tokens swapped
    assert not torch.equal(page_checksums(layers[::-1], idx, 4), base)  # K and V swapped
    assert not torch.equal(page_checksums(layers, torch.tensor([9, 4, 12, 3]), 4), base)
    moved = [[t.clone() for t in part] for part in layers]
    for part, src in zip(moved, layers, strict=True):
        part[0][[0, 1, 2, 5]] = src[0][idx]  # the same bytes at other slots
    assert torch.equal(page_checksums(moved, torch.tensor([0, 1, 2, 5]), 4), base)
    zeros = [[torch.zeros_like(t) for t in part] for part in layers]
    assert int(page_checksums(zeros, idx, 4)[0, 0]) != 0


def test_record_then_verify_reports_the_first_bad_page_and_the_count() -> None:
    layers = make_layers(2, 3, 16, (2, 4), torch.float16)
    idx = slots_of(12, 16)
    store = torch.full((10, 3), POISON, dtype=torch.int64)
    rows = torch.tensor([7, 2, 9, 0, 4, 5])
    record_page_checksums(layers, idx, 2, store, rows)
    assert torch.equal(store[rows], page_checksums(layers, idx, 2))
    untouched = torch.ones(10, dtype=torch.bool)
    untouched[rows] = False
    assert bool((store[untouched] == POISON).all())
    assert verify_page_checksums(layers, idx, 2, store, rows).tolist() == [6, 0]
    layers[1][2][idx[9]].view(torch.uint8).view(-1)[3] ^= 0x10  # page 4, layer 2
    layers[0][0][idx[6]].view(torch.uint8).view(-1)[0] ^= 0x01  # page 3, layer 0
    assert verify_page_checksums(layers, idx, 2, store, rows).tolist() == [3, 2]
    empty = torch.empty(0, dtype=torch.int64)
    assert verify_page_checksums(layers, empty, 2, store, empty).tolist() == [0, 0]
    assert page_checksums(layers, empty, 2).shape == (0, 3)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"indices": torch.tensor([1, 2, 3]), "page_size": 2}, ValueError, "indices"),
        ({"indices": torch.tensor([1.0, 2.0])}, TypeError, "indices"),
        ({"indices": torch.tensor([1, 16])}, IndexError, "indices"),
        ({"indices": torch.tensor([-1, 2])}, IndexError, "indices"),
        ({"page_size": 0}, ValueError, "page_size"),
        ({"page_size": True}, TypeError, "page_size"),
        ({"rows": torch.tensor([0, 4])}, IndexError, "rows"),
        ({"rows": torch.tensor([0])}, ValueError, "rows"),
        ({"store": torch.full((4, 3), 7, dtype=torch.int64)}, ValueError, "store"),
        ({"store": torch.full((4, 2), 7, dtype=torch.int32)}, ValueError, "store"),
        ({"store": torch.full((2, 4), 7, dtype=torch.int64).t()}, ValueError, "store"),
        ({"layers": []}, TypeError, "layers"),
        ({"layers": "kv"}, TypeError, "layers"),
        ({"backend": "cuda"}, ValueError, "backend"),
        ({"max_programs": 0}, ValueError, "max_programs"),
    ],
)
def test_bad_arguments_raise_before_anything_is_written(kwargs, error, match) -> None:
    layers = make_layers(2, 2, 16, (1, 4), torch.float16)
    args = {
        "layers": layers,
        "indices": torch.tensor([4, 5]),
        "page_size": 1,
        "store": torch.full((4, 2), POISON, dtype=torch.int64),
        "rows": torch.tensor([0, 3]),
    }
    args.update(kwargs)
    before = args["store"].clone()
    with pytest.raises(error, match=match):
        record_page_checksums(**args)
    assert torch.equal(args["store"], before)
    with pytest.raises(error, match=match):
        verify_page_checksums(**args)


def test_mixed_layer_tensors_are_refused() -> None:
    layers = make_layers(2, 2, 16, (1, 4), torch.float16)
    layers[1][1] = layers[1][1].float()
    with pytest.raises(ValueError, match="layers"):
        page_checksums(layers, torch.tensor([1]), 1)
    with pytest.raises(ValueError, match="layers"):
        page_checksums([layers[0], layers[1][:1]], torch.tensor([1]), 1)


def check_triton_matches_reference(parts, shape, dtype, page_size, device, max_programs=64):
    num_slots = max(24, 6 * page_size)
    layers = make_layers(parts, 2, num_slots, shape, dtype, seed=5, device=device)
    idx = slots_of(3 * page_size, num_slots, seed=6).to(device)
    cpu_layers = [[t.cpu() for t in part] for part in layers]
    want = page_checksums(cpu_layers, idx.cpu(), page_size)
    got = page_checksums(layers, idx, page_size, backend="triton", max_programs=max_programs)
    assert torch.equal(got.cpu(), want)
    store = torch.full((5, 2), POISON, dtype=torch.int64)
    store = store.pin_memory() if device == "cuda" else store
    rows = torch.tensor([4, 0, 2])
    record_page_checksums(
        layers, idx, page_size, store, rows, backend="triton", max_programs=max_programs
    )
    if device == "cuda":
        torch.cuda.synchronize()
    assert torch.equal(store[rows], want) and bool((store[[1, 3]] == POISON).all())
    layers[parts - 1][1][idx[page_size]].view(torch.uint8).view(-1)[-1] ^= 0x80  # page 1
    result = verify_page_checksums(
        layers, idx, page_size, store, rows, backend="triton", max_programs=max_programs
    )
    assert result.tolist() == [1, 1]


@INTERPRET
@pytest.mark.parametrize(("parts", "shape", "dtype", "page_size"), GEOMETRIES)
def test_triton_interpreter_matches_reference(parts, shape, dtype, page_size) -> None:
    check_triton_matches_reference(parts, shape, dtype, page_size, "cpu")


@INTERPRET
def test_triton_interpreter_walks_work_with_few_programs_and_wide_items() -> None:
    """Two programs over 6 work items; items wider than one tile of words."""
    check_triton_matches_reference(1, (1, 2600), torch.float32, 1, "cpu", max_programs=2)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize(
    ("parts", "shape", "dtype", "page_size"),
    [
        *GEOMETRIES,
        (2, (8, 128), torch.bfloat16, 64),
        (1, (1, 576), torch.bfloat16, 16),
        (2, (8, 128), torch.bfloat16, 1),
    ],
)
def test_cuda_matches_reference(parts, shape, dtype, page_size) -> None:
    check_triton_matches_reference(parts, shape, dtype, page_size, "cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_cuda_needs_a_pinned_store() -> None:
    layers = make_layers(2, 2, 16, (1, 4), torch.float16, device="cuda")
    with pytest.raises(ValueError, match="pinned"):
        record_page_checksums(
            layers,
            torch.tensor([1], device="cuda"),
            1,
            torch.zeros(4, 2, dtype=torch.int64),
            torch.tensor([0]),
        )
