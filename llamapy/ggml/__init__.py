"""Tensor types, quantization, the compute graph and its backends."""

from .types import TRAITS, GGMLType, row_size, traits

__all__ = ["TRAITS", "GGMLType", "row_size", "traits"]
