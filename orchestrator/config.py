"""Compose the Hydra config once, and turn config errors into one clear line."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from jobs import strategies

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
GROUPS = ("model", "strategy", "mesh", "cluster", "tracking", "sweep")


# `${cp_strategies:}` in a sweep: every CP strategy of the registry, so a new one joins the sweeps by itself.
OmegaConf.register_new_resolver("cp_strategies", lambda: list(strategies.CP_NAMES), replace=True)


class ConfigError(ValueError):
    """Bad input found before anything starts: the CLI prints it as one line and exits 2."""


def load(overrides: list[str], conf_dir: Path = CONF_DIR) -> DictConfig:
    """Compose `config.yaml` with command-line overrides (Hydra's own grammar), then check the top-level
    options against the schema; trial keys are checked per grid point by grid.expand."""
    from orchestrator import checks  # imports ConfigError from here

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
            cfg = compose(config_name="config", overrides=list(overrides))
        tree = OmegaConf.to_container(cfg, resolve=True)
    except Exception as e:  # hydra raises several types; all mean "bad input"
        raise ConfigError(_one_line(e, overrides)) from e
    checks.check_options(tree)
    return cfg


def _one_line(e: Exception, overrides: list[str]) -> str:
    msg = " ".join(str(e).split())
    for g in GROUPS:
        if f"'{g}'" in msg and ("Could not find" in msg or "not found" in msg):
            opts = sorted(p.stem for p in (CONF_DIR / g).glob("*.yaml"))
            return f"{msg.split('Available options')[0].strip()} — choose {g} from: {', '.join(opts)}"
    if "Key '" in msg and "not in struct" in msg:
        return f"{msg.split(' full_key')[0]} — check the key name, or add it with '+key=value'"
    return msg


def group_option(group: str, name: str, conf_dir: Path = CONF_DIR) -> dict:
    """One option of a config group as a plain dict (loaded once per grid axis value, not per point)."""
    path = conf_dir / group / f"{name}.yaml"
    if not path.exists():
        opts = sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))
        raise ConfigError(f"unknown {group} {name!r} in the sweep grid — choose from: {', '.join(opts)}")
    return OmegaConf.to_container(OmegaConf.load(path), resolve=True)
