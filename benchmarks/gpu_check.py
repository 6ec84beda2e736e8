"""The prepared device check for one NVIDIA H200: flash (cuDNN) parity and speed, one-GPU trials, host memory.

How the lead runs it through the device tool (timeout_s 600; the check plans for --budget-s 480 and kills
what still runs at 1.1x that):
    PYTHONUNBUFFERED=1 python3 benchmarks/gpu_check.py --out $OUT 2>&1 | tee $OUT/log.txt
Here first, on a CPU host (tiny sizes, kernel=flash falls back to xla and says why):
    python benchmarks/gpu_check.py --dry-run --out DIR
Afterwards, on the dev machine (where the planner imports), the planner beside each trial of sections 4-5:
    python benchmarks/gpu_check.py --compare DIR/gpu_check.json [--out DIR2]

Sections, every item timed and saved into DIR/gpu_check.json as it finishes (an item's error is recorded and
the rest go on; past its share of the budget a section records its remaining items "skipped: time"):
1 env, 2 parity, 3 speed (benchmarks/gpu_check_kernels.py, one child process); 4 trials, 5 host_memory
(benchmarks/gpu_check_trials.py, one process per trial). This parent process never starts JAX.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks import gpu_check_trials
from benchmarks.gpu_check_common import DRY, GPU, SECTIONS, Recorder

KERNELS = Path(__file__).resolve().parent / "gpu_check_kernels.py"
RESULT = "gpu_check.json"


def meta(argv: list[str], dry_run: bool, budget_s: float) -> dict[str, Any]:
    """Who made the figures: command, date, commit where git can tell."""
    out: dict[str, Any] = {
        "command": " ".join(["python benchmarks/gpu_check.py", *argv]),
        "dry_run": dry_run,
        "budget_s": budget_s,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
    }
    try:
        from orchestrator import provenance

        out["commit"] = provenance.git_commit()
    except Exception as e:  # noqa: BLE001 - the device copy may have no .git
        out["commit"] = f"unknown ({type(e).__name__})"
    return out


def run_kernels(rec: Recorder, dry_run: bool, attempts: int = 3) -> None:
    """Sections 1-3 in a child process that adds them to the JSON itself. A child that dies (a crash in a
    kernel takes the process) loses the item it was running, recorded as such; the next child goes on."""
    cmd = [
        sys.executable,
        str(KERNELS),
        "--out",
        str(rec.path),
        "--t0",
        str(rec.t0),
        "--budget-s",
        str(rec.budget_s),
        *(["--dry-run"] if dry_run else []),
    ]
    exits: list[int | str] = []
    for _ in range(attempts):
        try:
            exits.append(
                subprocess.run(
                    cmd, env=gpu_check_trials.child_env(dry_run), timeout=rec.hard_left()
                ).returncode
            )
        except subprocess.TimeoutExpired:
            exits.append("killed (the check's time limit)")
        meta = rec.data.get("meta", {})
        rec.data = Recorder(rec.path, rec.t0, rec.budget_s).data | {"meta": meta}  # with the child's sections
        running = rec.data.pop("running", None)
        if running:
            rec.items(running[0])[running[1]] = {
                "error": f"the kernels process ended during this item ({exits[-1]})"
            }
        rec.save()
        if exits[-1] == 0 or not running or not isinstance(exits[-1], int):
            break
    rec.data["meta"]["kernels_process"] = exits[-1] if len(exits) == 1 else exits
    for sec in ("env", "parity", "speed"):
        if sec not in rec.data:
            rec.data[sec] = {"error": f"the kernels process ended before this section (exit {exits[-1]})"}
    rec.save()


def check(out_dir: Path, dry_run: bool, budget_s: float, argv: list[str]) -> dict[str, Any]:
    """Run every section; the JSON's dict."""
    import time

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / RESULT
    path.unlink(missing_ok=True)
    rec = Recorder(path, time.time(), budget_s)
    rec.data["meta"] = meta(argv, dry_run, budget_s)
    rec.save()
    run_kernels(rec, dry_run)
    env = rec.data["env"].get("items", {}).get("env", {})
    api_ok = bool(env.get("private_api", {}).get("ok"))
    gpu_check_trials.trials(rec, DRY if dry_run else GPU, out_dir, api_ok, dry_run)
    gpu_check_trials.add_planner(rec)
    rec.data["meta"]["elapsed_s"] = round(rec.elapsed(), 1)
    rec.save()
    return rec.data


def gib(b: Any) -> str:
    if not isinstance(b, int | float):
        return "-"
    return f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.1f} MiB"


def num(x: Any, fmt: str) -> str:
    return format(x, fmt) if isinstance(x, int | float) else "-"


def item_line(key: str, it: dict[str, Any]) -> str:
    if "skipped" in it:
        return f"  {key:28} skipped: {it['skipped']}"
    if "error" in it and not it.get("steps_run"):
        return f"  {key:28} ERROR {it['error'].splitlines()[0][:150]}"
    ran = "cuDNN" if it.get("flash_ran") else "fell back: " + "; ".join(it.get("fallbacks", []))[:90]
    if "errors" in it:
        errs = " ".join(f"{n} {e:.1e}" for n, e in it["errors"].items())
        return f"  {key:28} {errs}  {'ok' if it['within_tol'] else 'OVER TOL'}  {ran}"
    if "tflops" in it:
        ran = "" if it["kernel"] == "xla" else ran
        rate = f"{it['tflops']:8.3g} TFLOP/s {it['frac_peak']:7.2%}"
        return f"  {key:28} {it['median_s'] * 1e3:9.2f} ms {rate}  {ran}"
    line = (
        f"  {key:28} {num(it.get('params', 0) / 1e6, '.1f')}M params, "
        f"compile {num(it.get('compile_s'), '.1f')}s, "
        f"step {num(it.get('step_time_median_s'), '.3f')}s, MFU {num(it.get('mfu'), '.1%')}, "
        f"peak {gib(it.get('peak_bytes_in_use'))}, compiled {gib(it.get('compiled_bytes_per_device'))}, "
        f"planner {gib(it.get('planner_bytes'))}, kernel {it.get('kernel')}"
    )
    if it.get("kernel_fallbacks"):
        line += f" (fell back: {'; '.join(it['kernel_fallbacks'])[:80]})"
    if vs := it.get("vs_" + gpu_check_trials.BASE):
        line += (
            "; vs " + gpu_check_trials.BASE + ": " + ", ".join(f"{k} x{v:.2f}" for k, v in vs.items() if v)
        )
    return line + (f"; ERROR {it['error'].splitlines()[0][:100]}" if "error" in it else "")


def table(data: dict[str, Any]) -> str:
    """The JSON as plain text, one line per item."""
    m = data.get("meta", {})
    lines = [
        f"gpu_check {m.get('date', '')} commit {m.get('commit', '')} dry_run={m.get('dry_run')} "
        f"elapsed {m.get('elapsed_s')}s"
    ]
    for sec in SECTIONS:
        body = data.get(sec, {})
        lines.append(sec + (f": ERROR {body['error']}" if "error" in body else ""))
        for key, it in body.get("items", {}).items():
            if sec == "env" and "error" not in it and "skipped" not in it:
                api = it["private_api"]
                lines.append(
                    f"  jax {it['jax']} jaxlib {it['jaxlib']}, {it['backend']} {it['device_kind']}, "
                    f"compute capability {it['compute_capability']}, cuDNN {it['cudnn_version']}"
                )
                lines.append(
                    f"  private cuDNN API: {'ok' if api['ok'] else 'MOVED: ' + json.dumps(api['failed'])}"
                )
            else:
                lines.append(item_line(key, it))
    return "\n".join(lines)


def compare(path: Path, out_dir: Path | None) -> int:
    """Planner (analytic bytes, predicted step) beside every measured trial of sections 4-5."""
    data = json.loads(path.read_text())
    rows = [
        "trial                          measured step / MFU      planner step / MFU       "
        "runtime peak   compiled     planner bytes"
    ]
    spec = None
    for name, it in gpu_check_trials.trial_items(data):
        if "spec" not in it:
            rows.append(f"{name:30} no spec ({it.get('skipped') or it.get('error', '')[:60]})")
            continue
        try:
            spec = gpu_check_trials.TrialSpec.from_json(it["spec"])
            it |= gpu_check_trials.planner_figures(spec)
        except Exception as e:  # noqa: BLE001 - say which trial the planner could not price, go on
            rows.append(f"{name:30} planner failed: {type(e).__name__}: {e}")
            continue
        rows.append(
            f"{name:30} {num(it.get('step_time_median_s'), '9.4g')}s / {num(it.get('mfu'), '6.1%')}     "
            f"{it['planner_step_s']:9.4g}s / {it['planner_mfu']:6.1%}     "
            f"{gib(it.get('peak_bytes_in_use')):>12}  "
            f"{gib(it.get('compiled_bytes_per_device')):>11}  {gib(it['planner_bytes']):>12}"
        )
    if spec is not None:
        # the planner's constants for the trials' cluster
        from orchestrator.plan.cluster_model import model_of

        c = model_of(spec.cluster)
        rows.append(
            f"planner step model: the trials' cluster {spec.cluster.name} (matmul_efficiency {c.matmul_efficiency}, "
            f"attention_efficiency {c.attention_efficiency}; 1.0 prices at peak, the roofline)"
        )
    print("\n".join(rows))
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "gpu_check_compare.json").write_text(json.dumps(data, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--out", type=Path, help="directory for gpu_check.json (with --compare: the annotated copy)"
    )
    p.add_argument("--dry-run", action="store_true", help="CPU host: tiny sizes, flash expected to fall back")
    p.add_argument("--compare", type=Path, metavar="FILE", help="a gpu_check.json: add the planner's figures")
    p.add_argument(
        "--budget-s", type=float, help="seconds the sections share (default: 480 GPU, 240 dry run)"
    )
    a = p.parse_args(argv)
    if a.compare:
        return compare(a.compare, a.out)
    if a.out is None:
        p.error("--out DIR is required")
    budget = a.budget_s if a.budget_s is not None else (DRY if a.dry_run else GPU).budget_s
    data = check(a.out, a.dry_run, budget, argv)
    print(table(data), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
