"""Local attention kernels behind one signature, and a custom-VJP `attend` that every strategy can use.

A kernel is a pair fwd(q, k, v, mask) -> (out, lse), bwd(q, k, v, o, lse, do, mask) -> (dq, dk, dv) over local
arrays; the mask (jobs.attention.kernels.mask.Mask) is one frozen value with the call's true positions (the
causal mask is `q_pos >= kv_pos`, so permuted layouts need no special case), packed documents' segment ids,
sliding window or chunk, the keys' static layout (its Order, for static-mask kernels) and the blocks. "xla" runs
everywhere; hardware kernels (TPU splash, GPU flash) plug in here without touching the strategies. "auto" (the
default) is splash on TPU, flash on GPU, xla elsewhere. A sliding window or chunk (`span`) is a position mask:
xla runs it; splash runs it as one static mask where the call holds the whole sequence (Order.whole: ulysses,
none) and refuses it elsewhere (rules.validate_masks, before any trace); flash falls back to xla; auto picks
splash or xla as splash would allow. Attention sinks need nothing from a kernel: `attend` (and the ring's saved
core) correct the final (out, lse) once (jobs.attention.core.add_sinks), and any kernel's backward given the
corrected pair is right.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import jax

from jobs import spec
from jobs.attention.core import add_sinks, match_varying, sinks_grad
from jobs.attention.kernels.flash import flash_bwd, flash_fwd
from jobs.attention.kernels.mask import Mask
from jobs.attention.kernels.splash import splash_bwd, splash_fwd
from jobs.attention.kernels.xla import xla_bwd, xla_fwd

Arr = jax.Array
FwdFn = Callable[[Arr, Arr, Arr, Mask], tuple[Arr, Arr]]  # (q, k, v, mask) -> (out fp32, lse fp32)
BwdFn = Callable[[Arr, Arr, Arr, Arr, Arr, Arr, Mask], tuple[Arr, Arr, Arr]]  # (q, k, v, o, lse, do, mask)


@dataclass(frozen=True)
class Kernel:
    """fwd(q, k, v, mask) -> (out fp32, lse fp32); bwd(q, k, v, o, lse, do, mask) -> (dq, dk, dv) fp32."""

    name: str
    fwd: FwdFn
    bwd: BwdFn


def _auto(phase: str):
    """splash on TPU, flash on GPU, xla elsewhere.

    lax.platform_dependent keeps only the target platform's branch when lowering, so an AOT compile for a
    TPU topology from a CPU host picks splash too; GPU is chosen on the host (a GPU is compiled where it runs).
    """

    def call(*args):
        mask: Mask = args[-1]
        other = spec.OWN_KERNEL["gpu"] if jax.default_backend() == "gpu" else "xla"
        tpu, rest = getattr(KERNELS[spec.OWN_KERNEL["tpu"]], phase), getattr(KERNELS[other], phase)
        # splash masks are static: balanced positions are data, and a window or chunk is one static mask only
        # where the call holds the whole sequence (ulysses, none); xla everywhere else
        if mask.order.layout == "balanced" or (mask.span.limited and not mask.order.whole):
            tpu = rest = getattr(KERNELS["xla"], phase)
        return jax.lax.platform_dependent(*args, tpu=tpu, default=rest)

    return call


_PAIRS = {
    "xla": (xla_fwd, xla_bwd),
    "splash": (splash_fwd, splash_bwd),
    "flash": (flash_fwd, flash_bwd),
    "auto": (_auto("fwd"), _auto("bwd")),
}
# one per name jobs.spec owns (a name without an implementation fails here, at import)
KERNELS: dict[str, Kernel] = {name: Kernel(name, *_PAIRS[name]) for name in spec.KERNELS}


def get_kernel(name: str) -> Kernel:
    if name not in KERNELS:
        raise ValueError(f"unknown attention kernel {name!r}; use one of {', '.join(KERNELS)}")
    return KERNELS[name]


@partial(jax.custom_vjp, nondiff_argnums=(4,))
def attend(q: Arr, k: Arr, v: Arr, mask: Mask, kernel: str, sinks: Arr | None = None) -> Arr:
    """Attention of local queries q [B, Lq, H, D] over keys k, v [B, Lk, K, D] under `mask` with the kernel
    named `kernel`; out like q. Backward recomputes (saves q, k, v, out, lse). sinks [H] fp32: one sink logit
    per query head, applied once to this call's (out, lse), which must then hold every key the queries see
    (all_gather, ulysses and none call attend once per query)."""
    return _attend_fwd(q, k, v, mask, kernel, sinks)[0]


def _attend_fwd(q, k, v, mask, kernel, sinks=None):
    o, lse = get_kernel(kernel).fwd(q, k, v, mask)
    if sinks is not None:
        o, lse = add_sinks(o, lse, sinks)
    o = o.astype(q.dtype)
    return o, (q, k, v, o, lse, mask, sinks)


def _attend_bwd(kernel, res, do):
    q, k, v, o, lse, mask, sinks = res
    dq, dk, dv = get_kernel(kernel).bwd(q, k, v, o, lse, do, mask)
    dsinks = (
        None if sinks is None else match_varying(sinks_grad(o, lse, do, sinks), sinks).astype(sinks.dtype)
    )
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, dsinks


attend.defvjp(_attend_fwd, _attend_bwd)
