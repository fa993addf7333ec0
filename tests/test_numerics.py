"""The NaN/Inf diagnosis mode names the op, layer, request and position; off, it costs nothing
and changes nothing."""

import pytest
import torch

from fp8mla import numerics
from fp8mla.decode import dense_decode
from fp8mla.sparse import sparse_prefill
from helpers import paged_cache


@pytest.fixture
def diagnose():
    numerics.enable(True)
    yield
    numerics.enable(None)


def _slot(table, b, pos, page_size):
    return int(table[b, pos // page_size]) * page_size + pos % page_size


def test_nan_in_a_referenced_row_is_named(device, diagnose):
    cache, table, seqlens = paged_cache("fp8_ds_mla", [30, 12], 16, device=device)
    slot = _slot(table, 1, 7, 16)
    cache.layer(0).view(-1, 656)[slot, 528:530] = torch.tensor([0xC0, 0x7F], dtype=torch.uint8)
    q = torch.randn(2, 1, 4, 576, device=device).bfloat16()
    with numerics.layer_scope(12), pytest.raises(
            numerics.NumericsError,
            match=rf"dense_decode \(layer 12\): request 1, position 7 \(slot {slot}\): cache value "
                  r"512 is nan"):
        dense_decode(q, cache.layer(0), table, seqlens, kv_format="fp8_ds_mla")


def test_bad_scale_and_bad_q_are_named(device, diagnose):
    cache, table, seqlens = paged_cache("fp8_ds_mla", [30], 16, device=device)
    slot = _slot(table, 0, 3, 16)
    cache.layer(0).view(-1, 656)[slot, 516:520] = torch.zeros(4, dtype=torch.uint8)  # scale 1 = 0
    q = torch.randn(1, 1, 4, 576, device=device).bfloat16()
    with pytest.raises(numerics.NumericsError, match=r"position 3 .*: scale 1 is 0.0"):
        dense_decode(q, cache.layer(0), table, seqlens, kv_format="fp8_ds_mla")
    cache, table, seqlens = paged_cache("fp8", [30], 16, device=device)
    q[0, 0, 2, 100] = float("inf")
    with pytest.raises(numerics.NumericsError, match=r"q has a non-finite value at request 0, "
                                                     r"index \[0, 2, 100\]: inf"):
        dense_decode(q, cache.layer(0), table, seqlens, kv_format="fp8")


def test_sparse_checks_only_listed_slots(device, diagnose):
    cache, table, seqlens = paged_cache("bf16", [30], 16, device=device)
    q = torch.randn(2, 4, 576, device=device).bfloat16()
    idx = torch.tensor([[0, 1, -1], [2, 3, 4]], dtype=torch.int32, device=device)
    idx = torch.tensor([[_slot(table, 0, int(p), 16) if p >= 0 else -1 for p in row]
                        for row in idx.tolist()], dtype=torch.int32, device=device)
    sparse_prefill(q, cache.layer(0), idx, kv_format="bf16")  # poisoned pages never listed: ok
    cache.layer(0).view(-1, 576 * 2).view(torch.bfloat16)[int(idx[1, 2]), 9] = float("nan")
    with pytest.raises(numerics.NumericsError, match=r"sparse_attention: request 1, position 2"):
        sparse_prefill(q, cache.layer(0), idx, kv_format="bf16")


def test_off_by_default(device, monkeypatch):
    monkeypatch.delenv("FP8MLA_CHECK", raising=False)
    assert not numerics.enabled()
    monkeypatch.setenv("FP8MLA_CHECK", "1")
    assert numerics.enabled()
