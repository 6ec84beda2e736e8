"""`specs=DIR`: each runnable point's TrialSpec, its memory policy resolved, as a file a host of its cluster runs
with `python -m jobs.train`; nothing starts."""

from __future__ import annotations

import sys

from jobs import storage
from jobs.spec import TrialSpec
from orchestrator.plan import PlanRow, memory
from orchestrator.plan.validity import point_label


def write(directory: str, specs: list[TrialSpec], rows: list[PlanRow]) -> int:
    """Each runnable point's TrialSpec (policy already resolved) as DIR/<trial_id>.json, one line
    per file and per point skipped with the planner's reason; nothing starts. Exit 2 when no point runs."""
    written, seen = 0, set()
    for spec, row in zip(specs, rows, strict=True):
        if spec.trial_id in seen:
            continue
        seen.add(spec.trial_id)
        if row.verdict != "run":
            print(f"skipped {point_label(spec)} (trial {spec.trial_id}): {row.verdict}: {row.reason}")
            continue
        path = storage.join(directory, f"{spec.trial_id}.json")
        storage.write_text(path, spec.to_json())
        step = "" if row.predicted_step_s is None else f", step {row.predicted_step_s:.3g} s"
        hbm = row.predicted_hbm_bytes_per_device
        print(
            f"{path}: {point_label(spec)}, policy {row.policy or spec.train.remat}{step}"
            + ("" if hbm is None else f", {memory.gib(hbm)}/device")
        )
        written += 1
    if not written:
        print(
            f"error: no grid point is runnable on {specs[0].cluster.name}: nothing written", file=sys.stderr
        )
        return 2
    hint = (
        f"run one on a host of its cluster: python -m jobs.train {storage.join(directory, '<trial_id>.json')}"
    )
    if any(s.cluster.hosts_per_trial > 1 for s, r in zip(specs, rows, strict=True) if r.verdict == "run"):
        hint += (
            " (one host only: a trial of several hosts runs a process on each, so launch it with the driver)"
        )
    print(hint)
    return 0
