"""The benchmark cases' set-up and correctness checks run (tiny sizes, no timing) on any
device, so a GPU session spends its minutes measuring, not debugging."""

from dataclasses import replace

import pytest
import torch

from fp8mla import topk
from fp8mla.bench import decode as bench_decode
from fp8mla.bench import prefill as bench_prefill
from fp8mla.bench import sparse as bench_sparse
from fp8mla.runtime import decode_config

ENV = dict(gpu="test", torch="x", triton="x", date="2026-01-01", commit="x")


@pytest.fixture(autouse=True)
def no_timing(monkeypatch):
    monkeypatch.setattr(bench_sparse, "time_us", lambda fn: (fn(), 1.0)[1])
    monkeypatch.setattr(bench_decode, "time_us", lambda fn: (fn(), 1.0)[1])
    monkeypatch.setattr(bench_prefill, "time_us", lambda fn: (fn(), 1.0)[1])


def test_decode_cases_smoke(device):
    # `fp8mla bench decode`'s MTP case (s_q 2 × 16 heads: 32-row programs) at a small size,
    # then the pool case's shape with its baselines; every backend checked, then "timed"
    mtp = bench_decode.DECODE_CASES[-1]
    assert (mtp.heads, mtp.s_q) == (16, 2)
    case = bench_decode.DecodeCase(2, 130, 16, s_q=2)
    recs = bench_decode.run_case(case, "fp8", ENV, 1.0, device=device, floor=True)
    assert recs[0].case == "dense_decode/fp8/B2-ctx130-H16-sq2"
    assert recs[0].note.startswith("kernel=triton splits=") and recs[0].TBps > 0
    # the streaming read of the same bytes (checked read whole inside `floors.read_floor`)
    floor = [r for r in recs if r.backend.startswith("read_floor")]
    assert floor[0].backend == "read_floor" and floor[0].note.startswith("program=4096 words")
    assert floor[0].TBps * floor[0].us == pytest.approx(recs[0].TBps * recs[0].us, rel=1e-3)
    pool = bench_decode.DecodeCase(1, 100, 8, pool_tokens=1024)
    recs = bench_decode.run_case(pool, "fp8", ENV, 1.0, backends=(
        "fp8mla", "gather_cast", "full_cast"), kind="pool_cast/one_layer", device=device)
    assert {r.case for r in recs} == {"pool_cast/one_layer/B1-ctx100-pool1024"}
    assert [r.backend for r in recs][-2:] == ["gather_cast", "full_cast"]
    # the checked plan the phase and L2 scripts time (a forced split count reaches it)
    plan, fn = bench_decode.checked_plan(case, "fp8_ds_mla", num_splits=3, device=device)
    assert plan.num_splits == 3 and fn()[0].shape == (2, 2, 16, 512)


def test_prefill_case_smoke(device, monkeypatch):
    # `fp8mla bench decode`'s dense prefill rows at a small size: 7 new tokens over 40 (the
    # first group of four front-padded), checked against the reference, bytes of the groups
    # ("timed" at 1 ns: the rates' three decimals resolve a byte count to ~1 byte)
    monkeypatch.setattr(bench_prefill, "time_us", lambda fn: (fn(), 1e-3)[1])
    case = bench_prefill.PrefillCase(1, 7, 40, 3)
    assert case.visible() == sum(range(34, 41))
    rec, = bench_prefill.run_prefill(case, "fp8", ENV, 1.0, device=device)
    assert rec.case == "dense_prefill/fp8/B1-S7-ctx40-H3" and rec.note == "groups of 4"
    rows = (36 + 40) * 576 + case.io_bytes()  # two groups: tokens ≤ 2 (36 seen), 3–6 (40)
    assert rec.TBps * 1e-3 == pytest.approx(rows / 1e6, abs=1e-6)
    assert rec.TFLOPS * 1e-3 == pytest.approx(case.flops() / 1e6, abs=1e-4)


def test_ragged_prefill_case_smoke(device, monkeypatch):
    # the packed rows: 5, 0 and 2 new tokens over 12-token contexts (groups of min(4, ceil(7 /
    # 3)) = 3), each request's last queries checked; the same case a request at a time
    monkeypatch.setattr(bench_prefill, "time_us", lambda fn: (fn(), 1e-3)[1])
    case = bench_prefill.RaggedPrefillCase((5, 0, 2), 12, 3)
    recs = bench_prefill.run_ragged_prefill(case, "fp8", ENV, 1.0, device=device)
    assert [r.backend for r in recs] == ["fp8mla", "per_request"]
    assert {r.case for r in recs} == {"dense_prefill_ragged/fp8/B3-S5+0+2-ctx12-H3"}
    assert recs[0].note == "groups of 3"
    # groups: request 0's tokens 0–1 (padded; they see 9) and 2–4 (12), request 2's 0–1 (12)
    rows = (9 + 12 + 12) * 576 + case.io_bytes()
    assert recs[0].TBps * 1e-3 == pytest.approx(rows / 1e6, abs=1e-6)
    assert case.flops() == 2 * 3 * (sum(range(8, 13)) + 11 + 12) * 1088


def test_sparse_case_smoke(device):
    recs = bench_sparse.run_sparse(2, 8, 32, 2, ENV, 1.0, device=device, pool_tokens=4096,
                                   floor=True)
    rec = recs[0]
    assert rec.case == "sparse_decode/fp8_ds_mla/B2-H8-topk32-sq2" and rec.TFLOPS > 0
    # the gather floor of the same rows and lists, its rate on the rows it reads (4 lists ×
    # 32 rows of 656 bytes; q and out not: each program's sum checked in `floors.gather_floor`)
    floor = [r for r in recs if r.backend.startswith("gather_floor")]
    assert floor[0].backend == "gather_floor" and floor[0].note.startswith("program=")
    assert floor[0].note.endswith("(rows only)") and floor[0].TFLOPS is None
    assert floor[0].TBps * floor[0].us == pytest.approx(4 * 32 * 656 / 1e6, rel=1e-2)
    # a configuration and split count of benchmarks/sparse_variants.py reach the plan
    cfg = replace(decode_config(90, "fp8_ds_mla", 8, 1), block_n=32)
    rec = bench_sparse.run_sparse(2, 8, 64, 1, ENV, 1.0, device=device, pool_tokens=4096,
                                  config=cfg, num_splits=2)[0]
    assert rec.note.startswith("kernel=triton splits=2 block_n=32 ")
    # a prefill case: the same kernels, named per token
    rec = bench_sparse.run_sparse(5, 8, 32, 1, ENV, 1.0, device=device, pool_tokens=4096,
                                  prefill=True)[0]
    assert rec.case == "sparse_prefill/fp8_ds_mla/T5-H8-topk32" and rec.TFLOPS > 0


def test_indexer_topk_cases_smoke(device, monkeypatch):
    # the 1100-logit row counts as long (chunked by default, 2048 logits a program here), so
    # one program per row (chunk 0) and 1024-logit chunks are timed beside the default, and
    # 2048 (the default) is not timed twice; the GPU run: 0, 1024, 2048, 4096 less the default
    monkeypatch.setattr(bench_sparse, "TOPK_CHUNKS", (0, 1024, 2048))
    monkeypatch.setattr(topk, "CHUNKED_ABOVE", 1024)
    monkeypatch.setattr(topk, "CHUNK_SHORT", 2048)
    recs = bench_sparse.run_indexer_topk(ENV, 1.0, device=device, indexer_cases=[(2, 128, 32)],
                                         topk_cases=[(2, 256, 16), (1, 1100, 16)])
    assert [r.case for r in recs] == ["indexer/fp8/B2-ctx128-Hi32"] * 2 \
        + ["topk/B2-len256-k16"] * 4 + ["topk/B1-len1100-k16"] * 6
    timed = ["indexer", "fp8mla", "indexer_graph", "fp8mla_graph"]
    assert [r.backend for r in recs] == ["fp8mla", "fp8mla_graph"] + timed * 2 \
        + ["fp8mla_graph_chunk0", "fp8mla_graph_chunk1024"]


def test_keep_row_rewrites_the_file_after_every_row(tmp_path, capsys):
    """`harness.keep_row`: each row printed as a JSON line and the file rewritten whole, so a
    run cut short keeps what it measured."""
    import json

    from fp8mla.bench.harness import keep_row

    path, rows = str(tmp_path / "out.json"), []
    keep_row(path, rows, {"case": "a", "us": 1.5}, env={"gpu": "x"}, ceiling_TBps=4.4)
    keep_row(path, rows, {"case": "b", "us": 2.5}, env={"gpu": "x"}, ceiling_TBps=4.4)
    saved = json.load(open(path))
    assert saved == {"env": {"gpu": "x"}, "ceiling_TBps": 4.4,
                     "rows": [{"case": "a", "us": 1.5}, {"case": "b", "us": 2.5}]}
    assert [json.loads(line)["case"] for line in capsys.readouterr().out.splitlines()] == ["a", "b"]


def test_by_backend_picks_the_named_record(device):
    """`harness.by_backend`: a case's record by backend name (the scripts read
    "fp8mla_graph" and "fp8mla_graph_cleanL2" by name, not by position); an absent name is a
    KeyError listing those present."""
    from fp8mla.bench.harness import by_backend

    recs = bench_decode.run_case(bench_decode.DecodeCase(1, 70, 2, page_size=16), "fp8", {
        "gpu": "cpu", "torch": "t", "triton": "t", "date": "d", "commit": "c"}, 1.0,
        device=device)
    assert by_backend(recs, "fp8mla") is recs[0]
    with pytest.raises(KeyError, match="fp8mla_graph"):
        by_backend(recs, "fp8mla_graph" if device == "cpu" else "nothing")


@pytest.mark.parametrize("rows, iters, row_words, evict", [(16, 1, 164, ""),
                                                           (8, 3, 144, "evict_first")])
def test_read_floor_kernels_sum_what_they_read(device, rows, iters, row_words, evict):
    # the floors' kernels read every word they are given, once: the streaming read over a
    # length that ends mid-block, the gather over lists of odd width with duplicate slots
    # (each listed row's words — fp8_ds_mla's 164 in runs of 128 / 32 / 4, fp8's 144 in 128 /
    # 16 — summed once per entry)
    import triton

    from fp8mla.kernels.stream import _gather_read_kernel, _stream_read_kernel, word_runs

    g = torch.Generator().manual_seed(rows * 10 + iters)
    x = torch.randint(-50, 50, (1000,), generator=g, dtype=torch.int32).to(device)
    out = torch.empty(triton.cdiv(1000, 64 * iters), dtype=torch.int32, device=device)
    _stream_read_kernel[(out.shape[0],)](x, out, 1000, BLOCK=64, ITERS=iters, EVICT=evict)
    assert out.sum().item() == x.sum().item()

    pool = torch.randint(-50, 50, (300, row_words), generator=g, dtype=torch.int32).to(device)
    idx = torch.randint(0, 300, (3, 37), generator=g, dtype=torch.int32)
    idx[1, :5] = idx[1, 5]  # duplicates are read (and summed) once per listing
    idx = idx.to(device)
    chunks = triton.cdiv(37, rows * iters)
    out = torch.full((3, chunks), 7, dtype=torch.int32, device=device)
    r1, r2, r3 = word_runs(row_words)
    _gather_read_kernel[(3, chunks)](pool, idx, out, 37, R1=r1, R2=r2, R3=r3, ROWS=rows,
                                     ITERS=iters, EVICT=evict)
    sums = pool.sum(dim=1)
    want = torch.zeros(3, chunks, dtype=torch.int64)
    for lst in range(3):
        for e in range(37):
            want[lst, e // (rows * iters)] += sums[idx[lst, e]].item()
    assert torch.equal(out.cpu().long(), want)


def test_word_runs():
    from fp8mla.kernels.stream import word_runs

    assert word_runs(164) == (128, 32, 4) and word_runs(144) == (128, 16, 0)
    assert word_runs(288) == (256, 32, 0) and word_runs(64) == (64, 0, 0)
    with pytest.raises(ValueError, match="row_words"):
        word_runs(15)  # 8 + 4 + 2 + 1


def test_env_info_names_the_tree_it_ran(tmp_path, monkeypatch):
    # a record's commit is HEAD's, marked +dirty where tracked files differ from it, and
    # FP8MLA_COMMIT where set (the device machines run a copy whose git state is not its own)
    import subprocess

    from fp8mla.bench.harness import env_info

    git = lambda *a: subprocess.run(["git", *a], cwd=tmp_path, check=True,  # noqa: E731
                                    capture_output=True, text=True).stdout.strip()
    git("init", "-q")
    (tmp_path / "f.txt").write_text("a")
    git("add", "f.txt")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    head = git("rev-parse", "--short", "HEAD")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FP8MLA_COMMIT", raising=False)
    (tmp_path / "new.txt").write_text("untracked files do not count")
    assert env_info()["commit"] == head
    (tmp_path / "f.txt").write_text("b")
    assert env_info()["commit"] == head + "+dirty"
    monkeypatch.setenv("FP8MLA_COMMIT", "abc1234")
    assert env_info()["commit"] == "abc1234"


def test_bench_prints_each_case_against_its_floor(capsys):
    # fp8mla's graph replays against the floor of the same case and timer, each rate on the
    # bytes it moves (a case without floor rows prints nothing)
    from fp8mla.bench.cli import _print_floor_ratio
    from fp8mla.bench.harness import Record

    rec = lambda backend, tbps: Record(case="c", backend=backend, us=1.0,  # noqa: E731
                                       TBps=tbps, TFLOPS=None, ceiling_TBps=4.0, **ENV)
    _print_floor_ratio([rec("fp8mla_graph", 2.0), rec("fp8mla_graph_cleanL2", 3.0),
                        rec("gather_floor", 2.5), rec("gather_floor_cleanL2", 4.0)])
    _print_floor_ratio([rec("fp8mla_graph", 2.0)])
    lines = capsys.readouterr().out.split("\n")
    assert [ln.split()[-6:] for ln in lines if ln] == [
        ["at", "80%", "of", "the", "floor's", "rate"], ["at", "75%", "of", "the", "floor's", "rate"]]


def test_floors_reject_bad_arguments_by_name():
    # the floors' inputs checked before anything launches, each error naming its argument
    from fp8mla.bench.floors import gather_floor, read_floor

    rows = torch.zeros(8, 656, dtype=torch.uint8)
    idx = torch.zeros(2, 4, dtype=torch.int32)
    with pytest.raises(ValueError, match="n_bytes: expected a multiple of 4"):
        read_floor(1002, {}, "cpu")
    with pytest.raises(ValueError, match="evict: expected"):
        read_floor(1000, {}, "cpu", evict="evict_last")
    with pytest.raises(TypeError, match="rows: expected dtype uint8"):
        gather_floor(rows.view(torch.int32), idx, {}, "cpu")
    with pytest.raises(ValueError, match="rows: expected contiguous rows of a multiple of 16"):
        gather_floor(rows[:, :600], idx, {}, "cpu")
    with pytest.raises(TypeError, match="idx: expected dtype int32"):
        gather_floor(rows, idx.long(), {}, "cpu")
    with pytest.raises(ValueError, match=r"idx: expected slots in \[0, 8\), got -1"):
        gather_floor(rows, idx - 1, {}, "cpu")
    with pytest.raises(ValueError, match="evict: expected"):
        gather_floor(rows, idx, {}, "cpu", evict="first")


def test_flush_ab_plans_name_real_switches(monkeypatch):
    """`benchmarks/flush_ab.py`'s plans: arms that differ, each patching attributes their
    modules have (a misspelt or removed switch would stop the device run at its first arm,
    after the minutes spent reaching it), and every case a dense (DecodeCase, format) or a
    sparse (batch, heads, topk, s_q[, format])."""
    import pathlib

    monkeypatch.syspath_prepend(str(pathlib.Path(__file__).parents[1] / "benchmarks"))
    import decode_variants
    import flush_ab

    for name, (arms, cases) in flush_ab.PLANS.items():
        assert len({label for label, _ in arms}) == len(arms) > 1, name
        assert len({tuple(sorted(patch.items())) for _, patch in arms}) == len(arms), name
        for label, patch in arms:
            for key in patch:
                module, attr = decode_variants._owner(key)
                assert hasattr(module, attr), f"{name} / {label}: {key}"
        for case in cases:
            assert (isinstance(case[0], bench_decode.DecodeCase)
                    and case[1] in ("bf16", "fp8", "fp8_ds_mla")) or (
                len(case) in (4, 5) and all(isinstance(x, int) for x in case[:4])
                and case[4:] in ((), ("fp8",), ("fp8_ds_mla",), ("bf16",))), (name, case)
