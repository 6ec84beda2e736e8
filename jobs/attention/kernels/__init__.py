"""Local attention kernels behind one signature, and a custom-VJP `attend` that every strategy can use.

A kernel is a pair (fwd -> (out, lse), bwd -> (dq, dk, dv)) over local arrays with explicit token positions
(the causal mask is `q_pos >= kv_pos`, so permuted layouts need no special case). Packed documents: a kernel
gets `q_seg`/`kv_seg` [B, L] segment ids, and then per-row positions [B, L], only when the caller has
segment ids (without them the positions are one [L] vector, today's path). "xla" runs everywhere;
hardware kernels (TPU splash, GPU flash) plug in here without touching the strategies. Kernels with static
masks also get `order` (jobs.attention.kernels.hop.Order), which says how the key positions are laid out.
"auto" (the default) is splash on TPU, flash on GPU, xla elsewhere. A sliding window or chunk (`span`) is
a position mask: xla runs it; splash runs it as one static mask where the call holds the whole sequence
(Order.whole: ulysses, none) and refuses it elsewhere (cp_rules.validate_masks, before any trace); flash falls
back to xla; auto picks splash or xla as splash would allow. Attention sinks need nothing from a kernel: `attend` (and the ring's
saved core) correct the final (out, lse) once (jobs.attention.core.add_sinks), and any kernel's backward
given the corrected pair is right.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Protocol

import jax

from jobs.attention.core import add_sinks, match_varying, sinks_grad
from jobs.attention.kernels.flash import flash_bwd, flash_fwd
from jobs.attention.kernels.hop import MONOTONIC, Order
from jobs.attention.kernels.splash import splash_bwd, splash_fwd
from jobs.attention.kernels.xla import xla_bwd, xla_fwd
from jobs.attention.span import GLOBAL, Span
from jobs.spec import KERNEL_PLATFORM
from jobs.spec import KERNELS as NAMES

# what auto runs on each platform that has a kernel of its own (elsewhere: xla)
AUTO = {platform: name for name, platform in KERNEL_PLATFORM.items() if platform}


class FwdFn(Protocol):
    def __call__(
        self,
        q,
        k,
        v,
        q_pos,
        kv_pos,
        *,
        causal: bool,
        block_q: int,
        block_kv: int,
        order: Order = MONOTONIC,
        q_seg=None,
        kv_seg=None,
        span: Span = GLOBAL,
    ): ...


class BwdFn(Protocol):
    def __call__(
        self,
        q,
        k,
        v,
        o,
        lse,
        do,
        q_pos,
        kv_pos,
        *,
        causal: bool,
        block_q: int,
        block_kv: int,
        order: Order = MONOTONIC,
        q_seg=None,
        kv_seg=None,
        span: Span = GLOBAL,
    ): ...


@dataclass(frozen=True)
class Kernel:
    """fwd(q, k, v, q_pos, kv_pos) -> (out fp32, lse fp32); bwd(..., o, lse, do, ...) -> (dq, dk, dv) fp32."""

    name: str
    fwd: FwdFn
    bwd: BwdFn


def _positional(fn):
    """The xla kernel masks by positions alone, so it needs no `order`."""
    return lambda *args, order=MONOTONIC, **kw: fn(*args, **kw)


def _auto(phase: str):
    """splash on TPU, flash on GPU, xla elsewhere.

    lax.platform_dependent keeps only the target platform's branch when lowering, so an AOT compile for a
    TPU topology from a CPU host picks splash too; GPU is chosen on the host (a GPU is compiled where it runs).
    """

    def call(*args, q_seg=None, kv_seg=None, **kw):
        other = AUTO["gpu"] if jax.default_backend() == "gpu" else "xla"
        tpu, rest = getattr(KERNELS[AUTO["tpu"]], phase), getattr(KERNELS[other], phase)
        # splash masks are static: balanced positions are data, and a window or chunk is one static mask only
        # where the call holds the whole sequence (ulysses, none); xla everywhere else
        order = kw.get("order", MONOTONIC)
        if order.layout == "balanced" or (kw.get("span", GLOBAL).limited and not order.whole):
            tpu = rest = getattr(KERNELS["xla"], phase)
        segs = (q_seg, kv_seg)
        n = len(args)
        return jax.lax.platform_dependent(
            *args,
            segs,
            tpu=lambda *a: tpu(*a[:n], q_seg=a[n][0], kv_seg=a[n][1], **kw),
            default=lambda *a: rest(*a[:n], q_seg=a[n][0], kv_seg=a[n][1], **kw),
        )

    return call


_PAIRS = {
    "xla": (_positional(xla_fwd), _positional(xla_bwd)),
    "splash": (splash_fwd, splash_bwd),
    "flash": (flash_fwd, flash_bwd),
    "auto": (_auto("fwd"), _auto("bwd")),
}
# one per name jobs.spec owns (a name without an implementation fails here, at import)
KERNELS: dict[str, Kernel] = {name: Kernel(name, *_PAIRS[name]) for name in NAMES}


def get_kernel(name: str) -> Kernel:
    if name not in KERNELS:
        raise ValueError(f"unknown attention kernel {name!r}; use one of {', '.join(KERNELS)}")
    return KERNELS[name]


Arr = jax.Array


def _segs(segs: tuple | None) -> dict:
    return {} if segs is None else {"q_seg": segs[0], "kv_seg": segs[1]}


@partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8, 9, 11))
def attend(
    q: Arr,
    k: Arr,
    v: Arr,
    q_pos: Arr,
    kv_pos: Arr,
    causal: bool,
    kernel: str,
    block_q: int,
    block_kv: int,
    order: Order = MONOTONIC,
    segs: tuple[Arr, Arr] | None = None,
    span: Span = GLOBAL,
    sinks: Arr | None = None,
) -> Arr:
    """Attention of local queries q [B, Lq, H, D] over keys k, v [B, Lk, K, D] at positions q_pos [Lq], kv_pos [Lk];
    out like q. Backward recomputes (saves q, k, v, out, lse). Packed documents: segs = (q_seg [B, Lq],
    kv_seg [B, Lk]) and then q_pos [B, Lq], kv_pos [B, Lk]. span: sliding window or chunk (causal only).
    sinks [H] fp32: one sink logit per query head, applied once to this call's (out, lse), which must then
    hold every key the queries see (all_gather, ulysses and none call attend once per query)."""
    return _attend_fwd(q, k, v, q_pos, kv_pos, causal, kernel, block_q, block_kv, order, segs, span, sinks)[0]


def _attend_fwd(
    q,
    k,
    v,
    q_pos,
    kv_pos,
    causal,
    kernel,
    block_q,
    block_kv,
    order=MONOTONIC,
    segs=None,
    span=GLOBAL,
    sinks=None,
):
    kern = get_kernel(kernel)
    kw = dict(causal=causal, block_q=block_q, block_kv=block_kv, order=order, span=span, **_segs(segs))
    o, lse = kern.fwd(q, k, v, q_pos, kv_pos, **kw)
    if sinks is not None:
        o, lse = add_sinks(o, lse, sinks)
    o = o.astype(q.dtype)
    return o, (q, k, v, o, lse, q_pos, kv_pos, segs, sinks)


def _attend_bwd(causal, kernel, block_q, block_kv, order, span, res, do):
    q, k, v, o, lse, q_pos, kv_pos, segs, sinks = res
    kw = dict(causal=causal, block_q=block_q, block_kv=block_kv, order=order, span=span, **_segs(segs))
    dq, dk, dv = get_kernel(kernel).bwd(q, k, v, o, lse, do, q_pos, kv_pos, **kw)
    nothing = None if segs is None else (None, None)
    dsinks = (
        None if sinks is None else match_varying(sinks_grad(o, lse, do, sinks), sinks).astype(sinks.dtype)
    )
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None, nothing, dsinks


attend.defvjp(_attend_fwd, _attend_bwd)
