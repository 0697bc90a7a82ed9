"""The CPU backend: Numba kernels (compiled lazily, cached) and vectorized NumPy."""
