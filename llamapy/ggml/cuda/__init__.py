"""The CUDA backend (Numba CUDA kernels; device memory through CuPy or numba.cuda). Importing this
package imports nothing CUDA-related; ``backend`` and the kernel modules do."""
