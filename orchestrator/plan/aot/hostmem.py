"""The host memory one TPU compile of the train step needs: what its Ray task reserves (`memory=`), so a node runs
only as many compiles at once as its memory holds."""

from __future__ import annotations

from jobs.spec import TrialSpec

GIB = 2**30
# Max RSS of one compile process (python, jax, libtpu, the lowering and the compile), measured with jax 0.10.2 and
# libtpu 0.0.42.1 on a 2-core host, against tokens x model width (the activations' size, global):
#   tiny (width 64), tpu7x 2x2x1, ring:          2,048 tokens 1.0 GiB; 262,144: 1.8 GiB; 1,048,576: 1.9 GiB
#   Llama 3.1 8B widths, 2 layers, tpu7x 2x2x1:  65,536 tokens 2.3 GiB
#   llama3_1_8b_long, tpu7x_128 (128 devices):   131,072 tokens 2.2 GiB (186 s)
#   Llama 3.1 8B, 64-128 devices, 14,680,064 tokens: at most 8.2 GiB over docs/results/aot.md's compiles
# A line through a floor above every small compile and 10 % over the largest: an upper bound of each figure
# above (estimates only; what the compiler really takes varies with the program, not just its size).
FLOOR_BYTES = int(2.5 * GIB)
ANCHOR_TOKENS, ANCHOR_WIDTH, ANCHOR_BYTES = 14_680_064, 4096, 9 * GIB
PER_TOKEN_WIDTH = (ANCHOR_BYTES - FLOOR_BYTES) / (ANCHOR_TOKENS * ANCHOR_WIDTH)  # ~0.12 bytes


def compile_host_bytes(spec: TrialSpec, cap: int | None = None) -> int:
    """Host bytes a compile of `spec` needs: FLOOR_BYTES, plus PER_TOKEN_WIDTH per token of the global batch
    and unit of model width; monotone in context length. Capped at `cap` (the largest node's memory): a compile
    asking for more than any node has would wait forever, while one that merely may not fit still gets a node
    to itself and a chance."""
    tokens = spec.train.batch * spec.context_length
    need = int(FLOOR_BYTES + PER_TOKEN_WIDTH * tokens * spec.model.embed)
    return min(need, cap) if cap else need
