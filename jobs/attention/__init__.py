"""Context-parallel attention: all_gather, ulysses, ring, usp behind one `attention(...)` call."""

from jobs.attention.api import attention
from jobs.attention.core import merge
from jobs.attention.kernels import KERNELS, Kernel, attend, get_kernel
from jobs.attention.layout import from_zigzag, to_zigzag
from jobs.attention.reference import reference_attention
from jobs.strategies.rules import sequence_axes, validate, zigzag_permutation

__all__ = [
    "KERNELS",
    "Kernel",
    "attend",
    "attention",
    "from_zigzag",
    "get_kernel",
    "merge",
    "reference_attention",
    "sequence_axes",
    "to_zigzag",
    "validate",
    "zigzag_permutation",
]
