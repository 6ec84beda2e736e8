"""Model FLOPs per device per step, MaxText's formula (so our MFU compares with theirs), and peak tables.

Pure arithmetic: no jax import, so the planner uses the same numbers as the job.
"""

from __future__ import annotations

from jobs.spec import ModelSpec

# Peak dense bf16 TFLOP/s per JAX device (a v5p chip is one megacore device; a tpu7x chip is two).
PEAK_TFLOPS_PER_DEVICE: dict[str, float] = {
    "v5p": 459.0,
    "v6e": 918.0,
    "tpu7x": 1153.5,
    "h100": 989.0,
    "h200": 989.0,
    "b200": 2250.0,  # dense bf16 (conf/cluster/dgx_b200.yaml names the source)
}


def layer_flops(model: ModelSpec, length: int) -> tuple[float, float]:
    """Forward FLOPs of one sequence of `length` tokens: (weights part over all layers incl. unembed, attention part)."""
    E, M, D = model.embed, model.mlp, model.head_dim
    ffn = 2 * length * M * E * 2 + 2 * length * M * E  # SwiGLU: gate + up, then down
    qkv = 2 * length * E * (model.q_heads + 2 * model.kv_heads) * D
    out = 2 * length * E * model.q_heads * D
    unembed = 2 * length * E * model.vocab
    causal_attention = 0.5 * 4 * length**2 * model.q_heads * D  # exactly half of full attention
    return model.layers * (ffn + qkv + out) + unembed, model.layers * causal_attention


def train_tflops_per_device(model: ModelSpec, length: int, batch: int, devices: int) -> float:
    """Training TFLOPs per device per step: 3x forward (fwd + 2x bwd); remat recompute is not counted."""
    weights, attention = layer_flops(model, length)
    return 3 * (weights + attention) * batch / devices / 1e12
