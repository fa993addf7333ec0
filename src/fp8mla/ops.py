"""The public kernel entry points (validated launchers), gathered in one namespace."""

from fp8mla.decode import DecodePlan, dense_decode
from fp8mla.sparse import SparsePlan, sparse_decode, sparse_prefill

__all__ = ["DecodePlan", "dense_decode", "SparsePlan", "sparse_decode", "sparse_prefill"]
