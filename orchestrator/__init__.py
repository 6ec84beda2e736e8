"""The control plane: compose the grid, plan it, launch it on Ray, record it in MLflow (no jax at module top)."""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
"""The checkout that holds conf/, jobs/ and orchestrator/: Ray workers and subprocesses get it on PYTHONPATH."""
