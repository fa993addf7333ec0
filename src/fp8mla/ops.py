"""The public kernel entry points (validated launchers), gathered in one namespace."""

from fp8mla.decode import DecodePlan, dense_decode
from fp8mla.dsa import dsa_decode_step
from fp8mla.indexer import indexer_logits_paged, indexer_logits_ragged
from fp8mla.prefill import dense_prefill, dense_prefill_ragged
from fp8mla.sparse import SparsePlan, sparse_decode, sparse_prefill
from fp8mla.topk import topk_indices

indexer_logits = indexer_logits_paged  # the decode form under the role's name


__all__ = [
    "DecodePlan", "dense_decode", "dense_prefill", "dense_prefill_ragged", "SparsePlan",
    "sparse_decode", "sparse_prefill",
    "indexer_logits", "indexer_logits_paged", "indexer_logits_ragged", "topk_indices",
    "dsa_decode_step",
]
