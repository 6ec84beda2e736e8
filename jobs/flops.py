"""Model FLOPs per device per step, MaxText's formula (so our MFU compares with theirs), and peak tables.

Pure arithmetic: no jax import, so the planner uses the same numbers as the job.
"""

from __future__ import annotations

from jobs.spec import ModelSpec

# Peak dense bf16 TFLOP/s per JAX device (a v5p chip is one megacore device; a tpu7x chip is two; a v5e chip,
# `v5litepod` as Ray names it, and a v6e chip are one TensorCore each).
PEAK_TFLOPS_PER_DEVICE: dict[str, float] = {
    "v5p": 459.0,
    "v5litepod": 197.0,  # v5e: docs.cloud.google.com/tpu/docs/v5e
    "v6e": 918.0,
    "tpu7x": 1153.5,
    "h100": 989.0,
    "h200": 989.0,
    "b200": 2250.0,  # dense bf16 (conf/cluster/dgx_b200.yaml names the source)
}


def attention_flops(model: ModelSpec, length: int, kind: str) -> float:
    """Forward attention FLOPs of one layer of type `kind` over one sequence, MaxText's count (its
    calculate_tflops_training_per_device and the Gemma 3 / Llama 4 helpers): half of the non-causal square,
    4 * L * K * Hq * D / 2, where K is the keys a query could see without the causal mask: L (global),
    min(W, L) (a sliding window W: MaxText counts window x L, then halves it like the causal triangle), or its
    own chunk (chunk C: the sum over chunks of their squared lengths, n * C^2 + r^2, then halved)."""
    Hq, D = model.q_heads, model.head_dim
    if kind == "local":
        return 0.5 * 4 * length * min(model.window, length) * Hq * D
    if kind == "chunked":
        n, r = divmod(length, model.chunk)
        return 0.5 * 4 * (n * model.chunk**2 + r**2) * Hq * D
    return 0.5 * 4 * length**2 * Hq * D  # exactly half of full attention


def layer_flops(model: ModelSpec, length: int) -> tuple[float, float]:
    """Forward FLOPs of one sequence of `length` tokens: (weights part over all layers incl. unembed, attention
    part over all layers, each by its type in model.attention_pattern)."""
    E, M, D = model.embed, model.mlp, model.head_dim
    ffn = 2 * length * M * E * 2 + 2 * length * M * E  # gated (SwiGLU or GeGLU): gate + up, then down
    qkv = 2 * length * E * (model.q_heads + 2 * model.kv_heads) * D
    out = 2 * length * E * model.q_heads * D
    unembed = 2 * length * E * model.vocab
    # per type in first-seen order (a set's order would vary the float sum between processes)
    attention = sum(n * attention_flops(model, length, k) for k, n in model.layer_counts())
    return model.layers * (ffn + qkv + out) + unembed, attention


def train_tflops_per_device(model: ModelSpec, length: int, batch: int, devices: int) -> float:
    """Training TFLOPs per device per step: 3x forward (fwd + 2x bwd); remat recompute is not counted."""
    weights, attention = layer_flops(model, length)
    return 3 * (weights + attention) * batch / devices / 1e12
