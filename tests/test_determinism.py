"""Determinism: no floating-point atomics, so the same inputs give bitwise-identical outputs run to
run.
Batch invariance holds for a fixed split count: a request's output does not depend on the other
requests in the batch. (The automatic scheduler picks the split count from the batch size, so
without a fixed ``num_splits`` the rounding — not the math — may differ between batch sizes.)"""

import torch

from fp8mla.decode import DecodePlan
from fp8mla.sparse import SparsePlan
from helpers import paged_cache


def _decode(cache, table, seqlens, q, splits):
    plan = DecodePlan(batch=q.shape[0], num_heads=q.shape[2], kv_format=cache.fmt,
                      page_size=cache.page_size, cache_seqlens=seqlens, device=q.device,
                      num_splits=splits)
    out, lse = plan.run(q, cache.layer(0), table, seqlens, fp8_scale=cache.scale(0))
    return out.clone(), lse.clone()


def test_run_to_run_bitwise_identical(device):
    cache, table, seqlens = paged_cache("fp8_ds_mla", [120, 17], 16, device=device)
    q = torch.randn(2, 1, 8, 576, device=device).bfloat16()
    a = _decode(cache, table, seqlens, q, None)
    b = _decode(cache, table, seqlens, q, None)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_batch_invariance_with_fixed_splits(device):
    cache, table, seqlens = paged_cache("fp8", [100, 33, 70], 16, device=device, seed=4)
    q = torch.randn(3, 1, 8, 576, device=device).bfloat16()
    full = _decode(cache, table, seqlens, q, 4)
    alone = _decode(cache, table[:1], seqlens[:1], q[:1], 4)
    assert torch.equal(full[0][:1], alone[0]) and torch.equal(full[1][:1], alone[1])
    # the sparse path: one query's output does not depend on its neighbours either
    idx = torch.randint(0, 48, (3, 40), dtype=torch.int32, device=device)
    idx = table[0, (idx // 16).long()] * 16 + idx % 16
    qs = torch.randn(3, 8, 576, device=device).bfloat16()
    plan3 = SparsePlan(num_queries=3, num_heads=8, topk=40, kv_format="fp8", device=device,
                       num_splits=2)
    plan1 = SparsePlan(num_queries=1, num_heads=8, topk=40, kv_format="fp8", device=device,
                       num_splits=2)
    o3, _ = plan3.run(qs, cache.layer(0), idx.int().contiguous(), fp8_scale=cache.scale(0))
    o1, _ = plan1.run(qs[1:2], cache.layer(0), idx[1:2].int().contiguous(),
                      fp8_scale=cache.scale(0))
    assert torch.equal(o3[1:2], o1)
