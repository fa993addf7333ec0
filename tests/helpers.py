"""Builders shared by the kernel tests: random paged caches with poisoned free pages; the
portability compile started in the background; the skip where the SM90 Gluon kernels cannot
run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from fp8mla import reference
from fp8mla.cache import IndexKeyCache, PagedKVCache, build_block_table

POISON_PAD = 1 << 30  # block-table padding: a page id far past any pool


def sm90_gluon_only(what: str) -> None:
    """Skip unless this GPU is SM90 (compute capability 9.0) and this Triton has the Gluon the
    64-row kernels (`fp8mla.kernels.decode_sm90`) need; ``what``: "decode" or "sparse"."""
    from fp8mla.kernels import decode_sm90

    if torch.cuda.get_device_capability() != (9, 0) or not decode_sm90.AVAILABLE:
        pytest.skip(f"the Gluon {what} kernel serves SM90 (compute capability 9.0) only")


class LaunchRecorder:
    """Stands for a Triton / Gluon kernel in a CPU test of a launcher: ``kernel[grid](*args,
    **meta)`` appends (name, grid, meta) to ``calls`` instead of launching."""

    def __init__(self, calls: list, name: str = ""):
        self.calls, self.name = calls, name

    def __getitem__(self, grid):
        return lambda *args, **meta: self.calls.append((self.name, grid, meta))


def poison(cache: PagedKVCache) -> None:
    """Fill every byte of the pool so that a stray read shows, even at weight 0: NaN in bf16
    halves and in fp8_ds_mla scales / rope, e4m3fn's NaN (0x7F) in fp8 bytes (both e4m3
    conversions read it as NaN since session 49; 0x7E = 448 before)."""
    if cache.fmt.name == "fp8":
        cache.pool.fill_(0x7F)
    else:
        cache.pool.view(torch.int16).fill_(0x7FC0)  # bf16 NaN in every 16-bit half


def sparse_pool(fmt: str, policy: str | None, pages: int, page_size: int, device,
                g: torch.Generator) -> tuple[PagedKVCache, torch.Tensor]:
    """A poisoned pool where only half the slots hold random data: (cache, those slots)."""
    cache = PagedKVCache(pages, page_size, fmt, scale_policy=policy, fp8_scale=0.03,
                         device=device)
    poison(cache)
    live = torch.randperm(cache.num_slots, generator=g)[: max(1, cache.num_slots // 2)]
    cache.store(0, torch.randn(len(live), 512, generator=g).bfloat16().to(device),
                torch.randn(len(live), 64, generator=g).bfloat16().to(device), live.to(device))
    return cache, live


def sparse_lists(live: torch.Tensor, tokens: int, topk: int, g: torch.Generator) -> torch.Tensor:
    """Index lists int32 [tokens, topk] (on the CPU) over the ``live`` slots: ~20% −1, and the
    last entry a duplicate of the first."""
    idx = live[torch.randint(len(live), (tokens, topk), generator=g)].to(torch.int32)
    idx[torch.rand(tokens, topk, generator=g) < 0.2] = -1
    if topk > 1:
        idx[:, -1] = idx[:, 0]  # a duplicate
    return idx


def paged_cache(fmt: str, lens: list[int], page_size: int, *, policy: str | None = None,
                extra_pages: int = 3, device: str = "cpu", fp8_scale: float = 0.03,
                seed: int = 0, rows=None):
    """A poisoned cache holding random tokens for requests of ``lens``, pages shuffled
    (``rows``: a function (request, latent float32 [n, 512], rope [n, 64]) → the pair to store
    instead, where given).

    Returns (cache, block_table int32 [batch, max_pages] padded with POISON_PAD,
    cache_seqlens int32 [batch])."""
    g = torch.Generator().manual_seed(seed)
    need = [-(-n // page_size) for n in lens]
    num_pages = sum(need) + extra_pages
    cache = PagedKVCache(num_pages, page_size, fmt, scale_policy=policy, fp8_scale=fp8_scale,
                         device=device)
    poison(cache)
    perm = torch.randperm(num_pages, generator=g).tolist()
    tables, k = [], 0
    for n in need:
        tables.append(perm[k:k + n])
        k += n
    table = build_block_table(tables, max_pages=max(need + [1]) + 1, pad=POISON_PAD,
                              device=device)
    for b, n in enumerate(lens):
        pos = torch.arange(n, device=device)
        slots = table[b, pos // page_size].long() * page_size + pos % page_size
        lat = torch.randn(n, 512, generator=g).to(device)
        rope = torch.randn(n, 64, generator=g).to(device)
        if rows is not None:
            lat, rope = rows(b, lat, rope)
        cache.store(0, lat.bfloat16(), rope.bfloat16(), slots)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    return cache, table, seqlens


def ragged_prefill_reference(q: torch.Tensor, news: list[int], cache: PagedKVCache,
                             table: torch.Tensor, seqlens: torch.Tensor, scale: float):
    """The float32 reference of a packed prefill (`fp8mla.prefill.dense_prefill_ragged`), a
    request at a time: q bfloat16 [tokens, heads, 576], request b's news[b] new tokens in
    order. Returns (out float32 [tokens, heads, 512], lse float32 [tokens, heads])."""
    outs = [torch.zeros(0, q.shape[1], 512, device=q.device)]
    lses = [torch.zeros(0, q.shape[1], device=q.device)]
    at = 0
    for b, s in enumerate(news):
        if s:
            o, lo = reference.dense_mla_decode(q[None, at:at + s], cache.dequantize(0),
                                               table[b:b + 1], seqlens[b:b + 1], scale)
            outs.append(o[0])
            lses.append(lo[0])
        at += s
    return torch.cat(outs), torch.cat(lses)


def request_rows(kv: torch.Tensor, table: torch.Tensor, b: int, n: int,
                 page_size: int) -> torch.Tensor:
    """Request ``b``'s first ``n`` rows of a paged pool ``kv`` [pages, page_size, ...] through
    its block-table row: [n, ...]."""
    pos = torch.arange(n, device=kv.device)
    return kv[table[b, pos // page_size].long(), pos % page_size]


def assert_blind_rows(plan, run, lens: list[int], out: torch.Tensor,
                      lse: torch.Tensor) -> torch.Tensor:
    """The query rows of a causal decode that see no token (query i of s_q in a request of
    n ≤ s_q − i − 1 tokens), after ``out`` / ``lse`` = ``run()`` with empty_lse −inf: zeros in
    out and −inf in plan.max_logits there, and ``run(empty_lse=+inf)`` puts +inf in exactly
    those rows' lse, every other lse bitwise as before. Returns the mask, bool [batch, s_q]."""
    s_q = plan.s_q
    blind = torch.tensor([[n - s_q + i + 1 <= 0 for i in range(s_q)] for n in lens],
                         device=lse.device)
    assert torch.all(out[blind] == 0) and torch.all(plan.max_logits[blind] == float("-inf"))
    _, lse_inf = run(empty_lse=float("inf"))
    assert torch.all(lse_inf[blind] == float("inf")) and torch.equal(lse_inf[~blind], lse[~blind])
    return blind


def assert_timeline_in_order(timeline: torch.Tensor) -> None:
    """A run's `DecodePlan.timeline` (int64 [programs, 12]): every program stamped entry ≤ loop
    start ≤ tile 0 landed ≤ loop end ≤ exit on the global timer, all within a second, and an SM
    id of this GPU."""
    st = timeline.cpu()
    stamps = st[:, 0:10:2]
    assert torch.all(stamps[:, 1:] >= stamps[:, :-1]), stamps
    assert int(stamps.max() - stamps.min()) < 10**9
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert torch.all((st[:, 10] >= 0) & (st[:, 10] < sms)), st[:, 10]


def extreme_q(batch: int, heads: int, device="cuda", seed: int = 0) -> torch.Tensor:
    """q bf16 [batch, heads, 576] (batch ≥ 2, heads ≥ 5) with rows that stress a per-row
    power-of-two split into e4m3 halves: 30× (logits in the hundreds), 1e-4 and 1e-30
    magnitude, all zeros, one huge element among small ones (head 4 of the second query)."""
    q = torch.randn(batch, heads, 576, generator=torch.Generator().manual_seed(seed)).to(device)
    q[0, 0] *= 30  # large logits: the softmax nearly one-hot
    q[0, 1] *= 1e-4
    q[0, 2] *= 1e-30
    q[0, 3] = 0
    q[1, 4, 7] = 300
    return q.bfloat16()


# The FP8 first product (``QK8``) keeps each 128-dim chunk's sum to ~14 bits of its largest
# term: scores err by ~1.5e-4 of the row's largest |logit|, ~1.3e-3 where one q element dwarfs
# the rest (h200-20261202-s25-qk8-precision.json). Rows on it are checked at the standard
# tolerance plus this share of that logit (a lost low half of q would err by ~3%)
QK8_LOGIT_SHARE = 2e-3


def assert_close_qk8(out, lse, ro, rl, logit_max, name=""):
    """out bf16 [..., 512] and lse float32 [...] against the float32 reference (ro, rl) of the
    same shapes, each row's tolerance (atol 0.016 + rtol 0.016 on out, 1e-3 on lse) widened by
    QK8_LOGIT_SHARE · logit_max (float32 [...], the row's largest |scaled score|)."""
    assert out.shape == ro.shape and lse.shape == rl.shape == logit_max.shape, (
        f"{name}: shapes out {list(out.shape)} / {list(ro.shape)}, lse {list(lse.shape)} / "
        f"{list(rl.shape)}, logit_max {list(logit_max.shape)}")
    for got, want, what in ((out.float(), ro.float(), "out"), (lse, rl, "lse")):
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf()), (
            f"{name} {what}: NaN / inf where the reference has none (or the reverse)")
    extra = QK8_LOGIT_SHARE * logit_max
    err = (out.float() - ro.float()).abs() - (0.016 + 0.016 * ro.float().abs() + extra[..., None])
    where = torch.nonzero(err == err.max())[0].tolist()
    assert err.max() <= 0, (f"{name} out: {int((err > 0).sum())} elements past the QK8 "
                            f"tolerance; worst at {where}: {out[tuple(where)].item():.6g} against "
                            f"{ro[tuple(where)].item():.6g} (row's max |logit| "
                            f"{logit_max[tuple(where[:-1])].item():.4g})")
    lerr = (lse - rl).abs() - (1e-3 + 1e-3 * rl.abs() + extra)
    assert lerr.max() <= 0, (f"{name} lse: worst excess {lerr.max().item():.3g} at "
                             f"{torch.nonzero(lerr == lerr.max())[0].tolist()}")


PORTABILITY_DIR = "FP8MLA_PORTABILITY_DIR"  # the run's folder for the compile's result
# its longest wait: a cold Triton cache takes ~12 min of one core for the six targets (sm_90
# ~4, sm_86 ~1.3), ~14 min beside the interpreter tests' two workers (session 50)
COMPILE_TIMEOUT_S = 600


def portability_result() -> str:
    """Where this test run's portability compile publishes its lines: one file a run (the
    folder tests/conftest.py makes in its first process), shared by its xdist workers."""
    return os.path.join(os.environ[PORTABILITY_DIR], "compile.jsonl")


def start_portability_compile(workers: int, path: str) -> subprocess.Popen:
    """A portability compile run in ``workers`` processes, compiled (not interpreted), its
    JSON lines published at ``path`` once complete (`portability_compile.main`), its stderr
    beside it (a file, not a pipe: the process never blocks on a full pipe); in a process group
    of its own, which `stop_portability_compile` ends whole."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["FP8MLA_COMPILE_WORKERS"] = str(workers)
    script = os.path.join(os.path.dirname(__file__), "portability_compile.py")
    with open(path + ".err", "w") as err:
        return subprocess.Popen([sys.executable, script, path], env=env,
                                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)


def stop_portability_compile(proc: subprocess.Popen) -> None:
    """Ends a compile `start_portability_compile` started, its pool's processes with it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (AttributeError, ProcessLookupError):  # no process groups here; or already gone
        proc.kill()
    proc.wait()


def portability_rows(path: str, timeout: float, proc: subprocess.Popen | None = None) -> list:
    """The compile's JSON lines once ``path`` appears (``timeout`` seconds at most); fails the
    test with the compile's error where it failed or ``proc`` (this process's own compile)
    ended without a result."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        ended = proc is not None and proc.poll() is not None and not os.path.exists(path)
        if ended or time.monotonic() > deadline:
            err = open(path + ".err").read()[-3000:] if os.path.exists(path + ".err") else ""
            pytest.fail(f"the portability compile {'exited' if ended else 'took too long'} "
                        f"without its result: {err}")
        time.sleep(0.2)
    with open(path) as f:
        rows = [json.loads(line) for line in f.read().splitlines() if line.startswith("{")]
    status = rows.pop() if rows else {}
    assert status.get("exit") == 0, status.get("error", f"no status line in {path}")
    return rows


def index_cache(lens, page_size, device, seed=0, policy="fp32"):
    """An `IndexKeyCache` holding random keys for requests of ``lens`` tokens on shuffled pages
    (free pages and scales NaN-poisoned, block-table padding past the pool) → (cache,
    block table)."""
    g = torch.Generator().manual_seed(seed)
    need = [-(-n // page_size) for n in lens]
    cache = IndexKeyCache(sum(need) + 2, page_size, scale_policy=policy, device=device)
    cache.pool.fill_(0x7F)  # e4m3 NaN bytes and NaN scales: a stray read shows
    perm = torch.randperm(cache.num_pages, generator=g).tolist()
    tables, k = [], 0
    for n in need:
        tables.append(perm[k:k + n])
        k += n
    table = build_block_table(tables, max_pages=max(need) + 1, pad=POISON_PAD, device=device)
    for b, n in enumerate(lens):
        pos = torch.arange(n, device=device)
        slots = table[b, pos // page_size].long() * page_size + pos % page_size
        cache.store(0, torch.randn(n, 128, generator=g).bfloat16().to(device), slots)
    return cache, table


def indexer_reference_paged(cache, table, lens, q, w, s_q, max_len):
    """The float32 reference logits of `index_cache`'s requests: float32 [len(lens) · s_q,
    max_len], row b · s_q + i query i of request b (q: [len(lens), s_q, heads, 128]). lens:
    each request's length (query i sees n − s_q + 1 + i keys) or, a list per request, each
    query's own length."""
    keys = cache.dequantize(0)
    rows = []
    for b, n in enumerate(lens):
        his = n if isinstance(n, list) else [max(0, n - s_q + 1 + i) for i in range(s_q)]
        n = max(his)
        pos = torch.arange(n, device=keys.device)
        kb = torch.zeros(max_len, 128, device=keys.device)
        kb[:n] = keys[table[b, pos // cache.page_size].long() * cache.page_size + pos % cache.page_size]
        for i, hi in enumerate(his):
            rows.append(reference.indexer_logits(
                q[b, i:i + 1].float(), w[b * s_q + i:b * s_q + i + 1], kb,
                torch.tensor([0]), torch.tensor([hi])))
    return torch.cat(rows)
