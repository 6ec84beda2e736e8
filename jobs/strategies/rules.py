"""Context-parallel constraints, in pure Python so the planner and the attention code raise the same errors.

No jax import (not even indirectly): the control plane validates a trial before asking for any device.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from jobs import strategies
from jobs.strategies.base import LAYOUTS, MESH_AXES

# "reference" is the dense fp32 check used by tests and benchmarks; it is not a sweep strategy.
ATTENTION_STRATEGIES = (*strategies.NAMES, "reference")


def _get(strategy: str) -> strategies.Strategy:
    if strategy not in ATTENTION_STRATEGIES:
        raise ValueError(
            f"unknown attention strategy {strategy!r}; use one of {', '.join(ATTENTION_STRATEGIES)}"
        )
    return strategies.get("none" if strategy == "reference" else strategy)


def sequence_axes(strategy: str) -> tuple[str, ...]:
    """Mesh axes the sequence dimension is sharded over, major first."""
    return _get(strategy).axes


def ring_size(strategy: str, mesh: Mapping[str, int]) -> int:
    """Ring positions the strategy's zigzag layout is cut for (the data loader permutes by it)."""
    return _get(strategy).ring_size(mesh)


def mix_problem(strategy: str, local: str, mesh: Mapping[str, int], layout: str) -> str | None:
    """Whether the local and chunked layers may run `local` while the global ones run `strategy` (None: they
    may): both shard the sequence over the same axes (the activations between layers stay where they are) and
    cut it in the same token order (zigzag by the same ring size)."""
    if not local or local == strategy:
        return None
    a, b = _get(strategy), _get(local)
    if a.axes != b.axes:
        return (
            f"strategy.local={local} shards the sequence over {'x'.join(b.axes) or 'nothing'} but strategy "
            f"{strategy} over {'x'.join(a.axes) or 'nothing'}; the layers must share it: mix all_gather, ulysses "
            "and ring, or usp and double_ring"
        )
    if layout != "contiguous" and a.ring_size(mesh) != b.ring_size(mesh):
        return (
            f"strategy.local={local} cuts layout={layout} for {b.ring_size(mesh)} ring positions but {strategy} "
            f"for {a.ring_size(mesh)}: the layers would disagree on the token order; use strategy.layout=contiguous"
        )
    return None


def batch_problem(batch: int, data: int, fsdp: int, grad_accum: int = 1) -> str | None:
    """The one batch rule: `grad_accum` microbatches, each sharded over data x fsdp (None: it divides)."""
    dp, accum = data * fsdp, max(grad_accum, 1)
    if batch % (dp * accum) == 0:
        return None
    return (
        f"batch {batch} is split into grad_accum={accum} microbatches sharded over data*fsdp = {data}*{fsdp}: "
        f"{batch} % {dp * accum} = {batch % (dp * accum)}; use a batch that is a multiple of {dp * accum} or "
        "move devices to context"
    )


def validate(
    strategy: str,
    *,
    context_length: int,
    q_heads: int,
    kv_heads: int,
    mesh: Mapping[str, int],
    layout: str = "contiguous",
    batch: int | None = None,
) -> None:
    """Raise ValueError (one line: the numbers and the fix) if the attention cannot run as configured."""
    s = _get(strategy)
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; use one of {', '.join(LAYOUTS)}")
    size = _sizes(mesh)
    L, hq, hkv, t = int(context_length), int(q_heads), int(kv_heads), size["tensor"]
    _heads(L, hq, hkv, t)
    problem = None if batch is None else batch_problem(batch, size["data"], size["fsdp"])
    if problem:
        raise ValueError(problem)
    if layout not in s.layouts:
        raise ValueError(f"{strategy} does not support layout={layout}; use one of {', '.join(s.layouts)}")
    _sequence(strategy, s, L, size, layout)
    s.check(L=L, hq=hq // t, hkv=hkv // t, size=size, layout=layout)


def _sizes(mesh: Mapping[str, int]) -> dict[str, int]:
    """Every mesh axis's size (1 where not named); raises on an unknown axis or a size below 1."""
    unknown = sorted(set(mesh) - set(MESH_AXES))
    if unknown:
        raise ValueError(f"unknown mesh axes {unknown}; mesh axes are {', '.join(MESH_AXES)}")
    size = {a: int(mesh.get(a, 1)) for a in MESH_AXES}
    bad = {a: s for a, s in size.items() if s < 1}
    if bad:
        raise ValueError(f"mesh axis sizes must be >= 1, got {bad}")
    return size


def _heads(L: int, hq: int, hkv: int, t: int) -> None:
    """Positive sizes, GQA groups that divide, and a tensor axis that divides both head counts."""
    if L < 1 or hq < 1 or hkv < 1:
        raise ValueError(f"need positive sizes, got context_length={L}, q_heads={hq}, kv_heads={hkv}")
    if hq % hkv:
        raise ValueError(
            f"GQA needs q_heads % kv_heads == 0: {hq} % {hkv} = {hq % hkv}; use kv_heads dividing {hq}"
        )
    if hq % t or hkv % t:
        raise ValueError(
            f"tensor={t} shards heads, so it must divide q_heads={hq} and kv_heads={hkv}; "
            f"use a tensor size dividing {np.gcd(hq, hkv)}"
        )


def _sequence(strategy: str, s, L: int, size: dict[str, int], layout: str) -> None:
    """The sequence axes: none idle, a length they divide, and zigzag's two chunks per ring position."""
    seq = s.axes
    # A context axis the strategy does not shard over would replicate its work (none and the reference
    # are exempt: they run the whole sequence anyway, and the reference reads zigzag positions off `context`).
    idle = [(a, n) for a, n in size.items() if n > 1 and a.startswith("context") and a not in seq]
    if seq and idle:
        a, n = idle[0]
        users = [n_ for n_ in strategies.CP_NAMES if a in strategies.get(n_).axes]
        raise ValueError(
            f"{strategy} does not shard over {a}={n} (work would be replicated); set {a}=1"
            + (f" or use strategy={' or '.join(users)}" if users else "")
        )
    cp = int(np.prod([size[a] for a in seq])) if seq else 1
    if L % cp:
        axes = "x".join(f"{a}" for a in seq)
        raise ValueError(
            f"{strategy} shards the sequence over {axes} = {cp}: context_length % {cp} = {L % cp} "
            f"({L}); use a multiple of {cp}"
        )
    r = s.ring_size(size)
    if layout == "zigzag" and L % (2 * r):
        raise ValueError(
            f"{strategy} zigzag needs context_length % (2*{r} ring positions) == 0: {L} % {2 * r} = "
            f"{L % (2 * r)}; use a multiple of {2 * r} or layout=contiguous"
        )


def validate_tokens(
    layout: str,
    kernel: str,
    *,
    positions: bool,
    segment_ids: bool,
    length: int,
    batch: int,
    shapes: list[tuple[int, ...]] = (),
) -> None:
    """Raise ValueError (one line) if packed-document inputs do not fit the layout and kernel: balanced needs
    positions and segment ids, splash cannot run balanced, and each given array is int [B, L]."""
    if layout == "balanced" and not (positions and segment_ids):
        missing = " and ".join(
            n for n, have in (("positions", positions), ("segment_ids", segment_ids)) if not have
        )
        raise ValueError(
            f"layout=balanced is a data-dependent token order: pass {missing} ([B, L] int32, in that order, "
            "from the loader's permutation) or use layout=contiguous / zigzag"
        )
    if layout == "balanced" and kernel == "splash":
        raise ValueError(
            "kernel=splash cannot run layout=balanced (its masks are static, balanced positions are data); "
            "use kernel=xla or kernel=auto (xla for balanced)"
        )
    for s in shapes:
        if tuple(s) != (batch, length):
            raise ValueError(f"positions and segment_ids must be [B, L] = [{batch}, {length}], got {list(s)}")


# Strategies whose kernel calls hold the whole sequence as queries and keys: a window or chunk is then one static
# splash mask (LocalMask, ChunkedCausalMask). A ring hop's or a device block's mask moves with a traced offset.
SPLASH_SPAN_STRATEGIES = ("ulysses", "none")
SPLASH_SPAN = (
    "kernel=splash runs a sliding window or chunk only under ulysses or none, whose calls hold the whole "
    "sequence (a ring hop's or a device block's mask depends on a traced offset, which splash's static "
    "LocalMask / ChunkedCausalMask cannot take); use kernel=auto (xla for those layers) or kernel=xla"
)


def _positive(name: str, value) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int (tokens) or None, got {value!r}")


def validate_masks(
    *,
    causal: bool,
    kernel: str,
    q_heads: int,
    window: int | None = None,
    chunk: int | None = None,
    sinks_shape: tuple[int, ...] | None = None,
    strategy: str = "none",
    length: int | None = None,
) -> None:
    """Raise ValueError (one line) if a sliding window, chunked attention or attention sinks cannot run as
    given: window and chunk are positive ints, never both (no model we know stacks them on one layer; pass the
    one the layer has), and only causal; sinks are one logit per query head [q_heads]; splash takes a window or
    chunk shorter than the row (`length`; a longer one is global) only under SPLASH_SPAN_STRATEGIES."""
    _positive("window", window)
    _positive("chunk", chunk)
    if window is not None and chunk is not None:
        raise ValueError(
            f"window={window} and chunk={chunk} are two different masks; pass one of them (a sliding-window "
            "layer or a chunked one)"
        )
    if (window is not None or chunk is not None) and not causal:
        what = f"window={window}" if window is not None else f"chunk={chunk}"
        raise ValueError(f"{what} limits how far back a causal query sees; pass causal=True or drop it")
    if sinks_shape is not None and tuple(sinks_shape) != (q_heads,):
        raise ValueError(
            f"sinks are one logit per query head: shape [q_heads] = [{q_heads}], got {list(sinks_shape)}"
        )
    limited = any(n is not None and (length is None or n < length) for n in (window, chunk))
    if kernel == "splash" and limited and strategy not in SPLASH_SPAN_STRATEGIES:
        raise ValueError(SPLASH_SPAN)


def validate_dcn(strategy: str, *, mesh: Mapping[str, int], dcn: str, slices: int) -> None:
    """Raise ValueError (one line: the reason and the fix) if the mesh cannot span `slices` slices with the axis
    `dcn` laid across them (its outer factor indexes the slice). One slice: nothing crosses, nothing to check."""
    if slices <= 1:
        return
    s = _get(strategy)
    if not dcn:
        raise ValueError(
            f"the trial spans {slices} slices (cluster.slices_per_trial={slices}) but mesh.dcn names no axis to "
            f"lay across them; set mesh.dcn to one of {', '.join(s.dcn_axes)} ({strategy} allows these)"
        )
    if dcn not in MESH_AXES:
        raise ValueError(f"unknown mesh.dcn axis {dcn!r}; mesh axes are {', '.join(MESH_AXES)}")
    why = s.dcn_refusal(dcn)
    if why:
        # the strategies that shard over dcn and may lay it across slices (the refused one's own axes don't matter)
        rings = [n for n in strategies.CP_NAMES if dcn in (c := strategies.get(n)).axes and dcn in c.dcn_axes]
        alt = f", or strategy={' / '.join(rings)}, which may lay {dcn} across slices" if rings else ""
        raise ValueError(f"{strategy} cannot lay {dcn} across slices: {why}{alt}")
    n = int(mesh.get(dcn, 1))
    if n % slices:
        raise ValueError(
            f"mesh.dcn={dcn}: {dcn}={n} is not a multiple of slices_per_trial={slices} (its outer factor indexes "
            f"the slice); use {dcn} a multiple of {slices}"
        )


def zigzag_permutation(length: int, ring_size: int) -> np.ndarray:
    """Natural token index at each position of the zigzag layout (apply as x[:, perm]).

    The sequence is cut into 2R chunks; ring device r holds chunks r and 2R-1-r, so causal work is equal on
    every device. R=1 is the identity.
    """
    if length % (2 * ring_size):
        raise ValueError(
            f"zigzag needs length % (2*ring_size) == 0: {length} % {2 * ring_size} = {length % (2 * ring_size)}; "
            f"use a multiple of {2 * ring_size}"
        )
    c = length // (2 * ring_size)
    chunks_C = np.arange(2 * ring_size * c, dtype=np.int64).reshape(2 * ring_size, c)
    order = [i for r in range(ring_size) for i in (r, 2 * ring_size - 1 - r)]
    return chunks_C[order].reshape(-1)


def inverse_permutation(perm: np.ndarray) -> np.ndarray:
    """inv with inv[perm[i]] = i, to bring zigzag outputs back to natural order (x[:, inv])."""
    perm = np.asarray(perm)
    inv = np.empty_like(perm)
    inv[perm] = np.arange(perm.size, dtype=perm.dtype)
    return inv
