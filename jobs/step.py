"""The jitted train step: forward, backward, clipping and AdamW on FSDP-sharded fp32 parameters."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jobs.data.buckets import position_buckets
from jobs.mesh import named, param_specs, token_spec
from jobs.model import init_params, loss_fn
from jobs.spec import DTYPES as DTYPE_NAMES
from jobs.spec import TrialSpec

DTYPES = {name: getattr(jnp, name) for name in DTYPE_NAMES}  # train.dtype -> its jax.numpy type


def optimizer(spec: TrialSpec) -> optax.GradientTransformation:
    t = spec.train
    sched = optax.warmup_cosine_decay_schedule(
        0.0, t.lr, warmup_steps=max(t.warmup, 1), decay_steps=max(t.steps, t.warmup + 1), end_value=t.lr * 0.1
    )
    return optax.chain(
        optax.clip_by_global_norm(t.grad_clip), optax.adamw(sched, weight_decay=t.weight_decay)
    )


def state_shardings(spec: TrialSpec, mesh: Mesh):
    """Shardings of (params, opt_state) derived from the parameter specs (optimizer moments mirror params)."""
    pspecs = named(mesh, param_specs(spec.model, mesh))
    abstract = jax.eval_shape(lambda: init_params(spec.model, jax.random.key(0)))
    opt = optimizer(spec)
    opt_abs = jax.eval_shape(opt.init, abstract)
    # param-shaped moments (mu, nu) are sharded like the params; scalars (counts) are replicated
    opt_sh = optax.tree_map_params(
        opt, lambda _, sh: sh, opt_abs, pspecs, transform_non_params=lambda _: NamedSharding(mesh, P())
    )
    return pspecs, opt_sh, abstract, opt_abs


def held_shardings(spec: TrialSpec, pspecs, opt_sh) -> tuple:
    """Where (params, opt_state) live between steps: the train.memory.host parts in pinned host memory."""

    def place(tree, part):
        if part not in spec.train.memory.host:
            return tree
        return jax.tree.map(lambda s: s.with_memory_kind("pinned_host"), tree)

    return place(pspecs, "params"), place(opt_sh, "optimizer")


def batch_keys(spec: TrialSpec) -> dict[str, jnp.dtype]:
    """What a batch holds, [B, L] each: packed documents add their segment ids, and under the balanced layout
    (a per-row token order) the true row position of every token, which the attention's mask needs."""
    keys = {"tokens": jnp.int32, "targets": jnp.int32, "positions": jnp.int32, "mask": jnp.float32}
    if spec.train.data.kind == "recall":  # each query's distance to its key: accuracy by distance
        keys["distance"] = jnp.int32
    if spec.train.data.kind == "documents":
        keys["segment_ids"] = jnp.int32
        if spec.strategy.layout == "balanced":
            keys["row_positions"] = jnp.int32
    return keys


def batch_shardings(spec: TrialSpec, mesh: Mesh) -> dict:
    tok = NamedSharding(mesh, token_spec(spec.strategy.name))
    return dict.fromkeys(batch_keys(spec), tok)


def make_train_step(spec: TrialSpec, mesh: Mesh):
    """(init_fn, step_fn): jitted with explicit shardings; step donates the state.

    train.memory.host parts arrive in and leave to pinned host memory (the jit's shardings say so); the
    step copies them to device before use. Untouched when host is empty: the same program as before."""
    pspecs, opt_sh, _, _ = state_shardings(spec, mesh)
    host = spec.train.memory.host
    bsh = batch_shardings(spec, mesh)
    opt = optimizer(spec)
    kw = dict(
        model=spec.model,
        strategy=spec.strategy,
        mesh=mesh,
        dtype=DTYPES[spec.train.dtype],
        remat=spec.train.remat,
        memory=spec.train.memory,
    )
    accum = spec.train.grad_accum
    bkeys = batch_keys(spec)

    def init(key):
        params = init_params(spec.model, key)
        return params, opt.init(params)

    def grads_of(params, batch):
        """(loss, grads, (loss summed, tokens) per position bucket) over the step's batch."""
        if accum == 1:
            (loss, (_, *by_pos)), g = jax.value_and_grad(functools.partial(loss_fn, **kw), has_aux=True)(
                params, batch
            )
            return loss, g, tuple(by_pos)
        micro = jax.tree.map(lambda x: x.reshape(accum, x.shape[0] // accum, *x.shape[1:]), batch)

        def body(carry, mb):
            (loss, (n, *pos)), g = jax.value_and_grad(functools.partial(loss_fn, **kw), has_aux=True)(
                params, mb
            )
            acc_g, acc_l, acc_n, acc_p = carry
            acc_p = tuple(a + b for a, b in zip(acc_p, pos, strict=True))
            return (jax.tree.map(lambda a, b: a + b * n, acc_g, g), acc_l + loss * n, acc_n + n, acc_p), None

        zeros = jax.tree.map(jnp.zeros_like, params)
        K = len(position_buckets(spec.context_length))
        start = (zeros, 0.0, 0.0, tuple(jnp.zeros(K) for _ in range(4 if "distance" in bkeys else 2)))
        (g, tot, n, by_pos), _ = jax.lax.scan(body, start, micro)
        return tot / n, jax.tree.map(lambda x: x / n, g), by_pos

    def to_device(x, sh, part):
        return jax.device_put(x, sh) if part in host else x

    def step(state, batch):
        params = to_device(state[0], pspecs, "params")
        loss, g, (pos_loss, pos_tokens, *by_distance) = grads_of(params, batch)
        # only the update reads the moments: brought to device after the backward, not held through it
        opt_state = to_device(state[1], opt_sh, "optimizer")
        updates, opt_state = opt.update(g, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics = {
            "loss": loss,
            "grad_norm": optax.tree.norm(g),
            "pos_loss": pos_loss,
            "pos_tokens": pos_tokens,
        } | (dict(zip(("dist_hits", "dist_queries"), by_distance, strict=True)) if by_distance else {})
        return (params, opt_state), metrics

    state_sh = held_shardings(spec, pspecs, opt_sh)
    init_fn = jax.jit(init, out_shardings=state_sh)
    step_fn = jax.jit(step, in_shardings=(state_sh, bsh), out_shardings=(state_sh, None), donate_argnums=0)
    return init_fn, step_fn


def abstract_args(spec: TrialSpec, mesh: Mesh):
    """ShapeDtypeStructs with shardings for (state, batch): enough to lower the step without any data."""
    pspecs, opt_sh, p_abs, o_abs = state_shardings(spec, mesh)
    pspecs, opt_sh = held_shardings(spec, pspecs, opt_sh)  # the memory kinds, so AOT compiles see them

    def sds(a, s):
        return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)

    state = (jax.tree.map(sds, p_abs, pspecs), jax.tree.map(sds, o_abs, opt_sh))
    bsh = batch_shardings(spec, mesh)
    shape = (spec.train.batch, spec.context_length)
    batch = {k: jax.ShapeDtypeStruct(shape, dt, sharding=bsh[k]) for k, dt in batch_keys(spec).items()}
    return state, batch


def lower_train_step(spec: TrialSpec, mesh: Mesh) -> jax.stages.Lowered:
    """The real train step lowered on abstract sharded arguments (AOT compile for any topology)."""
    _, step_fn = make_train_step(spec, mesh)
    return step_fn.lower(*abstract_args(spec, mesh))
