"""Measurements on one real TPU chip, run on the TPU VM itself (no Ray, no MLflow: only jax and jobs/).

    python -m benchmarks.chip env|hostlink|matmul|splash|train [--specs DIR] [--out DIR] [--budget-s S]

Each part appends JSON lines to OUT/<part>.jsonl as it goes, so a run cut short keeps what it measured:
- env: versions, the device and its memory limit;
- hostlink: device -> pinned host and back, bytes/s each way (what train.memory's offload and host state pay);
- matmul: a large bf16 matmul's TFLOP/s (how close the chip comes to its spec sheet);
- splash: a bare `splash_attention` call (forward + backward) over block sizes and the fused backward, and the
  job's own attention path (jobs.attention.attention, strategy none) at the same shapes, splash and xla;
- train: every TrialSpec JSON in --specs (sorted by name) through the job's own `jobs.train.train`, one process:
  the compile's memory analysis, each step's time, the runtime's counters, or the error that stopped it.
The page and the planner's side of each point are benchmarks/chip_page.py's (on any host).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import traceback
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jobs import tuning

GIB = 2**30


class Sink:
    """OUT/<part>.jsonl, a line per result, flushed at once."""

    def __init__(self, out: Path, part: str):
        out.mkdir(parents=True, exist_ok=True)
        self.f = open(out / f"{part}.jsonl", "a")  # noqa: SIM115

    def __call__(self, **rec) -> None:
        line = json.dumps(rec, default=str)
        print(line, flush=True)
        self.f.write(line + "\n")
        self.f.flush()


def _time(fn, *args, reps: int = 5) -> tuple[float, float]:
    """(first call incl. compile, median of `reps` later calls), seconds."""
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    first = time.perf_counter() - t0
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        ts.append(time.perf_counter() - t0)
    return first, float(np.median(ts))


def env(sink: Sink, _args) -> None:
    import importlib.metadata as md

    vers = {}
    for pkg in ("jax", "jaxlib", "libtpu", "libtpu-nightly", "optax"):
        try:
            vers[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    d = jax.devices()[0]
    sink(
        part="env",
        versions=vers,
        platform=d.platform,
        device_kind=d.device_kind,
        devices=len(jax.devices()),
        memory_stats=d.memory_stats(),
        python=sys.version.split()[0],
        cpus=os.cpu_count(),
    )


def hostlink(sink: Sink, _args) -> None:
    d = jax.devices()[0]
    dev = jax.sharding.SingleDeviceSharding(d)
    host = dev.with_memory_kind("pinned_host")
    for size in (256 * 2**20, GIB):
        x = jax.device_put(jnp.ones((size // 2,), jnp.bfloat16), dev)
        to_host = jax.jit(lambda a: a, out_shardings=host)
        to_dev = jax.jit(lambda a: a, out_shardings=dev)
        h = jax.block_until_ready(to_host(x))
        _, down = _time(to_host, x)
        _, up = _time(to_dev, h)
        # device_put too (what a host-resident state's step does is a jit with memory kinds, above)
        _, put_down = _time(lambda a: jax.device_put(a, host), x)
        _, put_up = _time(lambda a: jax.device_put(a, dev), h)
        sink(
            part="hostlink",
            bytes=size,
            device_to_host_s=down,
            host_to_device_s=up,
            device_to_host_bytes_per_s=size / down,
            host_to_device_bytes_per_s=size / up,
            put_device_to_host_bytes_per_s=size / put_down,
            put_host_to_device_bytes_per_s=size / put_up,
        )
        del x, h
        gc.collect()


def matmul(sink: Sink, _args) -> None:
    for n in (4096, 8192):
        a = jnp.ones((n, n), jnp.bfloat16)
        f = jax.jit(lambda x: x @ x)
        _, t = _time(f, a, reps=10)
        sink(part="matmul", n=n, seconds=t, tflops=2 * n**3 / t / 1e12)


SPLASH_SHAPES = (  # (q heads, kv heads, head_dim, length): the attention of the chip's train points
    (16, 8, 128, 8192),
    (16, 8, 128, 32768),
    (4, 1, 256, 32768),
)
BLOCKS = (128, 256, 512, 1024, 2048)


def _bare(hq: int, L: int, b: int, fused: bool):
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    from jobs.attention.kernels.splash_private import block_sizes

    mask = sm.MultiHeadMask([sm.CausalMask((L, L))] * hq)
    return sk.make_splash_mha(mask, block_sizes=block_sizes(b, b, fused), head_shards=1, q_seq_shards=1)


def _timing(first: float, t: float, flops: float) -> dict:
    """A timed call's fields: its first call (compile included), its median, and the rate that median gives."""
    return {"first_s": first, "seconds": t, "tflops": flops / t / 1e12}


def _fwd_bwd(attend):
    def loss(q, k, v):
        return jnp.sum(attend(q, k, v).astype(jnp.float32))

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


def _job_path(sink: Sink, rec: dict, mesh, kernel: str, b: int, qkv, flops: float) -> float | None:
    from jobs.attention.api import attention
    from jobs.attention.kernels import splash_private

    splash_private.make.cache_clear()
    out = None
    try:
        f = _fwd_bwd(
            lambda q_, k_, v_: attention(
                q_, k_, v_, strategy="none", mesh=mesh, kernel=kernel, block_q=b, block_kv=b
            )
        )
        first, t = _time(f, *qkv)
        sink(**rec, path="job", kernel=kernel, block=b, **_timing(first, t, flops))
        out = t
    except Exception as e:
        sink(**rec, path="job", kernel=kernel, block=b, error=str(e).splitlines()[0][:300])
    splash_private.make.cache_clear()
    jax.clear_caches()
    gc.collect()
    return out


def splash(sink: Sink, args) -> None:
    """Bare splash over block sizes and the fused backward, per shape; then the job's own path
    (splash at jobs/tuning.py's block, fused where jobs.tuning.fused_backward allows) and the xla kernel at 512,
    for the same shapes."""
    from jax.sharding import Mesh

    mesh = Mesh(np.array(jax.devices()[:1]), ("context",))
    key = jax.random.key(0)
    best: dict[tuple[int, int], tuple[float, int, bool]] = {}
    data = {}
    for hq, hkv, D, L in SPLASH_SHAPES:
        ks = jax.random.split(key, 3)
        q = jax.random.normal(ks[0], (hq, L, D), jnp.bfloat16)
        k = jax.random.normal(ks[1], (hkv, L, D), jnp.bfloat16)
        v = jax.random.normal(ks[2], (hkv, L, D), jnp.bfloat16)
        flops = 4 * L * L * hq * D / 2 * 3.5  # causal: forward x1, backward x2.5 (its five matmuls of four)
        rec = dict(part="splash", hq=hq, hkv=hkv, head_dim=D, length=L)
        data[(D, L)] = (rec, flops, q, k, v)
        for b in BLOCKS:
            if b > L or (b == 128 and L > 8192) or time.monotonic() > args.deadline - 370:
                continue
            for fused in (False, True):
                try:
                    first, t = _time(_fwd_bwd(_bare(hq, L, b, fused)), q, k, v)
                    sink(**rec, path="bare", block=b, fused_bwd=fused, **_timing(first, t, flops))
                    if (D, L) not in best or t < best[(D, L)][0]:
                        best[(D, L)] = (t, b, fused)
                except Exception as e:  # a block the chip's VMEM cannot take: say so, go on
                    sink(**rec, path="bare", block=b, fused_bwd=fused, error=str(e).splitlines()[0][:300])
                jax.clear_caches()
                gc.collect()
    sink(part="splash_best", best={f"{D}/{L}": [b, f, t] for (D, L), (t, b, f) in best.items()})
    for (D, L), (rec, flops, q, k, v) in data.items():
        if time.monotonic() > args.deadline - 330:
            continue
        qkv = tuple(jnp.swapaxes(x, 0, 1)[None] for x in (q, k, v))  # the job's [B, L, H, D]
        # the job's own choice: the tuned block (jobs/tuning.py), fused where its partial dq fits
        _job_path(sink, rec, mesh, "splash", tuning.block("splash", "v5litepod", D, L), qkv, flops)
        _job_path(sink, rec, mesh, "xla", 512, qkv, flops)


def train_points(sink: Sink, args) -> None:
    from jobs import train
    from jobs.hardware import device_memory
    from jobs.spec import TrialSpec

    deadline = min(time.monotonic() + args.budget_s, args.deadline)
    for path in sorted(Path(args.specs).glob("*.json")):
        left = deadline - time.monotonic()
        if left < args.min_left_s:
            sink(part="train", name=path.stem, skipped=f"{left:.0f} s left of the budget")
            continue
        spec = TrialSpec.from_json(path.read_text())
        rec = dict(
            part="train",
            name=path.stem,
            trial_id=spec.trial_id,
            block=spec.strategy.block_q,
        )
        t0 = time.perf_counter()
        start, steps, summary = None, [], None
        try:
            for r in train.train(spec):
                d = r.to_dict()
                if d["kind"] == "start":
                    start = d
                elif d["kind"] == "step":
                    steps.append(
                        {
                            k: d.get(k)
                            for k in (
                                "step",
                                "loss",
                                "step_time_s",
                                "mfu",
                                "runtime_peak_bytes",
                                "runtime_bytes_in_use",
                            )
                        }
                    )
                elif d["kind"] == "summary":
                    summary = d
            sink(
                **rec,
                ok=True,
                wall_s=time.perf_counter() - t0,
                start=start,
                steps=steps,
                summary=summary,
                runtime=device_memory(),
            )
        except Exception as e:
            msg = str(e)
            sink(
                **rec,
                ok=False,
                wall_s=time.perf_counter() - t0,
                start=start,
                steps=steps,
                error_type=type(e).__name__,
                error=msg[:4000],
                oom="RESOURCE_EXHAUSTED" in msg or "out of memory" in msg.lower(),
                trace=traceback.format_exc()[-2000:],
            )
        jax.clear_caches()
        gc.collect()


PARTS = {"env": env, "hostlink": hostlink, "matmul": matmul, "splash": splash, "train": train_points}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("parts", nargs="+", choices=tuple(PARTS))
    p.add_argument("--specs", default="chip/specs", help="folder of TrialSpec JSON files (train)")
    p.add_argument("--out", default=os.environ.get("OUT", "chip/out"))
    p.add_argument(
        "--budget-s", type=float, default=480.0, help="train: start no point after this many seconds"
    )
    p.add_argument(
        "--total-s", type=float, default=1e9, help="every part: start nothing after this many seconds"
    )
    p.add_argument("--min-left-s", type=float, default=25.0, help="train: skip a point with less left")
    args = p.parse_args(argv)
    args.deadline = time.monotonic() + args.total_s
    out = Path(args.out)
    for part in args.parts:
        t0 = time.perf_counter()
        try:
            PARTS[part](Sink(out, part), args)
        except Exception:
            Sink(out, "errors")(part=part, trace=traceback.format_exc()[-3000:])
        print(f"# {part}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
