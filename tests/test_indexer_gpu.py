"""The SM90 indexer (`fp8mla.kernels.indexer_sm90`: FP8 wgmma over the keys as the TMA copies
them) against the float32 reference, over many tiles and pages, and that it is the kernel
that ran (GPU only; the Triton kernel's tests run everywhere in test_indexer_topk)."""

import pytest
import torch

from fp8mla import indexer as indexer_mod
from fp8mla import reference
from fp8mla.formats import dequantize_index_keys, quantize_index_keys
from fp8mla.indexer import indexer_logits_paged, indexer_logits_ragged
from fp8mla.testing import assert_close
from helpers import index_cache, indexer_reference_paged, sm90_gluon_only

pytestmark = pytest.mark.gpu


@pytest.fixture
def sm90_launches(monkeypatch):
    """Skips off SM90; counts the launches of the Gluon indexer."""
    sm90_gluon_only("indexer")
    calls = []
    launch = indexer_mod._launch_sm90

    def counted(*args, **kw):
        calls.append(kw["paged"])
        return launch(*args, **kw)

    monkeypatch.setattr(indexer_mod, "_launch_sm90", counted)
    return calls


@pytest.mark.parametrize("heads,s_q,page_size,lens", [
    (64, 1, 64, [0, 1, 63, 64, 65, 4097]), (64, 2, 128, [5000, 130, 2]),
    (48, 3, 256, [777, 256]), (64, 4, 64, [300]), (33, 1, 64, [2049, 1])])
@pytest.mark.parametrize("tiles", [None, 3, 17])
def test_sm90_indexer_paged_matches_reference(sm90_launches, monkeypatch, heads, s_q,
                                              page_size, lens, tiles):
    """Lengths 0, inside a tile, at and past tile and page ends; the launcher's spans (one
    tile a program at these sizes), spans of three tiles (programs starting mid-row) and of 17
    (the ring's stages reused: its barriers' later phases); NaN in every byte no request owns.
    Heads from `fp8mla.indexer.SM90_MIN_HEADS` (33: padded to 64), where the launcher serves
    it."""
    if tiles:
        monkeypatch.setattr(indexer_mod, "PROGRAMS_PER_SM", 0)
        monkeypatch.setattr(indexer_mod, "SM90_TILES_PER_PROGRAM", tiles)
    cache, table = index_cache(lens, page_size, "cuda", seed=heads + s_q)
    g = torch.Generator().manual_seed(heads)
    q = (2 * torch.randn(len(lens), s_q, heads, 128, generator=g)).to(torch.float8_e4m3fn)
    w = torch.rand(len(lens) * s_q, heads, generator=g)
    max_len = table.shape[1] * page_size + 37  # a tail past the table: −inf
    out = indexer_logits_paged(q.cuda(), w.cuda(), cache.layer(0), table,
                               torch.tensor(lens, dtype=torch.int32, device="cuda"),
                               max_len=max_len)
    assert sm90_launches == [True]
    ref = indexer_reference_paged(cache, table, lens, q.cuda(), w.cuda(), s_q, max_len)
    assert_close(out, ref, atol=1e-3, rtol=1e-3)
    assert torch.isneginf(out[:s_q]).all() == (lens[0] == 0)


@pytest.mark.parametrize("heads,seq", [(64, 1000), (40, 64), (33, 129), (48, 50)])
@pytest.mark.parametrize("tiles", [None, 3, 17])
def test_sm90_indexer_ragged_matches_reference(sm90_launches, monkeypatch, heads, seq, tiles):
    """Each row its own window, starting and ending inside tiles, empty, the whole sequence;
    the last tile's copy past the keys' end (the TMA's zeros, scored −inf), 50 keys in all
    (fewer than one 64-row copy)."""
    if tiles:
        monkeypatch.setattr(indexer_mod, "PROGRAMS_PER_SM", 0)
        monkeypatch.setattr(indexer_mod, "SM90_TILES_PER_PROGRAM", tiles)
    g = torch.Generator().manual_seed(seq)
    kb, ks = quantize_index_keys(torch.randn(seq, 128, generator=g))
    rows = 9
    q = (2 * torch.randn(rows, heads, 128, generator=g)).to(torch.float8_e4m3fn)
    w = torch.rand(rows, heads, generator=g)
    starts = torch.randint(0, seq, (rows,), generator=g, dtype=torch.int32)
    ends = (starts + torch.randint(0, seq, (rows,), generator=g, dtype=torch.int32)).clamp(
        max=seq)
    starts[0], ends[0] = 0, seq
    starts[1], ends[1] = 5, 5
    out = indexer_logits_ragged(q.cuda(), w.cuda(), kb.cuda(), ks.cuda(), starts.cuda(),
                                ends.cuda())
    assert sm90_launches == [False]
    ref = reference.indexer_logits(q.float(), w, dequantize_index_keys(kb, ks), starts, ends)
    assert_close(out.cpu(), ref, atol=1e-3, rtol=1e-3)
    assert torch.isneginf(out[1]).all()


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_sm90_indexer_rings_of_two_to_four_stages(sm90_launches, monkeypatch, stages):
    """Rings of 2–4 stages (the default, `indexer_sm90.NS`, is 3; 4 was until session 45):
    17-tile spans wrap them many times, each stage refilled as soon as its tile is scored."""
    from fp8mla.kernels import indexer_sm90

    monkeypatch.setattr(indexer_sm90, "NS", stages)
    monkeypatch.setattr(indexer_mod, "PROGRAMS_PER_SM", 0)
    monkeypatch.setattr(indexer_mod, "SM90_TILES_PER_PROGRAM", 17)
    lens = [3000, 1089, 64]
    cache, table = index_cache(lens, 64, "cuda", seed=stages)
    g = torch.Generator().manual_seed(stages)
    q = (2 * torch.randn(len(lens), 2, 64, 128, generator=g)).to(torch.float8_e4m3fn)
    w = torch.rand(len(lens) * 2, 64, generator=g)
    max_len = table.shape[1] * 64
    out = indexer_logits_paged(q.cuda(), w.cuda(), cache.layer(0), table,
                               torch.tensor(lens, dtype=torch.int32, device="cuda"),
                               max_len=max_len)
    assert sm90_launches == [True]
    ref = indexer_reference_paged(cache, table, lens, q.cuda(), w.cuda(), 2, max_len)
    assert_close(out, ref, atol=1e-3, rtol=1e-3)


def test_sm90_indexer_serves_only_where_it_can(sm90_launches):
    """bf16 q, fewer than SM90_MIN_HEADS heads (the Triton kernel's exact products, as fast),
    pages under 64 keys and a pool not 16-byte aligned take the Triton kernel."""
    lens = [200]
    fp8 = torch.float8_e4m3fn
    for q_dtype, heads, page_size, offset in ((torch.bfloat16, 64, 64, 0), (fp8, 32, 64, 0),
                                              (fp8, 64, 16, 0), (fp8, 64, 64, 4)):
        cache, table = index_cache(lens, page_size, "cuda")
        q = torch.randn(1, 1, heads, 128).to(q_dtype).cuda()
        w = torch.rand(1, heads).cuda()
        pool = cache.layer(0)
        if offset:  # the same pages seen 4 bytes into a larger buffer
            big = torch.empty(pool.numel() + offset, dtype=torch.uint8, device="cuda")
            big[offset:].copy_(pool.view(-1))
            pool = big[offset:].view(pool.shape)
        out = indexer_logits_paged(q, w, pool, table,
                                   torch.tensor(lens, dtype=torch.int32, device="cuda"),
                                   max_len=256)
        ref = indexer_reference_paged(cache, table, lens, q, w, 1, 256)
        assert_close(out, ref, atol=1e-3, rtol=1e-3)
    assert sm90_launches == []
