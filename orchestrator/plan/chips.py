"""The TPU chips the planner and the AOT compile know: libtpu's names for them and JAX devices per chip."""

from __future__ import annotations

# accelerator -> (topology name prefix, chip config, JAX devices per chip): a v5p chip is one megacore device,
# a tpu7x chip two.
CHIPS = {"v5p": ("v5", "megacore", 1), "tpu7x": ("tpu7x", "default", 2)}
