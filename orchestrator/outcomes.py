"""Typed outcomes of a trial attempt, how a host's exception maps to one, and the retry budgets per kind."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import ray


class Outcome(StrEnum):
    FINISHED = "finished"
    PREEMPTED = "preempted"  # a host or node died, or a host failed only because its peer vanished
    FAILED = "failed"  # an exception in the job
    INFEASIBLE = "infeasible"  # out of memory: never retried
    CANCELLED = "cancelled"  # Ctrl-C


INFEASIBLE_MARKERS = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory")
# A job exception caused by a lost peer (gloo / coordination service) is the peer's preemption, not a bug. So is
# a peer that came too late to a new gloo communicator: XLA's CPU runtime gives it a fixed 30 s (no flag), which
# a host starved of CPU can miss.
PEER_LOST_MARKERS = ("Connection closed by peer", "Connection reset by peer", "stopped sending heartbeats",
                     "Gloo context initialization failed")  # fmt: skip


def classify(err: BaseException) -> Outcome:
    """Typed outcome of an exception from a host task."""
    text = f"{err} {getattr(err, 'cause', '')}"
    if isinstance(err, ray.exceptions.OutOfMemoryError) or any(m in text for m in INFEASIBLE_MARKERS):
        return Outcome.INFEASIBLE
    if isinstance(err, ray.exceptions.TaskCancelledError):
        return Outcome.CANCELLED
    if isinstance(err, ray.exceptions.RayTaskError):
        return Outcome.PREEMPTED if any(m in text for m in PEER_LOST_MARKERS) else Outcome.FAILED
    # worker or node died, task lost with its node: the slice is gone, not the code
    return Outcome.PREEMPTED


def combine(outcomes: list[Outcome]) -> Outcome:
    """One trial outcome from its hosts': a lost host explains its peers' errors; OOM beats a crash."""
    for o in (Outcome.PREEMPTED, Outcome.INFEASIBLE, Outcome.FAILED, Outcome.CANCELLED):
        if o in outcomes:
            return o
    return Outcome.FINISHED


@dataclass(frozen=True)
class RetryBudgets:
    """Retries per trial, separately for preemptions (not the code's fault) and failures (maybe a bug)."""

    preemption: int = 3
    failure: int = 1

    def limit(self, outcome: Outcome) -> int:
        return {Outcome.PREEMPTED: self.preemption, Outcome.FAILED: self.failure}.get(outcome, 0)
