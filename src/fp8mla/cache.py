"""Paged latent and index-key caches with quantize-on-write stores.

A pool is ``[num_layers, num_pages, page_size, row_bytes]`` uint8 (one allocation for all
layers; ``num_layers=1`` for one per layer). A token's slot is page · page_size + offset; block
tables map a request's logical page i to a physical page (int32 ``[batch, max_pages]``).
"""

from __future__ import annotations

import math
import operator

import torch

from fp8mla import formats
from fp8mla._checks import check_int, check_page_size, check_slot_range, check_tensor
from fp8mla.formats import (
    INDEX_HEAD_DIM,
    INDEX_ROW_BYTES,
    LATENT_DIM,
    ROPE_DIM,
    SCALE_POLICIES,
    KVFormat,
    dequantize_index_keys,
    dequantize_kv,
)
from fp8mla.kernels.launch import fast
from fp8mla.kernels.store import (
    FMT_BF16,
    FMT_DS_MLA,
    FMT_FP8,
    _store_index_keys_kernel,
    _store_kv_kernel,
)

__all__ = ["PagedKVCache", "IndexKeyCache", "PageAllocator", "build_block_table", "slot_mapping"]

_FORMAT_IDS = {"bf16": FMT_BF16, "fp8": FMT_FP8, "fp8_ds_mla": FMT_DS_MLA}


def _check_slots(slots: torch.Tensor, n_tokens: int, num_slots: int, check: bool) -> torch.Tensor:
    check_tensor("slot_mapping", slots, dtype=(torch.int32, torch.int64), shape=(n_tokens,))
    if check:
        check_slot_range("slot_mapping", slots, num_slots)
    return slots.contiguous()


class PagedKVCache:
    """The MLA latent cache: rows of ``[c_kv (512) | k_rope (64)]`` in one `KVFormat`.

    pool: uint8 ``[num_layers, num_pages, page_size, fmt.row_bytes]``.
    fp8_scales: float32 ``[num_layers]``, the per-tensor scale of the ``fp8`` format (the
    value an engine calibrates; other formats ignore it).
    """

    def __init__(
        self,
        num_pages: int,
        page_size: int,
        kv_format: str | KVFormat = "fp8_ds_mla",
        *,
        scale_policy: str | None = None,
        num_layers: int = 1,
        fp8_scale: float = 1.0,
        device: str | torch.device = "cpu",
    ) -> None:
        self.fmt = formats.kv_format(kv_format, scale_policy)
        self.num_pages = check_int("num_pages", num_pages, lo=1)
        self.page_size = check_page_size(page_size)
        self.num_layers = check_int("num_layers", num_layers, lo=1)
        if not (isinstance(fp8_scale, (int, float)) and math.isfinite(fp8_scale) and fp8_scale > 0):
            raise ValueError(f"fp8_scale: expected a finite float > 0, got {fp8_scale!r}")
        self.pool = torch.zeros(num_layers, num_pages, page_size, self.fmt.row_bytes,
                                dtype=torch.uint8, device=device)
        self.fp8_scales = torch.full((num_layers,), float(fp8_scale), dtype=torch.float32,
                                     device=device)

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    @property
    def device(self) -> torch.device:
        return self.pool.device

    def layer(self, i: int) -> torch.Tensor:
        """uint8 [num_pages, page_size, row_bytes] view of layer ``i``."""
        check_int("layer", i, lo=0, hi=self.num_layers - 1)
        return self.pool[i]

    def scale(self, i: int) -> torch.Tensor:
        """float32 [1] view of layer ``i``'s per-tensor fp8 scale."""
        check_int("layer", i, lo=0, hi=self.num_layers - 1)
        return self.fp8_scales[i:i + 1]

    def store(
        self, layer: int, latent: torch.Tensor, rope: torch.Tensor, slot_mapping: torch.Tensor,
        *, check: bool = True,
    ) -> None:
        """Quantize and write tokens into their slots.

        latent: [tokens, 512] bf16/fp16/fp32; rope: [tokens, 64] bf16/fp16/fp32; slot_mapping:
        [tokens] int32/int64, −1 skips a token. ``check`` (default on) validates slots on the
        host (a device sync) and rejects out-of-range ones before anything is written; without
        it a slot outside the pool writes nothing.
        """
        rows = self.layer(layer)
        n = latent.shape[0] if isinstance(latent, torch.Tensor) else -1
        float_dtypes = (torch.bfloat16, torch.float16, torch.float32)
        check_tensor("latent", latent, dtype=float_dtypes, shape=(None, LATENT_DIM),
                     device=self.device, contiguous_last=True)
        check_tensor("rope", rope, dtype=float_dtypes, shape=(n, ROPE_DIM), device=self.device,
                     contiguous_last=True)
        slots = _check_slots(slot_mapping, n, self.num_slots, check)
        if n == 0:
            return
        flat = rows.view(-1, self.fmt.row_bytes)
        fast(_store_kv_kernel)[(n,)](
            latent, rope, slots, self.scale(layer),
            flat, flat.view(torch.float32), flat.view(torch.bfloat16),
            latent.stride(0), rope.stride(0), self.num_slots,
            ROW_BYTES=self.fmt.row_bytes, FORMAT=_FORMAT_IDS[self.fmt.name],
            POW2=self.fmt.scale_policy == "pow2", LATENT=LATENT_DIM, ROPE=ROPE_DIM, TILE=128,
        )

    def dequantize(self, layer: int) -> torch.Tensor:
        """Reference read-back: float32 [num_pages, page_size, 576]."""
        return dequantize_kv(self.layer(layer), self.fmt, self.scale(layer))


class IndexKeyCache:
    """The lightning indexer's key cache in DeepGEMM's paged layout (docs/DESIGN.md §3).

    pool: uint8 ``[num_layers, num_pages, page_size · 132]``: per page, page_size × 128 e4m3
    key bytes, then page_size float32 scales.
    """

    def __init__(
        self, num_pages: int, page_size: int, *, scale_policy: str = "fp32", num_layers: int = 1,
        device: str | torch.device = "cpu",
    ) -> None:
        if scale_policy not in SCALE_POLICIES:
            raise ValueError(
                f"scale_policy: expected one of {', '.join(SCALE_POLICIES)}, got {scale_policy!r}"
            )
        self.scale_policy = scale_policy
        self.num_pages = check_int("num_pages", num_pages, lo=1)
        self.page_size = check_page_size(page_size)
        self.num_layers = check_int("num_layers", num_layers, lo=1)
        self.pool = torch.zeros(num_layers, num_pages, page_size * INDEX_ROW_BYTES,
                                dtype=torch.uint8, device=device)

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    def layer(self, i: int) -> torch.Tensor:
        """uint8 [num_pages, page_size · 132] view of layer ``i``."""
        check_int("layer", i, lo=0, hi=self.num_layers - 1)
        return self.pool[i]

    def deep_gemm_view(self, i: int) -> torch.Tensor:
        """Layer ``i`` shaped as DeepGEMM's ``kv_cache_fp8``: uint8 [num_pages, page_size, 1, 132]
        (same bytes; the last dim is not one token's row, as in DeepGEMM)."""
        return self.layer(i).view(self.num_pages, self.page_size, 1, INDEX_ROW_BYTES)

    def store(self, layer: int, keys: torch.Tensor, slot_mapping: torch.Tensor, *,
              check: bool = True) -> None:
        """Quantize and write index keys. keys: [tokens, 128] bf16/fp16/fp32; slot_mapping:
        [tokens] int32/int64 (−1 skips)."""
        pages = self.layer(layer)
        check_tensor("keys", keys, dtype=(torch.bfloat16, torch.float16, torch.float32),
                     shape=(None, INDEX_HEAD_DIM), device=self.pool.device, contiguous_last=True)
        n = keys.shape[0]
        slots = _check_slots(slot_mapping, n, self.num_slots, check)
        if n == 0:
            return
        flat = pages.view(-1)
        fast(_store_index_keys_kernel)[(n,)](
            keys, slots, flat, flat.view(torch.float32), keys.stride(0), self.page_size,
            self.num_slots, DIM=INDEX_HEAD_DIM, POW2=self.scale_policy == "pow2",
        )

    def read(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(uint8 [num_slots, 128] key bytes, float32 [num_slots] scales) by slot."""
        pages = self.layer(layer)
        ps = self.page_size
        keys = pages[:, : ps * INDEX_HEAD_DIM].reshape(self.num_pages * ps, INDEX_HEAD_DIM)
        scales = pages[:, ps * INDEX_HEAD_DIM:].contiguous().view(torch.float32).reshape(-1)
        return keys, scales

    def dequantize(self, layer: int) -> torch.Tensor:
        """Reference read-back: float32 [num_slots, 128]."""
        return dequantize_index_keys(*self.read(layer))


class PageAllocator:
    """A free list of physical pages (lowest id first)."""

    def __init__(self, num_pages: int) -> None:
        self.num_pages = check_int("num_pages", num_pages, lo=1)
        self._free = list(range(num_pages - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        check_int("n", n, lo=0)
        if n > len(self._free):
            raise RuntimeError(f"PageAllocator: {n} pages requested, {len(self._free)} free")
        return [self._free.pop() for _ in range(n)]

    def free(self, pages: list[int]) -> None:
        for p in pages:
            check_int("pages[i]", p, lo=0, hi=self.num_pages - 1)
        taken = set(pages)
        if len(taken) != len(pages) or taken & set(self._free):
            raise ValueError("pages: double free (a page listed twice or already free)")
        self._free.extend(sorted(pages, reverse=True))


def build_block_table(
    pages_per_request: list[list[int]], *, max_pages: int | None = None, pad: int = -1,
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """int32 [batch, max_pages] block table; entries past a request's pages hold ``pad``."""
    width = max([len(p) for p in pages_per_request] + [1]) if max_pages is None else max_pages
    table = torch.full((len(pages_per_request), width), pad, dtype=torch.int32)
    for b, pages in enumerate(pages_per_request):
        for p in pages:  # ints (numpy's and 0-d tensors' too) naming pages
            try:
                if operator.index(p) >= 0:
                    continue
            except TypeError:
                raise TypeError(f"pages_per_request[{b}]: expected page ids (ints), got "
                                f"{type(p).__name__} {p!r}") from None
            raise ValueError(f"pages_per_request[{b}]: expected page ids >= 0, got {p}")
        if len(pages) > width:
            raise ValueError(f"max_pages: request {b} has {len(pages)} pages, more than {width}")
        table[b, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
    return table.to(device)


def slot_mapping(block_table: torch.Tensor, positions: torch.Tensor, page_size: int,
                 batch_index: torch.Tensor, *, check: bool = True) -> torch.Tensor:
    """The cache slots of tokens, int64 [tokens]: block_table[b, pos // page_size] · page_size
    + pos % page_size for each token's request b and position pos.

    block_table: int32 [batch, max_pages] (`build_block_table`); positions: int32 / int64
    [tokens], each token's position in its request; page_size: the cache's; batch_index:
    int32 / int64 [tokens], each token's request (a row of ``block_table``). ``check``
    (default on) validates positions and requests on the host (a device sync); off, nothing
    syncs (CUDA-graph safe) and out-of-range values index out of range."""
    check_page_size(page_size)
    check_tensor("block_table", block_table, dtype=torch.int32, ndim=2)
    check_tensor("positions", positions, dtype=(torch.int32, torch.int64), ndim=1,
                 device=block_table.device)
    check_tensor("batch_index", batch_index, dtype=(torch.int32, torch.int64),
                 shape=tuple(positions.shape), device=block_table.device)
    if check and positions.numel():  # (a host sync)
        cover = block_table.shape[1] * page_size
        lo, hi = (int(v) for v in positions.aminmax())
        if lo < 0 or hi >= cover:
            raise ValueError(f"positions: expected values in [0, {cover}) (block_table's pages "
                             f"× page_size), got {lo if lo < 0 else hi}")
        lo, hi = (int(v) for v in batch_index.aminmax())
        if lo < 0 or hi >= block_table.shape[0]:
            raise ValueError(f"batch_index: expected values in [0, {block_table.shape[0]}) "
                             f"(block_table's rows), got {lo if lo < 0 else hi}")
    pages = block_table[batch_index.long(), positions.long() // page_size].long()
    return pages * page_size + positions.long() % page_size

