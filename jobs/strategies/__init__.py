"""The strategy registry: one pure-Python description per CP strategy (jobs/strategies/<name>.py, no jax),
its JAX body in jobs/attention/<name>.py. Everything that varies by strategy asks the registry."""

from __future__ import annotations

import importlib
from functools import cache

from jobs.strategies.base import Local, Strategy

# The registry: adding a strategy is its two files, its conf/strategy/<name>.yaml and one name here.
NAMES = ("none", "all_gather", "ulysses", "ring", "usp", "double_ring")
CP_NAMES = tuple(n for n in NAMES if n != "none")

__all__ = ["CP_NAMES", "NAMES", "Local", "Strategy", "get"]


@cache
def get(name: str) -> Strategy:
    """The description of `name`; ValueError (one line) for a name not in the registry."""
    if name not in NAMES:
        raise ValueError(f"unknown attention strategy {name!r}; use one of {', '.join(NAMES)}")
    return importlib.import_module(f"jobs.strategies.{name}").STRATEGY
