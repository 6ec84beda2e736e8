"""Analytic per-device HBM of one train step (jobs/step.py), term by term, before any device is asked for."""

from __future__ import annotations

import dataclasses

from jobs import strategies, tuning
from jobs.spec import ModelSpec, TrialSpec, loss_chunk_tokens, residuals
from jobs.strategies.base import BF16, FP32, Local, Reach

LANES = 128  # a TPU vector register's lanes: the tile of an array's minor dimension in HBM


def _lanes(n: int) -> int:
    return -(-n // LANES) * LANES


def local_sizes(spec: TrialSpec) -> Local:
    m, mesh = spec.model, spec.mesh
    T = mesh.tensor
    s = strategies.get(spec.strategy.name)
    P = s.cp(mesh.shape())
    U, R = s.degrees(mesh.shape())
    dp = mesh.data * mesh.fsdp * max(spec.train.grad_accum, 1)
    return Local(
        B=max(spec.train.batch // dp, 1),
        Ll=max(spec.context_length // P, 1),
        L=spec.context_length,
        P=P,
        U=U,
        R=R,
        T=T,
        S=mesh.size,
        hq=max(m.q_heads // T, 1),
        hkv=max(m.kv_heads // T, 1),
        M=max(m.mlp // T, 1),
        V=max(m.vocab // T, 1),
        D=m.head_dim,
    )


def layer_params(m: ModelSpec) -> int:
    return m.embed * m.head_dim * (2 * m.q_heads + 2 * m.kv_heads) + 3 * m.embed * m.mlp + 2 * m.embed


def layer_reaches(spec: TrialSpec) -> tuple[tuple[str, int, Reach], ...]:
    """(layer type, layers of it, how far back its queries see) per type of model.attention_pattern, in
    first-seen order: a window or chunk that covers the whole row is global (Reach.of), as the job runs it."""
    m, L = spec.model, spec.context_length
    sizes = {"local": (m.window, 0), "chunked": (0, m.chunk)}
    return tuple((k, n, Reach.of(*sizes.get(k, (0, 0)), L)) for k, n in m.layer_counts())


def layer_spec(spec: TrialSpec, kind: str) -> TrialSpec:
    """The trial as a layer of type `kind` runs it: with strategy.local, the local and chunked layers' strategy
    (the same mesh and token order, jobs/strategies/rules.mix_problem)."""
    name = spec.strategy.for_layer(kind)
    if name == spec.strategy.name:
        return spec
    return dataclasses.replace(spec, strategy=dataclasses.replace(spec.strategy, name=name))


def attention_bytes(spec: TrialSpec, x: Local | None = None) -> int:
    """Transient bytes of the strategy's attention for one layer (its registry entry's term): the largest
    over the model's layer types (a window's halo holds less than a whole gather), each under its strategy."""
    s = spec.strategy
    out = 0
    for kind, _, reach in layer_reaches(spec):
        here = layer_spec(spec, kind)
        sizes = x if here is spec and x is not None else local_sizes(here)
        strategy = strategies.get(here.strategy.name)
        out = max(out, strategy.attention_bytes(sizes, s.block_q, s.block_kv, reach, s.layout))
    return out


def pattern_copies(m: ModelSpec) -> int:
    """Parameters of the layers a partial pattern's scan takes as a slice (0 where the pattern divides them)."""
    k = len(m.attention_pattern)
    return 0 if k <= 1 or m.layers % k == 0 else m.layers // k * k * layer_params(m)


def fused_dq(spec: TrialSpec, x: Local) -> int:
    """The partial dq of a fused splash backward, where the job fuses it (a call of the device's tokens)."""
    if spec.kernel != "splash":
        return 0
    n = spec.call_tokens
    args = (x.B, x.hq, n, n, int(spec.strategy.block_kv), spec.model.head_dim)
    return tuning.fused_dq_bytes(*args) if tuning.fused_backward(*args) else 0


def breakdown(spec: TrialSpec, *, chunk_tokens: int | None = None) -> dict[str, int]:
    """Per-device bytes by term; `peak` combines them into the predicted HBM high-water mark of one step.

    Held against the TPU compiler's own peak for the chip (memory_analysis's peak_memory_in_bytes, the figure
    it refuses by; benchmarks/aot.py), not its argument + output - alias + temp, whose temporaries carry
    allocator slack that grows with the HBM the compiler is given (docs/results/aot.md)."""
    m, unpadded = spec.model, local_sizes(spec)
    lanes = _lanes if spec.cluster.platform == "tpu" else int
    # On TPU an array's minor dimension is laid out in tiles of LANES: a 64-wide embedding or 16-wide head takes
    # the room of 128, and a per-head fp32 row ([.., H]) the room of 128 heads. The attention's own transients
    # keep their fit to the compiles (`attention_bytes` on the unpadded sizes: each kernel lays out its tiles).
    x = dataclasses.replace(unpadded, D=lanes(unpadded.D), M=lanes(unpadded.M))
    n, E, D, N = m.n_params(), lanes(m.embed), x.D, m.layers
    tok, remat = x.tokens, spec.train.remat
    # Residuals of one layer per token, what its backward reads: on the attention's side the norm output,
    # roped q, k and v, the attention out (bf16) and its lse (fp32); on the MLP's the mid residual and its
    # norm output, gate and up and their product.
    attn_res = E * BF16 + (2 * x.hq + 2 * x.hkv) * D * BF16 + lanes(x.hq) * FP32
    mlp_res = 2 * E * BF16 + 3 * x.M * BF16
    # Bytes per token per layer of jobs/model.py's checkpoint names; what the remat preset plus train.memory keep
    # in HBM is `saved`, what they move to pinned host memory `host_tok` (counted in host_offload, not HBM).
    named = {"layer_input": E * BF16, "attn_out": x.hq * D * BF16 + lanes(x.hq) * FP32, "mlp_act": x.M * BF16}
    mem = spec.train.memory
    moved: tuple[str, ...] = ()
    if remat == "none":
        saved, host_tok = E * BF16 + attn_res + mlp_res, 0
    else:
        kept, moved = residuals(remat, mem)
        # the layer input is the scanned layer's own input: kept in HBM unless offloaded
        saved = (0 if "layer_input" in moved else E * BF16) + sum(
            named[k] for k in kept if k != "layer_input"
        )
        host_tok = sum(named[k] for k in moved)
    # What one layer's backward holds per token beside its attention's transients: the residual stream's gradient
    # (fp32) and, under remat, the MLP's recomputed residuals (the attention's own are its kernel's inputs);
    # without remat they are saved, and the backward's gradients (gate's, up's, the product's) take their place.
    # Offloaded layer inputs come back through no buffer of their own: a model with four staging buffers per
    # token was above what libtpu fits tpu7x_128 ring at 14M into (docs/results/aot.md, remat=offload).
    layer_tok = E * FP32 + (3 * x.M * BF16 if remat == "none" else mlp_res)
    lt = loss_chunk_tokens(x.Ll, x.B, x.V) * x.B if chunk_tokens is None else min(tok, chunk_tokens) or tok
    table = m.vocab * E // x.T * BF16  # one vocab x embed table in bf16, what a device holds of it
    return {
        # fp32 master params, fp32 grads and AdamW mu, nu: sharded over every mesh axis (FSDP x tensor). The grads
        # are the backward's accumulators: they exist from the last layer's backward on, not in the loss phase.
        "params": n * FP32 // x.S,
        "grads": n * FP32 // x.S,
        # train.memory.host=[optimizer]: AdamW's moments live in pinned host memory; only the update reads them
        # (TPU compile of a 130M model: HBM peak -150 MiB for 124 MiB of moments). Params on host save nothing
        # during the step (they come to device for it), so they stay counted here.
        "optimizer": 0 if "optimizer" in mem.host else 2 * n * FP32 // x.S,
        # a layer pattern that does not divide the layers (Gemma 3 1B: 26 over 6): jobs/model.layers_in_pattern
        # scans a slice of the stacked fp32 params, a copy, and its gradient comes back as one more (the v5e
        # compile of Gemma 3 1B: 5 x f32[4,6,6912,1152] beside the [26, ...] params)
        "pattern_copies": pattern_copies(m) * 2 * FP32 // x.S,
        # the whole step's batch is resident; grad_accum splits what one pass of the model sees
        "batch": 4 * x.B * max(spec.train.grad_accum, 1) * x.Ll * 4,
        # grad_accum > 1: jobs/step.py sums each microbatch's fp32 gradients into an accumulator of its own
        "grad_accumulator": n * FP32 // x.S if spec.train.grad_accum > 1 else 0,
        # What the forward leaves for backward: alive from the last layer until the first one's backward.
        "saved_activations": N * tok * saved,
        "host_offload": N * tok * host_tok
        + sum(k * n * FP32 // x.S for part, k in (("optimizer", 2), ("params", 1)) if part in mem.host),
        # Loss phase (jobs/model.loss_fn's chunk scan and its backward), as the TPU compiles hold it (live ranges
        # of the tpu7x_128 and v5p_128 compiles at 131,072 and 1,048,576 tokens): the unembedding table gathered in
        # bf16 throughout; while a chunk is unembedded, its fp32 logits and their gradient (the bf16 matmul output
        # shares their slot) with the last layer's output and its fp32 gradient; at the end, the table's gradient
        # summed over the local tokens as a whole bf16 table, its copy reduced across devices, and the last
        # chunk's logit gradient in bf16.
        "unembedding": table,
        "logits": lt * x.V * 2 * FP32,
        "loss_activations": tok * E * (BF16 + FP32),
        "unembedding_grad": table,
        "unembedding_grad_reduced": table,
        "logits_grad": lt * x.V * BF16,
        # Layer phase (backward of one layer): FSDP gathers its weights in bf16, and their gradients stay bf16 until
        # reduce-scattered (the cast precedes the gather: bf16[4096,14336] gradients in the 14M compile); the
        # recomputed residuals and the attention's transients (kernel, travelling K/V). The unembedding's
        # gradient waits here for the update (both clusters' compiles keep one whole table of it).
        "gathered_weights": layer_params(m) // x.T * (BF16 + BF16),
        "layer_working_set": tok * layer_tok,
        "attention": attention_bytes(spec, unpadded),
        # splash's fused backward: one partial dq per key block, summed after the call (jobs.tuning decides
        # where the job fuses, by these bytes). It lives in the attention's backward, after the MLP's: beside
        # the residual stream's fp32 gradient only, in place of the MLP's residuals and the two-kernel
        # backward's accumulators (Qwen3 0.6B at 32K on a v5e: 15.67 GiB fused, 13.33 with two kernels, for
        # 4.0 GiB of partials)
        "fused_dq": fused_dq(spec, x),
        "stream_grad": tok * E * FP32,
        # Update phase (after the backward, activations gone): the params, the grads and AdamW's moments;
        # train.memory.host=[optimizer] brings the moments to the device for it (Qwen3 0.6B on a v5e chip: an
        # 8.66 GiB program for 2.22 GiB of params, as much of grads and 4.44 of moments).
        "optimizer_on_device": 2 * n * FP32 // x.S if "optimizer" in mem.host else 0,
    }


PERSISTENT = ("params", "optimizer", "batch", "grad_accumulator", "saved_activations", "pattern_copies")
LAYER_PHASE = ("grads", "unembedding_grad", "gathered_weights")
UPDATE_PHASE = ("params", "optimizer", "batch", "grad_accumulator", "grads", "optimizer_on_device")


def loss_phase(b: dict[str, int]) -> int:
    """The table throughout, and the larger of its two moments: a chunk's logits, or the table's gradient."""
    unembed = b["logits"] + b["loss_activations"]
    reduce = b["unembedding_grad"] + b["unembedding_grad_reduced"] + b["logits_grad"]
    return b["unembedding"] + max(unembed, reduce)


def layer_phase(b: dict[str, int]) -> int:
    """One layer's backward: what it holds throughout, and the larger of its MLP's and its attention's parts."""
    mlp_then_attention = b["layer_working_set"] + b["attention"]
    fused = b["fused_dq"] + b["stream_grad"] if b["fused_dq"] else 0
    return sum(b[k] for k in LAYER_PHASE) + max(mlp_then_attention, fused)


def update_phase(b: dict[str, int]) -> int:
    return sum(b[k] for k in UPDATE_PHASE)


def peak(b: dict[str, int]) -> int:
    """Peak = what lives through the forward and backward plus the larger of their phases (the loss's logits are
    freed before any layer's backward starts, so the two never add up), or the update's, whichever is more."""
    return max(sum(b[k] for k in PERSISTENT) + max(loss_phase(b), layer_phase(b)), update_phase(b))


def total(spec: TrialSpec, **kw) -> int:
    return peak(breakdown(spec, **kw))


def gib(b: float) -> str:
    return f"{b / 2**30:,.1f} GiB"
