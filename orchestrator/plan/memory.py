"""Analytic per-device HBM of one train step (jobs/step.py), term by term, before any device is asked for."""

from __future__ import annotations

from jobs import strategies
from jobs.spec import ModelSpec, TrialSpec, residuals
from jobs.strategies.base import BF16, FP32, Local

# Mirrors jobs.model.LOSS_CHUNK (not imported: that pulls in jax): jobs/model.loss_fn unembeds each device's
# local sequence in chunks of this many tokens; unchunked, the logits are the largest term at 14M tokens.
LOSS_CHUNK_TOKENS = 8192


def local_sizes(spec: TrialSpec) -> Local:
    m, mesh = spec.model, spec.mesh
    T = mesh.tensor
    s = strategies.get(spec.strategy.name)
    P = s.cp(mesh.shape())
    U, R = s.degrees(mesh.shape())
    dp = mesh.data * mesh.fsdp * max(spec.train.grad_accum, 1)
    return Local(
        B=max(spec.train.batch // dp, 1), Ll=max(spec.context_length // P, 1), L=spec.context_length, P=P,
        U=U, R=R, T=T, S=mesh.size, hq=max(m.q_heads // T, 1), hkv=max(m.kv_heads // T, 1),
        M=max(m.mlp // T, 1), V=max(m.vocab // T, 1), D=m.head_dim,
    )  # fmt: skip


def layer_params(m: ModelSpec) -> int:
    return m.embed * m.head_dim * (2 * m.q_heads + 2 * m.kv_heads) + 3 * m.embed * m.mlp + 2 * m.embed


def attention_bytes(spec: TrialSpec, x: Local | None = None) -> int:
    """Transient bytes of the strategy's attention for one layer (its registry entry's term)."""
    s = spec.strategy
    return strategies.get(s.name).attention_bytes(x or local_sizes(spec), s.block_q, s.block_kv)


def breakdown(spec: TrialSpec, *, loss_chunk_tokens: int | None = None) -> dict[str, int]:
    """Per-device bytes by term; `peak` combines them into the predicted HBM high-water mark of one step."""
    m, x = spec.model, local_sizes(spec)
    n, E, D, N = m.n_params(), m.embed, m.head_dim, m.layers
    tok, remat = x.tokens, spec.train.remat
    # Residuals of one layer per token, what backward needs: norm outputs and mid residual (E-sized),
    # roped q, k and v, attention out (bf16) and lse (fp32), gate and up and their product (M-sized).
    res = 3 * E * BF16 + (2 * x.hq + 2 * x.hkv) * D * BF16 + x.hq * FP32 + 3 * x.M * BF16
    # Backward of one layer: gradients flowing through the MLP (3 x M) and residual stream, dq/dk/dv.
    grad_ws = 3 * x.M * BF16 + 2 * E * FP32 + (x.hq + 2 * x.hkv) * D * BF16
    # Bytes per token per layer of jobs/model.py's checkpoint names; what the remat preset plus train.memory keep
    # in HBM is `saved`, what they move to pinned host memory `host_tok` (counted in host_offload, not HBM).
    named = {"layer_input": E * BF16, "attn_out": x.hq * D * BF16 + x.hq * FP32, "mlp_act": x.M * BF16}
    mem = spec.train.memory
    if remat == "none":
        saved, host_tok = E * BF16 + res, 0
    else:
        kept, moved = residuals(remat, mem)
        # the layer input is the scanned layer's own input: kept in HBM unless offloaded
        saved = (0 if "layer_input" in moved else E * BF16) + sum(
            named[k] for k in kept if k != "layer_input"
        )
        host_tok = sum(named[k] for k in moved)
    working = grad_ws + (0 if remat == "none" else res)
    chunk = LOSS_CHUNK_TOKENS if loss_chunk_tokens is None else loss_chunk_tokens
    lt = min(tok, chunk) if chunk > 0 else tok
    gathered_layer = layer_params(m) // x.T
    emb = (1 if m.tie_embeddings else 2) * m.vocab * E // x.T  # the embedding and unembedding tables
    return {
        # fp32 master params, fp32 grads and AdamW mu, nu: sharded over every mesh axis (FSDP x tensor).
        "params": n * FP32 // x.S,
        "grads": n * FP32 // x.S,
        # train.memory.host=[optimizer]: AdamW's moments live in pinned host memory; only the update reads them
        # (TPU compile of a 130M model: HBM peak -150 MiB for 124 MiB of moments). Params on host save nothing
        # during the step (they come to device for it), so they stay counted here.
        "optimizer": 0 if "optimizer" in mem.host else 2 * n * FP32 // x.S,
        "batch": 4 * x.B * x.Ll * 4,
        # What the forward leaves for backward: alive from the last layer until the first one's backward.
        "saved_activations": N * tok * saved,
        "host_offload": N * tok * host_tok
        + sum(k * n * FP32 // x.S for part, k in (("optimizer", 2), ("params", 1)) if part in mem.host),
        # Loss phase: one chunk's logits in fp32 and their gradient (the bf16 matmul output shares a slot with
        # them: the TPU compile of tpu7x_128 at 1M holds bf16[8192,128256] + f32[1,8192,128256] in one 3.91 GiB
        # slot, f32[1,8192,128256] in another). Both tables gathered in bf16 twice (the all-gather's flat
        # buffer and each table as laid out for its use) and their fp32 gradients whole before reduce-scatter.
        "logits": lt * x.V * 2 * FP32,
        "gathered_embeddings": emb * (2 * BF16 + FP32),
        # Layer phase (backward of one layer): FSDP gathers it in bf16 and prefetches the next; its fp32
        # grads exist before reduce-scatter; the recomputed residuals and the attention's transients.
        "gathered_weights": gathered_layer * (2 * BF16 + FP32),
        "layer_working_set": tok * working,
        "attention": attention_bytes(spec, x),
    }


PERSISTENT = ("params", "grads", "optimizer", "batch", "saved_activations")
LOSS_PHASE = ("logits", "gathered_embeddings")
LAYER_PHASE = ("gathered_weights", "layer_working_set", "attention")


def peak(b: dict[str, int]) -> int:
    """Peak = what lives through the step plus the larger phase: the loss's logits are freed before any
    layer's backward starts, so the two phases never add up."""
    return sum(b[k] for k in PERSISTENT) + max(sum(b[k] for k in LOSS_PHASE), sum(b[k] for k in LAYER_PHASE))


def total(spec: TrialSpec, **kw) -> int:
    return peak(breakdown(spec, **kw))


def gib(b: float) -> str:
    return f"{b / 2**30:,.1f} GiB"
