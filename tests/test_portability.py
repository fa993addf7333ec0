"""Every kernel compiles for SM80, SM86, SM89, SM90, SM100 and SM120 (with
FP8MLA_COMPILE_TARGETS: the capabilities listed there) with the configuration its launcher picks
there and fits that target's shared memory (docs/DESIGN.md §7); FP8 decoding uses the hardware
e4m3 conversion exactly where it exists (SM89+) and the software path on SM80 and SM86.
Runs on the CPU: Triton compiles for any target without the GPU."""

import pytest

import portability_compile as pc
from fp8mla.decode import PDL_SIGNAL, combine_warps
from fp8mla.kernels import decode_sm90
from fp8mla.runtime import decode_config
from helpers import COMPILE_TIMEOUT_S, portability_result, portability_rows

# Shared memory per block (opt-in maximum), bytes: docs/DESIGN.md §7 (SM87 as SM80, SM103 as
# SM100, SM121 as SM120; SM110's — SM101 before CUDA 13 — not known here: SM120's, the smallest)
SMEM_LIMIT = {80: 163 * 1024, 86: 99 * 1024, 87: 163 * 1024, 89: 99 * 1024, 90: 227 * 1024,
              100: 227 * 1024, 101: 99 * 1024, 103: 227 * 1024, 110: 99 * 1024, 120: 99 * 1024,
              121: 99 * 1024}


@pytest.fixture(scope="module")
def compiled(request):
    """The compile's JSON lines by (what, cc): the one compile of the test run, which conftest
    started at collection (in the first xdist worker, for all of them)."""
    proc = getattr(request.config, "portability_compile", None)
    rows = portability_rows(portability_result(), COMPILE_TIMEOUT_S, proc)
    return {(r["what"], r["cc"]): r for r in rows}


@pytest.fixture
def sm90(compiled):
    """The sm_90 compiles by name (skips where FP8MLA_COMPILE_TARGETS leaves sm_90 out)."""
    if pc.SM90_CC not in pc.TARGETS:
        pytest.skip("sm_90 is not among the compiled targets (FP8MLA_COMPILE_TARGETS)")
    return {what: row for (what, cc), row in compiled.items() if cc == pc.SM90_CC}


def _expected():
    for cc in pc.TARGETS:
        for fmt in pc.FORMAT_IDS:
            for heads, s_q in pc.DECODE_SHAPES:
                yield f"decode/{fmt}/H{heads}-sq{s_q}", cc
                yield f"decode/{fmt}/H{heads}-sq{s_q}-misaligned", cc
                if decode_config(cc, fmt, heads, s_q).tma and cc == pc.GATHER_CC:
                    yield f"decode/{fmt}/H{heads}-sq{s_q}-gather", cc
            for heads in pc.SPARSE_HEADS[cc == 90]:
                yield f"sparse/{fmt}/H{heads}", cc
            yield f"store/{fmt}", cc
        for what in ("combine/D512-bf16", "combine/D32-bf16", "combine/D16-bf16",
                     "combine/D512-fp32", "combine/D32-fp32", "combine/D16-fp32", "compact_indices",
                     "store/index_keys",
                     "indexer/Hi32",
                     "indexer/Hi64", "rope/fp32", "rope/bf16", "rms_norm", "quant_rows",
                     "topk/1024+0", "topk/4096+256", "topk/4096+1024", "topk/8192+0",
                     "topk_chunked/_topk_pass_kernel", "topk_chunked/_topk_sample_kernel",
                     "topk_chunked/_topk_compact_kernel",
                     "topk_chunked/_topk_finish_kernel/sampled0",
                     "topk_chunked/_topk_finish_kernel/sampled1"):
            yield what, cc
        if cc == pc.SM90_CC:
            for block_d, block_s in pc.COMBINE_STEPS:
                yield f"combine/D{block_d}-S{block_s}-bf16", cc
                yield f"combine/D{block_d}-S{block_s}-fp32", cc
            yield "combine/D512-S2-bf16-4warps", cc
            yield "combine/D16-S256-bf16-4warps", cc
        if cc == pc.SM90_CC:  # packed plans' Triton fallback (`SM90_PACKED`)
            yield "decode/fp8/H16-sq4-misaligned", cc
            yield "decode/fp8_ds_mla/H16-sq4-misaligned", cc
        if cc == pc.SM90_CC and decode_sm90.AVAILABLE:
            for what in ("decode_sm90/fp8/H128", "sparse_sm90/fp8_ds_mla/H128",
                         "decode_sm90/fp8/H128-acc-rows", "sparse_sm90/fp8_ds_mla/H128-acc-rows",
                         "paged_sm90/fp8_ds_mla/H128", "decode_sm90/fp8/H128-sq2",
                         "paged_sm90/fp8_ds_mla/H128-sq2", "paged_sm90/fp8/H128",
                         "sparse_sm90/fp8/H128", "decode_sm90/fp8/H16-sq4-packed",
                         "paged_sm90/fp8_ds_mla/H16-sq4-packed",
                         "decode_mma8/fp8/H8", "decode_mma16/fp8/H16",
                         "decode_mma16_qk8/fp8/H16",
                         "decode_mma8/fp8_ds_mla/H8", "decode_mma16/fp8_ds_mla/H16",
                         "decode_mma16_qk8/fp8_ds_mla/H16",
                         "sparse_mma8/fp8_ds_mla/H8", "sparse_mma8_qk8/fp8_ds_mla/H8"):
                yield what, cc
                yield f"{what}-direct", cc
            yield "indexer_sm90/Hi64", cc  # from SM90_MIN_HEADS (33) heads, padded to 64
            yield "indexer_sm90/Hi64-ragged", cc
        if cc >= pc.PDL_CC:
            yield "combine/D512-pdl", cc
            if cc == pc.GATHER_CC:
                yield "decode/fp8/H16-sq1-pdl", cc


@pytest.mark.parametrize("what,cc", list(_expected()))
def test_kernel_fits_target(compiled, what, cc):
    row = compiled.get((what, cc))
    assert row is not None, f"{what} did not compile for sm_{cc}"
    assert row["cubin"], f"{what}: no cubin for sm_{cc}"
    assert not row["trap"], f"{what}: compiled to a trap on sm_{cc} (an invalid configuration)"
    assert row["shared"] <= SMEM_LIMIT[cc], (
        f"{what}: {row['shared']} B shared memory > sm_{cc}'s {SMEM_LIMIT[cc]} B")
    if what.startswith(("decode/fp8", "sparse/fp8", "indexer/")):
        assert row["hw_cvt"] == (cc >= 89), "hardware e4m3 conversion iff SM89+"
    if what.startswith("decode/"):  # whole tiles by tensor-memory copies where they pay
        _, fmt, shape = what.split("/")
        heads, s_q = (int(x) for x in shape[1:].removesuffix("-pdl").removesuffix(
            "-gather").removesuffix("-misaligned").split("-sq"))
        tma = decode_config(cc, fmt, heads, s_q).tma and not shape.endswith(
            ("-gather", "-misaligned"))
        assert row["tma"] == tma, "TMA as the launcher picks"
        assert not row["tma"] or cc >= 90, "TMA only on SM90+"
    if what.startswith(("indexer/", "decode_sm90/")):
        assert row["tma"] == (cc >= 90), "TMA copies iff SM90+"
    if what.startswith("indexer_sm90/"):  # FP8 wgmma on the copied bytes: nothing converted
        assert row["tma"] and not row["hw_cvt"], "keys by TMA, no e4m3 conversion"
    if what.startswith(("indexer/", "indexer_sm90/")):  # `kernels.indexer._relu`
        assert row["max_nan"] and not row["max_num"], "the ReLU keeps NaN (max.NaN.f32)"
    if what.startswith(("sparse_sm90/", "paged_sm90/")):
        assert not row["tma"], "rows are gathered one token at a time (cp.async)"
    # the Gluon SM90 kernels signal the combine wherever one follows (bar the fp8 wide form:
    # `fp8mla.decode.PDL_SIGNAL`)
    gluon_pdl = (what.startswith(("decode_sm90/", "sparse_sm90/", "paged_sm90/", "decode_mma",
                                  "sparse_mma"))
                 and not what.startswith(("decode_mma16/fp8/", "decode_mma16_qk8/fp8/"))
                 and not what.endswith("-direct") and PDL_SIGNAL)
    assert row["pdl"] == (what.endswith("-pdl") or gluon_pdl), (
        "griddepcontrol only where PDL is compiled in")


@pytest.mark.parametrize("what", [f"combine/D{d}-S{s}-{parts}" for d, s in pc.COMBINE_STEPS
                                  for parts in ("bf16", "fp32")])
def test_combine_sums_splits_within_warps(sm90, what):
    """The split combine's programs at the launcher's warps (`fp8mla.decode.combine_warps`) sum
    a step's splits within a warp — sm_90 PTX: no `bar.sync` in programs of ≥ 128 dims but for
    one layout conversion of the split weights in 32-split 128-dim steps, and ≤ 2 such in the
    one-warp programs under 128 dims — where 4 warps stacked bf16 splits across warps (5
    barriers under triton 3.6, 10 under 3.9; session 32: the combine 4.0 → 7.8 µs, bf16
    partials' loss at 2–4 splits) and summed B=1 × 128K's 256 splits in 16-dim programs
    through shared memory (17 barriers under triton 3.9, 21 under 3.6; session 33: −0.4 µs at
    1 warp)."""
    block_d = int(what.split("/D")[1].split("-")[0])
    allowed = 2 if block_d < 128 else 1 if what.startswith("combine/D128-S32") else 0
    assert sm90[what]["cta_barriers"] <= allowed, what
    for four_warps in ("combine/D512-S2-bf16-4warps", "combine/D16-S256-bf16-4warps"):
        assert sm90[four_warps]["cta_barriers"] >= 4  # 5–21


@pytest.mark.parametrize("fmt", ["fp8", "fp8_ds_mla"])
@pytest.mark.parametrize("heads", [8, 128])
def test_sm90_gluon_plans_fall_back_on_a_fitting_config(sm90, fmt, heads):
    """A pool not 16-byte aligned sends an SM90 Gluon plan (≤ 16 rows: 8 heads; 64 rows: 128)
    to the Triton kernel with `decode_config`'s config as it is — such plans never compile the
    Triton kernel, so nothing fitted it. Its misaligned compile (every tile gathered) fits
    (`test_kernel_fits_target`) only if that is the config the row compiled: the fit did not
    step it down. Should a Triton release make it, these plans need their fallback fitted.
    (Packed plans' fallback, s_q 4 × 16 heads, is compiled unfitted: `H16-sq4-misaligned`,
    whose shared memory `test_kernel_fits_target` checks.)"""
    row = sm90[f"decode/{fmt}/H{heads}-sq1-misaligned"]
    assert not row["fitted"], f"{fmt} H{heads}: stepped down to {row['block_n']} / {row['stages']}"


def test_combine_warps_fill_one_row():
    """`combine_warps`: a 512-dim row is 128 threads of 16 bytes in float32, 64 in bf16; every
    program gets that many warps, at least one (every program under 128 dims)."""
    want = {(512, 4): 4, (512, 2): 2, (256, 4): 2, (256, 2): 1, (128, 4): 1, (128, 2): 1,
            (64, 4): 1, (32, 2): 1, (16, 2): 1}
    assert {k: combine_warps(*k) for k in want} == want


@pytest.mark.parametrize("kernel", ["decode_sm90/fp8/H128", "sparse_sm90/fp8_ds_mla/H128",
                                    "paged_sm90/fp8_ds_mla/H128"])
@pytest.mark.parametrize("direct", ["", "-direct"])
def test_sm90_rows_in_order_store_16_bytes(sm90, kernel, direct):
    """The 64-row Gluon kernels' bf16 rows in dim order (`fp8mla.decode.SM90_ROWS_IN_ORDER`,
    `decode_sm90._store_o`): 16 stores of 16 bytes a thread for the [64, 512] rows — the
    output (one split) or bf16 partials — where the accumulator's layout stores 2 dims (4
    bytes) at a time: 64 such a thread (offline, pointers aligned; float32 partials keep
    their 64 8-byte stores: in order they spill). The few 4-byte stores left are lse and
    max_logits. sm_90 PTX."""
    if not decode_sm90.AVAILABLE:
        pytest.skip("this Triton has no (such) Gluon")
    in_order = sm90[f"{kernel}{direct}"]["stores"]
    assert in_order["v4."] == 16 and in_order["v2."] == 0 and in_order[""] <= 4, in_order
