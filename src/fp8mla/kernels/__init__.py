"""@triton.jit kernels only; the launchers that validate inputs and pick grids live in fp8mla.ops
and fp8mla.cache."""
