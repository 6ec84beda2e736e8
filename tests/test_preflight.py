"""The environment's faults at start are bad input: one `error:` line, exit 2, nothing recorded or launched."""

import pytest
from servers import free_port  # a port nothing listens on (bound, then released)


def stale_ray_tmpdir(tmp_path) -> dict:
    """Ray's temp dir holding the address file of a head node that is gone (what a dead `ray start` leaves)."""
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{free_port()}\n")
    return {"RAY_TMPDIR": str(tmp_path), "RAY_ADDRESS": ""}


def no_credentials(tmp_path) -> dict:
    """No key file, no gcloud ADC (a fresh HOME), and a metadata server that refuses at once (as off GCP)."""
    dead = f"127.0.0.1:{free_port()}"
    return {
        "HOME": str(tmp_path),
        "GOOGLE_APPLICATION_CREDENTIALS": "",
        "STORAGE_EMULATOR_HOST": "",
        "GCE_METADATA_HOST": dead,
        "GCE_METADATA_IP": dead,
    }


FAULTS = {
    "tracking server down": (
        lambda tmp: (["tracking=server", f"tracking.uri=http://127.0.0.1:{free_port()}"], {}),
        "tracking server http://127.0.0.1:",
    ),
    "no Ray at the address": (
        lambda tmp: (["cluster=v5p_128", f"cluster.address=127.0.0.1:{free_port()}"], {}),
        "the Ray head at 127.0.0.1:",
    ),
    "stale Ray address file": (
        lambda tmp: (["cluster=v5p_128"], stale_ray_tmpdir(tmp)),
        "ray_current_cluster) does not answer",
    ),
    "gs:// without credentials": (
        lambda tmp: (["run.checkpoint_dir=gs://cp-ckpt/runs"], no_credentials(tmp)),
        "gs://cp-ckpt/runs needs Google Cloud credentials",
    ),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_start_up_fault_is_one_line_and_exit_2(tmp_path, cli, fault):
    make, says = FAULTS[fault]
    args, env = make(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    tracking = [] if any(a.startswith("tracking=") for a in args) else ["tracking=local"]
    res = cli(["context_length=512", "train.steps=2", *tracking, *args], cwd=run, env=env)
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    errors = res.stderr.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("error: ") and says in errors[0], res.stderr
    assert "nothing started" in errors[0] and "Traceback" not in res.stdout + res.stderr
    assert list(run.iterdir()) == []  # no sqlite store, no journal: nothing was recorded
