"""DSAAttention against transformers' GlmMoeDsaAttention (tiny random config): a prefill, then
decode steps, through the paged caches, on the fp8mla kernels and on the reference backend."""

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import GlmMoeDsaConfig  # noqa: E402
from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import (  # noqa: E402
    GlmMoeDsaAttention,
    GlmMoeDsaRotaryEmbedding,
)

from fp8mla.cache import IndexKeyCache, PagedKVCache, build_block_table  # noqa: E402
from fp8mla.config import from_hf_config, preset  # noqa: E402
from fp8mla.layer import DSAAttention, _rms_norm, rope_cos_sin  # noqa: E402

PREFILL, DECODE = 9, 3


def _hf(index_topk, seed=0):
    cfg = GlmMoeDsaConfig(hidden_size=128, num_attention_heads=2, num_key_value_heads=2,
                          q_lora_rank=64, kv_lora_rank=512, qk_nope_head_dim=32,
                          qk_rope_head_dim=64, v_head_dim=32, index_n_heads=4,
                          index_head_dim=128, index_topk=index_topk, num_hidden_layers=1,
                          rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    attn = GlmMoeDsaAttention(cfg, layer_idx=0).float().eval()
    with torch.no_grad():  # norms away from 1 so a wrong norm shows
        for name, p in attn.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    return cfg, attn


def _hf_forward(cfg, attn, x):
    b, t, _ = x.shape
    pos = torch.arange(t)[None].expand(b, t)
    cos, sin = GlmMoeDsaRotaryEmbedding(cfg)(x, pos)
    mask = torch.full((t, t), torch.finfo(torch.float32).min).triu(1)[None, None].expand(b, 1, t, t)
    with torch.no_grad():
        out, _, topk = attn(x, (cos, sin), mask.contiguous(), position_ids=pos)
    return out, topk


def _run_ours(layer, x, kv_format, device, topk_override=None):
    """Prefill PREFILL tokens, then DECODE single-token steps; returns all outputs."""
    b, t, _ = x.shape
    kv = PagedKVCache(8, 4, kv_format, device=device)
    ic = IndexKeyCache(8, 4, device=device)
    table = build_block_table([[5, 1, 6], [0, 7, 2]][:b], device=device)
    outs = []
    spans = [(0, PREFILL)] + [(i, i + 1) for i in range(PREFILL, t)]
    for lo, hi in spans:
        pos = torch.arange(lo, hi, device=device)[None].expand(b, hi - lo)
        over = None if topk_override is None else topk_override[:, lo:hi].to(device)
        with torch.no_grad():
            outs.append(layer(x[:, lo:hi].to(device), pos, kv, ic, 0, table, topk_override=over))
    return torch.cat(outs, 1).cpu()


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def _covered_run(device, backend, kv_format):
    """(ours, transformers') outputs of the layer whose index_topk covers the whole context."""
    cfg, attn = _hf(index_topk=64)
    x = torch.randn(2, PREFILL + DECODE, 128)
    want, _ = _hf_forward(cfg, attn, x)
    layer = DSAAttention.from_hf(attn, from_hf_config(cfg.to_dict()), backend=backend,
                                 rms_norm_eps=cfg.rms_norm_eps, dtype=torch.float32,
                                 device=device)
    return _run_ours(layer, x, kv_format, device), want


@pytest.mark.parametrize("kv_format,bound", [("bf16", 1e-2), ("fp8_ds_mla", 4e-2)])
@pytest.mark.parametrize("backend", ["fp8mla", "reference"])
def test_matches_transformers_when_topk_covers_the_context(device, kv_format, bound, backend):
    got, want = _covered_run(device, backend, kv_format)
    assert want.abs().mean() > 1e-2  # a real signal, not zeros
    assert _rel(got, want) < bound, _rel(got, want)


@pytest.mark.parametrize("backend", ["fp8mla", "reference"])
def test_dsa_prefill_indexer_in_chunks_of_rows(device, monkeypatch, backend):
    """The prefill's indexer logits, a few new tokens' rows at a time (as for long prompts:
    `fp8mla.prefill.CHUNK_ENTRIES`), choose what the whole block chooses: the layer still
    matches transformers, and the rows went through in several chunks."""
    import fp8mla.prefill as prefill_mod
    from fp8mla import layer as layer_mod

    monkeypatch.setattr(prefill_mod, "CHUNK_ENTRIES", 2 * PREFILL)  # two rows a chunk
    chunks = []
    monkeypatch.setattr(layer_mod, "row_chunks",
                        lambda *a, **k: chunks.append(prefill_mod.row_chunks(*a, **k))
                        or chunks[-1])
    got, want = _covered_run(device, backend, "bf16")
    assert _rel(got, want) < 1e-2, _rel(got, want)
    # each request's prefill rows in chunks of two (then the reference's one-row decode steps)
    assert [len(c) for c in chunks[:2]] == [-(-PREFILL // 2)] * 2
    assert all(len(c) == 1 for c in chunks[2:])


@pytest.mark.parametrize("kv_format,bound", [("bf16", 1e-2), ("fp8_ds_mla", 4e-2)])
def test_matches_transformers_given_its_topk_set(device, kv_format, bound):
    cfg, attn = _hf(index_topk=4, seed=1)
    x = torch.randn(2, PREFILL + DECODE, 128)
    want, hf_topk = _hf_forward(cfg, attn, x)
    layer = DSAAttention.from_hf(attn, from_hf_config(cfg.to_dict()),
                                 rms_norm_eps=cfg.rms_norm_eps, dtype=torch.float32,
                                 device=device)
    got = _run_ours(layer, x, kv_format, device, topk_override=hf_topk)
    assert _rel(got, want) < bound, _rel(got, want)
    # our own FP8 indexer picks (nearly) the same sets: a hard top-k flips only on near-ties
    b, t = x.shape[:2]
    ic = IndexKeyCache(8, 4, device=device)
    table = build_block_table([[5, 1, 6], [0, 7, 2]], device=device)
    pos = torch.arange(t, device=device)[None].expand(b, t)
    x_d = x.to(device)
    with torch.no_grad():  # the indexer alone, on the same inputs
        q_resid = _rms_norm(layer.q_a_proj(x_d), layer.q_a_layernorm, layer.eps)
        cos, sin = rope_cos_sin(pos, layer.cfg)
        slots = table.gather(1, (pos // 4).long()).long() * 4 + pos % 4
        ours = layer._indexer(x_d, q_resid, cos, sin, ic, 0, slots, table, pos).cpu()
        # the decode form (paged keys, no host sync) agrees with the prefill form
        last = layer._indexer(x_d[:, -2:], q_resid[:, -2:], cos[:, -2:], sin[:, -2:], ic, 0,
                              slots[:, -2:], table, pos[:, -2:]).cpu()
        assert torch.equal(last, ours[:, -2:])
    agree = total = 0
    for r in range(b):
        for i in range(t):
            ref = {int(p) for p in hf_topk[r, i] if p <= i}
            mine = {int(p) for p in ours[r, i] if p >= 0}
            agree += len(ref & mine)
            total += len(ref)
    assert agree / total >= 0.9, f"indexer set overlap {agree}/{total}"


def test_bad_state_dict_names_each_key():
    cfg, attn = _hf(index_topk=8)
    layer = DSAAttention(from_hf_config(cfg.to_dict()), dtype=torch.float32)
    sd = attn.state_dict()
    del sd["o_proj.weight"]
    sd["extra.weight"] = torch.zeros(1)
    sd["q_b_proj.weight"] = torch.zeros(3, 3)
    with pytest.raises(ValueError, match=r"missing o_proj.weight; unexpected extra.weight; "
                                         r"q_b_proj.weight: expected shape \[192, 64\], got \[3, 3\]"):
        layer.load_hf_state_dict(sd)


def test_shared_step_inputs_and_reloaded_weights(device):
    """A step's StepInputs shared across layers gives the per-layer result bit for bit, a
    mismatched one is refused, and weights loaded after a forward are the ones used (the fused
    projection weight is rebuilt, not stale)."""
    cfg, attn = _hf(index_topk=8)
    mcfg = from_hf_config(cfg.to_dict())
    layer = DSAAttention.from_hf(attn, mcfg, rms_norm_eps=cfg.rms_norm_eps, dtype=torch.float32,
                                 device=device)
    x = torch.randn(2, PREFILL + DECODE, 128)
    kv = PagedKVCache(8, 4, "bf16", device=device)
    ic = IndexKeyCache(8, 4, device=device)
    table = build_block_table([[5, 1, 6], [0, 7, 2]], device=device)
    pos = torch.arange(PREFILL, device=device)[None].expand(2, PREFILL)
    with torch.no_grad():
        plain = layer(x[:, :PREFILL].to(device), pos, kv, ic, 0, table)
        step = layer.step_inputs(pos, table, kv.page_size)
        shared = layer(x[:, :PREFILL].to(device), pos, kv, ic, 0, table, step=step)
        assert torch.equal(plain, shared)
        with pytest.raises(ValueError, match="step: expected the StepInputs"):
            layer(x[:, :PREFILL].to(device), pos.clone(), kv, ic, 0, table, step=step)
    _, other = _hf(index_topk=8, seed=1)
    layer.load_hf_state_dict(other.state_dict())  # written in place
    wk = torch.randn_like(other.indexer.wk.weight)
    layer.wk.weight = torch.nn.Parameter(wk.to(device))  # replaced
    with torch.no_grad():
        other.indexer.wk.weight.copy_(wk)
    fresh = DSAAttention.from_hf(other, mcfg, rms_norm_eps=cfg.rms_norm_eps,
                                 dtype=torch.float32, device=device)
    reloaded = _run_ours(layer, x, "bf16", device)
    assert torch.equal(reloaded, _run_ours(fresh, x, "bf16", device))
    assert not torch.allclose(reloaded[:, :PREFILL], plain.cpu())  # the new weights are used


def test_fused_weights_refresh_and_mixed_dtypes(device):
    """Writes through .data are invisible to PyTorch's versions: refresh_weights rebuilds the
    fused / absorbed weights. Projections of mixed dtypes are not stacked (no silent upcast)."""
    cfg, attn = _hf(index_topk=8)
    mcfg = from_hf_config(cfg.to_dict())
    kw = dict(rms_norm_eps=cfg.rms_norm_eps, dtype=torch.float32, device=device)
    layer = DSAAttention.from_hf(attn, mcfg, **kw)
    x = torch.randn(2, PREFILL, 128)

    def prefill(lay):
        kv, ic = PagedKVCache(8, 4, "bf16", device=device), IndexKeyCache(8, 4, device=device)
        table = build_block_table([[5, 1, 6], [0, 7, 2]], device=device)
        pos = torch.arange(PREFILL, device=device)[None].expand(2, PREFILL)
        with torch.no_grad():
            return lay(x.to(device), pos, kv, ic, 0, table).cpu()

    prefill(layer)  # builds the fused weights
    layer.q_b_proj.weight.data.mul_(2.0)
    layer.refresh_weights()
    with torch.no_grad():
        attn.q_b_proj.weight.mul_(2.0)
    assert torch.equal(prefill(layer), prefill(DSAAttention.from_hf(attn, mcfg, **kw)))
    layer.weights_proj.double()  # one projection in another dtype: PyTorch's own error,
    with pytest.raises(RuntimeError, match="dtype"):  # not a silently upcast stack
        prefill(layer)
    assert layer.q_a_proj.weight.dtype == torch.float32


def test_step_inputs_bad_input(device):
    cfg, attn = _hf(index_topk=8)
    layer = DSAAttention(from_hf_config(cfg.to_dict()), dtype=torch.float32, device=device)
    pos = torch.zeros(2, 1, dtype=torch.int64, device=device)
    table = torch.zeros(2, 3, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="page_size"):
        layer.step_inputs(pos, table, 3)
    with pytest.raises(ValueError, match="block_table"):
        layer.step_inputs(pos, table[:1], 4)


def test_mtp_step_of_requests_at_different_lengths(device):
    """An S = 2 decode step of two requests at different positions: the indexer's decode form
    (paged keys, each request's length from `StepInputs`) gives each request its own window —
    the same logits top-k as the prefill form over each request alone (before session 44 the
    second request read the first's length: a strided view the kernel read with unit
    stride)."""
    cfg, attn = _hf(index_topk=4, seed=2)
    layer = DSAAttention.from_hf(attn, from_hf_config(cfg.to_dict()),
                                 rms_norm_eps=cfg.rms_norm_eps, dtype=torch.float32,
                                 device=device)
    ic = IndexKeyCache(8, 4, device=device)
    table = build_block_table([[5, 1, 6], [0, 7, 2]], device=device)
    x = torch.randn(2, 11, 128, device=device)
    ends = (7, 11)  # request 0 holds 7 tokens after the step, request 1 holds 11
    with torch.no_grad():
        q_resid = _rms_norm(layer.q_a_proj(x), layer.q_a_layernorm, layer.eps)
        alone = []
        for r, n in enumerate(ends):  # the prefill form, one request at a time: all its tokens
            pos = torch.arange(n, device=device)[None]
            cos, sin = rope_cos_sin(pos, layer.cfg)
            slots = table[r:r + 1].gather(1, pos // 4).long() * 4 + pos % 4
            alone.append(layer._indexer(x[r:r + 1, :n], q_resid[r:r + 1, :n], cos, sin, ic, 0,
                                        slots, table[r:r + 1], pos).cpu()[0, -2:])
        pos = torch.tensor([[5, 6], [9, 10]], device=device)  # the last two tokens of each
        step = layer.step_inputs(pos, table, 4)
        assert step.lengths.tolist() == [7, 11] and step.lengths.stride() == (1,)
        cos, sin = rope_cos_sin(pos, layer.cfg)
        rows = torch.stack([x[0, 5:7], x[1, 9:11]])
        q_rows = torch.stack([q_resid[0, 5:7], q_resid[1, 9:11]])
        both = layer._indexer(rows, q_rows, cos, sin, ic, 0, step.slots, table, pos,
                              step=step).cpu()
    assert torch.equal(both[0], alone[0]) and torch.equal(both[1], alone[1])


def test_forward_bad_input_names_the_argument(device):
    cfg, attn = _hf(index_topk=8)
    layer = DSAAttention.from_hf(attn, from_hf_config(cfg.to_dict()), dtype=torch.float32,
                                 device=device)
    kv = PagedKVCache(4, 4, "bf16", device=device)
    ic = IndexKeyCache(4, 4, device=device)
    table = build_block_table([[0, 1]], device=device)
    x = torch.randn(1, 2, 128, device=device)
    pos = torch.arange(2, device=device)[None]
    with pytest.raises(ValueError, match=r"hidden: expected shape \[\*, \*, 128\], got \[1, 2, 64\]"):
        layer(x[..., :64], pos, kv, ic, 0, table)
    with pytest.raises(ValueError, match=r"positions: expected shape \[1, 2\], got \[1, 3\]"):
        layer(x, torch.arange(3, device=device)[None], kv, ic, 0, table)
    with pytest.raises(TypeError, match=r"block_table: expected dtype int32, got int64"):
        layer(x, pos, kv, ic, 0, table.long())
    with pytest.raises(ValueError, match=r"positions: expected values in \[0, 8\) .*got 8"):
        layer(x, pos + 7, kv, ic, 0, table)  # past the table's two pages of 4
    with torch.no_grad():  # a 4-token prefill, then a decode step (its token on page 1)
        layer(torch.randn(1, 4, 128, device=device), torch.arange(4, device=device)[None], kv,
              ic, 0, table)
    bad = table.clone()  # whose old context's page is outside the pool: refused, never read
    bad[0, 0] = 10**7
    with pytest.raises(ValueError, match=r"block_table: a page within context_lens"), \
            torch.no_grad():
        layer(x[:, :1], torch.tensor([[4]], device=device), kv, ic, 0, bad)


YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "mscale": 1.0,
        "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "beta_fast": 32,
        "beta_slow": 1}


@pytest.mark.parametrize("kv_format,bound,rope,chunk_entries,mode", [
    ("bf16", 1e-2, {"rope_type": "default", "rope_theta": 10000.0}, None, "native"),
    ("fp8", 4e-2, {"rope_type": "default", "rope_theta": 10000.0}, 3, "native"),
    ("bf16", 1e-2, YARN, None, "native"),
    ("fp8", 4e-2, {"rope_type": "default", "rope_theta": 10000.0}, None, "gather_cast"),
])
def test_deepseek_v3_dense_mla_matches_transformers(device, monkeypatch, kv_format, bound, rope,
                                                    chunk_entries, mode):
    """Dense MLA through the layer: the prefill on `fp8mla.prefill.dense_prefill` (in chunks of
    one group of tokens where ``chunk_entries`` says: a block-table row a chunk), decode steps
    on the paged decode kernel (fp8mla's `DecodePlan`, planned once for the block table's
    span); the cast baseline (``mode`` gather_cast) attends every step's query rows to index
    lists of their visible tokens (`fp8mla.prefill.visible_slots`)."""
    import fp8mla.prefill as prefill_mod
    from fp8mla import layer as layer_mod

    if chunk_entries is not None:
        monkeypatch.setattr(prefill_mod, "CHUNK_ENTRIES", chunk_entries)
    decode_runs, prefills, chunks, listed = [], [], [], []
    plan_fn, prefill_fn, chunks_fn, slots_fn = (layer_mod._decode_plan, layer_mod.dense_prefill,
                                                prefill_mod.row_chunks, layer_mod.visible_slots)

    def decode_plan(*args):
        plan = plan_fn(*args)
        decode_runs.append(plan)
        return plan

    monkeypatch.setattr(layer_mod, "_decode_plan", decode_plan)
    monkeypatch.setattr(layer_mod, "dense_prefill",
                        lambda q, *a, **k: prefills.append(q.shape[1]) or prefill_fn(q, *a, **k))
    monkeypatch.setattr(prefill_mod, "row_chunks",
                        lambda *a, **k: chunks.append(chunks_fn(*a, **k)) or chunks[-1])
    monkeypatch.setattr(layer_mod, "visible_slots",
                        lambda *a: listed.append(len(a[1])) or slots_fn(*a))
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
        DeepseekV3Attention,
        DeepseekV3RotaryEmbedding,
    )

    cfg = DeepseekV3Config(hidden_size=128, num_attention_heads=3, num_key_value_heads=3,
                           q_lora_rank=64, kv_lora_rank=512, qk_nope_head_dim=32,
                           qk_rope_head_dim=64, v_head_dim=32, num_hidden_layers=1,
                           max_position_embeddings=163840, rope_parameters=dict(rope))
    cfg._attn_implementation = "eager"
    torch.manual_seed(3)
    attn = DeepseekV3Attention(cfg, layer_idx=0).float().eval()
    with torch.no_grad():
        for name, p in attn.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    x = torch.randn(2, PREFILL + DECODE, 128)
    b, t, _ = x.shape
    pos = torch.arange(t)[None].expand(b, t)
    cos, sin = DeepseekV3RotaryEmbedding(cfg)(x, pos)
    mask = torch.full((t, t), torch.finfo(torch.float32).min).triu(1)[None, None].expand(b, 1, t, t)
    with torch.no_grad():
        want = attn(x, (cos, sin), mask.contiguous(), position_ids=pos)[0]
    ours = from_hf_config(cfg.to_dict())
    assert not ours.is_sparse
    layer = DSAAttention.from_hf(attn, ours, rms_norm_eps=cfg.rms_norm_eps, dtype=torch.float32,
                                 device=device)
    layer.attn_mode = mode
    got = _run_ours(layer, x, kv_format, device)
    assert _rel(got, want) < bound, _rel(got, want)
    if mode != "native":  # every step's rows over lists (the prefill's in one chunk)
        assert listed == [b * PREFILL] + [b] * DECODE and not prefills and not decode_runs
        return
    assert len(decode_runs) == DECODE and len(set(map(id, decode_runs))) == 1  # one plan
    assert prefills == [PREFILL] and not listed
    groups = b * -(-PREFILL // prefill_mod.GROUP)  # the prefill's decode requests
    assert len(chunks) == 1 and len(chunks[0]) == (1 if chunk_entries is None else groups)


def test_yarn_rope_matches_transformers():
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding

    cfg = DeepseekV3Config(hidden_size=128, num_attention_heads=2, q_lora_rank=64,
                           kv_lora_rank=512, qk_nope_head_dim=32, qk_rope_head_dim=64,
                           v_head_dim=32, num_hidden_layers=1, max_position_embeddings=163840,
                           rope_parameters=dict(YARN))
    pos = torch.tensor([[0, 1, 77, 5000, 100000]])
    cos, sin = DeepseekV3RotaryEmbedding(cfg)(torch.zeros(1, 5, 128), pos)
    ours = from_hf_config(cfg.to_dict())
    assert ours.yarn_factor == 40.0 and ours.yarn_rope_mscale == 1.0
    c, s = rope_cos_sin(pos, ours)
    assert torch.allclose(c, cos[..., :32], atol=1e-4) and torch.allclose(s, sin[..., :32], atol=1e-4)


def test_deepseek_v32_layer_and_indexer_match_transformers(device):
    from transformers import DeepseekV32Config
    from transformers.models.deepseek_v32.modeling_deepseek_v32 import (
        DeepseekV32Attention,
        DeepseekV32RotaryEmbedding,
    )

    def make(topk):
        cfg = DeepseekV32Config(hidden_size=128, num_attention_heads=2, num_key_value_heads=2,
                                q_lora_rank=64, kv_lora_rank=512, qk_nope_head_dim=32,
                                qk_rope_head_dim=64, v_head_dim=32, index_n_heads=4,
                                index_head_dim=128, index_topk=topk, num_hidden_layers=1,
                                max_position_embeddings=163840, rope_parameters=dict(YARN))
        cfg._attn_implementation = "eager"
        torch.manual_seed(5)
        return cfg, DeepseekV32Attention(cfg, layer_idx=0).float().eval()

    x = torch.randn(2, PREFILL + DECODE, 128)
    b, t, _ = x.shape
    pos = torch.arange(t)[None].expand(b, t)
    mask = torch.full((t, t), torch.finfo(torch.float32).min).triu(1)[None, None].expand(b, 1, t, t)
    cfg, attn = make(64)  # top-k covers the context: the layer output must match
    cos, sin = DeepseekV32RotaryEmbedding(cfg)(x, pos)
    with torch.no_grad():
        want = attn(x, (cos, sin), mask.contiguous(), position_ids=pos)[0]
    ours = from_hf_config(cfg.to_dict())
    assert ours.indexer_hadamard and not ours.indexer_rope_interleave
    layer = DSAAttention.from_hf(attn, ours, rms_norm_eps=cfg.rms_norm_eps, dtype=torch.float32,
                                 device=device)
    got = _run_ours(layer, x, "fp8_ds_mla", device)
    assert _rel(got, want) < 4e-2, _rel(got, want)
    # top-k below the context: our FP8 indexer (Hadamard, half-split RoPE) picks transformers' sets
    cfg, attn = make(4)
    with torch.no_grad():
        q_resid = attn.q_a_layernorm(attn.q_a_proj(x))
        ref = attn.indexer(x, q_resid, (cos, sin), mask[:, 0].contiguous(), pos)
    layer = DSAAttention.from_hf(attn, from_hf_config(cfg.to_dict()),
                                 rms_norm_eps=cfg.rms_norm_eps, dtype=torch.float32,
                                 device=device)
    ic = IndexKeyCache(8, 4, device=device)
    table = build_block_table([[5, 1, 6], [0, 7, 2]], device=device)
    x_d, pos_d = x.to(device), pos.to(device)
    with torch.no_grad():
        qr = _rms_norm(layer.q_a_proj(x_d), layer.q_a_layernorm, layer.eps)
        c, s = rope_cos_sin(pos_d, layer.cfg)
        slots = table.gather(1, (pos_d // 4).long()).long() * 4 + pos_d % 4
        mine = layer._indexer(x_d, qr, c, s, ic, 0, slots, table, pos_d).cpu()
    agree = total = 0
    for r in range(b):
        for i in range(t):
            want_set = {int(p) for p in ref[r, i] if p <= i}
            agree += len(want_set & {int(p) for p in mine[r, i] if p >= 0})
            total += len(want_set)
    assert agree / total >= 0.9, f"indexer set overlap {agree}/{total}"


@pytest.mark.parametrize("interleave", [True, False])
@pytest.mark.parametrize("heads,dim", [(1, 64), (3, 64), (5, 128)])
def test_fused_rope_matches_the_torch_form(device, interleave, heads, dim):
    """rope_rows (one kernel: rope dims first, the rest copied) equals apply_rope + cat, on a
    strided slice as the layer passes it."""
    from fp8mla.layer import apply_rope, rope_rows

    g = torch.Generator().manual_seed(heads * dim + interleave)
    wide = torch.randn(2, 3, heads, dim + 32, generator=g).bfloat16().to(device)
    x = wide[..., 32:]  # last dim contiguous, rows strided
    pos = torch.tensor([[0, 5, 900], [7, 8, 70000]], device=device)
    cos, sin = rope_cos_sin(pos, preset("glm5"))
    got = rope_rows(x, cos, sin, interleave)
    want = torch.cat([apply_rope(x[..., :64].float(), cos, sin, interleave),
                      x[..., 64:].float()], dim=-1)
    assert got.dtype == torch.float32 and got.shape == x.shape
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)
    # bf16 out: the float32 result rounded to nearest even (ties and all), as .to() rounds
    as_bf16 = rope_rows(x, cos, sin, interleave, out_dtype=torch.bfloat16)
    assert as_bf16.dtype == torch.bfloat16
    mismatched = (as_bf16 != got.to(torch.bfloat16)).float().mean().item()
    assert mismatched < 1e-3, mismatched  # an ulp where float32 sums differ in the last bit
    with pytest.raises(ValueError, match="out_dtype"):
        rope_rows(x, cos, sin, interleave, out_dtype=torch.float16)


def test_fused_rope_bf16_keeps_nan(device):
    """A NaN with the GPU's canonical payload (0x7FFFFFFF) must not round into −0.0."""
    from fp8mla.layer import rope_rows

    x = torch.randn(1, 1, 2, 128)
    x.view(torch.int32)[0, 0, 0, 3] = 0x7FFFFFFF  # a rope dim
    x.view(torch.int32)[0, 0, 1, 100] = 0x7FFFFFFF  # a copied dim
    cos, sin = rope_cos_sin(torch.tensor([[3]]), preset("glm5"))
    got = rope_rows(x.to(device), cos.to(device), sin.to(device), True,
                    out_dtype=torch.bfloat16).cpu()
    assert got[0, 0, 1, 100].isnan()
    assert got[0, 0, 0].isnan().any()
    assert not got[0, 0, 1, :64].isnan().any()


@pytest.mark.parametrize("n", [128, 512, 1536])  # 1536: DeepSeek's q_lora_rank, not a power of 2
def test_fused_rms_norm_matches_transformers_form(device, n):
    from fp8mla.layer import rms_norm

    g = torch.Generator().manual_seed(n)
    x = (torch.randn(3, 5, n + 64, generator=g) * 3).bfloat16().to(device)[..., 64:]
    w = (1 + 0.1 * torch.randn(n, generator=g)).bfloat16().to(device)
    got, want = rms_norm(x, w, 1e-6), _rms_norm(x, w, 1e-6)
    assert got.dtype == torch.bfloat16 and got.shape == x.shape
    # the same roundings; only the fp32 sum's order differs: at most one bf16 ulp apart
    torch.testing.assert_close(got.float(), want.float(), rtol=8e-3, atol=0)


def test_fused_row_quantization_matches_torch(device):
    from fp8mla.layer import quantize_rows_e4m3

    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 7, 128, generator=g) * torch.rand(2, 3, 7, 1, generator=g) * 40
    x[0, 0, 0] = 0.0  # amax floored at 1e-4
    q8, scale = quantize_rows_e4m3(x.to(device))
    want_scale = x.abs().amax(-1).clamp_min(1e-4) / 448.0
    torch.testing.assert_close(scale.cpu(), want_scale, rtol=0, atol=0)
    want = (x / want_scale[..., None]).to(torch.float8_e4m3fn)
    assert torch.equal(q8.cpu().view(torch.uint8), want.view(torch.uint8))


def test_fused_row_helpers_reject_bad_input(device):
    from fp8mla.layer import quantize_rows_e4m3, rms_norm, rope_rows

    x = torch.randn(3, 128, device=device)  # rms_norm reads rows and weight with unit stride
    with pytest.raises(ValueError, match=r"x: expected a contiguous last dimension"):
        rms_norm(x.t().contiguous().t(), torch.ones(3, device=device), 1e-6)
    with pytest.raises(ValueError, match=r"weight: expected a contiguous last dimension"):
        rms_norm(x, torch.ones(256, device=device)[::2], 1e-6)
    with pytest.raises(ValueError, match=r"weight: expected shape \[128\], got \[64\]"):
        rms_norm(x, torch.ones(64, device=device), 1e-6)

    cos = sin = torch.zeros(2, 32, device=device)
    with pytest.raises(ValueError, match=r"x: expected \[\.\.\., n, 64\] or \[\.\.\., n, 128\], got"):
        rope_rows(torch.zeros(2, 1, 96, device=device), cos, sin, True)
    with pytest.raises(ValueError, match=r"cos: expected shape \[2, 32\], got \[3, 32\]"):
        rope_rows(torch.zeros(2, 1, 64, device=device), torch.zeros(3, 32, device=device), sin,
                  True)
    with pytest.raises(ValueError, match=r"x: expected a power-of-two last dimension"):
        quantize_rows_e4m3(torch.zeros(4, 96, device=device))


def test_plans_used_in_a_graph_capture_are_kept(monkeypatch):
    """The layer's shared plans keep the last KEEP shapes, but never drop one fetched while a
    CUDA graph was being captured: its replays write into that plan's buffers."""
    from fp8mla._plans import PlanCache

    plans, capturing = PlanCache(), [False]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    capturing[0] = True
    captured = plans.get(("graph",), object)
    capturing[0] = False
    first = plans.get(("eager", 0), object)
    for i in range(1, 2 * PlanCache.KEEP):
        plans.get(("eager", i), object)
    assert plans.get(("graph",), object) is captured  # kept, the same buffers
    assert plans.get(("eager", 0), object) is not first  # dropped, built again
    assert len(plans.plans) == PlanCache.KEEP
