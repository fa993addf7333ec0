"""The fast launch path (`fp8mla.kernels.launch`) on real kernels (GPU only): every kernel
family's plans give bitwise the outputs of Triton's own launch path, the fast path is taken
from the second call on, and a call whose arguments Triton would specialize differently (q
a strided view, a pool at another alignment) still matches the reference."""

import pytest
import torch

from fp8mla import reference
from fp8mla.decode import DecodePlan
from fp8mla.kernels import launch
from fp8mla.sparse import SparsePlan
from fp8mla.testing import assert_close
from helpers import paged_cache, sparse_lists, sparse_pool

pytestmark = pytest.mark.gpu


def _hits() -> int:
    return sum(fl.hits for fl in launch._LAUNCHERS.values())


def _both_paths(run, monkeypatch):
    """``run()``'s outputs through Triton's path, then twice through the fast one (the first
    keeps the kernels, the second reuses them): asserted equal bit for bit."""
    monkeypatch.setattr(launch, "FAST_LAUNCH", False)
    want = [t.clone() for t in run()]
    monkeypatch.setattr(launch, "FAST_LAUNCH", True)
    for _ in range(2):
        hits = _hits()
        got = run()
        for w, g in zip(want, got, strict=True):
            assert torch.equal(w.view(torch.uint8), g.view(torch.uint8))
    assert _hits() > hits  # the second call went the fast way


@pytest.mark.parametrize("fmt,heads,s_q,lens,page_size", [
    ("fp8", 8, 1, [20000, 3, 0], 64),  # ≤ 8-row kernel + combine
    ("fp8", 16, 1, [9000, 700], 64),  # the wide form
    ("fp8", 128, 1, [3000, 64], 64),  # the 64-row TMA kernel
    ("fp8", 64, 2, [1000, 77], 1),  # the gather kernel, MTP
    ("fp8_ds_mla", 8, 1, [20000, 5], 64),
    ("fp8_ds_mla", 64, 1, [4000, 1], 16),
    ("bf16", 8, 1, [20000, 5], 64),  # the Triton kernel
])
def test_fast_path_matches_tritons_bitwise(fmt, heads, s_q, lens, page_size, monkeypatch):
    policy = "pow2" if fmt == "fp8_ds_mla" else None
    cache, table, seqlens = paged_cache(fmt, lens, page_size, policy=policy, device="cuda",
                                        seed=heads + s_q)
    q = torch.randn(len(lens), s_q, heads, 576,
                    generator=torch.Generator().manual_seed(heads)).bfloat16().cuda()
    plan = DecodePlan(batch=len(lens), num_heads=heads, s_q=s_q, kv_format=cache.fmt,
                      page_size=page_size, cache_seqlens=seqlens, device="cuda")
    _both_paths(lambda: plan.run(q, cache.layer(0), table, seqlens, fp8_scale=cache.scale(0),
                                 check=False), monkeypatch)


@pytest.mark.parametrize("fmt,heads", [("fp8_ds_mla", 8), ("fp8_ds_mla", 64), ("fp8", 128),
                                       ("bf16", 16)])
def test_fast_path_matches_tritons_bitwise_sparse(fmt, heads, monkeypatch):
    g = torch.Generator().manual_seed(heads)
    cache, live = sparse_pool(fmt, "pow2" if fmt == "fp8_ds_mla" else None, 256, 64, "cuda", g)
    q = torch.randn(6, heads, 576, generator=g).bfloat16().cuda()
    idx = sparse_lists(live, 6, 2048, g).cuda()
    lengths = torch.tensor([2048, 1, 0, 1500, 2047, 64], dtype=torch.int32, device="cuda")
    plan = SparsePlan(num_queries=6, num_heads=heads, topk=2048, kv_format=cache.fmt,
                      device="cuda")
    _both_paths(lambda: plan.run(q, cache.layer(0), idx, lengths, fp8_scale=cache.scale(0),
                                 check=False), monkeypatch)


@pytest.mark.parametrize("heads", [8, 128])
def test_changed_strides_and_alignment_after_the_first_call(heads, monkeypatch):
    """The fast path's key tells a strided q and a pool at another address apart from the
    first call's: each result matches the reference."""
    monkeypatch.setattr(launch, "FAST_LAUNCH", True)
    lens = [5000, 129]
    cache, table, seqlens = paged_cache("fp8", lens, 64, device="cuda", seed=heads)
    g = torch.Generator().manual_seed(heads)
    wide = torch.randn(2, 1, heads, 1152, generator=g).bfloat16().cuda()
    plan = DecodePlan(batch=2, num_heads=heads, kv_format="fp8", page_size=64,
                      cache_seqlens=seqlens, device="cuda")
    kv = cache.dequantize(0)
    for q in (wide[..., :576].contiguous(), wide[..., :576], wide[..., 576:]):
        out, lse = plan.run(q, cache.layer(0), table, seqlens, fp8_scale=cache.scale(0))
        ro, rl = reference.dense_mla_decode(q, kv, table, seqlens, 576 ** -0.5)
        assert_close(out, ro, name="out")
        assert_close(lse, rl, atol=1e-3, rtol=1e-3, name="lse")
    # the same pool at an address ≡ 8 (mod 16): the Triton kernel serves that (`_launch`)
    pool = cache.layer(0)
    moved = torch.empty(pool.numel() + 8, dtype=torch.uint8, device="cuda")[8:].view(pool.shape)
    moved.copy_(pool)
    out, lse = plan.run(wide[..., :576], moved, table, seqlens, fp8_scale=cache.scale(0))
    ro, rl = reference.dense_mla_decode(wide[..., :576], kv, table, seqlens, 576 ** -0.5)
    assert_close(out, ro, name="out (moved pool)")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
@pytest.mark.parametrize("fast", [False, True])
def test_runs_on_the_tensors_device_not_the_current_one(fast, monkeypatch):
    """Triton launches on the current CUDA device: with cuda:0 current, a cache stored, a dense
    plan and a sparse plan on cuda:1 launch on cuda:1 (Triton's path and the fast one), match
    the reference there, and leave cuda:0 current."""
    monkeypatch.setattr(launch, "FAST_LAUNCH", fast)
    torch.cuda.set_device(0)
    dev = torch.device("cuda:1")
    lens = [5000, 129, 0]
    cache, table, seqlens = paged_cache("fp8_ds_mla", lens, 64, policy="pow2", device="cuda:1",
                                        seed=5)  # (the store kernel on cuda:1 too)
    q = torch.randn(3, 1, 8, 576, generator=torch.Generator().manual_seed(5)).bfloat16().to(dev)
    plan = DecodePlan(batch=3, num_heads=8, kv_format=cache.fmt, page_size=64,
                      cache_seqlens=seqlens, device=dev)
    for _ in range(2):  # (the second call: the fast path's kept kernel, where on)
        out, lse = plan.run(q, cache.layer(0), table, seqlens)
    assert torch.cuda.current_device() == 0 and out.device == dev
    kv = cache.dequantize(0)
    ro, rl = reference.dense_mla_decode(q, kv, table, seqlens, 576 ** -0.5)
    assert_close(out, ro, name="out")
    assert_close(lse, rl, atol=1e-3, rtol=1e-3, name="lse")
    slots = table[0, :2].long() * 64
    idx = torch.stack([slots, slots + 1, slots + 2]).view(1, 6).expand(3, 6).to(torch.int32)
    sparse = SparsePlan(num_queries=3, num_heads=8, topk=6, kv_format=cache.fmt, device=dev)
    for _ in range(2):
        out, lse = sparse.run(q[:, 0], cache.layer(0), idx.contiguous())
    ro, rl = reference.sparse_mla(q[:, 0], kv.view(-1, 576), idx, 576 ** -0.5)
    assert torch.cuda.current_device() == 0
    assert_close(out, ro, name="sparse out")
    assert_close(lse, rl, atol=1e-3, rtol=1e-3, name="sparse lse")
