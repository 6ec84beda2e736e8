"""A config key's one declaration: its default, its range or allowed values and its meaning, as the metadata of
a dataclass field (`key(...)`). The dataclass holds the type.

Pure Python, so the seam's own dataclasses (jobs/spec.py) declare their keys with it. The driver's checks
(orchestrator/config/keys.py), `--help` (orchestrator/cli/help.py) and the reference pages (docs/gen/reference_pages.py)
read every key from these declarations; none keeps a list of its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MISSING: Any = dataclasses.MISSING


@dataclass(frozen=True)
class Rule:
    """What a key accepts beyond its type: a range, a set of names, "auto", or any non-empty string. On a list
    key it holds for each entry."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    choices: tuple[str, ...] = ()
    auto: bool = False  # "auto" is accepted too: a value filled in later (the mesh, the planner's policy)
    nonempty: bool = False
    # a list of names that is a sequence (model.attention_pattern), not a set: a name may come again
    repeats: bool = False


def key(
    default: Any = MISSING,
    *,
    doc: str,
    factory: Callable[[], Any] = MISSING,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    choices: tuple[str, ...] = (),
    auto: bool = False,
    nonempty: bool = False,
    repeats: bool = False,
    id_at_default: bool = True,
) -> Any:
    """A dataclass field declaring a config key: `default` (or `factory`, for a section; neither: required),
    what it accepts and `doc`, its meaning (Markdown; the first sentence is its `--help` line).

    `id_at_default=False`: the key enters the trial id (jobs/spec.py TrialSpec.identity) only when it is not at
    its default. A key added after trials ran is declared so: those trials keep their ids, so MLflow resumes
    them, the regression gate's baselines still match and the cached AOT compiles stay valid."""
    rule = Rule(ge=ge, gt=gt, le=le, choices=tuple(choices), auto=auto, nonempty=nonempty, repeats=repeats)
    meta = {"doc": doc, "rule": rule, "id_at_default": id_at_default}
    return dataclasses.field(default=default, default_factory=factory, metadata=meta)


def default(f: dataclasses.Field) -> Any:
    """The declared default (a section's, from its factory); MISSING: the key is required."""
    return f.default if f.default_factory is MISSING else f.default_factory()


def doc(f: dataclasses.Field) -> str:
    """The meaning `key()` declared ("" for a field declared without it)."""
    return f.metadata.get("doc", "")


def rule(f: dataclasses.Field) -> Rule:
    """What the field accepts beyond its type (a field declared without `key()` accepts its whole type)."""
    return f.metadata.get("rule", Rule())


def id_at_default(f: dataclasses.Field) -> bool:
    """Whether the key enters the trial id at its default (`key(id_at_default=...)`; a plain field does)."""
    return f.metadata.get("id_at_default", True)
