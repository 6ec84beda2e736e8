"""Local attention kernels behind one signature, and a custom-VJP `attend` that every strategy can use.

A kernel is a pair (fwd -> (out, lse), bwd -> (dq, dk, dv)) over local arrays with explicit token positions
(the causal mask is `q_pos >= kv_pos`, so permuted layouts need no special case). "xla" runs everywhere;
hardware kernels (TPU splash, GPU flash) plug in here without touching the strategies.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Protocol

import jax

from jobs.attention.xla_kernel import xla_bwd, xla_fwd


class FwdFn(Protocol):
    def __call__(self, q, k, v, q_pos, kv_pos, *, causal: bool, block_q: int, block_kv: int): ...


class BwdFn(Protocol):
    def __call__(self, q, k, v, o, lse, do, q_pos, kv_pos, *, causal: bool, block_q: int, block_kv: int): ...


@dataclass(frozen=True)
class Kernel:
    """fwd(q, k, v, q_pos, kv_pos) -> (out fp32, lse fp32); bwd(..., o, lse, do, ...) -> (dq, dk, dv) fp32."""

    name: str
    fwd: FwdFn
    bwd: BwdFn


def _splash_unavailable(*args, **kwargs):
    # Splash's public API takes a static mask object and returns no lse we can merge across ring hops with
    # per-hop positions; wrapping it cleanly (custom residuals, block-sparse mask per hop) is future work.
    raise NotImplementedError(
        "kernel='splash' is not wired yet: jax.experimental.pallas.ops.tpu.splash_attention needs per-hop "
        "masks and an lse output; use kernel='xla' (runs on TPU too)"
    )


KERNELS: dict[str, Kernel] = {
    "xla": Kernel("xla", xla_fwd, xla_bwd),
    "splash": Kernel("splash", _splash_unavailable, _splash_unavailable),
}


def get_kernel(name: str) -> Kernel:
    if name not in KERNELS:
        raise ValueError(f"unknown attention kernel {name!r}; use one of {', '.join(KERNELS)}")
    return KERNELS[name]


def register_kernel(kernel: Kernel) -> None:
    """Plug in a hardware kernel (e.g. a GPU flash kernel) under its name."""
    KERNELS[kernel.name] = kernel


@partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def attend(
    q_BxLqxHxD: jax.Array,
    k_BxLkxKxD: jax.Array,
    v_BxLkxKxD: jax.Array,
    qpos_Lq: jax.Array,
    kpos_Lk: jax.Array,
    causal: bool,
    kernel: str,
    block_q: int,
    block_kv: int,
) -> jax.Array:
    """Attention of local queries over the given keys; out like q. Backward recomputes (saves q,k,v,out,lse)."""
    o, _ = get_kernel(kernel).fwd(
        q_BxLqxHxD,
        k_BxLkxKxD,
        v_BxLkxKxD,
        qpos_Lq,
        kpos_Lk,
        causal=causal,
        block_q=block_q,
        block_kv=block_kv,
    )
    return o.astype(q_BxLqxHxD.dtype)


def _attend_fwd(q, k, v, q_pos, kv_pos, causal, kernel, block_q, block_kv):
    o, lse = get_kernel(kernel).fwd(q, k, v, q_pos, kv_pos, causal=causal, block_q=block_q, block_kv=block_kv)
    o = o.astype(q.dtype)
    return o, (q, k, v, o, lse, q_pos, kv_pos)


def _attend_bwd(causal, kernel, block_q, block_kv, res, do):
    q, k, v, o, lse, q_pos, kv_pos = res
    dq, dk, dv = get_kernel(kernel).bwd(
        q, k, v, o, lse, do, q_pos, kv_pos, causal=causal, block_q=block_q, block_kv=block_kv
    )
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None


attend.defvjp(_attend_fwd, _attend_bwd)
