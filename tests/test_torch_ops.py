"""The custom ops trace under torch.compile (fake implementations) and compute what the Python
functions compute."""

import torch

import fp8mla.torch_ops  # noqa: F401  (registers torch.ops.fp8mla.*)
from fp8mla.decode import dense_decode
from fp8mla.testing import assert_close
from helpers import paged_cache


def test_compiled_dsa_pipeline_matches_eager(device):
    from fp8mla.cache import IndexKeyCache

    kv, table, seqlens = paged_cache("fp8_ds_mla", [40, 9], 16, device=device, seed=9)
    index_cache = IndexKeyCache(kv.num_pages, 16, device=device)
    for b, n in enumerate(seqlens.tolist()):
        pos = torch.arange(n, device=device)
        index_cache.store(0, torch.randn(n, 128, device=device).bfloat16(),
                          table[b, pos // 16].long() * 16 + pos % 16)
    q = torch.randn(2, 1, 4, 576, device=device).bfloat16()
    q_index = torch.randn(2, 1, 8, 128, device=device).to(torch.float8_e4m3fn)
    w = torch.rand(2, 8, device=device)

    def step(q, q_index, w):
        logits = torch.ops.fp8mla.indexer_logits(q_index, w, index_cache.layer(0), table,
                                                 seqlens, table.shape[1] * 16)
        slots_pos = torch.ops.fp8mla.topk_indices(logits, 8, seqlens)
        slots = torch.where(slots_pos >= 0,
                            table.gather(1, (slots_pos // 16).clamp_min(0).long()) * 16
                            + slots_pos % 16, slots_pos)
        out, lse = torch.ops.fp8mla.sparse_attention(q[:, 0], kv.layer(0), slots.int(), None,
                                                     "fp8_ds_mla", 576 ** -0.5, None)
        dense, _ = torch.ops.fp8mla.dense_decode(q, kv.layer(0), table, seqlens, "fp8_ds_mla",
                                                 576 ** -0.5, None)
        return out, lse, dense

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    got = compiled(q, q_index, w)
    want = step(q, q_index, w)
    for g, e in zip(got, want, strict=True):
        assert g.shape == e.shape and g.dtype == e.dtype
        assert torch.equal(g, e)
    ref, _ = dense_decode(q, kv.layer(0), table, seqlens, kv_format="fp8_ds_mla")
    assert_close(got[2], ref.float())


def test_compiled_dense_prefill_matches_eager(device):
    """The packed prefill op under torch.compile: what `dense_prefill_ragged` gives, and the
    float32 reference's."""
    from fp8mla.prefill import dense_prefill_ragged
    from helpers import ragged_prefill_reference

    kv, table, seqlens = paged_cache("fp8", [30, 6], 16, device=device, seed=4)
    cu = torch.tensor([0, 5, 8], dtype=torch.int32, device=device)
    q = torch.randn(8, 3, 576, device=device).bfloat16()

    def prefill(q):
        return torch.ops.fp8mla.dense_prefill(q, cu, kv.layer(0), table, seqlens, "fp8", 0.05,
                                              kv.scale(0))

    got = torch.compile(prefill, backend="aot_eager", fullgraph=True)(q)
    want = dense_prefill_ragged(q, cu, kv.layer(0), table, seqlens, kv_format="fp8",
                                softmax_scale=0.05, fp8_scale=kv.scale(0))
    for g, e in zip(got, want, strict=True):
        assert g.shape == e.shape and g.dtype == e.dtype and torch.equal(g, e)
    ro, rl = ragged_prefill_reference(q, [5, 3], kv, table, seqlens, 0.05)
    assert_close(got[0], ro, name="out")
    assert_close(got[1], rl, atol=3e-3, rtol=1e-3, name="lse")


def test_each_op_documents_its_tensors():
    from fp8mla import torch_ops

    for name in torch_ops.__all__:
        doc = getattr(torch_ops, name).__doc__ or ""
        assert doc.startswith(f"torch.ops.fp8mla.{name[:-3]}(") and "[" in doc and "→" in doc, name
