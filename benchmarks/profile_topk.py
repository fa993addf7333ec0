"""Top-k on long rows, one program per row (chunk 0) vs several (topk_indices(chunk=...);
None: the default): graph-replay medians and, per launch, the kernels' GPU times
(torch.profiler), to see where a chunked selection spends its time (digit passes that work,
passes that return at once, compaction, the compacted rows' selection). "ties": the logits
rounded to a dozen levels, so thousands tie at the k-th value, the candidates overflow the
compaction's capacity and rows finish chunk by chunk (the overflow path: its digit passes 5–8
then take full time, not ~1 µs).

    python benchmarks/profile_topk.py OUT.json
"""

import json
import sys
from collections import defaultdict
from functools import partial

import torch
from torch.profiler import ProfilerActivity, profile

from fp8mla.bench.harness import env_info, graphed, read_ceiling_tbps, script_args, time_us
from fp8mla.bench.sparse import _index_problem, topk_reference
from fp8mla.indexer import indexer_logits_paged
from fp8mla.topk import topk_indices

script_args(__doc__)

K = 2048
results = []
for rows, length, ties in ((64, 16384, False), (64, 32768, False), (64, 131072, False),
                           (256, 32768, False), (8, 131072, False), (64, 32768, True)):
    cache, table, q, w, lens = _index_problem(rows, length, 32, "cuda", seed=1)
    logits_fn = partial(indexer_logits_paged, q, w, cache.layer(0), table, lens, max_len=length,
                        check=False)
    logits = logits_fn()
    if ties:  # ~12 levels: each holds thousands of a row's 32K logits
        logits = ((logits - logits.mean()) / logits.std() * 2).round()
    us_logits = time_us(graphed(logits_fn))
    ref = topk_reference(logits, K)  # no −inf in these rows
    for chunk in (None, 0, 1024, 2048, 4096):
        fn = partial(topk_indices, logits, K, chunk=chunk)
        assert torch.equal(fn().sort(1).values, ref), f"chunk {chunk}: selection differs"
        replay = graphed(fn)
        us = time_us(replay)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            replay()
            torch.cuda.synchronize()
        kernels = defaultdict(list)
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                kernels[e.name[:40]].append(round(e.device_time_total, 1))
        row = {"rows": rows, "length": length, "ties": ties, "chunk": chunk, "us": us, "us_logits": us_logits,
               "ratio": us / us_logits, "kernels_us": dict(kernels)}
        results.append(row)
        print(f"{rows:4d} x {length:6d}{' ties' if ties else ''} chunk {str(chunk):5s} {us:8.1f} us "
              f"({us / us_logits:.2f} x logits {us_logits:.1f})  {dict(kernels)}", flush=True)
with open(sys.argv[1], "w") as f:
    json.dump({**env_info(), "ceiling_TBps": read_ceiling_tbps(), "results": results}, f, indent=1)
