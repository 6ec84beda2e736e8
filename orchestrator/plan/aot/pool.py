"""Many points' compiles at once: one Ray task per point, each in a fresh process reserving the host memory its
compile needs, all reading and writing one cache (a directory, or gs://bucket/prefix that every user and the
nightly sweep share). The tasks run on the Ray this process is connected to: orchestrator/launch/cluster.py's
join_or_start starts or joins it. ray is imported only inside functions: `orchestrator.plan.aot` stays
importable without it.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

from rich.console import Console

from jobs.spec import TrialSpec
from orchestrator.plan.aot import cache
from orchestrator.plan.aot.result import CompileResult, failed, perturb, worst
from orchestrator.plan.aot.target import CHIPS, compile_host_bytes, topology_tag
from orchestrator.ui.progress import CompileBar

log = logging.getLogger(__name__)
# What the driver's serial compile reads from its environment besides the cache: libtpu's flags change the
# program compiled, the emulator and project where a gs:// cache is. A worker of a Ray started elsewhere (a
# cluster, another test) has its own environment, so they travel with each task.
FORWARD = ("LIBTPU_INIT_ARGS", "STORAGE_EMULATOR_HOST", "GOOGLE_CLOUD_PROJECT")


def worker_env(cache_at: str = "") -> dict[str, str]:
    """What a compile task sets before jax loads: the cache location, the driver's FORWARD variables, and
    ALLOW_MULTIPLE_LIBTPU_LOAD=1, without which the second libtpu process on a host stops at libtpu's
    /tmp/libtpu_lockfile ("ABORTED: Internal error when accessing libtpu multi-process lockfile", checked with
    libtpu 0.0.42.1); JAX_PLATFORMS=cpu, so a task landing on a TPU host never takes its chips (the compile
    asks libtpu for a virtual topology either way; the program hash is the same)."""
    env = {k: os.environ[k] for k in FORWARD if k in os.environ}
    env[cache.ENV] = cache.location(cache_at)
    return env | {"ALLOW_MULTIPLE_LIBTPU_LOAD": "1", "JAX_PLATFORMS": "cpu"}


def _compile(spec_json: str, topology: str | None, env: dict[str, str], draw: int = 1) -> tuple[str, bool]:
    """The task: the point's cached answer (draw `draw`'s), else its compile (cached), as (CompileResult JSON,
    cache hit)."""
    os.environ.update(env)  # a fresh process (max_calls=1): before jax and the storage client read them
    perturb(draw)
    spec = TrialSpec.from_json(spec_json)
    try:
        got, hit = cache.lookup(spec, topology, draw=draw)
    except Exception as e:  # noqa: BLE001 -- one broken point must not hide the others' answers
        got, hit = failed(spec, topology, e), False
    return got.to_json(), hit


@functools.cache
def _task() -> Any:
    import ray

    # A fresh process per compile: libtpu's flags are read once per process, and a finished compile's
    # gigabytes go back to the host. No retry: a compile that killed its worker would do it again.
    return ray.remote(num_cpus=1, max_calls=1, max_retries=0)(_compile)


def node_memory() -> int | None:
    """The largest `memory` resource among alive nodes with CPUs: no compile may ask for more, or Ray would
    hold it forever."""
    import ray

    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive") and n["Resources"].get("CPU")]
    return int(max((r.get("memory", 0) for r in nodes), default=0)) or None


def label(spec: TrialSpec, topology: str | None = None) -> str:
    tag = topology_tag(spec, topology) if spec.cluster.accelerator in CHIPS else spec.cluster.accelerator
    return f"{spec.strategy.name} {spec.mesh.label()} {spec.context_length:,} on {tag} ({spec.trial_id})"


def compile_all(
    specs: list[TrialSpec],
    topology: str | None = None,
    *,
    workers: int = 0,
    cache_at: str = "",
    progress: str = "auto",
    console: Console | None = None,
    draws_per_point: int = 1,
) -> list[tuple[CompileResult, bool]]:
    """(CompileResult, cache hit) per spec, in order: at most `workers` compiles at once (0: one per CPU of the
    Ray cluster), each a Ray task reserving compile_host_bytes of memory, all on the cache at `cache_at` ("":
    $CP_AOT_CACHE, else .cache/aot). A compile that raised, or whose worker died, is a failed result. With
    `draws_per_point` k > 1 each point is compiled k times, each draw its own task, and judged by the worst
    (result.worst); its hit is True only when every draw was cached. `progress`: auto | rich | plain, on
    `console` (a new one on stdout when None). Ray must be up (launch/cluster.py's
    join_or_start): a task would otherwise start one of Ray's choosing, which may be another user's."""
    if not specs:
        return []
    import ray

    if not ray.is_initialized():
        raise RuntimeError("no Ray to compile on: start or join one first (launch.cluster.join_or_start)")
    slots = workers or max(int(ray.cluster_resources().get("CPU", 1)), 1)
    cap, env, task = node_memory(), worker_env(cache_at), _task()
    k = max(draws_per_point, 1)
    got_draws: list[list[tuple[CompileResult, bool] | None]] = [[None] * k for _ in specs]
    # popped from the end: submitted in the given order, a point's draws one after another
    todo = [(i, d) for i in reversed(range(len(specs))) for d in reversed(range(1, k + 1))]
    running: dict[Any, tuple[int, int]] = {}
    # The driver keeps `slots` tasks in flight (not Ray's CPU count): aot_workers holds on a shared cluster too.
    with CompileBar(len(todo), slots, progress, console) as bar:
        while todo or running:
            while todo and len(running) < slots:
                i, d = todo.pop()
                opts: dict[str, Any] = {"memory": compile_host_bytes(specs[i], cap)}
                if d > 1:  # its own worker process, started with its own string hashing (result.perturb)
                    opts["runtime_env"] = {"env_vars": {"PYTHONHASHSEED": str(d)}}
                running[task.options(**opts).remote(specs[i].to_json(), topology, env, d)] = (i, d)
            bar.set_running(len(running))
            [ref], _ = ray.wait(list(running), num_returns=1)
            i, d = running.pop(ref)
            try:
                text, hit = ray.get(ref)
                got = CompileResult.from_json(text)
            except Exception as e:  # noqa: BLE001 -- the worker died (killed for memory, crashed): a row
                got, hit = failed(specs[i], topology, e), False
            got_draws[i][d - 1] = (got, hit)
            name = label(specs[i], topology) + (f" draw {d}/{k}" if k > 1 else "")
            bar.finished(name, _outcome(got, hit), got.status == "failed", hit)
    out = []
    for row in got_draws:
        done = [x for x in row if x is not None]  # every slot filled: the loop ends when none is left
        out.append((worst([g for g, _ in done]), all(h for _, h in done)))
    return out


def _outcome(got: CompileResult, hit: bool) -> str:
    """A finished compile in words, for the progress line."""
    if hit:
        return f"{got.status} (cache hit)"
    return f"failed: {got.error}" if got.status == "failed" else f"{got.status} in {got.compile_s:.0f} s"
