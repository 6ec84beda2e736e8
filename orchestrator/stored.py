"""A finished trial's records read back from its child run, so a sweep's plots cover the trials an earlier or
another driver of the same sweep finished (a resumed sweep, a takeover), not only this driver's."""

from __future__ import annotations

import json
import logging
import tempfile

from jobs.records import Record, parse_known

log = logging.getLogger(__name__)
LOG_ARTIFACT = "trial_log.txt"  # the trial log: one JSON record per line, between "[time] status" lines


def parse_trial_log(text: str) -> list[Record]:
    """The records of a trial log, in the order its driver saw them (status lines skipped)."""
    return parse_known(json.loads(ln) for ln in text.splitlines() if ln.startswith("{"))


def stored_records(client, run_id: str) -> list[Record]:
    """A trial's records from its child run's trial log; [] (logged) where the run has none or the store fails,
    since a plot must never cost a sweep its exit code."""
    try:
        with tempfile.TemporaryDirectory() as d:
            with open(client.download_artifacts(run_id, LOG_ARTIFACT, d)) as f:
                return parse_trial_log(f.read())
    except Exception as e:  # noqa: BLE001
        log.warning("run %s: its trial log could not be read back (%s: %s)", run_id, type(e).__name__, e)
        return []
