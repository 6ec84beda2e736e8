"""Kernel block sizes measured fastest on real chips: what a strategy's `block_q: auto` / `block_kv: auto` become.

Pure Python (no jax): TrialSpec resolves `auto` when it is built, so the planner prices, the trial id hashes and
the job runs the same integers. Rows come from benchmarks/chip.py's splash sweep on the chip (forward and
backward of one causal call, docs/results/v5e.md); a chip, kernel or head_dim without rows keeps DEFAULT_BLOCK.
"""

from __future__ import annotations

import math

AUTO = "auto"
DEFAULT_BLOCK = 512
# (kernel, accelerator) -> head_dim -> ((tokens per kernel call, fastest block), ...), measured on the chip.
# v5e (Ray's v5litepod), splash forward + backward, 16 q / 8 kv heads, 2026-12-07: 1024-token blocks beat 512 by
# 13-22 % at 8K and 32K; 2048 does not compile (the kernel's scoped VMEM), 128-256 are 2-6x slower.
BLOCKS: dict[tuple[str, str], dict[int, tuple[tuple[int, int], ...]]] = {
    ("splash", "v5litepod"): {128: ((8192, 1024), (32768, 1024))},
}
# splash's fused backward (dq computed inside the dK/dV kernel) was 13-15 % faster on the chip, but it writes one
# partial dq per key block and sums them after: (keys / block_kv) x q's size in bf16, a transient that grows with
# the square of the length. The job fuses where those partials stay within this many bytes (the planner counts
# them: orchestrator/plan/memory.py), the two-kernel backward elsewhere (a 131,072-token call of 8 heads with
# 512-blocks needs 64 GiB of them: the chip refused it at 65.07G).
FUSED_DQ_BYTES = 2**32


def block(kernel: str, accelerator: str, head_dim: int, tokens: int) -> int:
    """The measured fastest block for a call over `tokens` queries (the row of the nearest length, by ratio),
    else DEFAULT_BLOCK."""
    rows = BLOCKS.get((kernel, accelerator), {}).get(head_dim)
    if not rows:
        return DEFAULT_BLOCK
    _, best = min(rows, key=lambda r: abs(math.log(r[0] / max(tokens, 1))))
    return best


def concrete(value: int | str) -> int:
    """A block size as a kernel takes it: `auto` outside a TrialSpec (which resolves it by the chip) is the
    default."""
    return DEFAULT_BLOCK if value == AUTO else int(value)


def fused_dq_bytes(rows: int, heads: int, q_tokens: int, kv_tokens: int, block_kv: int, head_dim: int) -> int:
    """Bytes of the partial dq a fused splash backward writes for one call (head_dim in TPU lanes of 128)."""
    lanes = -(-head_dim // 128) * 128
    return max(kv_tokens // max(block_kv, 1), 1) * rows * heads * q_tokens * lanes * 2


def fused_backward(
    rows: int, heads: int, q_tokens: int, kv_tokens: int, block_kv: int, head_dim: int
) -> bool:
    """Whether splash's backward runs fused for a call of these sizes (FUSED_DQ_BYTES)."""
    return fused_dq_bytes(rows, heads, q_tokens, kv_tokens, block_kv, head_dim) <= FUSED_DQ_BYTES
