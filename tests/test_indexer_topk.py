"""Indexer logits, top-k selection and the composite DSA decode step against the references."""

import pytest
import torch

from fp8mla import indexer as indexer_mod
from fp8mla import reference, topk
from fp8mla.cache import IndexKeyCache
from fp8mla.dsa import dsa_decode_step
from fp8mla.formats import dequantize_index_keys, quantize_index_keys
from fp8mla.indexer import indexer_logits_paged, indexer_logits_ragged
from fp8mla.kernels.topk_chunked import ST_CAND, ST_CURSOR, ST_NVALID, ST_PREFIX
from fp8mla.testing import assert_close
from fp8mla.topk import compact_capacity, topk_indices
from helpers import index_cache, indexer_reference_paged, paged_cache


@pytest.fixture(params=["fill", "span-prefetch", "span-pipelined"])
def tiles_per_program(request, monkeypatch):
    """fill: the launcher's choice (one key tile per program at these sizes); span-*: each
    program walks up to three tiles (as long rows do on a GPU, up to MAX_TILES_PER_PROGRAM:
    the prefetching loop's lookups two tiles ahead meet real pages), programs starting past
    position 0, windows starting and ending inside their spans, with either tile loop
    (registers carrying the next tile, or the compiler's pipeline) at every head count — and on
    an SM90 GPU, fp8 q of 33+ heads over pages of ≥ 64 keys, the Gluon kernel's spans of three
    tiles."""
    if request.param.startswith("span"):
        monkeypatch.setattr(indexer_mod, "PROGRAMS_PER_SM", 0)
        monkeypatch.setattr(indexer_mod, "MAX_TILES_PER_PROGRAM", 3)  # 12 from 64 heads
        monkeypatch.setattr(indexer_mod, "SM90_TILES_PER_PROGRAM", 3)
        always = request.param == "span-prefetch"
        monkeypatch.setattr(indexer_mod, "PREFETCH_MIN_HEADS", 0 if always else 1 << 30)
    return request.param


def _queries(batch, s_q, heads, device, seed, dtype=torch.float8_e4m3fn):
    """Random index queries [batch, s_q, heads, 128] of ``dtype`` and their float32 weights
    [batch · s_q, heads]."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, s_q, heads, 128, generator=g).to(dtype).to(device)
    return q, torch.rand(batch * s_q, heads, generator=g).to(device)


@pytest.mark.parametrize("q_dtype", [torch.float8_e4m3fn, torch.bfloat16])
@pytest.mark.parametrize("heads,s_q,lens,page_size", [(1, 1, [5], 1), (32, 2, [195, 3], 2),
                                                      (64, 4, [130], 64), (7, 3, [2, 40], 16),
                                                      (32, 1, [200, 64], 128)])
def test_indexer_paged_matches_reference(device, q_dtype, heads, s_q, lens, page_size,
                                         tiles_per_program):
    cache, table = index_cache(lens, page_size, device, seed=heads)
    q, w = _queries(len(lens), s_q, heads, device, heads + 1, q_dtype)
    max_len = table.shape[1] * page_size
    out = indexer_logits_paged(q, w, cache.layer(0), table,
                               torch.tensor(lens, dtype=torch.int32, device=device),
                               max_len=max_len)
    ref = indexer_reference_paged(cache, table, lens, q, w, s_q, max_len)
    assert_close(out, ref, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("heads,page_size", [(5, 16), (64, 64)])
def test_indexer_paged_per_query_lengths(device, heads, page_size, tiles_per_program):
    """context_lens [batch, s_q]: each query row its own window [0, L), read in place (no
    causal staircase, any s_q — 6 here, above the causal form's 4 — zero lengths too) over
    its request's pages; the keys past a row's length are NaN-poisoned by `index_cache`'s
    pool; 64 heads of fp8 q over pages of 64 take the Gluon kernel on an SM90 GPU."""
    lens = [[130, 7, 0, 129, 64, 1], [3, 40, 40, 2, 0, 17]]
    cache, table = index_cache([130, 40], page_size, device, seed=heads + 2)
    q, w = _queries(2, 6, heads, device, heads + 3)
    max_len = table.shape[1] * page_size
    got = indexer_logits_paged(q, w, cache.layer(0), table,
                               torch.tensor(lens, dtype=torch.int32, device=device),
                               max_len=max_len)
    assert_close(got, indexer_reference_paged(cache, table, lens, q, w, 6, max_len),
                 atol=1e-3, rtol=1e-3)
    with pytest.raises(ValueError, match=r"context_lens: expected shape \[2, 6\], got \[2, 5\]"):
        indexer_logits_paged(q, w, cache.layer(0), table,
                             torch.zeros(2, 5, dtype=torch.int32, device=device), max_len=max_len)
    with pytest.raises(ValueError, match=r"context_lens: expected a contiguous \[batch, s_q\]"):
        indexer_logits_paged(q, w, cache.layer(0), table,
                             torch.zeros(2, 8, dtype=torch.int32, device=device)[:, :6],
                             max_len=max_len)
    with pytest.raises(ValueError, match=r"s_q \(q.shape\[1\]; above 4 with context_lens "
                                         r"\[batch, s_q\] only\): expected an int in \[1, 4\], "
                                         r"got 6"):  # the causal form: 1–4 queries
        indexer_logits_paged(q, w, cache.layer(0), table,
                             torch.tensor([130, 40], dtype=torch.int32, device=device),
                             max_len=max_len)


@pytest.mark.parametrize("heads,page_size,q_dtype", [(5, 16, torch.bfloat16),
                                                    (64, 64, torch.float8_e4m3fn)])
def test_indexer_nan_in_a_key_or_q_stays_nan(device, heads, page_size, q_dtype,
                                             tiles_per_program):
    """A NaN stored in one key's e4m3 bytes (its scale finite) makes that key's logit NaN, as
    the reference's ReLU; a NaN in one head of a query makes that row NaN over its window and
    −inf outside it; nothing else moves (the comparison fails before the fix: a plain max
    ReLU dropped NaN on the GPU and in triton ≥ 3.8's interpreter, such a key scoring 0), and
    top-k never selects a NaN logit. bf16 q and fp8 q (on an SM90 GPU at 64 heads: the Gluon
    kernel's FP8 wgmma)."""
    lens = [2 * page_size + 3, page_size + 1]
    cache, table = index_cache(lens, page_size, device, seed=heads + 4)
    pos = page_size + 1  # request 0's key in its second page
    page = table[0, pos // page_size].item()
    cache.layer(0).view(cache.num_pages, -1)[page, (pos % page_size) * 128 + 77] = 0x7F
    q, w = _queries(2, 2, heads, device, heads + 5, q_dtype)
    if q_dtype == torch.bfloat16:
        q[1, 0, heads - 1, 5] = float("nan")  # request 1, query 0, the last head
    else:
        q.view(torch.uint8)[1, 0, heads - 1, 5] = 0x7F  # e4m3fn's NaN
    max_len = table.shape[1] * page_size
    out = indexer_logits_paged(q, w, cache.layer(0), table,
                               torch.tensor(lens, dtype=torch.int32, device=device),
                               max_len=max_len)
    ref = indexer_reference_paged(cache, table, lens, q, w, 2, max_len)
    assert ref[0, pos].isnan() and ref[1, pos].isnan() and ref[2, :lens[1] - 1].isnan().all()
    assert_close(out, ref, atol=1e-3, rtol=1e-3)  # NaN and −inf where the reference has them
    chosen = topk_indices(out, 8)
    assert not (chosen[:2] == pos).any() and (chosen[2] == -1).all()


@pytest.mark.parametrize("heads,page_size", [(8, 16), (32, 64), (64, 64)])
def test_indexer_fast_path_skips_pages_outside_the_pool(device, heads, page_size,
                                                        tiles_per_program):
    """check=False never reads a page a block-table entry puts outside the pool (past it,
    negative, or so large that its word offset overflows int32): those keys' logits are −inf,
    the others as the reference's (gathered tiles and, from pages of 64, whole TMA tiles; 64
    heads on SM90: the Gluon kernel, whose copies the pool's descriptor bounds)."""
    lens = [3 * page_size, 2 * page_size + 5]
    cache, table = index_cache(lens, page_size, device, seed=heads)
    bad = table.clone()
    bad[0, 1], bad[1, 0], bad[1, 2] = cache.num_pages, -2, 1 << 30
    q, w = _queries(2, 1, heads, device, heads + 1)
    max_len = table.shape[1] * page_size
    out = indexer_logits_paged(q, w, cache.layer(0), bad,
                               torch.tensor(lens, dtype=torch.int32, device=device),
                               max_len=max_len, check=False)
    ref = indexer_reference_paged(cache, table, lens, q, w, 1, max_len)
    skipped = torch.zeros_like(ref, dtype=torch.bool)
    for b, col in ((0, 1), (1, 0), (1, 2)):
        skipped[b, col * page_size:(col + 1) * page_size] = True
    ref[skipped] = float("-inf")
    assert torch.isinf(out[skipped]).all()
    assert_close(out, ref, atol=1e-3, rtol=1e-3)


def test_indexer_ragged_windows(device, tiles_per_program):
    kb, ks = quantize_index_keys(torch.randn(300, 128))
    q = torch.randn(5, 64, 128).to(torch.float8_e4m3fn)
    w = torch.rand(5, 64)
    starts = torch.tensor([0, 10, 5, 89, 70], dtype=torch.int32)
    ends = torch.tensor([90, 30, 5, 300, 250], dtype=torch.int32)
    out = indexer_logits_ragged(q.to(device), w.to(device), kb.to(device), ks.to(device),
                                starts.to(device), ends.to(device))
    ref = reference.indexer_logits(q.float(), w, dequantize_index_keys(kb, ks), starts, ends)
    assert_close(out, ref, atol=1e-3, rtol=1e-3)
    assert torch.isinf(out[2]).all()


def test_sm90_gluon_indexer_serves_fp8_q_from_33_heads():
    """Which kernel an SM90 GPU's launch takes (host logic, no launch): the Gluon FP8-wgmma
    kernel for fp8 q of `SM90_MIN_HEADS` heads or more over 16-byte aligned keys (paged: pages
    of ≥ 64 keys); the exact Triton kernel for fewer heads, bf16 q, short pages, unaligned
    keys, other GPUs and the interpreter."""
    from fp8mla.kernels import decode_sm90
    from fp8mla.runtime import Target

    keys, h100 = torch.empty(4 * 64 * 132, dtype=torch.uint8), Target(90, 132)

    def serves(heads=64, dtype=torch.float8_e4m3fn, target=h100, keys=keys, paged=True,
               page_size=64):
        q = torch.empty(3, heads, 128, dtype=dtype)
        return indexer_mod._sm90_serves(target, q, keys, paged, page_size)

    gluon = decode_sm90.AVAILABLE  # a Triton with Gluon
    assert indexer_mod.SM90_MIN_HEADS == 33
    assert serves() == serves(heads=33) == serves(paged=False, page_size=1) == gluon
    assert not serves(heads=32)
    assert not serves(dtype=torch.bfloat16)
    assert not serves(page_size=16)
    assert not serves(keys=keys[4:])
    assert not serves(target=Target(100, 148))
    assert not serves(target=Target(90, 4, interpreted=True))


def test_strided_index_tensors_are_refused(device):
    """The kernels read lengths, windows, key scales and block-table rows with unit stride: a
    strided view (every other element of a larger tensor) is refused with an error naming it,
    not misread."""
    def spaced(t):  # the same values, every other element of a tensor twice as long
        wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device)
        wide[..., ::2] = t
        return wide[..., ::2]

    def refused(name, call):
        with pytest.raises(ValueError, match=rf"{name}: expected a contiguous last dimension"):
            call()

    cache, table = index_cache([70, 30], 16, device)
    q = torch.randn(2, 1, 4, 128).to(torch.float8_e4m3fn).to(device)
    w = torch.rand(2, 4, device=device)
    lens = torch.tensor([70, 30], dtype=torch.int32, device=device)
    refused("block_table", lambda: indexer_logits_paged(q, w, cache.layer(0), spaced(table),
                                                        lens, max_len=80))
    refused("context_lens", lambda: indexer_logits_paged(q, w, cache.layer(0), table,
                                                         spaced(lens), max_len=80))
    kb, ks = quantize_index_keys(torch.randn(40, 128))
    kb, ks = kb.to(device), ks.to(device)
    q = torch.randn(3, 4, 128).to(torch.float8_e4m3fn).to(device)
    w = torch.rand(3, 4, device=device)
    starts = torch.tensor([0, 5, 10], dtype=torch.int32, device=device)
    ends = torch.tensor([40, 20, 10], dtype=torch.int32, device=device)
    refused("key_scales", lambda: indexer_logits_ragged(q, w, kb, spaced(ks), starts, ends))
    refused("starts", lambda: indexer_logits_ragged(q, w, kb, ks, spaced(starts), ends))
    refused("ends", lambda: indexer_logits_ragged(q, w, kb, ks, starts, spaced(ends)))
    logits = torch.randn(2, 300, device=device)
    refused("lengths", lambda: topk_indices(logits, 16, lengths=spaced(lens)))
    refused("block_table", lambda: topk_indices(logits, 16, lengths=lens,
                                                block_table=spaced(table), page_size=16))
    # fp8 q is read as 32-bit words: a start off a 4-byte boundary is refused, naming q
    buf = torch.randn(1, 4 * 128 + 1).to(torch.float8_e4m3fn).to(device)
    with pytest.raises(ValueError, match=r"q: expected fp8 rows on 4-byte boundaries"):
        indexer_logits_ragged(buf[:, 1:].view(1, 4, 128), torch.rand(1, 4, device=device), kb,
                              ks, starts[:1], ends[:1])


@pytest.mark.parametrize("chunk", [0, 1024])
def test_topk_slots_never_past_the_block_table(device, chunk):
    """A row scanned past its block table's pages (lengths or logits wider than max_pages ·
    page_size) picks only positions the table maps: the same slots as the top-k of the
    covered prefix (before, such positions read past the table row: garbage slots)."""
    g = torch.Generator().manual_seed(30)
    logits = torch.randn(2, 300, generator=g).to(device)
    lens = torch.tensor([300, 40], dtype=torch.int32, device=device)
    table = torch.randperm(10, generator=g).to(torch.int32).view(2, 5).to(device)  # 80 tokens
    got = topk_indices(logits, 8, lengths=lens, block_table=table, page_size=16, chunk=chunk)
    pos = topk_indices(logits[:, :80].contiguous(), 8, lengths=lens.clamp(max=80), chunk=chunk)
    want = torch.where(pos >= 0, table.gather(1, pos.clamp(min=0).long() // 16) * 16 + pos % 16,
                       -1)
    assert torch.equal(got, want)


@pytest.mark.parametrize("chunk", [0, 1024])
def test_topk_slots_of_bad_pages_are_minus_one_not_wrapped(device, chunk):
    """Block-table entries the emitted slots cannot name — negative, or so large that
    page · page_size passes int32 — come out −1 (skipped downstream), never a wrapped slot
    that looks valid; a page merely past the pool comes out as computed (the sparse kernels
    skip slots outside the pool)."""
    g = torch.Generator().manual_seed(31)
    logits = torch.randn(1, 256, generator=g).to(device)
    table = torch.tensor([[3, -1, 1 << 27, 9]], dtype=torch.int32, device=device)  # pages of 64
    got = topk_indices(logits, 256, block_table=table, page_size=64, chunk=chunk)
    pos = topk_indices(logits, 256, chunk=chunk).long()
    page = table[0, pos[0] // 64].long()
    want = torch.where((page >= 0) & (page < 1 << 27), page * 64 + pos[0] % 64, -1)
    assert torch.equal(got[0].long(), want)
    assert (got == -1).sum() == 128 and (got >= 9 * 64).sum() == 64


def test_indexer_bad_input(device):
    cache, table = index_cache([20], 16, device)
    q = torch.randn(1, 1, 65, 128).to(torch.float8_e4m3fn).to(device)
    lens = torch.tensor([20], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match=r"index heads \(q.shape\[-2\]\): expected an int in \[1, 64\], got 65"):
        indexer_logits_paged(q, torch.rand(1, 65, device=device), cache.layer(0), table, lens,
                             max_len=32)
    q = torch.randn(1, 1, 8, 64).to(torch.float8_e4m3fn).to(device)
    with pytest.raises(ValueError, match=r"q: expected index_head_dim 128, got 64"):
        indexer_logits_paged(q, torch.rand(1, 8, device=device), cache.layer(0), table, lens,
                             max_len=32)
    q = torch.randn(1, 1, 8, 128).to(torch.float8_e4m3fn).to(device)
    with pytest.raises(ValueError, match=r"weights: expected shape \[1, 8\]"):
        indexer_logits_paged(q, torch.rand(2, 8, device=device), cache.layer(0), table, lens,
                             max_len=32)
    with pytest.raises(ValueError, match=r"context_lens: expected values in \[0, 32\]"):
        indexer_logits_paged(q, torch.rand(1, 8, device=device), cache.layer(0), table,
                             lens + 13, max_len=32)
    for bad in (torch.zeros(0, 16 * 132), torch.zeros(4, 3 * 132), torch.zeros(4, 100)):
        with pytest.raises(ValueError, match=r"key_cache: expected uint8 \[num_pages ≥ 1, "
                                             r"page_size · 132\], page_size a power of two"):
            indexer_logits_paged(q, torch.rand(1, 8, device=device),
                                 bad.to(torch.uint8).to(device), table, lens, max_len=32)


def test_indexer_pool_with_padded_pages_is_read_right_and_said(device, monkeypatch):
    """A key pool whose pages are padded apart (a page stride above page · 132 bytes, as some
    engines allocate it) gives the packed pool's logits — through a copy of the pool, which a
    warning says once per process."""
    import warnings

    import fp8mla.indexer as indexer_mod

    cache, table = index_cache([40, 9], 16, device, seed=3)
    q = torch.randn(2, 1, 8, 128).to(torch.float8_e4m3fn).to(device)
    w = torch.rand(2, 8, device=device)
    lens = torch.tensor([40, 9], dtype=torch.int32, device=device)
    packed = cache.deep_gemm_view(0)
    want = indexer_logits_paged(q, w, packed, table, lens, max_len=48)
    wide = torch.full((packed.shape[0], 16 * 132 + 512), 0x7F, dtype=torch.uint8, device=device)
    wide[:, :16 * 132] = packed.reshape(packed.shape[0], -1)
    padded = wide[:, :16 * 132].view(packed.shape[0], 16, 1, 132)  # page stride 2624 bytes
    assert not padded.is_contiguous()
    monkeypatch.setattr(indexer_mod, "_warned_padded", False)
    with pytest.warns(UserWarning, match=r"key_cache: pages are not packed .* copies the whole"):
        got = indexer_logits_paged(q, w, padded, table, lens, max_len=48)
    assert torch.equal(got, want)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per process; the 2-D form alike
        assert torch.equal(indexer_logits_paged(q, w, wide[:, :16 * 132], table, lens,
                                                max_len=48), want)


@pytest.mark.parametrize("chunk", [0, 1024])  # one program per row / several
@pytest.mark.parametrize("k", [1, 7, 2048])
def test_topk_matches_reference_sets_with_tie_rule(device, k, chunk):
    g = torch.Generator().manual_seed(k)
    x = torch.randn(4, 3000, generator=g)
    x[0, 100:400] = 1.5  # a plateau across the threshold: lower positions win
    x[1, 50:] = float("-inf")  # fewer candidates than k (for k > 50): −1 padding
    x[2] = torch.randint(0, 2, (3000,), generator=g).float()  # two values: ties at k = 2048
    x[2, 1::2] *= -1.0  # −0.0 among the zeros: equal to +0.0, lower positions win
    x[3, ::3] = float("nan")  # never chosen
    out = topk_indices(x.to(device), k, chunk=chunk).cpu()
    ref = reference.topk_indices(torch.where(x.isnan(), float("-inf"), x), k)
    for r in range(4):
        assert set(out[r].tolist()) == set(ref[r].tolist()), f"row {r}"
        chosen = out[r][out[r] >= 0]
        assert torch.all(chosen[1:] > chosen[:-1]), "positions ascend"


def test_topk_rows_longer_than_one_block(device):
    """Rows past MAX_BLOCK take several loop steps per pass: ties and the threshold straddle
    the step boundary, and lengths end mid-step."""
    from fp8mla.topk import MAX_BLOCK

    n = MAX_BLOCK + 1500
    g = torch.Generator().manual_seed(5)
    x = torch.randint(0, 40, (2, n), generator=g).float()  # heavy ties everywhere
    x[0, MAX_BLOCK - 300:MAX_BLOCK + 300] = 100.0  # a plateau across the boundary
    lengths = torch.tensor([n, MAX_BLOCK + 7], dtype=torch.int32)
    out = topk_indices(x.to(device), 700, lengths=lengths.to(device)).cpu()
    for r in range(2):
        ref = reference.topk_indices(x[r:r + 1, : int(lengths[r])], 700)[0]
        assert set(out[r].tolist()) == set(ref.tolist()), f"row {r}"


def test_topk_rows_with_a_register_tail(device):
    """A row just past a power of two (4160 = 4096 + 64, a 65-page table) is held as a 4096
    block plus a tail: ties straddle the boundary, a length ends inside the tail."""
    from fp8mla.topk import _block

    n = 4160
    assert _block(n)[:2] == (4096, 256)
    g = torch.Generator().manual_seed(11)
    x = torch.randint(0, 30, (3, n), generator=g).float()
    x[0, 4000:4160] = 50.0  # a plateau across the block/tail boundary, cut by k
    x[1] = torch.randn(n, generator=g)
    x[2, ::2] = float("-inf")  # fewer candidates than k = 2048 (padding)
    lengths = torch.tensor([n, 4097, 3000], dtype=torch.int32)  # the last ends before the tail
    for k in (100, 2048):
        out = topk_indices(x.to(device), k, lengths=lengths.to(device)).cpu()
        for r in range(3):
            ref = reference.topk_indices(x[r:r + 1, : int(lengths[r])], k)[0]
            assert set(out[r].tolist()) == set(ref.tolist()), f"row {r}, k {k}"
    # slots through a 65-page table, and a length past the row (clamped, never read beyond)
    table = torch.randperm(200, generator=g)[:195].view(3, 65).int()
    long = torch.tensor([n, n + 999, 4097], dtype=torch.int32)
    slots = topk_indices(x.to(device), 300, lengths=long.to(device), block_table=table.to(device),
                         page_size=64).cpu()
    for r in range(3):
        pos = reference.topk_indices(x[r:r + 1, : min(int(long[r]), n)], 300)[0]
        pos = pos[pos >= 0].long()
        want = set((table[r, pos // 64].long() * 64 + pos % 64).tolist())
        assert set(slots[r][slots[r] >= 0].tolist()) == want, f"row {r}"


def test_default_chunk_by_rows_and_length():
    """The chunked path takes rows longer than 8K while at most 2 rows per SM (else one
    program per row), 1024 logits a program up to 32K and 2048 beyond (H200 sweep)."""
    from fp8mla.topk import default_chunk

    assert default_chunk(64, 8192, 132) == 0 and default_chunk(265, 32768, 132) == 0
    assert default_chunk(64, 8193, 132) == 1024 and default_chunk(264, 32768, 132) == 1024
    assert default_chunk(64, 32769, 132) == 2048 and default_chunk(1, 262144, 132) == 2048


def test_topk_chunked_slots_lengths_and_bad_chunk(device):
    """Several programs per row: ranks continue across chunks (ties straddling a chunk
    boundary), slots through the block table, lengths ending mid-chunk or past the row, a row
    with nothing valid, rows settled at different passes; rows finished from their compacted
    candidates (≤ compact_capacity(150) = 1024 after 2 digits) and rows whose ties overflow it
    (row 4: every key equal; row 0: its plateau) and finish over the whole row."""
    g = torch.Generator().manual_seed(3)
    n = 3 * 1024 + 100
    assert compact_capacity(150) < n
    x = torch.randint(0, 25, (5, n), generator=g).float()
    x[0, 1000:1100] = 99.0  # a plateau across the first chunk boundary, cut by k
    x[0, 2000:3100] = 98.0  # ties beyond the capacity just below it
    x[1] = torch.randn(n, generator=g)  # distinct: unsettled after 2 digits, compacted
    x[3] = float("-inf")
    x[4] = 7.0
    lengths = torch.tensor([n, n + 500, 2500, n, n], dtype=torch.int32)
    table = torch.randperm(300, generator=g)[:5 * 50].view(5, 50).int()
    out = topk_indices(x.to(device), 150, lengths=lengths.to(device), block_table=table.to(device),
                       page_size=64, chunk=1024).cpu()
    for r in range(5):
        pos = reference.topk_indices(x[r:r + 1, : min(int(lengths[r]), n)], 150)[0]
        pos = pos[pos >= 0].long().sort().values
        want = (table[r, pos // 64].long() * 64 + pos % 64).tolist()
        assert out[r][out[r] >= 0].tolist() == want, f"row {r}"  # in position order
    assert (out[3] == -1).all()
    for bad in (1000, 512, 16384, -1):
        with pytest.raises(ValueError, match=r"chunk: expected None, 0 \(one program per row\) "
                                             rf"or a power of two in \[1024, 8192\], got {bad}"):
            topk_indices(x.to(device), 4, chunk=bad)


def test_topk_chunked_compaction_paths(device):
    """Which rows the compaction takes (the workspace's candidate count ≤ capacity) and that
    both paths select exactly: candidates = capacity (compacted), capacity + 1 (not: the whole
    row in one program), as many valid keys as k (all taken), distinct values (compacted, the
    select going on from 2 digits)."""
    k, n = 150, 3 * 1024 + 100
    cap = compact_capacity(k)
    g = torch.Generator().manual_seed(5)
    x = torch.full((4, n), float("-inf"))
    x[0, torch.randperm(n, generator=g)[:cap]] = 5.0  # cap equal keys: candidates = cap
    x[1, torch.randperm(n, generator=g)[:cap + 1]] = 5.0
    x[2, torch.randperm(n, generator=g)[:k]] = torch.randn(k, generator=g)
    x[3] = torch.randn(n, generator=g)
    xd = x.to(device)
    out = torch.empty(4, k, dtype=torch.int32, device=device)
    lengths = torch.full((4,), n, dtype=torch.int32, device=device)
    ws = topk._chunked(xd, out, lengths.view(1, -1), lengths, k, 1, 1, False, 1024).cpu()
    cand = ws[:, ST_CAND.value]
    assert cand[:3].tolist() == [cap, cap + 1, k] and k < cand[3] <= cap
    ref = reference.topk_indices(x, k)
    for r in range(4):
        assert out[r].cpu().tolist() == ref[r].sort().values.tolist(), f"row {r}"


def _finish_matches_reference(x, xd, lengths, k, chunk, ws, runs, cval, cpos):
    """The chunked top-k's last launch over the given state: every row equals the reference's
    positions, ascending, then the −1 padding."""
    out = torch.empty(x.shape[0], k, dtype=torch.int32, device=xd.device)
    topk._finish(xd, out, lengths.view(1, -1), lengths, k, 1, 1, False, chunk, ws, runs, cval,
                 cpos)
    ref = reference.topk_indices(x, k)
    for r in range(x.shape[0]):
        want = sorted(p for p in ref[r].tolist() if p >= 0)
        assert out[r].cpu().tolist() == want + [-1] * (k - len(want)), f"row {r}"


@pytest.mark.parametrize("k,n", [(300, 5117), (320, 5000)])  # digit passes / sampled
def test_topk_chunked_runs_claimed_in_any_order(device, k, n):
    """The compaction's chunks claim their runs of the buffer with atomics, so on a GPU the runs
    lie in any order; the finish puts them back in position order. Scramble them (reverse the
    runs, poison the gap) and the selection — ties cut at the lower positions — is unchanged."""
    chunk = 1024
    assert topk.sampled(n, k) == (k == 320)
    g = torch.Generator().manual_seed(9)
    x = torch.randn(2, n, generator=g)
    x[0, 900:1300] = 3.0  # ties across a chunk boundary, cut by k
    x[1, ::5] = float("-inf")
    xd = x.to(device)
    lengths = torch.full((2,), n, dtype=torch.int32, device=device)
    ws, runs, cval, cpos = topk._candidates(xd, lengths, k, chunk)
    cand = ws[:, ST_CURSOR.value].cpu()
    assert (cand <= cval.shape[1]).all() and (cand > k).all()
    for r in range(2):  # move run c to the end of the buffer's used part, last chunk first
        starts, ns = runs[r, :, 0].cpu().tolist(), runs[r, :, 1].cpu().tolist()
        val, pos = cval[r].clone(), cpos[r].clone()
        cval[r].fill_(float("nan"))
        cpos[r].fill_(-7)
        at = 0
        for c in reversed(range(len(ns))):
            cval[r, at:at + ns[c]] = val[starts[c]:starts[c] + ns[c]]
            cpos[r, at:at + ns[c]] = pos[starts[c]:starts[c] + ns[c]]
            runs[r, c, 0] = at
            at += ns[c]
        assert at == int(cand[r])
    _finish_matches_reference(x, xd, lengths, k, chunk, ws, runs, cval, cpos)


def test_topk_chunked_sampled_threshold(device):
    """Rows of ≤ 16 k logits take a threshold from evenly spread samples instead of digit
    passes: distinct values (the threshold keeps between k and capacity), a plateau cut by k
    across chunks, rows with fewer valid keys than the sample's rank (every valid key kept), a
    row shorter than the capacity, and heavy ties (more than capacity at the threshold: the
    whole row in one program) — all exact, positions ascending."""
    k, n, chunk = 150, 2300, 1024  # capacity 1024; rows shorter than SAMPLES: strata of 0–1
    assert topk.sampled(n, k) and not topk.sampled(n, 100)
    g = torch.Generator().manual_seed(21)
    x = torch.randn(6, n, generator=g)
    x[1, 700:1400] = 2.5  # ties at the k-th value across a chunk boundary
    x[2, 40:] = float("-inf")  # 40 valid keys: fewer than k
    x[3, ::7] = float("-inf")
    x[4] = torch.randint(0, 2, (n,), generator=g).float()  # ~1150 ties at the top value
    x[5, 1:] = 0.0
    lengths = torch.tensor([n, n, n, n, n, 900], dtype=torch.int32)
    xd, ld = x.to(device), lengths.to(device)
    ws, runs, cval, cpos = topk._candidates(xd, ld, k, chunk)
    kept = ws[:, ST_CURSOR.value].cpu()
    assert k <= kept[0] <= compact_capacity(k), "the sampled threshold's count"
    assert kept[2] == 40 and ws[2, ST_NVALID.value] == 40
    assert kept[4] > compact_capacity(k)  # more ties than fit: finished over the whole row
    out = topk_indices(xd, k, lengths=ld, chunk=chunk).cpu()
    for r in range(6):
        ref = reference.topk_indices(x[r:r + 1, : int(lengths[r])], k)[0]
        assert out[r].tolist() == ref.sort().values.tolist() if r != 2 else \
            out[r, :40].tolist() == list(range(40)) and (out[r, 40:] == -1).all(), f"row {r}"


def test_topk_chunked_unlucky_threshold_falls_back(device):
    """A sampled threshold that keeps fewer than k keys (or more than capacity) is detected
    from the compaction's counts: such a row finishes over the whole row, still exact. One that
    keeps exactly k, or every valid key of a row with fewer than k, is taken as it is — with
    keys equal to the threshold among them (1.0: the low 16 key bits zero, as any
    bf16-representable logit's)."""
    k, n, chunk = 150, 2300, 1024
    g = torch.Generator().manual_seed(22)
    x = torch.randn(5, n, generator=g)
    x[3, 1000:1000 + k] = 1.0 + torch.rand(k, generator=g)  # exactly k keys ≥ 1.0 ...
    x[3, 1000] = 1.0  # ... the smallest of them = the threshold
    x[3, 1000 + k:] = torch.rand(n - 1000 - k, generator=g) * 0.9
    x[3, :1000] = -torch.rand(1000, generator=g)
    x[4] = float("-inf")
    x[4, 7:7 + 60] = 1.0 + torch.rand(60, generator=g)  # 60 valid keys, the smallest = T
    x[4, 7] = 1.0
    xd = x.to(device)
    lengths = torch.full((5,), n, dtype=torch.int32, device=device)
    top = x.sort(dim=1, descending=True).values
    assert (top[:3, k] > 0).all()
    keys = top.view(torch.int32) | (-2147483648)  # positive values' order-preserving keys
    one = torch.tensor([1.0]).view(torch.int32) | (-2147483648)
    ws = torch.zeros(5, topk.WS_WORDS.value, dtype=torch.int32)
    ws[0, ST_PREFIX.value] = keys[0, k // 2]  # keeps k / 2 + 1
    ws[1, ST_PREFIX.value] = 0  # keeps every key: 2300 > capacity 1024
    ws[2, ST_PREFIX.value] = keys[2, k]  # keeps k + 1: enough
    ws[3:, ST_PREFIX.value] = one  # keeps exactly k / every valid key, the least equal to T
    ws = ws.to(device)
    runs, cval, cpos = topk._compact(xd, lengths, k, chunk, ws)
    assert ws[:, ST_CURSOR.value].cpu().tolist() == [k // 2 + 1, n, k + 1, k, 60]
    _finish_matches_reference(x, xd, lengths, k, chunk, ws, runs, cval, cpos)


def test_topk_chunked_sampled_rows_longer_than_the_sample(device):
    """Sampled rows longer than SAMPLES: strata of one or two positions at hashed offsets, the
    sample's rank from the row length; distinct values, a plateau at the k-th value, a row
    ending mid-chunk, and one that is mostly −inf; positions, and slots through a block table
    shared by two rows per request."""
    k, n, chunk = 320, 5000, 1024
    assert topk.sampled(n, k) and n > topk.SAMPLES
    g = torch.Generator().manual_seed(23)
    x = torch.randn(4, n, generator=g)
    x[1, 2000:2600] = 1.7  # ~ the k-th value: a plateau cut by k
    x[3, torch.rand(n, generator=g) < 0.93] = float("-inf")  # ~350 valid: just over k
    lengths = torch.tensor([n, n, 4321, n], dtype=torch.int32)
    xd, ld = x.to(device), lengths.to(device)
    ws, runs, cval, cpos = topk._candidates(xd, ld, k, chunk)
    kept = ws[:, ST_CURSOR.value].cpu()
    assert ((kept >= k) & (kept <= compact_capacity(k))).all(), kept
    out = topk_indices(xd, k, lengths=ld, chunk=chunk).cpu()
    table = torch.randperm(400, generator=g)[:2 * 79].view(2, 79).int()  # 2 rows per request
    slots = topk_indices(xd, k, lengths=ld, block_table=table.to(device), page_size=64,
                         rows_per_request=2, chunk=chunk).cpu()
    for r in range(4):
        ref = reference.topk_indices(x[r:r + 1, : int(lengths[r])], k)[0]
        assert out[r].tolist() == ref.sort().values.tolist(), f"row {r}"
        pos = out[r].long()
        assert slots[r].tolist() == (table[r // 2, pos // 64].long() * 64 + pos % 64).tolist()


def test_topk_slots_and_lengths(device):
    x = torch.randn(4, 64)
    table = torch.tensor([[5, 2, 7, 1], [3, 0, 6, 4]], dtype=torch.int32)
    lengths = torch.tensor([64, 64, 10, 0], dtype=torch.int32)
    out = topk_indices(x.to(device), 8, lengths=lengths.to(device), block_table=table.to(device),
                       page_size=16, rows_per_request=2).cpu()
    for r in range(4):
        pos = reference.topk_indices(x[r:r + 1, : int(lengths[r])], 8)[0]
        pos = pos[pos >= 0].long()
        slots = table[r // 2, pos // 16] * 16 + pos % 16
        assert set(out[r][out[r] >= 0].tolist()) == set(slots.tolist())
    assert torch.all(out[3] == -1)


def test_topk_bad_input(device):
    with pytest.raises(ValueError, match=r"k: expected an int in \[1, 4096\], got 0"):
        topk_indices(torch.zeros(1, 8, device=device), 0)
    with pytest.raises(TypeError, match=r"logits: expected dtype float32, got bfloat16"):
        topk_indices(torch.zeros(1, 8, device=device).bfloat16(), 2)
    with pytest.raises(ValueError, match=r"page_size: expected the block table's page size"):
        topk_indices(torch.zeros(1, 8, device=device), 2,
                     block_table=torch.zeros(1, 1, dtype=torch.int32, device=device))


@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "bf16"])
def test_dsa_decode_step_matches_reference_pipeline(device, fmt):
    lens, s_q, heads, topk, ps = [90, 20], 2, 8, 16, 16
    kv, table, seqlens = paged_cache(fmt, lens, ps, device=device, seed=3)
    index_cache = IndexKeyCache(kv.num_pages, ps, device=device)
    g = torch.Generator().manual_seed(4)
    for b, n in enumerate(lens):
        pos = torch.arange(n, device=device)
        slots = table[b, pos // ps].long() * ps + pos % ps
        index_cache.store(0, torch.randn(n, 128, generator=g).bfloat16().to(device), slots)
    q = torch.randn(2, s_q, heads, 576, generator=g).bfloat16().to(device)
    q_index = torch.randn(2, s_q, 32, 128, generator=g).to(torch.float8_e4m3fn).to(device)
    w = torch.rand(2 * s_q, 32, generator=g).to(device)
    out, lse, slots = dsa_decode_step(q, q_index, w, kv.layer(0), index_cache.layer(0), table,
                                      seqlens, kv_format=fmt, topk=topk)
    spaced = torch.stack([seqlens, seqlens], 1)[:, 0]  # the same lengths, stride 2
    with pytest.raises(ValueError, match=r"cache_seqlens: expected a contiguous last dimension"):
        dsa_decode_step(q, q_index, w, kv.layer(0), index_cache.layer(0), table, spaced,
                        kv_format=fmt, topk=topk)
    with pytest.raises(ValueError, match=r"^topk: expected an int in \[1, 4096\], got 0"):
        dsa_decode_step(q, q_index, w, kv.layer(0), index_cache.layer(0), table, seqlens,
                        kv_format=fmt, topk=0)
    negative = seqlens.clone()
    negative[0] = -3
    with pytest.raises(ValueError, match=r"^cache_seqlens: expected lengths in \[0, \d+\].*got -3"):
        dsa_decode_step(q, q_index, w, kv.layer(0), index_cache.layer(0), table, negative,
                        kv_format=fmt, topk=topk)
    # a latent pool of fewer pages than the index cache: a page the lengths use is outside it
    short = kv.layer(0)[: int(table[table >= 0].min()) + 1]
    with pytest.raises(ValueError, match=r"^block_table: a page within cache_seqlens points "
                                         r"outside the pool"):
        dsa_decode_step(q, q_index, w, short, index_cache.layer(0), table, seqlens,
                        kv_format=fmt, topk=topk)
    with pytest.raises(ValueError, match=r"q_index: expected shape \[2, 2, \*, \*\]"):
        dsa_decode_step(q, q_index[:1], w, kv.layer(0), index_cache.layer(0), table, seqlens,
                        kv_format=fmt, topk=topk)
    # reference pipeline: indexer → top-k (positions → slots) → sparse attention
    logits = indexer_reference_paged(index_cache, table, lens, q_index, w, s_q, table.shape[1] * ps)
    ref_pos = reference.topk_indices(logits.cpu(), topk)
    kvf = kv.dequantize(0).reshape(-1, 576)
    for r in range(2 * s_q):
        b = r // s_q
        pos = ref_pos[r][ref_pos[r] >= 0].long()
        ref_slots = (table[b].cpu()[pos // ps].long() * ps + pos % ps).tolist()
        assert set(slots.view(-1, topk)[r][slots.view(-1, topk)[r] >= 0].tolist()) == set(ref_slots)
        ro, rl = reference.sparse_mla(q.view(-1, heads, 576)[r:r + 1], kvf,
                                      torch.tensor([ref_slots], device=device), 576 ** -0.5)
        assert_close(out.view(-1, heads, 512)[r:r + 1], ro, name=f"row {r} out")
        assert_close(lse.view(-1, heads)[r:r + 1], rl, atol=1e-3, rtol=1e-3, name=f"row {r} lse")
