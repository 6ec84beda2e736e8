"""GPU kernel: cuDNN flash attention behind the (out, lse) / (dq, dk, dv) kernel interface.

Why the private module: the public jax.nn.dot_product_attention(implementation="cudnn", return_residual=True)
casts the softmax stats to the output dtype and its VJP drops their gradient, so merging hops through it is
silently wrong. jax 0.10.2 jax/_src/cudnn/fused_attention_stablehlo.py: `dot_product_attention(...,
return_residual=True)` (line 1939) returns (out, stats) with stats fp32 [B, N, T], the natural-log logsumexp
of the scaled scores; the backward primitive `_dot_product_attention_bwd_p_wrapper` (line 1170, bound like
`_dot_product_attention_bwd_rule`, line 466) takes (q, k, v, bias, q_seqlen, kv_seqlen, q_offsets,
kv_offsets, page_table_k, page_table_v, stats, out, dout), so a hop's backward gets the GLOBAL out and lse
(what Transformer Engine's JAX ring does). tests/test_kernels_flash.py checks those names on any host.

cuDNN has no fp32 flash path and no offset-causal mask: fp32 inputs and a device's query block against the
whole sequence (all_gather) run the xla kernel, which is exact for any positions. So do packed documents
(segment ids): cuDNN's ragged q_seqlen/offsets path is not wired here yet. So does any shape cuDNN's own check
refuses (head_dim over 256 on Hopper, 128 before it; no cuDNN found), and so do sliding windows and chunks
(cuDNN's sliding_window_length is by index, not by the true positions a ring hop or a zigzag block has). Every such fallback is decided while
tracing, logged once per reason, and kept in FALLBACKS, which the trial's start record reports.
"""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp

from jobs.attention.kernels.mask import Mask
from jobs.attention.kernels.xla import xla_bwd, xla_fwd
from jobs.strategies import rules

try:  # a private module: absent or moved means "no flash kernel", never an import error for the project
    from jax._src.cudnn import fused_attention_stablehlo as _fa
except ImportError:  # pragma: no cover
    _fa = None


log = logging.getLogger(__name__)
# Why the flash kernel ran the xla kernel instead, in the order first seen: jobs/train.py clears it before a
# compile and reports what that compile's tracing added (the start record's kernel_fallbacks).
FALLBACKS: dict[str, None] = {}


def api_drift() -> dict[str, str]:
    """What of jax's private cuDNN module this file binds has moved: each failed check's name -> why ({}: none).
    tests/test_kernels_flash.py asserts {} on any host; the GPU check records it."""
    import inspect

    import jax.extend.core

    def rule_head() -> list[str]:
        return list(inspect.signature(_fa._dot_product_attention_bwd_rule).parameters)[:8]

    checks = {
        "module present": lambda: _fa is not None,
        "dot_product_attention(scale, mask_type, qkv_layout, return_residual)": lambda: (
            {"scale", "mask_type", "qkv_layout", "return_residual"}
            <= set(inspect.signature(_fa.dot_product_attention).parameters)
        ),
        "MaskType CAUSAL, NO_MASK": lambda: {"CAUSAL", "NO_MASK"} <= set(_fa.MaskType.__members__),
        "AttentionLayout.BTNH == 0": lambda: _fa.AttentionLayout.BTNH.value == 0,
        # flash_bwd binds these by name, in the rule's order
        "_dot_product_attention_bwd_rule's first 8 parameters": lambda: (
            rule_head()
            == [
                "scale",
                "seed",
                "dropout_rate",
                "variadic_args",
                "mask_type",
                "layout",
                "sliding_window_length",
                "is_training",
            ]
        ),
        "_dot_product_attention_bwd_p_wrapper is a Primitive": lambda: isinstance(
            _fa._dot_product_attention_bwd_p_wrapper, jax.extend.core.Primitive
        ),
    }
    failed = {}
    for name, check in checks.items():
        try:
            if not check():
                failed[name] = "false"
        except Exception as e:  # noqa: BLE001 - a moved name is an AttributeError: record it and go on
            failed[name] = f"{type(e).__name__}: {e}"
    return failed


def refusal(
    q: jax.Array, k: jax.Array, v: jax.Array, causal: bool, segmented: bool = False, limited: bool = False
) -> str:
    """Why cuDNN flash cannot run this call ("" when it can); fwd and bwd ask alike, so they always agree."""
    if _fa is None:
        return "jax's cuDNN attention module is missing"
    if limited:
        return "a sliding window or chunk (masked by true positions, which cuDNN's index masks are not)"
    if q.dtype not in (jnp.bfloat16, jnp.float16):
        return f"{q.dtype} inputs (cuDNN flash is bf16/fp16 only)"
    if causal and q.shape[1] != k.shape[1]:
        return "a causal block with its own offset (cuDNN's causal mask is by index)"
    if segmented:
        return "packed documents (segment ids are not wired to cuDNN)"
    try:  # cuDNN's own shape rules (head_dim, architecture, version), as its entry point would apply them
        layout = _fa.AttentionLayout.BTNH.value
        _fa.check_is_flash_attention(q, k, v, layout, _fa.check_cudnn_version(), False, True)
    except (NotImplementedError, RuntimeError) as e:
        return f"cuDNN refuses it: {e}"
    return ""


def _falls_back(q, k, v, mask: Mask) -> bool:
    why = refusal(q, k, v, mask.causal, mask.segmented, mask.span.limited)
    if why and why not in FALLBACKS:
        FALLBACKS[why] = None
        log.warning("flash attention kernel: %s; running the xla kernel", why)
    return bool(why)


def _mask_type(mask: Mask):
    return _fa.MaskType.CAUSAL if mask.causal else _fa.MaskType.NO_MASK


def _perm(k: jax.Array, mask: Mask):
    """Zigzag whole sequences go to natural order (the cuDNN causal mask is by index)."""
    if not (mask.causal and mask.order.permuted):
        return None, None
    perm = rules.zigzag_permutation(k.shape[1], mask.order.ring)
    return jnp.asarray(perm, jnp.int32), jnp.asarray(rules.inverse_permutation(perm), jnp.int32)


def _take(x: jax.Array, idx) -> jax.Array:
    return x if idx is None else jnp.take(x, idx, axis=1)


def flash_fwd(q, k, v, mask: Mask):
    """(out fp32 [B, Lq, H, D], lse fp32 [B, Lq, H]); positions and blocks serve only the xla fallback."""
    if _falls_back(q, k, v, mask):
        return xla_fwd(q, k, v, mask)
    perm, inv = _perm(k, mask)
    q, k, v = (_take(x, inv) for x in (q, k, v))
    out, stats_BxHxL = _fa.dot_product_attention(
        q,
        k,
        v,
        scale=q.shape[-1] ** -0.5,
        mask_type=_mask_type(mask),
        qkv_layout="BTNH",
        return_residual=True,
    )
    lse = jnp.swapaxes(stats_BxHxL.astype(jnp.float32), 1, 2)
    return _take(out.astype(jnp.float32), perm), _take(lse, perm)


def flash_bwd(q, k, v, o, lse, do, mask: Mask):
    """dq, dk, dv (fp32) from the given (global) out and lse."""
    if _falls_back(q, k, v, mask):
        return xla_bwd(q, k, v, o, lse, do, mask)
    perm, inv = _perm(k, mask)
    q, k, v, do = (_take(x, inv) for x in (q, k, v, do.astype(q.dtype)))
    o, lse = _take(o.astype(q.dtype), inv), _take(lse.astype(jnp.float32), inv)
    unused = jnp.zeros(0, q.dtype)
    dq, dk, dv = _fa._dot_product_attention_bwd_p_wrapper.bind(
        q,
        k,
        v,
        unused,  # bias
        unused,  # q_seqlen
        unused,  # kv_seqlen
        unused,  # q_offsets
        unused,  # kv_offsets
        unused,  # page_table_k
        unused,  # page_table_v
        jnp.swapaxes(lse, 1, 2),  # softmax stats [B, N, T]
        o,
        do,
        scale=q.shape[-1] ** -0.5,
        seed=42,  # the public API's default; no dropout, so unused
        dropout_rate=0.0,
        variadic_args=(False, False),  # (has_bias, has_dbias)
        mask_type=_mask_type(mask),
        layout=_fa.AttentionLayout.BTNH.value,
        sliding_window_length=None,
    )
    return tuple(_take(g.astype(jnp.float32), perm) for g in (dq, dk, dv))
