"""The memory-policy candidates the recommender searches: each residual saved, offloaded or recomputed, train
state on host where the chip has it, one candidate per distinct effect, each with the override words that select it."""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, replace

from jobs.spec import HOST_STATE, REMAT_NAMES, REMAT_PRESETS, REMATS, MemorySpec, TrainSpec, residuals

# Each residual's fate under a remat policy; "recompute" is jax.checkpoint's default.
FATES = ("recompute", "save", "offload")


@dataclass(frozen=True)
class Policy:
    """One memory policy: train.remat plus train.memory, and the words that select it on the command line."""

    remat: str
    memory: MemorySpec

    @functools.cached_property
    def key(self) -> tuple:
        """What the step does with it: policies equal after jobs.spec.residuals() are one candidate."""
        if self.remat == "none":
            return ("none", (), (), self.memory.host)
        return ("remat", *residuals(self.remat, self.memory), self.memory.host)

    @functools.cached_property  # asked once per candidate the recommender sizes
    def family(self) -> str:
        """The kind of policy, for the recommender's losing-family lines: none, recompute, save, offload..."""
        if self.remat == "none":
            base = "no remat"
        else:
            saved, moved = residuals(self.remat, self.memory)
            base = "+".join(w for w, names in (("save", saved), ("offload", moved)) if names) or "recompute"
        return base + (" +host state" if self.memory.host else "")

    def words(self) -> list[str]:
        """Override words that select exactly this policy (shell-quoted where a list needs it)."""
        out = [f"train.remat={self.remat}"]
        for k in ("save", "offload", "host"):
            names = getattr(self.memory, k)
            if names:
                out.append(f"'train.memory.{k}=[{','.join(names)}]'")
        return out

    def label(self) -> str:
        return " ".join(w.strip("'") for w in self.words())

    def apply(self, train: TrainSpec) -> TrainSpec:
        return replace(train, remat=self.remat, memory=self.memory)


def short(train: TrainSpec) -> str:
    """A policy in few words for a table cell: the preset, then each train.memory list, e.g.
    "full offload=[attn_out,layer_input] host=[optimizer,params]"."""
    m = train.memory
    lists = [f"{k}=[{','.join(getattr(m, k))}]" for k in ("save", "offload", "host") if getattr(m, k)]
    return " ".join([train.remat, *lists])


def _valid(p: Policy) -> bool:
    """orchestrator/plan/validity.py's memory rules, on the policy alone (they read only train)."""
    if p.remat == "none":
        return not (p.memory.save or p.memory.offload)
    saved, moved = REMAT_PRESETS[p.remat]
    m = p.memory
    overlap = set(m.save) & set(m.offload)
    return not (overlap or set(m.save) & set(moved) or set(m.offload) & set(saved))


def _host_sets(platform: str) -> list[tuple[str, ...]]:
    """Host-held train state is a TPU feature (docs/howto/memory-policies.md: on GPU it raised the peak)."""
    if platform != "tpu":
        return [()]
    return [tuple(c) for r in range(len(HOST_STATE) + 1) for c in itertools.combinations(HOST_STATE, r)]


def candidates(platform: str) -> list[Policy]:
    """Every distinct policy for a platform, fewest words first among equals (a preset before its spelled-out
    equivalent), the default train.remat=full first of all."""
    found: dict[tuple, Policy] = {}
    for host in _host_sets(platform):
        options = [Policy("none", MemorySpec(host=host))]
        for remat in REMATS[1:]:
            preset_saved, preset_moved = REMAT_PRESETS[remat]
            for fates in itertools.product(FATES, repeat=len(REMAT_NAMES)):
                want = dict(zip(REMAT_NAMES, fates, strict=True))
                if want["layer_input"] == "save":  # the scanned layer's carry: kept under every remat already
                    continue
                save = tuple(n for n in REMAT_NAMES if want[n] == "save" and n not in preset_saved)
                move = tuple(n for n in REMAT_NAMES if want[n] == "offload" and n not in preset_moved)
                options.append(Policy(remat, MemorySpec(save=save, offload=move, host=host)))
        for p in sorted(options, key=lambda p: (len(p.words()), REMATS.index(p.remat) != 1)):
            if _valid(p):
                found.setdefault(p.key, p)
    return list(found.values())
