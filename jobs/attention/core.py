"""Online-softmax bookkeeping: merge partial attention results by log-sum-exp, in fp32, safe for empty rows."""

from __future__ import annotations

import jax
import jax.numpy as jnp

NEG_INF = float("-inf")


def varying_axes(*xs: jax.Array) -> tuple[str, ...]:
    """Manual mesh axes any of xs varies over (empty outside shard_map)."""
    axes: set[str] = set()
    for x in xs:
        mat = getattr(jax.typeof(x), "manual_axis_type", None)
        axes |= set(getattr(mat, "varying", ()) or ())
    return tuple(sorted(axes))


def match_varying(x: jax.Array, *refs: jax.Array) -> jax.Array:
    """pcast x to vary over the axes refs vary over.

    shard_map (jax >= 0.7) types loop carries and cond branches by the axes they vary over; a fresh constant
    (zeros, -inf) is invariant and would not match the varying value the loop body returns.
    """
    missing = tuple(a for a in varying_axes(*refs) if a not in varying_axes(x))
    return jax.lax.pcast(x, missing, to="varying") if missing else x


def safe_max(lse: jax.Array) -> jax.Array:
    """Replace -inf by 0 so that exp(x - m) never sees -inf - -inf."""
    return jnp.where(jnp.isneginf(lse), 0.0, lse)


def merge(
    o1_BxLxHxD: jax.Array, lse1_BxLxH: jax.Array, o2_BxLxHxD: jax.Array, lse2_BxLxH: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Combine two normalised partial results over disjoint key sets into one (fp32).

    Rows where both sides saw no key keep lse = -inf and o = 0 (no NaN).
    """
    lse1, lse2 = lse1_BxLxH.astype(jnp.float32), lse2_BxLxH.astype(jnp.float32)
    m = safe_max(jnp.maximum(lse1, lse2))
    w1, w2 = jnp.exp(lse1 - m), jnp.exp(lse2 - m)
    total = w1 + w2
    lse = jnp.where(total > 0, m + jnp.log(jnp.where(total > 0, total, 1.0)), NEG_INF)
    inv = jnp.where(total > 0, 1.0 / jnp.where(total > 0, total, 1.0), 0.0)
    o = (o1_BxLxHxD.astype(jnp.float32) * (w1 * inv)[..., None]) + (
        o2_BxLxHxD.astype(jnp.float32) * (w2 * inv)[..., None]
    )
    return o, lse


def empty_like(o_BxLxHxD: jax.Array, lse_BxLxH: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The neutral element of merge: no key seen (o = 0, lse = -inf), varying like the inputs."""
    o = match_varying(jnp.zeros(o_BxLxHxD.shape, jnp.float32), o_BxLxHxD, lse_BxLxH)
    lse = match_varying(jnp.full(lse_BxLxH.shape, NEG_INF, jnp.float32), o_BxLxHxD, lse_BxLxH)
    return o, lse


def add_sinks(o_BxLxHxD: jax.Array, lse_BxLxH: jax.Array, sinks_H: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The attention-sink correction of a merged (out, lse): one logit s per query head joins every row's
    softmax denominator and brings no value (gpt-oss). o' = o * exp(lse) / (exp(lse) + exp(s)) =
    o * sigmoid(lse - s), lse' = logaddexp(lse, s); a row that saw no key (lse = -inf) gets o' = 0, lse' = s.

    Applied once per query, after every hop is merged (never per hop: each hop would add the sink again).
    (o', lse') is exactly what attention over the keys plus one value-less key of logit s returns, so a
    kernel's backward given them (p = exp(score - lse'), delta = sum(o' * do)) yields the right dq, dk, dv
    unchanged; the sink's own gradient is `sinks_grad`.
    """
    s = sinks_H.astype(jnp.float32)
    lse = lse_BxLxH.astype(jnp.float32)
    o = o_BxLxHxD.astype(jnp.float32) * jax.nn.sigmoid(lse - s)[..., None]
    return o, jnp.logaddexp(lse, s)


def sinks_grad(
    o_BxLxHxD: jax.Array, lse_BxLxH: jax.Array, do_BxLxHxD: jax.Array, sinks_H: jax.Array
) -> jax.Array:
    """d sinks [H] (fp32) from the sink-corrected (o', lse') and dout: the sink's probability is
    exp(s - lse') and its value 0, so d s = -sum over rows of exp(s - lse') * sum_d(o' * do)."""
    delta_BxLxH = jnp.sum(o_BxLxHxD.astype(jnp.float32) * do_BxLxHxD.astype(jnp.float32), axis=-1)
    p_sink = jnp.exp(sinks_H.astype(jnp.float32) - lse_BxLxH.astype(jnp.float32))
    return -jnp.sum(p_sink * delta_BxLxH, axis=(0, 1))
