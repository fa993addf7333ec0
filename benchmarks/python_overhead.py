"""Host-side (Python) cost of one decode call, native and through the FlashMLA-compatible API,
with the kernel launches stubbed out: what an engine that does not use CUDA graphs pays on the
CPU per call before any GPU work. Runs on a CPU (no GPU needed).

    python benchmarks/python_overhead.py
"""

import os
import sys
import time

os.environ["TRITON_INTERPRET"] = "1"  # CPU tensors are accepted; nothing is launched below
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import torch  # noqa: E402

import fp8mla.decode as decode  # noqa: E402
from fp8mla.compat import flash_mla  # noqa: E402
from fp8mla.sparse import SparsePlan  # noqa: E402
from helpers import paged_cache  # noqa: E402


class _NoLaunch:
    """Stands in for a Triton kernel: launching does nothing, compiling is refused."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None

    def warmup(self, *args, **kwargs):
        raise AttributeError("no compile")


def per_call_us(fn, n=3000) -> float:
    for _ in range(100):
        fn()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def main() -> None:
    decode._mla_decode_kernel = decode._combine_splits_kernel = _NoLaunch()
    cache, table, seqlens = paged_cache("fp8_ds_mla", [100, 50], 64)
    rows, q = cache.layer(0), torch.randn(2, 1, 8, 576).bfloat16()
    plan = decode.DecodePlan(batch=2, num_heads=8, kv_format="fp8_ds_mla", page_size=64,
                             max_seqlen=table.shape[1] * 64, device="cpu")
    meta, _ = flash_mla.get_mla_metadata()
    k_cache = rows.unsqueeze(2)
    idx = torch.randint(0, rows.shape[0] * 64, (2, 1, 64), dtype=torch.int32)
    sparse = SparsePlan(num_queries=2, num_heads=8, topk=64, kv_format="fp8_ds_mla",
                        device="cpu")
    meta_s, _ = flash_mla.get_mla_metadata()
    flat = rows.view(-1, rows.shape[-1])
    cases = {
        "dense native": lambda: plan.run(q, rows, table, seqlens, check=False),
        "dense compat": lambda: flash_mla.flash_mla_with_kvcache(
            q, k_cache, table, seqlens, 512, meta, causal=True, is_fp8_kvcache=True),
        "sparse native": lambda: sparse.run(q[:, 0], flat, idx[:, 0], check=False),
        "sparse compat": lambda: flash_mla.flash_mla_with_kvcache(
            q, k_cache, None, None, 512, meta_s, is_fp8_kvcache=True, indices=idx),
    }
    for name, fn in cases.items():
        print(f"{name:14s} {per_call_us(fn):7.1f} us per call (host only, launches stubbed)")


if __name__ == "__main__":
    main()
