"""Wait for a Ray job and turn its outcome into the cron run's exit code and a one-line JSON summary.

`ray job submit` only says "failed" (exit 1), but the sweep's own exit code matters to whoever is paged: 1 failed
trials, 2 bad input, 3 the regression gate. Ray keeps it as `driver_exit_code`; this reads it back, so the
CronJob's pod exits with the orchestrator's code and its last log line is the JSON an alert can parse.

    job_summary.py --address URL --submission-id ID --sweep-id SID [--state]

With --state it only prints the job's state: NONE when Ray has no job of that id, UNREACHABLE when the job API
does not answer.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from typing import Any

UNREACHABLE = 4  # the job could not be submitted or followed: an infrastructure problem, not a sweep result
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
RESULT_LINE = re.compile(r"^sweep \S+: \d+ finished")
POLL_S = float(os.environ.get("SUMMARY_POLL_S", "10"))
# A head restart or a network blip should not page anyone: keep polling this many times before giving up.
MAX_ERRORS = int(os.environ.get("SUMMARY_MAX_ERRORS", "60"))


class NoSuchJob(LookupError):
    pass


def client(address: str):
    """A job client that retries while the head is starting (token auth comes from RAY_AUTH_TOKEN)."""
    from ray.job_submission import JobSubmissionClient

    for attempt in range(MAX_ERRORS):
        try:
            return JobSubmissionClient(address)
        except Exception as e:  # ConnectionError, or a 5xx while the dashboard starts
            if attempt == MAX_ERRORS - 1:
                raise
            print(f"job API at {address} not reachable ({e}); retrying", file=sys.stderr)
            time.sleep(POLL_S)
    raise AssertionError("unreachable")


def job_info(c, submission_id: str):
    try:
        return c.get_job_info(submission_id)
    except RuntimeError as e:
        if "status code 404" in str(e) or "does not exist" in str(e):
            raise NoSuchJob(submission_id) from e
        raise


def wait(c, submission_id: str):
    """The job's info once it is terminal; tolerates MAX_ERRORS consecutive failures to ask."""
    errors = 0
    while True:
        try:
            info = job_info(c, submission_id)
            errors = 0
            if str(info.status) in TERMINAL or getattr(info.status, "value", None) in TERMINAL:
                return info
        except NoSuchJob:
            raise
        except Exception as e:
            errors += 1
            if errors >= MAX_ERRORS:
                raise
            print(f"asking for {submission_id} failed ({e}); retrying", file=sys.stderr)
        time.sleep(POLL_S)


def exit_code(status: str, driver_exit_code: int | None) -> int:
    if status == "SUCCEEDED":
        return 0
    if status == "FAILED" and driver_exit_code:
        return int(driver_exit_code)
    # STOPPED by someone, or FAILED with no driver code (the supervisor or the head died).
    return UNREACHABLE


def from_logs(logs: str) -> dict[str, Any]:
    """The orchestrator's result line and the last JSON object it printed (e.g. the regression gate's)."""
    out: dict[str, Any] = {}
    for line in logs.splitlines():
        line = line.strip()
        if RESULT_LINE.match(line):
            out["result"] = line
        elif line.startswith("dashboard: "):
            out["dashboard"] = line.removeprefix("dashboard: ")
        elif line.startswith("{") and line.endswith("}"):
            try:
                out["sweep"] = json.loads(line)
            except json.JSONDecodeError:
                pass
    return out


def summary(info, logs: str, submission_id: str, sweep_id: str) -> dict[str, Any]:
    status = getattr(info.status, "value", str(info.status))
    start, end = info.start_time, info.end_time
    return {
        "event": "cp_sweep_cron",
        "submission_id": submission_id,
        "sweep_id": sweep_id,
        "status": status,
        "exit_code": exit_code(status, info.driver_exit_code),
        "driver_exit_code": info.driver_exit_code,
        "duration_s": round((end - start) / 1000, 1) if start and end else None,
        "message": (info.message or "")[:500],
        **from_logs(logs),
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--address", required=True)
    p.add_argument("--submission-id", required=True)
    p.add_argument("--sweep-id", required=True)
    p.add_argument("--state", action="store_true", help="print the job's state and exit")
    a = p.parse_args(argv)
    out: dict[str, Any] = {"event": "cp_sweep_cron", "submission_id": a.submission_id, "sweep_id": a.sweep_id}
    try:
        c = client(a.address)
        if a.state:
            try:
                info = job_info(c, a.submission_id)
                print(getattr(info.status, "value", str(info.status)))
            except NoSuchJob:
                print("NONE")
            return 0
        info = wait(c, a.submission_id)
        logs = c.get_job_logs(a.submission_id)
        out = summary(info, logs, a.submission_id, a.sweep_id)
    except NoSuchJob:
        out |= {"status": "NOT_SUBMITTED", "exit_code": UNREACHABLE}
    except Exception as e:
        if a.state:
            print(f"job API at {a.address}: {e}", file=sys.stderr)
            print("UNREACHABLE")
            return 0
        out |= {"status": "UNREACHABLE", "exit_code": UNREACHABLE, "message": str(e)[:500]}
    print(json.dumps(out, sort_keys=True), flush=True)
    return out["exit_code"]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
