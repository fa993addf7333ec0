"""What differs between the Tritons fp8mla runs on (3.6–3.9): the decode kernel's config fitted
to the GPU's shared memory (`fp8mla.runtime.fit_shared`: a Triton that stages more through
shared memory than the configs were sized for — triton 3.8, ~1.9× on the fp8 tiles — gets fewer
stages or smaller tiles, never a launch that fails), and the oldest Triton accepted."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch

import fp8mla.decode as decode_mod
from fp8mla import reference
from fp8mla.decode import DecodePlan
from fp8mla.runtime import (
    DecodeConfig,
    Target,
    block_shared_limit,
    decode_config,
    fit_shared,
    smaller_configs,
)
from fp8mla.testing import assert_close
from helpers import paged_cache


def _shared(cfg, tma):
    """A stand-in compile's shared memory: a ring of [block_n, 576] bytes a stage, plus a
    staged operand the size of one stage."""
    stages = cfg.tma_stages if tma else cfg.num_stages
    return SimpleNamespace(metadata=SimpleNamespace(shared=cfg.block_n * 576 * (stages + 1)))


def test_block_shared_limits():
    assert [block_shared_limit(cc) for cc in (80, 89, 90, 100, 120)] == [
        163 * 1024, 99 * 1024, 227 * 1024, 227 * 1024, 99 * 1024]


@pytest.mark.parametrize("tma", [False, True])
def test_smaller_configs_order(tma):
    """The config itself first; its stages down to 2 before the tile halves; each halved tile
    back at the stages it had; 16 tokens and 2 stages last; only the stages that matter vary."""
    cfg = DecodeConfig(block_n=64, heads_per_block=8, num_warps=4, num_stages=3, tma=tma,
                       tma_stages=3, lookahead=2)
    seen = list(smaller_configs(cfg, tma))
    assert seen[0] == cfg
    key = "tma_stages" if tma else "num_stages"
    other = "num_stages" if tma else "tma_stages"
    assert [(c.block_n, getattr(c, key)) for c in seen] == [
        (64, 3), (64, 2), (32, 3), (32, 2), (16, 3), (16, 2)]
    assert all(getattr(c, other) == 3 for c in seen)
    # carrying slots two tiles ahead is kept only at the stages it was chosen for
    assert [c.lookahead for c in seen] == ([2] * 6 if tma else [2, 1, 2, 1, 2, 1])
    assert all(dataclasses.replace(c, block_n=64, num_stages=3, tma_stages=3, lookahead=2) == cfg
               for c in seen)


def test_fit_shared_takes_the_first_that_fits():
    cfg = DecodeConfig(block_n=64, heads_per_block=8, num_warps=4, num_stages=3)
    calls = []

    def compile_fn(c):
        calls.append(c)
        return _shared(c, False)

    assert fit_shared(cfg, False, compile_fn, 10**6)[0] == cfg and calls == [cfg]  # one compile
    calls.clear()
    fitted, kernel = fit_shared(cfg, False, compile_fn, 64 * 576 * 3)  # 4 stages' worth: no
    assert (fitted.block_n, fitted.num_stages) == (64, 2)
    assert kernel.metadata.shared == 64 * 576 * 3 and len(calls) == 2
    fitted, _ = fit_shared(cfg, False, compile_fn, 64 * 576 * 2)
    assert (fitted.block_n, fitted.num_stages) == (32, 3)


def test_fit_shared_steps_past_a_spilling_config():
    """Past the tuned config, the first smaller one that fits without spilling (triton 3.8's
    32-row fp8 config at 2 stages spills; half its tile at 3 does not); the tuned config kept
    where it fits, spilling or not; where every one that fits spills, or spills are not known,
    the first that fits."""
    cfg = DecodeConfig(block_n=64, heads_per_block=8, num_warps=4, num_stages=3)
    limit = 64 * 576 * 3  # (64, 3) does not fit, (64, 2) and smaller do

    def fit(spilling, known=True, limit=limit):
        def compile_fn(c):
            kernel = _shared(c, False)
            kernel.spills = (c.block_n, c.num_stages) in spilling
            return kernel

        spills = (lambda k: k.spills) if known else (lambda k: None)
        fitted, kernel = fit_shared(cfg, False, compile_fn, limit, spills=spills)
        assert kernel.metadata.shared == _shared(fitted, False).metadata.shared
        return fitted.block_n, fitted.num_stages

    assert fit({(64, 2)}) == (32, 3)
    assert fit({(64, 2), (32, 3)}) == (32, 2)
    assert fit({(64, 2)}, known=False) == (64, 2)
    assert fit({(n, st) for n in (64, 32, 16) for st in (3, 2)}) == (64, 2)
    assert fit({(64, 3)}, limit=10**6) == (64, 3)  # tuned, fits: kept though it spills
    assert fit_shared(cfg, False, lambda c: _shared(c, False), limit)[0].num_stages == 2


def test_fit_shared_refuses_what_cannot_fit():
    cfg = DecodeConfig(block_n=32, heads_per_block=8, num_warps=4, num_stages=2)
    with pytest.raises(ValueError, match=r"even the smallest configuration: its compile needs "
                                         r"27648 B of shared memory, this GPU allows 1000 B"):
        fit_shared(cfg, False, lambda c: _shared(c, False), 1000)
    # a config asked for by name is never changed: kept, or refused naming it
    with pytest.raises(ValueError, match=r"^config: its compile needs 55296 B .* allows 50000 B"):
        fit_shared(cfg, False, lambda c: _shared(c, False), 50000, fixed=True)
    assert fit_shared(cfg, False, lambda c: _shared(c, False), 60000, fixed=True)[0] == cfg


class _FakeKernel:
    """Stands in for `_mla_decode_kernel` on the CPU: ``warmup`` records each compile's tile
    and stages and answers with a shared-memory size from them, and spills (words a thread)
    from ``spills`` by (tile, stages) (nothing compiles)."""

    def __init__(self, spills=None):
        self.compiled, self.spills = [], spills or {}

    def warmup(self, *args, grid, **meta):
        key = (meta["BLOCK_N"], meta["num_stages"])
        self.compiled.append((*key, meta["TMA"]))
        n = meta["BLOCK_N"] * 576 * (meta["num_stages"] + 1)
        return SimpleNamespace(metadata=SimpleNamespace(shared=n), n_regs=128,
                               n_spills=self.spills.get(key, 0), _init_handles=lambda: None)


@pytest.mark.parametrize("cc,given", [(120, False), (120, True), (90, False)])
def test_plan_fits_its_config_to_the_target(monkeypatch, cc, given):
    """A plan compiles each candidate config as it would launch it (its tile and stages reach
    the kernel's compile) and keeps the first that fits the target; a config passed to it is
    kept where it fits and refused where it does not."""
    fake = _FakeKernel()
    monkeypatch.setattr(decode_mod, "_mla_decode_kernel", fake)
    monkeypatch.setattr(decode_mod, "target_for", lambda device: Target(cc=cc, num_sms=8))
    monkeypatch.setattr(DecodePlan, "_mma8_schedule", lambda self, *a: None)
    monkeypatch.setattr(DecodePlan, "_sm90_serves", lambda self: False)
    cfg = DecodeConfig(block_n=64, heads_per_block=8, num_warps=4, num_stages=3)
    kw = dict(batch=2, num_heads=8, kv_format="fp8", page_size=16, max_seqlen=1000,
              device="cpu", config=cfg if given else None)
    if given and cc == 120:  # 64 tokens × 4 stages' worth > 99 KB
        with pytest.raises(ValueError, match=r"^config: its compile needs 147456 B"):
            DecodePlan(**kw)
        return
    plan = DecodePlan(**kw)
    limit = block_shared_limit(cc)
    assert fake.compiled[-1] == (plan.config.block_n, plan.config.num_stages, False)
    assert plan.config.block_n * 576 * (plan.config.num_stages + 1) <= limit
    if given:
        assert plan.config == cfg and len(fake.compiled) == 1
    elif cc == 120:  # the fp8 8-head config: 64 tokens, 2 stages = 110592 B; 32 tokens fit
        assert (plan.config.block_n, plan.config.num_stages) == (32, 2)
        assert fake.compiled == [(64, 2, False), (32, 2, False)]
    else:
        assert plan.config == decode_config(90, "fp8", 8, 1) and len(fake.compiled) == 1
    assert plan._descs == (None, None)  # the stand-in pool's descriptors are not kept


def test_plan_steps_past_a_spilling_config(monkeypatch):
    """The plan reads each step-down's spills from its loaded binary (Triton's ``n_spills``) and
    steps past one that holds more than `SPILL_WORDS` words a thread in local memory."""
    fake = _FakeKernel(spills={(32, 2): decode_mod.SPILL_WORDS + 1})
    monkeypatch.setattr(decode_mod, "_mla_decode_kernel", fake)
    monkeypatch.setattr(decode_mod, "target_for", lambda device: Target(cc=120, num_sms=8))
    monkeypatch.setattr(DecodePlan, "_mma8_schedule", lambda self, *a: None)
    monkeypatch.setattr(DecodePlan, "_sm90_serves", lambda self: False)
    plan = DecodePlan(batch=2, num_heads=8, kv_format="fp8", page_size=16, max_seqlen=1000,
                      device="cpu")
    assert fake.compiled == [(64, 2, False), (32, 2, False), (16, 2, False)]
    assert (plan.config.block_n, plan.config.num_stages) == (16, 2)
    assert plan.compiled_resources == (128, 16 * 576 * 3)
    fake.spills = {(32, 2): decode_mod.SPILL_WORDS}  # within the tolerance: not a spill
    plan = DecodePlan(batch=2, num_heads=8, kv_format="fp8", page_size=16, max_seqlen=1000,
                      device="cpu")
    assert (plan.config.block_n, plan.config.num_stages) == (32, 2)


# configs a plan steps down to (tests/portability_compile.py's rows, "fitted"): each must
# still compute the same attention
STEPPED = [
    ("fp8", 8, 1, dict(block_n=32)),  # triton 3.8, sm_89 / sm_120: 143 → 79 KB
    ("fp8", 16, 2, dict(block_n=64)),  # triton 3.8, sm_90's 32-row programs: 284 → 160 KB
    ("fp8", 16, 2, dict(num_stages=2)),  # the same at 2 stages: fits 212 KB, but spills
    ("fp8_ds_mla", 8, 1, dict(block_n=32, num_stages=2)),  # two steps down; none needs it yet
]


@pytest.mark.parametrize("fmt,heads,s_q,change", STEPPED)
def test_stepped_down_configs_match_reference(device, fmt, heads, s_q, change):
    major, minor = torch.cuda.get_device_capability() if device == "cuda" else (9, 0)
    cc = major * 10 + minor
    cfg = dataclasses.replace(decode_config(cc, fmt, heads, s_q), **change)
    lens = [150, 33, 0]
    cache, table, seqlens = paged_cache(fmt, lens, 64, device=device, seed=heads * 7 + s_q,
                                        policy="pow2" if fmt == "fp8_ds_mla" else None)
    g = torch.Generator().manual_seed(heads)
    q = torch.randn(len(lens), s_q, heads, 576, generator=g).bfloat16().to(device)
    plan = DecodePlan(batch=len(lens), num_heads=heads, s_q=s_q, kv_format=cache.fmt,
                      page_size=64, cache_seqlens=seqlens, device=device, config=cfg,
                      num_splits=2)
    assert plan.config == cfg and plan.kernel == "triton"
    out, lse = plan.run(q, cache.layer(0), table, seqlens, fp8_scale=cache.scale(0))
    ro, rl = reference.dense_mla_decode(q, cache.dequantize(0), table, seqlens, 576 ** -0.5)
    assert_close(out, ro, name="out")
    assert_close(lse, rl, atol=1e-3, rtol=1e-3, name="lse")


@pytest.mark.gpu
def test_plan_steps_down_on_a_gpu_and_matches_reference(monkeypatch):
    """On the GPU: with the shared-memory limit set below what this Triton's compile of the
    launcher's config needs, the plan compiles a smaller one, launches it, and matches the
    reference (what a Triton that stages more than 3.6 / 3.9 meets on a real target)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    monkeypatch.setattr(DecodePlan, "_mma8_schedule", lambda self, *a: None)
    monkeypatch.setattr(DecodePlan, "_sm90_serves", lambda self: False)
    lens = [3000, 65, 0]
    cache, table, seqlens = paged_cache("fp8", lens, 64, device="cuda", seed=3)
    q = torch.randn(len(lens), 1, 8, 576, generator=torch.Generator().manual_seed(4))
    q = q.bfloat16().cuda()
    kw = dict(batch=len(lens), num_heads=8, kv_format=cache.fmt, page_size=64,
              cache_seqlens=seqlens, device="cuda")
    fits = []  # (config, shared bytes) of each plan's fitted compile

    def recording(*args, **kwargs):
        cfg, kernel = fit_shared(*args, **kwargs)
        fits.append((cfg, kernel.metadata.shared))
        return cfg, kernel

    monkeypatch.setattr(decode_mod, "fit_shared", recording)
    full = DecodePlan(**kw)
    need = fits[-1][1]
    # the limit Triton's launcher enforces on this GPU (227 KB on an H100 / H200)
    assert full._shared_limit() >= need and full._shared_limit() >= 99 * 1024
    monkeypatch.setattr(DecodePlan, "_shared_limit", lambda self: need - 1)
    plan = DecodePlan(**kw)
    assert plan.config != full.config and fits[-1] == (plan.config, fits[-1][1])
    assert fits[-1][1] < need
    out, lse = plan.run(q, cache.layer(0), table, seqlens, fp8_scale=cache.scale(0))
    ro, rl = reference.dense_mla_decode(q, cache.dequantize(0), table, seqlens, 576 ** -0.5)
    assert_close(out, ro, name="out")
    assert_close(lse, rl, atol=1e-3, rtol=1e-3, name="lse")


def test_require_triton_names_the_version():
    from fp8mla.kernels import require_triton

    for ok in ("3.6.0", "3.9.0", "3.10.1+git8d2e4b1", "4.0.0"):
        require_triton(ok)
    for old in ("3.5.1", "3.4.0", "2.3.1", "nightly"):
        with pytest.raises(ImportError, match=rf"fp8mla needs triton >= 3\.6 .*found triton {old}"):
            require_triton(old)
