"""KV formats and paged caches: byte layouts, store kernels bit-exact with the reference
encoder, round-trip bounds for every format and page size, rejected stores write nothing."""

import pytest
import torch

from fp8mla.cache import IndexKeyCache, PageAllocator, PagedKVCache, build_block_table, slot_mapping
from fp8mla.formats import (
    compute_scale,
    dequantize_index_keys,
    dequantize_kv,
    kv_format,
    quantize_index_keys,
    quantize_kv,
)

# Relative round-trip bound (‖x̂ − x‖ / ‖x‖) per format on N(0, 1) data: e4m3 keeps 3 mantissa
# bits (≤ 2⁻⁴ relative per value, ≈ 2.6% RMS measured); bf16 storage of bf16 input is exact.
BOUNDS = {"bf16": 0.0, "fp8": 0.035, "fp8_ds_mla": 0.035}
FORMATS = [("bf16", None), ("fp8", None), ("fp8_ds_mla", "pow2"), ("fp8_ds_mla", "fp32")]


def test_row_sizes_and_ds_mla_layout():
    assert [kv_format(f).row_bytes for f in ("bf16", "fp8", "fp8_ds_mla")] == [1152, 576, 656]
    lat = torch.randn(3, 512)
    lat[1, 128:256] = 0  # an all-zero tile gets a finite scale
    rope = torch.randn(3, 64)
    rows = quantize_kv(lat, rope, "fp8_ds_mla")
    scales = rows[:, 512:528].contiguous().view(torch.float32)
    assert torch.all(torch.log2(scales) == torch.round(torch.log2(scales)))  # pow2 policy
    assert torch.equal(rows[:, 528:].contiguous().view(torch.bfloat16), rope.bfloat16())
    expect = compute_scale(lat.bfloat16().float().view(3, 4, 128).abs().amax(-1), "pow2")
    assert torch.equal(scales, expect)
    lat_back = rows[:, :512].contiguous().view(torch.float8_e4m3fn).float().view(3, 4, 128)
    assert torch.equal((lat_back * scales[..., None]).view(3, 512), dequantize_kv(rows, "fp8_ds_mla")[:, :512])


@pytest.mark.parametrize("fmt,policy", FORMATS)
@pytest.mark.parametrize("page_size", [1, 16, 64, 256])
def test_store_matches_reference_and_round_trips(device, fmt, policy, page_size):
    g = torch.Generator().manual_seed(page_size)
    n = 37
    cache = PagedKVCache(-(-3 * n // page_size) + 1, page_size, fmt, scale_policy=policy, fp8_scale=0.01,
                         device=device)
    lat = torch.randn(n, 512, generator=g).bfloat16().to(device)
    rope = torch.randn(n, 64, generator=g).bfloat16().to(device)
    slots = torch.randperm(cache.num_slots, generator=g)[:n].to(device)
    slots[5] = -1  # skipped
    before = cache.pool.clone()
    cache.store(0, lat, rope, slots)
    flat = cache.layer(0).view(-1, cache.fmt.row_bytes)
    keep = slots >= 0
    ref = quantize_kv(lat[keep], rope[keep], cache.fmt, cache.scale(0))
    assert torch.equal(flat[slots[keep]], ref), "store kernel differs from the reference encoder"
    untouched = torch.ones(cache.num_slots, dtype=torch.bool, device=device)
    untouched[slots[keep]] = False
    assert torch.equal(flat[untouched], before.view(-1, cache.fmt.row_bytes)[untouched])
    x = torch.cat([lat, rope], 1).float()[keep]
    err = (dequantize_kv(flat[slots[keep]], cache.fmt, cache.scale(0)) - x).norm() / x.norm()
    assert err <= BOUNDS[fmt]


@pytest.mark.parametrize("policy", ["fp32", "pow2"])
def test_index_key_store_layout(device, policy):
    cache = IndexKeyCache(3, 16, scale_policy=policy, device=device)
    keys = torch.randn(20, 128).bfloat16().to(device)
    slots = torch.randperm(48)[:20].to(device)
    cache.store(0, keys, slots)
    kb, ks = cache.read(0)
    rb, rs = quantize_index_keys(keys, policy)
    assert torch.equal(kb[slots], rb) and torch.equal(ks[slots], rs)
    page, off = int(slots[0]) // 16, int(slots[0]) % 16  # DeepGEMM layout: keys, then scales
    raw = cache.layer(0)[page]
    assert torch.equal(raw[off * 128:(off + 1) * 128], rb[0])
    assert torch.equal(raw[16 * 128 + 4 * off:16 * 128 + 4 * off + 4].view(torch.float32), rs[:1])
    err = (dequantize_index_keys(rb, rs) - keys.float()).norm() / keys.float().norm()
    assert err < 0.035
    assert cache.deep_gemm_view(0).shape == (3, 16, 1, 132)


@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "fp8", "bf16"])
def test_stored_nan_stays_nan_where_it_was(device, fmt):
    """A NaN written into the cache reads back as NaN in that element alone (e4m3fn's 0x7F;
    before, the fp8 encoders' clamp turned it into a finite value no check could see); the
    index keys likewise."""
    cache = PagedKVCache(2, 4, fmt, device=device)
    lat, rope = torch.randn(3, 512), torch.randn(3, 64)
    lat[1, 5] = rope[2, 3] = float("nan")
    cache.store(0, lat.bfloat16().to(device), rope.bfloat16().to(device),
                torch.tensor([0, 1, 2], device=device))
    nan = cache.dequantize(0).reshape(-1, 576)[:3].isnan().cpu()
    want = torch.zeros(3, 576, dtype=torch.bool)
    want[1, 5] = want[2, 512 + 3] = True
    assert torch.equal(nan, want)
    keys = IndexKeyCache(2, 4, device=device)
    k = torch.randn(3, 128)
    k[1, 7] = float("nan")
    keys.store(0, k.bfloat16().to(device), torch.tensor([0, 1, 2], device=device))
    want = torch.zeros(3, 128, dtype=torch.bool)
    want[1, 7] = True
    assert torch.equal(keys.dequantize(0)[:3].isnan().cpu(), want)


def test_rejected_store_leaves_cache_unchanged(device):
    cache = PagedKVCache(2, 16, "fp8_ds_mla", device=device)
    before = cache.pool.clone()
    lat = torch.randn(4, 512, device=device).bfloat16()
    rope = torch.randn(4, 64, device=device).bfloat16()
    slots = torch.tensor([0, 1, 2, 32], device=device)
    with pytest.raises(ValueError, match=r"slot_mapping: expected slots in \[-1, 32\).*got 32"):
        cache.store(0, lat, rope, slots)
    with pytest.raises(ValueError, match=r"rope: expected shape \[4, 64\], got \[3, 64\]"):
        cache.store(0, lat, rope[:3], slots)
    with pytest.raises(TypeError, match=r"latent: expected dtype"):
        cache.store(0, lat.to(torch.int32), rope, slots)
    assert torch.equal(cache.pool, before)


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "fp8_ds_mla", "index_keys"])
def test_unchecked_store_writes_nothing_outside_the_pool(device, fmt):
    """check=False trusts the slots but never writes outside the pool: a slot past it (or far
    past it, or negative) writes nothing, the others are written as with check=True — into a
    layer between two others, so a stray write would show in a neighbour."""
    keys = fmt == "index_keys"
    cache = (IndexKeyCache(2, 16, num_layers=3, device=device) if keys
             else PagedKVCache(2, 16, fmt, num_layers=3, device=device))
    want = IndexKeyCache(2, 16, device=device) if keys else PagedKVCache(2, 16, fmt, device=device)
    g = torch.Generator().manual_seed(3)
    rows = [torch.randn(6, d, generator=g).bfloat16().to(device) for d in ((128,) if keys
                                                                           else (512, 64))]
    slots = torch.tensor([3, 32, -7, 10**6, 31, 2**40], device=device)
    cache.store(1, *rows, slots, check=False)
    good = torch.tensor([True, False, False, False, True, False], device=device)
    want.store(0, *[r[good] for r in rows], slots[good])
    assert torch.equal(cache.pool[1], want.pool[0])
    assert not cache.pool[0].any() and not cache.pool[2].any()


def test_bad_cache_arguments():
    with pytest.raises(ValueError, match=r"page_size: expected a power of two in \[1, 256\], got 48"):
        PagedKVCache(4, 48)
    with pytest.raises(ValueError, match=r"kv_format: expected one of bf16, fp8, fp8_ds_mla, got 'fp4'"):
        PagedKVCache(4, 16, "fp4")
    with pytest.raises(ValueError, match=r"scale_policy: expected one of pow2, fp32, got 'e8m0'"):
        PagedKVCache(4, 16, "fp8_ds_mla", scale_policy="e8m0")
    with pytest.raises(ValueError, match=r"fp8_scale: expected a finite float > 0"):
        PagedKVCache(4, 16, "fp8", fp8_scale=0.0)


def test_allocator_block_table_slots():
    alloc = PageAllocator(8)
    a, b = alloc.allocate(3), alloc.allocate(2)
    table = build_block_table([a, b], pad=99)
    assert table.dtype == torch.int32 and table.tolist() == [[0, 1, 2], [3, 4, 99]]
    pos = torch.tensor([0, 17, 5])
    assert slot_mapping(table, pos, 16, torch.tensor([0, 0, 1])).tolist() == [0, 17, 3 * 16 + 5]
    alloc.free(a)
    assert alloc.num_free == 6
    with pytest.raises(ValueError, match="double free"):
        alloc.free(a)
    with pytest.raises(RuntimeError, match="7 pages requested, 6 free"):
        alloc.allocate(7)


def test_block_table_and_slot_mapping_name_bad_entries():
    import numpy as np

    table = build_block_table([[np.int64(3), torch.tensor(2)], [1]])  # any int type
    assert table.tolist() == [[3, 2], [1, -1]]
    with pytest.raises(TypeError, match=r"pages_per_request\[0\]: expected page ids \(ints\), got float"):
        build_block_table([[1.5]])
    with pytest.raises(ValueError, match=r"pages_per_request\[1\]: expected page ids >= 0, got -2"):
        build_block_table([[0], [-2]])
    table = build_block_table([[0, 1], [2]])
    with pytest.raises(ValueError, match=r"positions: expected values in \[0, 32\).*got -1"):
        slot_mapping(table, torch.tensor([-1]), 16, torch.tensor([0]))
    with pytest.raises(ValueError, match=r"batch_index: expected values in \[0, 2\).*got 2"):
        slot_mapping(table, torch.tensor([5]), 16, torch.tensor([2]))
    with pytest.raises(ValueError, match=r"batch_index: expected shape \[2\], got \[1\]"):
        slot_mapping(table, torch.tensor([5, 6]), 16, torch.tensor([1]))
    assert slot_mapping(table, torch.tensor([3, 17]), 16, torch.tensor([0, 0])).tolist() == [3, 17]
    assert slot_mapping(table, torch.tensor([3]), 16, torch.tensor([1]), check=False).tolist() == [35]
