"""Profiling a trial: which steps it may trace (a pure rule, which the driver also checks before launch), the
traces (trace.py) and their breakdown (breakdown.py)."""

from __future__ import annotations

from collections.abc import Sequence


def steps_problem(steps: Sequence[int], train_steps: int) -> tuple[str, str, str] | None:
    """What is wrong with tracing `steps` (run.profile_steps) in a trial of `train_steps` steps, what is allowed,
    and the fix; None: nothing. Step 0's time is the warm-up (first allocations and transfers, not the step),
    and a step past the last never runs."""
    bad = [s for s in steps if not 0 < s < train_steps]
    if not bad:
        return None
    wrong = "names step 0, the warm-up, not a step's time" if 0 in bad else "names a step past the last"
    fix = (
        f"e.g. run.profile_steps=[{min(2, train_steps - 1)}]"
        if train_steps > 1
        else "raise train.steps to trace a step"
    )
    return wrong, f"steps 1 to train.steps - 1 = {train_steps - 1}", fix
