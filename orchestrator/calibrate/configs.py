"""Fitted constants written into conf/cluster/<name>.yaml: the file's step-time section (from its `# Step-time
model` line to the end) is written anew, a header saying where the values come from and each value; every key
before it stays as it was, and a key of the old section the fit does not set keeps its line."""

from __future__ import annotations

import re
from pathlib import Path

from omegaconf import OmegaConf

from orchestrator import REPO
from orchestrator.plan import cluster_model

MARK = "# Step-time model"


def number(v: float) -> str:
    """A float OmegaConf reads back as one (YAML 1.1 reads `1e-05`, without a dot, as a string)."""
    s = repr(float(f"{v:.4g}"))
    return s.replace("e", ".0e") if "e" in s and "." not in s.split("e")[0] else s


def write(name: str, values: dict[str, float], header: list[str], conf: Path = REPO / "conf") -> Path:
    path = conf / "cluster" / f"{name}.yaml"
    lines = path.read_text().splitlines()
    cut = next((i for i, line in enumerate(lines) if line.startswith(MARK)), len(lines))
    kept = [line for line in lines[cut:] if (m := re.match(r"^(\w+):", line)) and m.group(1) not in values]
    order = [f for f in cluster_model.MODEL_ORDER if f in values]
    text = "\n".join(
        [*lines[:cut], *(f"# {h}" if h else "#" for h in header), *kept]
        + [f"{k}: {number(values[k])}" for k in order]
    )
    text += "\n"
    # a bad value fails here, not at a sweep
    cluster_model.split(OmegaConf.to_container(OmegaConf.create(text)))
    path.write_text(text)
    cluster_model.load.cache_clear()
    return path
