"""The oracles agree with each other and with first principles; the comparator fails when it
should."""

import pytest
import torch

from fp8mla import reference
from fp8mla.testing import assert_close


def test_sparse_over_all_tokens_equals_dense():
    g = torch.Generator().manual_seed(0)
    kv = torch.randn(3, 4, 576, generator=g)  # 3 pages of 4
    table = torch.tensor([[2, 0, 1]], dtype=torch.int32)
    q = torch.randn(1, 1, 5, 576, generator=g)
    out, lse = reference.dense_mla_decode(q, kv, table, torch.tensor([10]), 0.1)
    slots = (table[0, torch.arange(10) // 4] * 4 + torch.arange(10) % 4)[None]
    idx = torch.cat([slots, torch.full((1, 3), -1)], 1)  # −1 entries are skipped
    s_out, s_lse = reference.sparse_mla(q[:, 0], kv.view(-1, 576), idx, 0.1)
    assert_close(s_out, out[:, 0], atol=1e-5, rtol=1e-5)
    assert_close(s_lse, lse[:, 0], atol=1e-5, rtol=1e-5)
    # first principles for one head
    k = kv.view(-1, 576)[slots[0]]
    s = (q[0, 0, 0] @ k.T) * 0.1
    assert torch.allclose(out[0, 0, 0], torch.softmax(s, 0) @ k[:, :512], atol=1e-5)


def test_causal_mtp_and_empty():
    kv = torch.randn(1, 8, 576)
    q = torch.randn(1, 3, 2, 576)
    out, lse = reference.dense_mla_decode(q, kv, torch.tensor([[0]]), torch.tensor([2]), 0.1)
    assert torch.all(lse[0, 0] == float("-inf")) and torch.all(out[0, 0] == 0)  # sees 0 tokens
    single, _ = reference.dense_mla_decode(q[:, 2:], kv, torch.tensor([[0]]), torch.tensor([2]), 0.1)
    assert torch.allclose(out[0, 2], single[0, 0])


def test_indexer_and_topk():
    q = torch.randn(2, 3, 128)
    w = torch.rand(2, 3)
    k = torch.randn(10, 128)
    logits = reference.indexer_logits(q, w, k, torch.tensor([0, 2]), torch.tensor([6, 4]))
    assert torch.isinf(logits[1, :2]).all() and torch.isinf(logits[1, 4:]).all()
    expect = (w[0, :, None] * torch.relu(q[0] @ k[:6].T)).sum(0)
    assert torch.allclose(logits[0, :6], expect, atol=1e-5)
    ties = torch.tensor([[1.0, 3.0, 3.0, float("-inf"), 2.0]])
    assert reference.topk_indices(ties, 6).tolist() == [[1, 2, 4, 0, -1, -1]]


def test_comparator_catches_nan_tolerance_and_direction():
    e = torch.ones(4, 4)
    a = e.clone().bfloat16()
    assert_close(a, e)
    a[1, 2] = float("nan")
    with pytest.raises(AssertionError, match=r"NaN positions differ .* at \[1, 2\]"):
        assert_close(a, e)
    with pytest.raises(AssertionError, match=r"1/16 elements outside .* worst at \[3, 0\]"):
        b = e.clone()
        b[3, 0] = 1.1
        assert_close(b, e)
    with pytest.raises(AssertionError, match="cosine"):
        assert_close(-e + 2 * e * (torch.arange(16).view(4, 4) % 2), e, atol=10, rtol=0)
