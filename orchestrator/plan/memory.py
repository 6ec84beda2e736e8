"""Analytic per-device HBM of one train step (jobs/step.py), term by term, before any device is asked for."""

from __future__ import annotations

from dataclasses import dataclass

from jobs.spec import ModelSpec, TrialSpec

# Mirrors jobs.model.LOSS_CHUNK (not imported: that pulls in jax): jobs/model.loss_fn unembeds each device's
# local sequence in chunks of this many tokens; unchunked, the logits are the largest term at 14M tokens.
LOSS_CHUNK_TOKENS = 8192
BF16, FP32 = 2, 4
TILE_BYTES = 15  # per score element of the attention kernel's working tile, see _kernel


@dataclass(frozen=True)
class Local:
    """Per-device sizes of one trial: what the memory and comm models are written in."""

    B: int  # sequences per device per microbatch
    Ll: int  # tokens per device along the sequence (L / P)
    L: int
    P: int  # context-parallel degree (all sequence axes)
    U: int  # Ulysses degree (ulysses: P; usp: context_ulysses; else 1)
    R: int  # ring degree (ring: P; usp: context; else 1)
    T: int  # tensor
    S: int  # mesh size
    hq: int  # q heads per device after tensor sharding
    hkv: int  # kv heads per device after tensor sharding
    M: int  # mlp width per device after tensor sharding
    V: int  # vocab per device after tensor sharding

    @property
    def tokens(self) -> int:
        return self.B * self.Ll


def local_sizes(spec: TrialSpec) -> Local:
    m, mesh, name = spec.model, spec.mesh, spec.strategy.name
    T, P = mesh.tensor, mesh.cp
    dp = mesh.data * mesh.fsdp * max(spec.train.grad_accum, 1)
    U = {"ulysses": mesh.context, "usp": mesh.context_ulysses}.get(name, 1)
    R = {"ring": mesh.context, "all_gather": mesh.context, "usp": mesh.context}.get(name, 1)
    return Local(
        B=max(spec.train.batch // dp, 1), Ll=max(spec.context_length // P, 1), L=spec.context_length, P=P,
        U=U, R=R, T=T, S=mesh.size, hq=max(m.q_heads // T, 1), hkv=max(m.kv_heads // T, 1),
        M=max(m.mlp // T, 1), V=max(m.vocab // T, 1),
    )  # fmt: skip


def layer_params(m: ModelSpec) -> int:
    return m.embed * m.head_dim * (2 * m.q_heads + 2 * m.kv_heads) + 3 * m.embed * m.mlp + 2 * m.embed


def _kernel(x: Local, tq: int, tk: int, hq: int, hkv: int, D: int, block_q: int, block_kv: int) -> int:
    """The blockwise kernel on tq queries x tk keys: fp32 out/dq accumulators, fp32 dk/dv, one score tile.

    The tile is one (block_q, block_kv) pair's scores, probabilities, dP and dS (fp32) and causal mask; the
    TPU compiler fuses some of them: 15 bytes per element fits its compiles of ring, all_gather and usp
    (13-17 seen; ulysses compiles to ~6).
    """
    acc = x.B * (tq * hq * (2 * D + 1) * FP32 + tk * hkv * 2 * D * FP32)
    tile = x.B * hq * min(block_q, tq) * min(block_kv, tk) * TILE_BYTES
    return acc + tile


def full_kv_bytes(spec: TrialSpec) -> int:
    """K and V of the whole sequence for one layer in bf16 (what all_gather puts on every device)."""
    x = local_sizes(spec)
    return 2 * x.B * x.L * x.hkv * spec.model.head_dim * BF16


def attention_bytes(spec: TrialSpec, x: Local | None = None) -> int:
    """Transient bytes of the strategy's attention for one layer (the larger of forward and backward)."""
    x = x or local_sizes(spec)
    s, D = spec.strategy, spec.model.head_dim
    bq, bk = s.block_q, s.block_kv
    kv_elem = x.B * x.hkv * D  # one token's K (or V) on this device, times batch
    if s.name == "all_gather":
        # Every device holds the whole sequence's K,V (bf16), and in backward their full fp32 gradients.
        return 2 * x.L * kv_elem * BF16 + _kernel(x, x.Ll, x.L, x.hq, x.hkv, D, bq, bk)
    if s.name in ("ulysses", "usp"):
        hq_u = max(x.hq // x.U, 1)
        hkv_u = max(x.hkv // x.U, 1)  # fewer kv heads than U: each device gets one replicated head
        tr = x.L // x.R  # tokens per device after the all-to-all (whole sequence for ulysses)
        # q, k, v, out in the head layout, plus the all-to-all's send buffers of the same size.
        a2a = 2 * x.B * tr * (2 * hq_u + 2 * hkv_u) * D * BF16
        ring = 2 * x.B * tr * hkv_u * D * (2 * BF16 + 2 * FP32) if s.name == "usp" and x.R > 1 else 0
        return a2a + ring + _kernel(x, tr, tr, hq_u, hkv_u, D, bq, bk)
    if s.name == "ring":
        # Two blocks in flight (current + next); in backward K,V (bf16) travel with dK,dV (fp32).
        return 2 * x.Ll * kv_elem * (2 * BF16 + 2 * FP32) + _kernel(x, x.Ll, x.Ll, x.hq, x.hkv, D, bq, bk)
    return _kernel(x, x.Ll, x.Ll, x.hq, x.hkv, D, bq, bk)  # none: local attention over the whole sequence


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
    saved = {
        "full": E * BF16,
        "save_attn": E * BF16 + x.hq * D * BF16 + x.hq * FP32,
        "none": E * BF16 + res,
        "offload": 0,  # layer inputs live in pinned host memory (counted in host_offload, not HBM)
    }.get(remat, E * BF16)
    working = grad_ws + (0 if remat == "none" else res)
    chunk = LOSS_CHUNK_TOKENS if loss_chunk_tokens is None else loss_chunk_tokens
    lt = min(tok, chunk) if chunk > 0 else tok
    gathered_layer = layer_params(m) // x.T
    emb = m.vocab * E // x.T
    return {
        # fp32 master params, fp32 grads and AdamW mu, nu: sharded over every mesh axis (FSDP x tensor).
        "params": n * FP32 // x.S,
        "grads": n * FP32 // x.S,
        "optimizer": 2 * n * FP32 // x.S,
        "batch": 4 * x.B * x.Ll * 4,
        # What the forward leaves for backward: alive from the last layer until the first one's backward.
        "saved_activations": N * tok * saved,
        "host_offload": N * tok * E * BF16 if remat == "offload" else 0,
        # Loss phase: logits in bf16 from the matmul, fp32 for the loss, their gradient; the unembedding
        # gathered in bf16 and its gradient whole before reduce-scatter.
        "logits": lt * x.V * (BF16 + 2 * FP32),
        "gathered_embeddings": emb * (BF16 + FP32),
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
