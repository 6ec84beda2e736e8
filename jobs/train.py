"""One trial on one host: spec in, a stream of metric records out (`python -m jobs.train spec.json`).

The host loop reports step n-1 after dispatching step n, so the device never waits on Python or logging.
Only process 0 yields records.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from jobs import flops
from jobs.attention.kernels import flash
from jobs.data import Batches
from jobs.data.buckets import bucket_labels
from jobs.faults import Faults
from jobs.hardware import compiled_bytes, device_memory, peak_tflops, program_peak_bytes
from jobs.mesh import make_mesh
from jobs.peers import compile_once, shares_compiles, sync_hosts
from jobs.profile import steps_problem
from jobs.profile.trace import Profiler
from jobs.records import ProfileRecord, Record, StartRecord, StepRecord, SummaryRecord, parse
from jobs.spec import TrialSpec
from jobs.step import abstract_args, batch_shardings, make_train_step
from jobs.strategies import rules

Fields = dict[str, Any]  # some fields of a start or summary record


def configure_host(spec: TrialSpec) -> None:
    """Standalone runs on CPU: simulate the spec's devices (read at backend start, so before jax.devices())."""
    for key, value in spec.cluster.host_env().items():
        if key == "XLA_FLAGS" and "xla_force_host_platform_device_count" not in os.environ.get(key, ""):
            os.environ[key] = (os.environ.get(key, "") + " " + value).strip()  # keep the user's other flags
        else:
            os.environ.setdefault(key, value)


def memory_record(compiled, platform: str) -> Fields:
    ma = compiled.memory_analysis()
    if ma is None:
        return {}
    out = {
        "argument_bytes": ma.argument_size_in_bytes,
        "output_bytes": ma.output_size_in_bytes,
        "alias_bytes": ma.alias_size_in_bytes,
        "temp_bytes": ma.temp_size_in_bytes,
    }
    out["compiled_bytes_per_device"] = compiled_bytes(ma)
    # the compiler's own peak where it is the chip's (XLA:CPU's leaves out its temporaries)
    if platform != "cpu" and (peak := program_peak_bytes(ma)) is not None:
        out["program_peak_bytes"] = peak
    return out


def slice_record(mesh: Mesh, dcn: str, slices: int) -> Fields:
    """Where the dcn axis landed: per position along it, the processes holding it (a multislice check)."""
    if slices <= 1:
        return {}
    axis = mesh.axis_names.index(dcn)
    by_pos = np.moveaxis(mesh.devices, axis, 0).reshape(mesh.devices.shape[axis], -1)
    return {"slices": slices, "dcn_processes": [sorted({d.process_index for d in row}) for row in by_pos]}


def _put(batch: dict[str, np.ndarray], shardings: dict) -> dict[str, jax.Array]:
    """Each process supplies only the shards its devices own (works single- and multi-host)."""
    return {
        k: jax.make_array_from_callback(v.shape, shardings[k], lambda idx, v=v: v[idx])
        for k, v in batch.items()
    }


def check(spec: TrialSpec) -> None:
    """The job's own guard (the planner checks the same before launch): one clear ValueError."""
    m, t = spec.model, spec.mesh.tensor
    if m.q_heads % t or m.kv_heads % t:
        raise ValueError(
            f"heads not divisible by the tensor axis: q_heads {m.q_heads}, kv_heads {m.kv_heads}, tensor {t}; "
            f"use a tensor size dividing {m.kv_heads}"
        )
    problem = rules.batch_problem(spec.train.batch, spec.mesh.data, spec.mesh.fsdp, spec.train.grad_accum)
    if problem:
        raise ValueError(problem)
    if why := steps_problem(spec.run.profile_steps, spec.train.steps):
        wrong, allowed, fix = why
        raise ValueError(
            f"run.profile_steps={list(spec.run.profile_steps)} {wrong}; allowed: {allowed} — {fix}"
        )


def train(spec: TrialSpec) -> Iterator[Record]:
    """Run the trial; yield a `start` record, one `step` record per step (a `profile` after each traced window
    of run.profile_steps), then a `summary` (jobs/records.py); their dict form is what the Ray batch, the
    standalone output and the checkpoint carry. Process 0 yields them all; another process only its profiles
    (run.profile_hosts=all).
    With run.checkpoint_dir set, resume from its latest checkpoint and save every run.checkpoint_every steps."""
    check(spec)
    lead = jax.process_index() == 0
    for rec in _attempt(spec, lead):
        if lead or isinstance(rec, ProfileRecord):
            yield rec


def _attempt(spec: TrialSpec, lead: bool) -> Iterator[Record]:
    """One attempt: compile, restore what a checkpoint holds, step to the end, summarize (every process)."""
    devices = jax.devices()
    if spec.cluster.devices < len(devices):  # e.g. a 1-device reference run inside an 8-device process
        devices = devices[: spec.cluster.devices]
    slices = spec.cluster.slices_per_trial
    mesh = make_mesh(spec.mesh, devices, slices)
    batches = Batches(spec)  # fails early on a missing data file
    init_fn, step_fn = make_train_step(spec, mesh)
    flash.FALLBACKS.clear()  # what this trace adds is this trial's (a cache hit still traces)
    compiled, init_fn, compile_s = _compile(spec, mesh, init_fn, step_fn)
    peak, peak_source = peak_tflops(spec)
    mem = memory_record(compiled, devices[0].platform)
    ckpt, state, first, history, restore_s = _resume(spec, mesh, init_fn, batches)
    sync_hosts("ready")  # after the init's compile too: the first step's collectives are the next thing
    steps = _Steps(spec, compiled, peak, lead, history)
    yield StartRecord(
        trial_id=spec.trial_id,
        devices=spec.mesh.size,
        processes=jax.process_count(),
        platform=jax.devices()[0].platform,
        compile_s=compile_s,
        restore_s=restore_s,
        peak_tflops_per_device=peak,
        peak_source=peak_source,
        tflops_per_device_per_step=steps.tflops,
        resumed_from_step=first,
        **mem,
        **slice_record(mesh, spec.mesh.dcn, slices),
        kernel_fallbacks=list(flash.FALLBACKS) or None,
    )
    # The checkpoint's records: the driver may never have received them (it drops steps it holds).
    yield from list(history)
    yield from _loop(spec, compiled, state, first, batches, batch_shardings(spec, mesh), steps, ckpt)
    if ckpt:
        ckpt.close()
    if history:
        yield _summary(spec, history, first, steps, mem, lead)


def _compile(spec: TrialSpec, mesh: Mesh, init_fn, step_fn) -> tuple[Any, Any, float]:
    """(the compiled step, the state's init, seconds until both can run). Where processes share a machine the
    init is compiled here too, so that its later processes load both (peers.compile_once); elsewhere it
    compiles at its first call, which a resumed trial never makes."""
    shared = shares_compiles()

    def lower() -> list[jax.stages.Lowered]:
        step = step_fn.lower(*abstract_args(spec, mesh))
        return [step, init_fn.lower(jax.random.key(spec.train.seed))] if shared else [step]

    t0 = time.perf_counter()
    compiled = compile_once(lower, list(mesh.devices.flat))
    return compiled[0], (compiled[1] if len(compiled) > 1 else init_fn), time.perf_counter() - t0


def _resume(spec: TrialSpec, mesh: Mesh, init_fn, batches: Batches) -> tuple[Any, Any, int, list, float]:
    """(checkpointer or None, state, first step, the records so far, restore seconds): a fresh start, or
    where run.checkpoint_dir's latest checkpoint left the trial."""
    ckpt = None
    if spec.run.checkpoint_dir:
        from jobs.checkpoint import Checkpointer  # orbax costs ~1 s to import: only when checkpointing

        ckpt = Checkpointer(spec.run.checkpoint_dir, spec.run.checkpoint_every)
    t0 = time.perf_counter()
    restored = ckpt.restore(abstract_args(spec, mesh)[0]) if ckpt else None
    if not restored:
        return ckpt, init_fn(jax.random.key(spec.train.seed)), 0, [], 0.0
    state, first, saved, data_state = restored
    if data_state:
        batches.restore(data_state)  # packed documents: the iterator resumes where the checkpoint left it
    history: list[StepRecord] = [parse(r) for r in saved]  # type: ignore[misc]
    return ckpt, state, first, history, time.perf_counter() - t0


class _Steps:
    """Turns a finished step's metrics into its record, appended to `history` (what a checkpoint carries);
    the time between two finishes is the step's."""

    def __init__(self, spec: TrialSpec, compiled, peak: float, lead: bool, history: list[StepRecord]):
        self.tokens = spec.tokens_per_step
        self.tflops = flops.train_tflops_per_device(
            spec.model, spec.context_length, spec.train.batch, spec.mesh.size
        )
        self.peak, self.lead, self.history = peak, lead, history
        self.labels = bucket_labels(spec.context_length)
        self.prof = Profiler(spec, compiled, on=lead or spec.run.profile_hosts == "all")
        self.last = time.perf_counter()

    def restart_clock(self) -> None:
        """What just happened (a trace's stop, a save) is not the next step's time."""
        self.last = time.perf_counter()

    def finish(self, step: int, m: dict) -> StepRecord:
        loss = float(m["loss"])  # blocks until `step` is done; the next step is already queued
        now = time.perf_counter()
        dt, self.last = now - self.last, now
        tf = self.tflops / dt
        in_use, peak_bytes = device_memory() if self.lead else (None, None)  # only process 0's are sent
        self.history.append(
            StepRecord(
                step=step,
                t_ms=int(time.time() * 1000),  # the record's own time: a re-sent copy is the same point
                loss=loss,
                grad_norm=float(m["grad_norm"]),
                step_time_s=dt,
                tokens_per_s=self.tokens / dt,
                tflops_per_s_per_device=tf,
                mfu=_mfu(tf, self.peak),
                runtime_peak_bytes=peak_bytes,
                runtime_bytes_in_use=in_use,
                loss_by_position=self._buckets(m, "pos_loss", "pos_tokens"),
                accuracy_by_distance=self._buckets(m, "dist_hits", "dist_queries"),
                profiled=self.prof.covers(step),
            )
        )
        return self.history[-1]

    def _buckets(self, m: dict, total: str, count: str) -> dict[str, float] | None:
        """Per position bucket: total / count where the bucket counted any (None: the metric is not there,
        as the recall task's distance buckets outside that task)."""
        if total not in m:
            return None
        tot, n = np.asarray(m[total]), np.asarray(m[count])
        return {k: float(t / c) for k, t, c in zip(self.labels, tot, n, strict=True) if c > 0}


def _mfu(tflops_per_s: float, peak: float) -> float:
    return tflops_per_s / peak if peak == peak and peak > 0 else float("nan")


def _loop(
    spec: TrialSpec, compiled, state, first: int, batches, bsh, steps: _Steps, ckpt
) -> Iterator[Record]:
    """Steps first..train.steps-1: step n-1 is reported after step n is dispatched; a traced window and a
    checkpoint report theirs before they close."""
    faults = Faults(jax.process_index())
    prof = steps.prof
    prev = None  # (step, metrics) dispatched but not yet reported
    for step in range(first, spec.train.steps):
        if prev is not None and prof.opens(step):  # a trace holds its own steps only: the one before is done
            yield steps.finish(*prev)
            prev = None
        prof.start(step)
        state, metrics = compiled(state, _put(batches(step), bsh))
        faults.slow_step()
        if prev is not None:
            yield steps.finish(*prev)
            faults.at(prev[0], "after_report")
        prev = (step, metrics)
        if prof.closes(step):  # the window's last step done before the trace stops
            yield steps.finish(*prev)
            prev = None
            if (profile := prof.stop(step, state)) is not None:  # never in `history`: not checkpointed
                yield profile
            steps.restart_clock()
        if ckpt and ckpt.due(step):
            yield from _save(step, state, prev, steps, ckpt, batches, faults)
            prev = None
    if prev is not None:
        yield steps.finish(*prev)


def _save(step: int, state, prev, steps: _Steps, ckpt, batches, faults: Faults) -> Iterator[Record]:
    """Report the step before saving, so the checkpoint holds every record up to the step it covers: whatever
    the driver has not received yet, a resumed trial re-sends."""
    faults.at(step, "before_save")
    rec = steps.finish(*prev) if prev else None  # None: reported already, at a profile's end
    ckpt.save(step, state, [r.to_dict() for r in steps.history], batches.state(step + 1))
    faults.at(step, "after_save")
    if rec:
        yield rec
    faults.at(step, "after_report")
    steps.restart_clock()  # the save is not part of the next step's time


def _summary(
    spec: TrialSpec, history: list[StepRecord], first: int, steps: _Steps, mem: Fields, lead: bool
) -> SummaryRecord:
    """The first step of an attempt includes warm-up (allocation, first transfer): the median of the others is
    the step time, and the summary says which steps (of which attempt) it covers. An attempt that resumed
    after the last step times the steps its checkpoint carried instead."""
    ran = [r for r in history if r.step >= first]  # this attempt's steps
    timed = ran or history
    timed = timed[1:] if len(timed) > 1 else timed
    timed = [r for r in timed if not r.profiled] or timed  # a traced step's time includes the tracing
    med = float(np.median([r.step_time_s for r in timed]))
    return SummaryRecord(
        steps=spec.train.steps,
        final_loss=history[-1].loss,
        steps_run=len(ran),
        attempt_from_step=first,
        timed_from_step=timed[0].step,
        timed_to_step=timed[-1].step,
        step_time_median_s=med,
        tokens_per_s=steps.tokens / med,
        tflops_per_s_per_device=steps.tflops / med,
        mfu=_mfu(steps.tflops / med, steps.peak),
        runtime_peak_bytes=device_memory()[1] if lead else None,
        **mem,
    )


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m jobs.train SPEC.json", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        spec = TrialSpec.from_json(f.read())
    configure_host(spec)
    for rec in train(spec):
        print(rec.to_json(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
