"""A compiled program's per-device memory from XLA's memory_analysis, summed in one place.

Pure arithmetic on the analysis object (no jax import): the train job and the control plane's AOT compile
both read it.
"""

from __future__ import annotations

from typing import Any


def compiled_bytes(ma: Any) -> int:
    """argument + output - alias + temp: donated state aliases its output, so the high-water mark is the
    arguments, the fresh outputs and the scratch."""
    return int(
        ma.argument_size_in_bytes + ma.output_size_in_bytes - ma.alias_size_in_bytes + ma.temp_size_in_bytes
    )
