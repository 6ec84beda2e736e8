"""Sections 4-5 of the GPU check: one-GPU trials end to end, and host-held state / residual offload on GPU.

Each trial is `python -m jobs.train SPEC.json` (that is, jobs.train.train(spec)) in a fresh process: the
runtime's peak_bytes_in_use is a high-water mark over the process's life, so trials sharing one process would
each report the largest before them; a fresh process per trial is also the project's own rule.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.gpu_check_common import TINY, Recorder, Sizes
from jobs import flops
from jobs.spec import ClusterSpec, MemorySpec, MeshSpec, StrategySpec, TrainSpec, TrialSpec

ROOT = Path(__file__).resolve().parent.parent
# One H200; its dense bf16 peak is jobs/flops.py's.
H200_1 = ClusterSpec(
    name="h200_1",
    kind="local",
    platform="gpu",
    accelerator="h200",
    hosts=1,
    devices_per_host=1,
    peak_tflops_per_device=flops.PEAK_TFLOPS_PER_DEVICE["h200"],
)
BASE = "big"  # section 5 compares against this section-4 trial
HOST = MemorySpec(host=("optimizer", "params"))  # jobs/spec.py HOST_STATE: train state in pinned host memory
OFFLOAD = MemorySpec(offload=("layer_input",))  # each layer's input residual to host between fwd and bwd


def trial_spec(s: Sizes, model_big: bool, kernel: str, memory: MemorySpec | None = None) -> TrialSpec:
    """A one-device trial: no CP, batch 1, bf16, full remat."""
    model, L = (s.big_model, s.big_L) if model_big else (TINY, s.tiny_L)
    train = TrainSpec(steps=s.steps, batch=1, dtype="bfloat16", remat="full", memory=memory or MemorySpec())
    strategy = StrategySpec(name="none", layout="contiguous", kernel=kernel)
    return TrialSpec(
        model=model, mesh=MeshSpec(), strategy=strategy, context_length=L, train=train, cluster=H200_1
    )


def summarise(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of one trial from its records (start, steps, summary)."""
    start = next((r for r in records if r.get("kind") == "start"), {})
    steps = [r for r in records if r.get("kind") == "step"]
    summary = next((r for r in records if r.get("kind") == "summary"), {})
    peaks = [r["peak_bytes_in_use"] for r in [*steps, summary] if r.get("peak_bytes_in_use") is not None]
    keys = (
        "compile_s",
        "platform",
        "peak_tflops_per_device",
        "tflops_per_device_per_step",
        "argument_bytes",
        "temp_bytes",
        "compiled_bytes_per_device",
    )
    out = {k: start.get(k) for k in keys}
    out["kernel_fallbacks"] = start.get("kernel_fallbacks") or []
    out |= {k: summary.get(k) for k in ("step_time_median_s", "mfu", "tokens_per_s", "final_loss")}
    out["timed_steps"] = [summary.get("timed_from_step"), summary.get("timed_to_step")]
    out["step_times_s"] = [r["step_time_s"] for r in steps]
    out["peak_bytes_in_use"] = max(peaks) if peaks else None
    out["steps_run"] = len(steps)
    return out


def run_trial(
    spec: TrialSpec, out_dir: Path, key: str, timeout_s: float, env: dict[str, str]
) -> dict[str, Any]:
    """One trial in a fresh process; its figures, the spec it ran and, on failure, why."""
    path = out_dir / f"{key}.spec.json"
    path.write_text(spec.to_json())
    res: dict[str, Any] = {
        "spec": spec.to_json(),
        "params": spec.model.n_params(),
        "kernel": spec.strategy.kernel,
    }
    cmd = [sys.executable, "-m", "jobs.train", str(path)]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
        stdout, stderr, rc = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        stdout, stderr, rc = _text(e.stdout), _text(e.stderr), None
        res["error"] = f"killed after {timeout_s:.0f}s (the check's time limit)"
    (out_dir / f"{key}.stderr.txt").write_text(stderr)
    records = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    res |= summarise(records)
    if rc:
        tail = "\n".join(stderr.strip().splitlines()[-15:])
        res["error"] = f"exit {rc}: {tail}"[-3000:]
    return res


def _text(b: bytes | str | None) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def child_env(dry_run: bool) -> dict[str, str]:
    """The trial processes' environment: the repository importable; a dry run on one simulated CPU device."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    if dry_run:
        env |= {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    return env


def trials(rec: Recorder, s: Sizes, out_dir: Path, api_ok: bool, dry_run: bool) -> None:
    """Sections 4 and 5. The tiny trial goes first: if the flash kernel breaks a whole step there, the 1B
    trials run the xla kernel instead (and say so) rather than fail the same way three more times."""
    env = child_env(dry_run)
    kernel = s.trial_kernel if api_ok else "xla"
    rec.data.setdefault("trials", {})["kernel"] = kernel if api_ok else "xla (private cuDNN API check failed)"
    tiny = rec.run(
        "trials",
        "tiny",
        lambda: run_trial(trial_spec(s, False, kernel), out_dir, "tiny", rec.hard_left(), env),
    )
    if "error" in tiny and "killed" not in tiny["error"] and kernel != "xla":
        kernel = "xla"
        rec.data["trials"]["kernel"] = "xla (the tiny trial failed with the flash kernel)"
    print(f"{s.big_model.name}: {s.big_model.n_params():,} parameters", flush=True)
    big = lambda key, mem: (
        lambda: run_trial(trial_spec(s, True, kernel, mem), out_dir, key, rec.hard_left(), env)
    )
    base = rec.run("trials", BASE, big(BASE, MemorySpec()))
    for key, mem in (("host_state", HOST), ("offload_layer_input", OFFLOAD)):
        res = rec.run("host_memory", key, big(key, mem))
        res["vs_" + BASE] = {
            k: res[k] / base[k] if res.get(k) and base.get(k) else None
            for k in ("compiled_bytes_per_device", "temp_bytes", "peak_bytes_in_use", "step_time_median_s")
        }
        rec.save()


def planner_figures(spec: TrialSpec) -> dict[str, Any]:
    """The planner's analytic bytes and predicted step (ImportError where the planner cannot load)."""
    from orchestrator.plan import memory, steptime

    st = steptime.step_time(spec)
    return {
        "planner_bytes": memory.total(spec),
        "planner_step_s": st.step_s,
        "planner_mfu": st.mfu,
        "planner_limiter": st.limiter,
    }


def add_planner(rec: Recorder) -> None:
    """Every trial's planner figures next to its measured ones, or why there are none."""
    try:
        import orchestrator.plan.memory  # noqa: F401 - only to say whether the planner loads on this host
    except ImportError as e:
        rec.data["meta"]["planner"] = f"not importable here ({e})"
    for section in ("trials", "host_memory"):
        for item in rec.data.get(section, {}).get("items", {}).values():
            if "spec" not in item:
                continue
            try:
                item |= planner_figures(TrialSpec.from_json(item["spec"]))
            except ImportError:
                item["planner"] = "not importable here"
            except Exception as e:  # noqa: BLE001 - a planner bug must not cost the measured figures
                item["planner"] = f"{type(e).__name__}: {e}"
    rec.save()


def trial_items(data: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(section/key, item) of sections 4-5, in order."""
    return [
        (f"{sec}/{k}", v)
        for sec in ("trials", "host_memory")
        for k, v in data.get(sec, {}).get("items", {}).items()
    ]
