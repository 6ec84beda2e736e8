"""Tier 1: every config in conf/ keeps its trial ids: MLflow resumes a trial by its id, the regression gate
compares runs of one id and the AOT cache is keyed on it, so a change to the spec or its keys' declarations must
leave today's ids as they are (a new key: `key(..., id_at_default=False)`, jobs/fields.py).

tests/trial_ids.json pins them, each under the command line that composes it: every model with every strategy and
every cluster with every strategy (one `-m` grid each, the same ids as composing each pair on its own), and every
point of every sweep; computed at commit 3061377, before the id flags replaced the lists of keys that came later."""

import json
from pathlib import Path

import pytest

from orchestrator.cli.args import compose, parse_args
from orchestrator.config import data
from orchestrator.config.grid import expand

PINNED = json.loads((Path(__file__).parent / "trial_ids.json").read_text())


@pytest.fixture
def no_data_check(monkeypatch):
    """Ids only: a documents sweep's corpus (data/stdlib) is neither built nor read."""
    monkeypatch.setattr(data, "problems", lambda d: [])


def test_every_config_keeps_its_trial_ids(no_data_check):
    changed = {}
    for line, ids in PINNED.items():
        now = [s.trial_id for s in expand(compose(parse_args(line.split())).tree)]
        if now != ids:
            changed[line] = (ids, now)
    assert not changed, f"{len(changed)} of {len(PINNED)} configs changed their trial ids: {changed}"


def test_the_pins_cover_every_model_strategy_and_sweep():
    conf = Path(__file__).parent.parent / "conf"
    names = {g: sorted(p.stem for p in (conf / g).glob("*.yaml")) for g in ("model", "strategy", "sweep")}
    want = {f"-m model={m} strategy={','.join(names['strategy'])}" for m in names["model"]}
    want |= {f"+sweep={w}" for w in names["sweep"]}
    assert want <= set(PINNED), f"configs without pinned ids: {sorted(want - set(PINNED))}"
