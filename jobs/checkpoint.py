"""Save and restore the train state with orbax, to a local directory or gs:// (so a preempted trial resumes).

For gs:// on one host the state is staged locally and mirrored to the bucket (restore mirrors it back
first); multi-host trials let orbax write gs:// directly.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile

import jax
import orbax.checkpoint as ocp

from jobs import storage


class Checkpointer:
    def __init__(self, uri: str, every: int, keep: int = 2):
        self.uri, self.every = uri, every
        # Multi-host: orbax writes gs:// itself (tensorstore's GCS driver, real GCS) so all hosts share one
        # directory, as its commit protocol needs. One host: stage locally and mirror through
        # google-cloud-storage, which also works against a GCS emulator.
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

    def latest_step(self) -> int | None:
        return self.mgr.latest_step()

    def restore(self, abstract_state):
        """(state, next step) from the latest checkpoint, or None when there is none."""
        step = self.mgr.latest_step()
        if step is None:
            return None
        state = self.mgr.restore(step, args=ocp.args.StandardRestore(abstract_state))
        return state, step + 1

    def maybe_save(self, step: int, state, force: bool = False) -> bool:
        """Save after `step` when due; the step number stored is the last completed step."""
        if not force and (self.every <= 0 or (step + 1) % self.every):
            return False
        # Finish the step first: orbax's multi-host save runs its own cross-process sync, which must not
        # interleave with the step's in-flight collectives (that deadlocked gloo on CPU).
        jax.block_until_ready(state)
        self.mgr.save(step, args=ocp.args.StandardSave(state), force=True)
        self.mgr.wait_until_finished()
        if self.mirror:
            storage.upload_dir(self.local, self.uri)
            storage.delete_prefix(self.uri, keep={str(s) for s in self.mgr.all_steps()})
        return True

    def close(self) -> None:
        self.mgr.close()
