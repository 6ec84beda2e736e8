"""Save and restore the train state with orbax, to a local directory or gs:// (so a preempted trial resumes).

A checkpoint also holds the metric records of every step it covers: a host killed after the save but before
the driver received those records resumes past them, so the resumed trial re-sends them from here.

For gs:// on one host the state is staged locally and mirrored to the bucket (restore mirrors it back
first); multi-host trials let orbax write gs:// directly.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from typing import Any

import jax
import orbax.checkpoint as ocp

from jobs import storage


class Checkpointer:
    def __init__(self, uri: str, every: int, keep: int = 2):
        self.uri, self.every = uri, every
        # Multi-host: orbax writes gs:// itself (tensorstore's GCS driver, real GCS) so all hosts share one
        # directory, as its commit protocol needs. One host: stage locally and mirror through jobs.storage
        # (gcsfs), which also works against a GCS emulator: tensorstore does not (gcp-storage-emulator sends
        # no x-goog-generation and ignores ifGenerationMatch, so reading OCDBT's manifest fails with
        # "Malformed StorageGeneration" intermittently).
        self.mirror = storage.is_gcs(uri) and jax.process_count() == 1
        if storage.is_gcs(uri) and not self.mirror:
            self.local = uri
        elif self.mirror:
            tag = hashlib.sha256(uri.encode()).hexdigest()[:16]
            self.local = os.path.join(tempfile.gettempdir(), "cp-orchestrator-ckpt", tag)
            shutil.rmtree(self.local, ignore_errors=True)  # the bucket is the truth, not a stale staging dir
            os.makedirs(self.local)
            if storage.exists(uri):
                storage.download_dir(uri, self.local)
        else:
            self.local = os.path.abspath(uri)
        opts = ocp.CheckpointManagerOptions(max_to_keep=keep, save_interval_steps=max(every, 1))
        self.mgr = ocp.CheckpointManager(self.local, options=opts)

    def restore(self, abstract_state) -> tuple[Any, int, list[dict], dict | None] | None:
        """(state, next step, step records up to it, the data loader's state to resume at that step) from the
        latest checkpoint, or None when there is none. A checkpoint from before data states has none."""
        step = self.mgr.latest_step()
        if step is None:
            return None
        items = dict(state=ocp.args.StandardRestore(abstract_state), records=ocp.args.JsonRestore())
        if "data" in (self.mgr.item_metadata(step) or {}):
            items["data"] = ocp.args.JsonRestore()
        got = self.mgr.restore(step, args=ocp.args.Composite(**items))
        return got.state, step + 1, list(got.records or []), got.get("data")

    def due(self, step: int) -> bool:
        """A save is due after `step` (the step number stored is the last completed step)."""
        return self.every > 0 and (step + 1) % self.every == 0

    def save(self, step: int, state, records: list[dict], data: dict | None = None) -> None:
        """Save the state after `step` with the metric records of steps 0..step and the data loader's state
        for step + 1 (JSON, written by process 0), so a resumed trial sees the batches it would have seen."""
        # Finish the step first: orbax's multi-host save runs its own cross-process sync, which must not
        # interleave with the step's in-flight collectives (that deadlocked gloo on CPU).
        jax.block_until_ready(state)
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            records=ocp.args.JsonSave(records),
            data=ocp.args.JsonSave(data or {}),
        )
        self.mgr.save(step, args=args, force=True)
        self.mgr.wait_until_finished()
        if self.mirror:
            storage.upload_dir(self.local, self.uri)
            storage.delete_prefix(self.uri, keep={str(s) for s in self.mgr.all_steps()})

    def close(self) -> None:
        self.mgr.close()
