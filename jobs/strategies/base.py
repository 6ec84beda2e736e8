"""What a CP strategy is, apart from its JAX body: mesh axes, rules, data layout, planner terms, words.

Pure Python (no jax): the control plane plans and validates with it before asking for a device, and the data
plane shards, permutes and dispatches with the same object. A subclass overrides only what differs.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import lru_cache

BF16, FP32 = 2, 4
TILE_BYTES = 15  # per score element of the attention kernel's working tile, see kernel_bytes
AUTO = "auto"
# The mesh axes, major to minor: the batch is sharded over BATCH_AXES, the sequence over a strategy's `axes`.
MESH_AXES = ("data", "fsdp", "context", "context_ulysses", "tensor")
BATCH_AXES = ("data", "fsdp")
# Token orders over the context shards (strategy.layout). balanced: packed documents in a loader's data-dependent
# permutation (jobs/data/balance.py: L/P tokens per device in contiguous runs), given with positions and segment
# ids; a trial needs train.data.kind=documents for it.
LAYOUTS = ("contiguous", "zigzag", "balanced")


@dataclass(frozen=True)
class Local:
    """Per-device sizes of one trial: what the memory and comm terms are written in."""

    B: int  # sequences per device per microbatch
    Ll: int  # tokens per device along the sequence (L / P)
    L: int
    P: int  # context-parallel degree (all sequence axes)
    U: int  # Ulysses degree (heads traded for sequence; 1 without an all-to-all)
    R: int  # ring degree (positions K/V travel through, or gather over; 1 without)
    T: int  # tensor
    S: int  # mesh size
    hq: int  # q heads per device after tensor sharding
    hkv: int  # kv heads per device after tensor sharding
    M: int  # mlp width per device after tensor sharding
    V: int  # vocab per device after tensor sharding
    D: int  # head_dim

    @property
    def tokens(self) -> int:
        return self.B * self.Ll

    @property
    def kv_token(self) -> int:
        """Elements of one token's K (or V) on this device, times batch."""
        return self.B * self.hkv * self.D


def travelling_kv_bytes(x: Local, tokens: int, hkv: int) -> int:
    """A ring's two K/V blocks in flight (current and next); in backward K,V (bf16) travel with dK,dV (fp32)."""
    return 2 * x.B * tokens * hkv * x.D * (2 * BF16 + 2 * FP32)


def kernel_bytes(x: Local, tq: int, tk: int, hq: int, hkv: int, block_q: int, block_kv: int) -> int:
    """The blockwise kernel on tq queries x tk keys: fp32 out/dq accumulators, fp32 dk/dv, one score tile.

    The tile is one (block_q, block_kv) pair's scores, probabilities, dP and dS (fp32) and causal mask; the
    TPU compiler fuses some of them: 15 bytes per element fits its compiles of ring, all_gather and usp
    (13-17 seen; ulysses compiles to ~6).
    """
    acc = x.B * (tq * hq * (2 * x.D + 1) * FP32 + tk * hkv * 2 * x.D * FP32)
    tile = x.B * hq * min(block_q, tq) * min(block_kv, tk) * TILE_BYTES
    return acc + tile


@dataclass(frozen=True)
class Reach:
    """How far back a causal query sees, for the planner: jobs/attention/span.Span's rule on plain ints (no jax
    here). A query at q sees a key at k iff lo(q) <= k <= q: lo is unlimited (global), q - window + 1, or the
    start of q's own chunk. `of` drops a window or chunk that covers the whole row, as Span.of does."""

    window: int = 0  # 0: none
    chunk: int = 0

    @staticmethod
    def of(window: int, chunk: int, length: int) -> Reach:
        return Reach(window if 0 < window < length else 0, chunk if 0 < chunk < length else 0)

    @property
    def limited(self) -> bool:
        return bool(self.window or self.chunk)

    @property
    def lookback(self) -> int | None:
        """Most keys before a query's own position it can see (None: unlimited)."""
        if self.window:
            return self.window - 1
        return self.chunk - 1 if self.chunk else None

    def lo(self, q: int) -> int:
        """The oldest key position a query at q sees (global: below every position)."""
        if self.window:
            return q - self.window + 1
        if self.chunk:
            return q // self.chunk * self.chunk
        return -(2**62)

    def ranges_see(self, q0: int, q1: int, k0: int, k1: int) -> bool:
        """May a query in [q0, q1] see a key in [k0, k1]? Exact for ranges (lo never decreases with q)."""
        return k0 <= q1 and self.lo(max(q0, k0)) <= k1


GLOBAL_REACH = Reach()


@lru_cache(maxsize=65536)
def causal_scores(q0: int, nq: int, k0: int, nk: int, bq: int, bk: int, reach: Reach = GLOBAL_REACH) -> int:
    """Score entries a block-skipping causal kernel computes on queries at true positions [q0, q0+nq) and keys
    at [k0, k0+nk): every (block_q x block_kv) tile with at least one visible score (query position >= key
    position, and within the query's `reach`) is computed whole, the others skipped. Blocks are aligned to each
    range's start (a call's own blocks); the last one in each direction may be short. A block of queries
    from qs to qe sees exactly the keys [lo(qs), qe] (lo never decreases), so a key block is live iff it meets
    that interval."""
    if nq <= 0 or nk <= 0 or not reach.ranges_see(q0, q0 + nq - 1, k0, k0 + nk - 1):
        return 0
    bq, bk = max(min(bq, nq), 1), max(min(bk, nk), 1)
    total = 0
    for start in range(0, nq, bq):
        rows = min(bq, nq - start)
        last_q = q0 + start + rows - 1  # the block's last query sees keys up to its own position
        visible = min(max(last_q - k0 + 1, 0), nk)
        first = max(reach.lo(q0 + start) - k0, 0) if reach.limited else 0  # its first query's oldest key
        if visible > first:
            total += rows * (min(-(-visible // bk) * bk, nk) - first // bk * bk)
    return total


@dataclass(frozen=True)
class Hop:
    """One step of a layer's attention forward on the busiest device: the tiles it computes, the kernel calls
    they take, and the K,V each device passes to its ring neighbour meanwhile (the next step's block)."""

    scores: (
        int  # of one q head: score entries computed, whole tiles with a visible score (masked ones skipped)
    )
    mean_scores: float  # the same averaged over the devices (what shared cores see: simulated CPU devices)
    calls: int  # kernel calls on the busiest device
    send_bytes: int  # per device, during this hop (0: nothing travels)
    count: int = 1  # identical consecutive hops
    merged: int = 0  # queries whose running (out, lse) this hop's partial result is merged into (0: none)


@dataclass(frozen=True)
class Schedule:
    """A layer's attention forward on one device: the hops in order, the q heads each kernel call covers, the
    tile shape, and the blocking collectives around the hops (an all-gather of K,V before them, all-to-alls
    around them). The backward and a replayed forward repeat it (backward: its own kernel cost, dK,dV travel)."""

    hops: tuple[Hop, ...]
    heads: int
    block_q: int
    block_kv: int
    gather_bytes: int = 0  # K,V an all-gather brings each device (the backward reduce-scatters dK,dV back)
    gather_group: int = 1
    a2a_bytes: int = 0  # what each device sends in the all-to-alls around the hops (q, k, v out; out back)
    a2a_group: int = 1
    ring_group: int = 1  # devices the K,V blocks travel around (1: nothing travels)

    @property
    def steps(self) -> int:
        return sum(h.count for h in self.hops)

    def scores(self, busiest: bool = True) -> float:
        return sum((h.scores if busiest else h.mean_scores) * h.count for h in self.hops)


def ring_hops(
    x: Local,
    P: int,
    Ll: int,
    layout: str,
    bq: int,
    bk: int,
    send: int,
    reach: Reach = GLOBAL_REACH,
    truncates: bool = True,
) -> tuple[Hop, ...]:
    """The P steps of a causal ring over shards of Ll tokens, the busiest device's at every step (steps are in
    lockstep: each waits for the neighbour's block). Contiguous: at step s only the devices r >= s see their
    source's keys, so every step after the first is a whole block somewhere. Zigzag (device r holds chunks r and
    2P-1-r of Ll/2): the first step is two diagonals and a whole chunk pair, every later one two whole chunk
    pairs on every device. A window or chunk (`reach`): see reach_hops."""
    if reach.limited:
        return reach_hops(P, Ll, layout, bq, bk, send, reach, truncates)
    if P <= 1:
        return (Hop(causal_scores(0, Ll, 0, Ll, bq, bk), causal_scores(0, Ll, 0, Ll, bq, bk), 1, 0),)
    if layout == "zigzag" and Ll % 2 == 0:
        C = Ll // 2
        diag, full = causal_scores(0, C, 0, C, bq, bk), causal_scores(C, C, 0, C, bq, bk)
        first = 2 * diag + full
        # every step merges a partial result into the running one of all Ll local queries (a later step: both
        # chunks against one key chunk, or the second chunk against both)
        return (
            Hop(first, first, 3, send, merged=Ll),
            Hop(2 * full, 2 * full, 2, send, P - 2, merged=Ll),
            Hop(2 * full, 2 * full, 2, 0, merged=Ll),
        )
    diag, full = causal_scores(0, Ll, 0, Ll, bq, bk), causal_scores(Ll, Ll, 0, Ll, bq, bk)
    # step s: P - s devices have a visible (whole) block, the rest skip theirs
    mean_later = full / 2  # (P - s) / P of the devices at step s, averaged over the P - 1 later steps
    return (
        Hop(diag, diag, 1, send, merged=Ll),
        Hop(full, mean_later, 1, send, P - 2, merged=Ll),
        Hop(full, mean_later, 1, 0, merged=Ll),
    )


def shard_runs(r: int, P: int, Ll: int, layout: str) -> tuple[tuple[int, int], ...]:
    """(first position, length) of the runs of consecutive positions device r holds: one contiguous, two zigzag."""
    if layout == "zigzag" and Ll % 2 == 0 and P > 1:
        C = Ll // 2
        return ((r * C, C), ((2 * P - 1 - r) * C, C))
    return ((r * Ll, Ll),)


def ring_steps(P: int, Ll: int, layout: str, lookback: int | None) -> int:
    """Steps a ring of P shards of Ll tokens runs: all P, unless its queries see at most `lookback` keys back (a
    window or chunk) in the contiguous layout, where device r needs only the blocks of r, r-1, ..., r-n+1:
    n = 1 + (Ll - 1 + lookback) // Ll. The ring then stops rotating after n steps (jobs/attention/cp/ring.py: the
    backward sends each block's gradient home n - 1 devices back). Zigzag keeps all P: a shard's second chunk
    reaches back to the device after it, the far end of the rotation."""
    if lookback is None or layout != "contiguous" or P <= 1:
        return P
    return min(P, 1 + (Ll - 1 + lookback) // Ll)


@lru_cache(maxsize=1024)
def reach_hops(
    P: int, Ll: int, layout: str, bq: int, bk: int, send: int, reach: Reach, truncates: bool = True
) -> tuple[Hop, ...]:
    """A ring under a window or chunk, as jobs/attention/cp/span_hop.py runs it: each hop is cut into (query
    run, key run) pairs (1 contiguous, 4 zigzag) and a pair no query can reach skips its kernel; a step within
    the ring's rotation passes its K,V block on even when it skips (ring_steps: a contiguous ring stops
    rotating at the window's last shard, when it `truncates`). Device by device and step by step: the busiest
    device's tiles and calls, and the mean; runs of identical steps are folded into counts. Double ring visits
    the same sources in another order and all of them; its steps are priced in this one."""
    steps: list[Hop] = []
    n = ring_steps(P, Ll, layout, reach.lookback) if truncates else P
    for s in range(n):
        per: list[tuple[int, int]] = []
        for r in range(P):
            j = (r - s) % P
            scores = calls = 0
            for q0, nq in shard_runs(r, P, Ll, layout):
                for k0, nk in shard_runs(j, P, Ll, layout):
                    t = causal_scores(q0, nq, k0, nk, bq, bk, reach)
                    scores, calls = scores + t, calls + (t > 0)
            per.append((scores, calls))
        busiest = max(per)
        mean = sum(p[0] for p in per) / P
        merged = Ll if busiest[0] else 0
        steps.append(Hop(busiest[0], mean, max(p[1] for p in per), send if s < n - 1 else 0, merged=merged))
    hops: list[Hop] = []
    for h in steps:  # fold consecutive identical steps
        if hops and replace(hops[-1], count=1) == h:
            hops[-1] = replace(hops[-1], count=hops[-1].count + 1)
        else:
            hops.append(h)
    return tuple(hops)


def gathered_scores(
    P: int, Ll: int, L: int, layout: str, bq: int, bk: int, reach: Reach = GLOBAL_REACH, halo: int = 0
) -> tuple[int, float, int]:
    """(busiest, mean score entries, calls) of local queries against the whole gathered sequence's keys, or,
    with a `halo` (a window or chunk, contiguous layout), against the halo's keys before the shard and its own."""
    if P <= 1:
        t = causal_scores(0, L, 0, L, bq, bk, reach)
        return t, float(t), 1
    if layout == "zigzag" and Ll % 2 == 0:
        C = Ll // 2
        per = [
            causal_scores(r * C, C, 0, L, bq, bk, reach)
            + causal_scores((2 * P - 1 - r) * C, C, 0, L, bq, bk, reach)
            for r in (0, P // 2, P - 1)
        ]
        return max(per), sum(per) / len(per), 2

    def keys(r: int) -> tuple[int, int]:
        return (max(r * Ll - halo, 0), min(halo, r * Ll) + Ll) if halo else (0, L)

    per = [causal_scores(r * Ll, Ll, *keys(r), bq, bk, reach) for r in (0, P // 2, P - 1)]
    return per[-1] if not reach.limited else max(per), sum(per) / 3, 1


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


class Strategy:
    """A single-axis CP strategy over `context` (the defaults); subclasses override what differs."""

    name: str = ""
    axes: tuple[str, ...] = ("context",)  # mesh axes the sequence is sharded over, major first
    ulysses_axis: str | None = None  # the axis whose all-to-all trades sequence for heads
    layouts: tuple[str, ...] = LAYOUTS  # the token orders it supports
    default_layout: str = "contiguous"  # what the recommender and the benchmarks pick
    collectives: tuple[str, ...] = ()  # HLO ops its compiled step must contain (a silent no-CP would not)
    summary: str = ""  # one line for the recommender and the docs

    # -- mesh -----------------------------------------------------------------------------------------
    def cp(self, mesh: Mapping[str, int]) -> int:
        """Devices the sequence is sharded over (the product of this strategy's axes; 1 without any)."""
        return math.prod(int(mesh.get(a, 1)) for a in self.axes)

    def ring_size(self, mesh: Mapping[str, int]) -> int:
        """Ring positions the zigzag layout is cut for (1: the layout is the identity)."""
        return int(mesh.get("context", 1))

    def resolve_mesh(
        self, free: int, context: int | str, inner: int | str, hq: int, hkv: int
    ) -> tuple[int, int]:
        """(context, context_ulysses) for `auto` axes: `free` devices are left after data, fsdp and tensor."""
        inner = 1 if inner == AUTO else int(inner)
        return (max(free // inner, 1) if context == AUTO else int(context)), inner

    def mesh_splits(self, cp: int) -> list[tuple[int, int]]:
        """(context, context_ulysses) splits of `cp` devices the recommender tries."""
        return [(cp, 1)]

    # -- rules ----------------------------------------------------------------------------------------
    def check(self, *, L: int, hq: int, hkv: int, size: Mapping[str, int], layout: str) -> None:
        """Raise ValueError (one line: the numbers and the fix) on what only this strategy forbids."""
        if self.ulysses_axis is None:
            return
        a, u = self.ulysses_axis, size[self.ulysses_axis]
        if hq % u:
            raise ValueError(
                f"{self.name} splits q heads over {a}={u}: q_heads/tensor = {hq} % {u} = {hq % u}; "
                f"use {a} dividing {hq}"
            )
        if hkv % u and u % hkv:
            raise ValueError(
                f"{self.name} splits kv heads over {a}={u}: kv_heads/tensor = {hkv} neither divides "
                f"nor is a multiple of {u}; use {a} dividing or a multiple of {hkv}"
            )

    # -- planner --------------------------------------------------------------------------------------
    def degrees(self, mesh: Mapping[str, int]) -> tuple[int, int]:
        """(U, R) of Local: Ulysses and ring degrees."""
        return 1, int(mesh.get("context", 1))

    def attention_bytes(
        self, x: Local, block_q: int, block_kv: int, reach: Reach = GLOBAL_REACH, layout: str = "contiguous"
    ) -> int:
        """Transient bytes of one layer's attention on a device (the larger of forward and backward); a
        window or chunk (`reach`) changes them only where the strategy fetches less for it (all_gather)."""
        return kernel_bytes(x, x.Ll, x.Ll, x.hq, x.hkv, block_q, block_kv)

    def comm_bytes(
        self, x: Local, reach: Reach = GLOBAL_REACH, layout: str = "contiguous", block_kv: int = 0
    ) -> tuple[int, int]:
        """Forward bytes one device sends per layer: (not overlappable, overlappable with attention); a window
        or chunk (`reach`) changes them only where the strategy sends less for it (all_gather's halo)."""
        return 0, 0

    def hop_tokens(self, x: Local) -> int:
        """Keys one kernel call sees (a ring hop's block, or the whole gathered sequence)."""
        return x.L

    def schedule(
        self, x: Local, layout: str, block_q: int, block_kv: int, reach: Reach = GLOBAL_REACH
    ) -> Schedule:
        """A layer's attention forward on the busiest device (the default: the whole sequence in one call);
        `reach`: the layer's window or chunk (its tiles beyond it are skipped)."""
        t = causal_scores(0, x.L, 0, x.L, block_q, block_kv, reach)
        return Schedule((Hop(t, float(t), 1, 0),), x.hq, block_q, block_kv)

    def imbalance(self, x: Local, layout: str) -> float:
        """Busiest device's causal work over the mean: contiguous shards leave the last device (2R-1)/R."""
        R = x.R
        return (2 * R - 1) / R if layout == "contiguous" and R > 1 else 1.0

    def overflow_hint(self, x: Local) -> str:
        """Said after 'needs N GiB' when a point does not fit (what of this strategy's own grows)."""
        return ""

    # -- multislice (mesh.dcn: the axis laid across slices, over the data-centre network) ------------------
    # Axes that may cross slices. Data parallelism may for every strategy: only its FSDP gathers and gradient
    # reduce-scatters cross, priced by the planner (not here). A strategy adds the ring axis whose hop hides.
    dcn_axes: tuple[str, ...] = ("data", "fsdp")

    def dcn_refusal(self, axis: str) -> str:
        """Why `axis` may not cross slices for this strategy, with the fix ('' when it may)."""
        if axis in self.dcn_axes:
            return ""
        if axis == "tensor":
            why = (
                "tensor all-reduces activations twice per layer and pass on the critical path: over DCN every "
                "layer waits on the slow network"
            )
        elif axis == self.ulysses_axis:
            why = (
                f"{self.name}'s all-to-all over {axis} would cross the slow network twice per layer and pass, "
                "with no compute to hide behind"
            )
        elif axis in self.axes:
            why = self.dcn_axis_reason(axis)
        else:
            why = f"{self.name} does not shard over {axis}"
        return f"{why}; use " + " or ".join(f"mesh.dcn={a}" for a in self.dcn_axes)

    def dcn_axis_reason(self, axis: str) -> str:
        """Why one of this strategy's own sequence axes (not in dcn_axes, not the all-to-all's) may not cross."""
        return f"{self.name} would exchange over {axis} with nothing to hide the slow network behind"

    def dcn_bytes(self, x: Local, mesh: Mapping[str, int], axis: str, slices: int) -> tuple[int, int]:
        """Forward bytes one device sends across slices per layer for attention when `axis` spans `slices`:
        (not overlappable, overlappable behind attention). FSDP gathers are the planner's, not the strategy's."""
        return 0, 0

    def dcn_words(self, mesh: Mapping[str, int], axis: str) -> str:
        """What crosses DCN when `axis` spans slices, in the recommender's words."""
        if axis in ("data", "fsdp"):
            return "only the FSDP gathers and gradient reduce-scatters cross DCN, hidden behind the matmuls"
        return ""

    # -- data plane -----------------------------------------------------------------------------------
    def local_fn(self) -> Callable:
        """The JAX body: jobs/attention/<name>.py's <name>_local(mesh, L, Options) -> fn(q, k, v, pos=None,
        seg=None, sinks=None), the per-device function run under one shard_map (pos, seg: packed documents' true
        positions and segment ids [B, L_local]; sinks: the local query heads' sink logits [H], applied once per
        query); imported only when asked for (this module never imports jax)."""
        return getattr(importlib.import_module(f"jobs.attention.cp.{self.name}"), f"{self.name}_local")


def usp_like_splits(cp: int) -> list[tuple[int, int]]:
    """Every power-of-two split of cp into an outer `context` and an inner `context_ulysses`, both > 1."""
    return [(cp // u, u) for u in (2**i for i in range(1, cp.bit_length())) if cp % u == 0 and 1 < u < cp]
