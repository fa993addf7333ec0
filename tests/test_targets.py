"""The configurations other GPUs run, run: dense and sparse plans made for SM80 (64-row programs
of 8 warps, no TMA), SM86 / SM89 (32-row programs, no TMA) and SM100 / SM120 (32-row programs,
fp8 pages by TMA) execute under the interpreter against the float32 reference.

The interpreter otherwise stands in for an SM90 GPU (`fp8mla.runtime.target_for`), and the GPUs
the suite runs on are SM90 too, so without this file these configurations are compiled
(tests/test_portability.py) but never executed. What the interpreter cannot show is the same
as everywhere: speed, and the hardware e4m3 conversion (every run here converts in software).
"""

import pytest
import torch

from fp8mla import decode as decode_mod
from fp8mla import reference
from fp8mla.decode import DecodePlan
from fp8mla.runtime import Target, decode_config, interpreting
from fp8mla.sparse import SparsePlan
from fp8mla.testing import assert_close
from helpers import paged_cache, sparse_lists, sparse_pool

pytestmark = pytest.mark.skipif(not interpreting(), reason="runs other GPUs' configurations "
                                "under Triton's interpreter (TRITON_INTERPRET=1)")

# one capability of each class: the configurations of 89 are 86's, those of 120 are 100's
CLASSES = (80, 86, 100)


@pytest.fixture(params=CLASSES, ids=lambda cc: f"sm{cc}")
def cc(request, monkeypatch):
    """Plans made in the test take compute capability ``cc``'s configuration (interpreted)."""
    monkeypatch.setattr(decode_mod, "target_for",
                        lambda device: Target(request.param, 8, interpreted=True))
    return request.param


@pytest.mark.parametrize("fmt,policy,heads,s_q,lens,page_size", [
    ("fp8", None, 128, 1, [70, 3], 64),  # SM80: 64 heads a program; others 32 (SM100: TMA)
    ("fp8_ds_mla", "fp32", 16, 4, [40, 130], 16),  # 64 query rows: 16 / 8 heads a program
    ("bf16", None, 8, 2, [65, 0], 1),
])
def test_dense_decode_in_other_targets_configurations(cc, fmt, policy, heads, s_q, lens,
                                                      page_size):
    cache, table, seqlens = paged_cache(fmt, lens, page_size, policy=policy, seed=heads + cc)
    g = torch.Generator().manual_seed(cc + s_q)
    q = torch.randn(len(lens), s_q, heads, 576, generator=g).bfloat16()
    plan = DecodePlan(batch=len(lens), num_heads=heads, s_q=s_q, kv_format=cache.fmt,
                      page_size=page_size, cache_seqlens=seqlens, softmax_scale=0.06,
                      device="cpu")
    assert plan.kernel == "triton" and plan.config == decode_config(cc, fmt, heads, s_q)
    assert plan.tma == (cc >= 90 and fmt == "fp8" and page_size >= plan.config.block_n)
    out, lse = plan.run(q, cache.layer(0), table, seqlens, fp8_scale=cache.scale(0))
    ro, rl = reference.dense_mla_decode(q, cache.dequantize(0), table, seqlens, 0.06)
    assert_close(out, ro, name="out")
    assert_close(lse, rl, atol=3e-3 if policy == "fp32" else 1e-3, rtol=1e-3, name="lse")


@pytest.mark.parametrize("fmt,policy,tokens,heads,topk", [
    ("fp8_ds_mla", "pow2", 2, 128, 40),
    ("fp8", None, 3, 16, 20),
])
def test_sparse_in_other_targets_configurations(cc, fmt, policy, tokens, heads, topk):
    g = torch.Generator().manual_seed(cc + heads)
    cache, live = sparse_pool(fmt, policy, 8, 16, "cpu", g)
    idx = sparse_lists(live, tokens, topk, g)  # −1 and duplicates among the entries
    q = torch.randn(tokens, heads, 576, generator=g).bfloat16()
    plan = SparsePlan(num_queries=tokens, num_heads=heads, topk=topk, kv_format=fmt,
                      softmax_scale=0.07, device="cpu")
    assert plan.kernel == "triton" and plan.config == decode_config(cc, fmt, heads, 1, True)
    out, lse = plan.run(q, cache.layer(0), idx, fp8_scale=cache.scale(0))
    ro, rl = reference.sparse_mla(q, cache.dequantize(0).reshape(-1, 576), idx, 0.07)
    assert_close(out, ro, name="out")
    assert_close(lse, rl, atol=1e-3, rtol=1e-3, name="lse")
