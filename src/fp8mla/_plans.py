"""`PlanCache`: plans kept by problem shape, for callers that cannot hold their own (the layer,
the FlashMLA compat API's earlier tensor-schedule interface)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable

import torch

__all__ = ["PlanCache"]


class PlanCache:
    """Plans by shape, built once per process (compiling a kernel and sizing a split workspace
    is host work a step should not repeat) and shared by every caller of that shape: callers
    pass their own outputs, so sharing is stream-ordered. The last `KEEP` shapes are kept —
    except a plan run while a CUDA graph was being captured, which is kept for good: the graph
    replays writes into its buffers (max logits, split partials), which must outlive it."""

    KEEP = 8

    def __init__(self) -> None:
        self.plans: OrderedDict[Hashable, object] = OrderedDict()
        self.pinned: dict[Hashable, object] = {}

    def get(self, key: Hashable, make: Callable[[], object]):
        plan = self.pinned.get(key) or self.plans.get(key)
        if plan is None:
            plan = self.plans[key] = make()
            while len(self.plans) > self.KEEP:
                self.plans.popitem(last=False)
        if key in self.plans:
            self.plans.move_to_end(key)
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                self.pinned[key] = self.plans.pop(key)
        return plan
