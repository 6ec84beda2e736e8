"""What a kernel call masks: one frozen value with the true positions, segment ids, causal flag, sliding window or
chunk, the static layout of the keys, and the blocks a kernel tiles the call in."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import NamedTuple

import jax

from jobs.attention.span import GLOBAL, Span

ALL = slice(None)


class Order(NamedTuple):
    """How the key positions of a call are laid out (the xla kernel ignores this: it masks by positions).

    layout/ring: keys are the whole sequence in `layout` order for ring size `ring` (global_positions), and
    the queries are either that same sequence or one device's block of it. The default (contiguous, 1) also
    covers every ring hop: a ring block's positions increase with the index (zigzag too: chunk r precedes
    chunk 2R-1-r), so a causal hop is the plain causal mask and any other hop is unmasked. layout="balanced"
    (packed documents, a data-dependent permutation): no static mask fits; only position-masking kernels run.
    whole: the queries and the keys are the same whole sequence (ulysses, none), so a sliding window or chunk is
    one static mask too.
    """

    layout: str = "contiguous"
    ring: int = 1
    whole: bool = False

    @property
    def permuted(self) -> bool:
        return self.layout == "zigzag" and self.ring > 1


MONOTONIC = Order()


@partial(
    jax.tree_util.register_dataclass,
    data_fields=["q_pos", "kv_pos", "q_seg", "kv_seg"],
    meta_fields=["causal", "block_q", "block_kv", "order", "span"],
)
@dataclass(frozen=True)
class Mask:
    """Which keys each query of a kernel call sees, and the blocks the kernel judges it in.

    Causal is by true positions (a query sees keys at positions <= its own), so permuted layouts need no special
    case. Packed documents add segment ids q_seg [B, Lq], kv_seg [B, Lk] (a query sees only its own document's
    keys), and then the positions are per row too. A pytree: positions and segment ids are its arrays, the rest
    is static (part of a trace's shape), so a Mask passes through jit, lax.cond and custom_vjp whole.
    """

    q_pos: jax.Array  # int32 [Lq], or [B, Lq] with segment ids
    kv_pos: jax.Array  # int32 [Lk], or [B, Lk] with segment ids
    causal: bool
    block_q: int
    block_kv: int
    order: Order = MONOTONIC  # for static-mask kernels (splash); position-masking kernels ignore it
    span: Span = GLOBAL  # sliding window or chunk (causal only)
    q_seg: jax.Array | None = None
    kv_seg: jax.Array | None = None

    @property
    def segmented(self) -> bool:
        return self.q_seg is not None

    def cut(self, qs: slice = ALL, ks: slice = ALL, *, causal: bool | None = None) -> Mask:
        """The mask of queries qs and keys ks (slices of the token axis, the last of positions and segment ids);
        causal: this part's own flag (a hop part wholly in the past needs none)."""
        take = lambda x, s: None if x is None else x[..., s]
        return replace(
            self,
            q_pos=take(self.q_pos, qs),
            kv_pos=take(self.kv_pos, ks),
            q_seg=take(self.q_seg, qs),
            kv_seg=take(self.kv_seg, ks),
            causal=self.causal if causal is None else causal,
        )
