"""Trial leases in the tracking store: however many drivers run one sweep id, each trial runs under one of them.

A lease is a param on the trial's child run, `lease_<n>` = the driver's token. MLflow params cannot change
once logged (the store's primary key decides a race), so of two drivers logging `lease_<n>` at once exactly
one wins epoch n. A driver is alive while its heartbeat tag on the sweep's parent run, `driver.<token>`, is
younger than TTL_S; on the same host a holder whose process is gone is dead at once (a SIGKILLed driver's
rerun need not wait out the TTL). A lease whose holder is dead is taken by logging the next epoch.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from tenacity import RetryError, Retrying, retry_if_result, stop_after_attempt

from orchestrator.tracking.runs import log_param_once

log = logging.getLogger(__name__)

HEARTBEAT_S = 10.0
TTL_S = 60.0  # six missed heartbeats: a driver on another host is presumed dead
CLAIM_LOOKS = 20
EXITED = "exited"


def _host() -> str:
    """This host's name as a token part: no dashes (they separate the parts), only what a tag key allows."""
    return re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname())


def driver_token() -> str:
    """host-pid-random: unique per driver, and names the host and process for people and for `alive`."""
    return f"{_host()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class Claim:
    ours: bool
    holder: str  # the driver token that holds the lease (ours, or the one we wait for)
    status: str  # the trial's status tag when we looked
    epoch: int = 1  # the lease's n: above 1, an earlier driver held the trial (and may have logged steps)


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's live process
        return False
    return False


class Leases:
    """The leases of one driver of one sweep: `claim` a trial, keep them alive, give them up on `close`."""

    def __init__(self, client: Any, run_ids: dict[str, str], sweep_key: str = "sweep"):
        self.client, self.run_ids, self.sweep_key = client, run_ids, sweep_key
        self.token = driver_token()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """One heartbeat now (so no claim of ours is ever backed by none), then one every HEARTBEAT_S."""
        self._beat(str(int(time.time())))
        self._thread = threading.Thread(target=self._loop, daemon=True, name="lease-heartbeat")
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self._beat(str(int(time.time())))
            except Exception as e:  # noqa: BLE001 - a store outage: the next beat tries again
                log.warning("lease heartbeat not delivered (%s)", type(e).__name__)

    def _beat(self, value: str) -> None:
        self.client.set_tag(self.run_ids[self.sweep_key], f"driver.{self.token}", value)

    def close(self) -> None:
        """Stop beating and say so: our leases are free at once for a driver that waits on them."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self._beat(EXITED)
        except Exception:  # noqa: BLE001 - the TTL frees them instead
            log.warning("could not release this driver's leases; they expire in %.0f s", TTL_S)

    def alive(self, holder: str) -> bool:
        """Whether the driver `holder` still holds its leases."""
        if holder == self.token:
            return True
        beat = self.client.get_run(self.run_ids[self.sweep_key]).data.tags.get(f"driver.{holder}")
        if beat is None or beat == EXITED:
            return False
        host, _, pid = holder.rpartition("-")[0].rpartition("-")
        if host == _host() and pid.isdigit() and _pid_gone(int(pid)):
            return False
        return time.time() - int(beat) < TTL_S

    def claim(self, key: str, settled: tuple[str, ...] = ("finished",)) -> Claim:
        """Take trial `key`'s lease unless a live driver holds it, or its holder left it in a `settled`
        status (then it is that driver's result, not ours to run again)."""
        # each look that finds another driver won the next epoch is followed by another: a bounded number
        looks = Retrying(retry=retry_if_result(lambda got: got is None), stop=stop_after_attempt(CLAIM_LOOKS))
        try:
            return looks(self._look, self.run_ids[key], settled)
        except RetryError:
            raise RuntimeError(
                f"trial {key}: the lease changed hands {CLAIM_LOOKS} times while this driver tried to claim it"
            ) from None

    def _look(self, rid: str, settled: tuple[str, ...]) -> Claim | None:
        """One look at the trial's lease, and a bid for the next epoch where its holder is gone; None when
        another driver's bid for that epoch won."""
        run = self.client.get_run(rid)
        params, status = run.data.params, run.data.tags.get("status", "")
        epochs = [int(k[6:]) for k in params if k.startswith("lease_") and k[6:].isdigit()]
        n = max(epochs, default=0)
        if n:
            holder = params[f"lease_{n}"]
            if holder == self.token:
                return Claim(True, holder, status, n)
            if status in settled or self.alive(holder):
                return Claim(False, holder, status, n)
        if log_param_once(self.client, rid, f"lease_{n + 1}", self.token) == self.token:
            return Claim(True, self.token, status, n + 1)
        return None


class SoleLeases:
    """tracking=none: no store for drivers to meet in, so every trial is this driver's."""

    token = "this-driver"

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass

    def claim(self, key: str, settled: tuple[str, ...] = ("finished",)) -> Claim:
        return Claim(True, self.token, "")
