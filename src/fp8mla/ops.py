"""The public kernel entry points (validated launchers), gathered in one namespace."""

from fp8mla.decode import DecodePlan, dense_decode

__all__ = ["DecodePlan", "dense_decode"]
