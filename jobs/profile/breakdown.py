"""Where a profiled step's time went: a jax.profiler trace (its Perfetto JSON) as seconds per category.

Pure Python (no jax): both the job and a notebook can read a trace. An op event names its HLO instruction
(XLA:CPU's thunks carry `hlo_op`, `hlo_module` and `device_ordinal`; TPU ops sit on a device's "XLA Ops"
thread); the compiled module's text says what each instruction is (its opcode, what a fusion contains, the
named scope in its metadata), so a `ppermute.134` is a collective-permute and a fusion holding a dot a matmul.
Without the text the op's name is read instead.

Per device, time is cut at every op boundary; each slice of time goes to the ops running in it (split evenly
when several run at once; a while loop or conditional alone counts as other compute), and no op at all is
idle. So the categories and idle add up to the traced wall time exactly. A collective's time is exposed where
no compute runs beside it on the same device, overlapped where some does.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

# jobs/attention/api.py wraps every strategy's attention (forward, backward, remat) in this jax.named_scope
ATTENTION_SCOPE = "cp_attention"
COLLECTIVES = ("all_gather", "all_to_all", "collective_permute", "reduce_scatter", "all_reduce")
COMPUTE = ("matmul", "attention", "other_compute")
CATEGORIES = ("matmul", "attention", *COLLECTIVES, "host_transfer", "other_compute", "idle")
CONTAINER = "container"  # while / conditional / call: their body's ops are events of their own

_COLLECTIVE_OPS = {
    "all-gather": "all_gather",
    "all-to-all": "all_to_all",
    "ragged-all-to-all": "all_to_all",
    "collective-permute": "collective_permute",
    "reduce-scatter": "reduce_scatter",
    "all-reduce": "all_reduce",
}
_CONTAINERS = {"while", "conditional", "call"}
_HOST_OPS = {"send", "recv", "send-done", "recv-done", "infeed", "outfeed"}
_HOST_TARGETS = ("MoveToHost", "MoveToDevice")  # offload annotations that survive as custom calls
_HOST_SPACE = ":S(5)"  # pinned host memory in a layout: what an offload copy writes to or reads from
_MATMUL_OPS = {"dot", "convolution", "ragged-dot"}
_MATMUL_TARGET = re.compile(r"matmul|gemm", re.I)  # oneDNN / cuBLAS custom calls

_INSTR = re.compile(r"^\s+(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_OPCODE = re.compile(r"\s([a-z][\w\-]*)\(")
_OPERAND = re.compile(r"[^%)]*%([\w.\-]+)")
_CALLS = re.compile(r"\b(?:calls|body|condition|true_computation|false_computation)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_TARGET = re.compile(r'custom_call_target="([^"]*)"')
_SCOPE = re.compile(rf"(?<![\w]){ATTENTION_SCOPE}(?![\w])")
# by name, when the module's text is not at hand (or lacks the op): first match wins
_BY_NAME = [
    (re.compile(r"^(while|conditional|call)\b"), CONTAINER),
    (re.compile(r"all[-_]gather"), "all_gather"),
    (re.compile(r"all[-_]to[-_]all"), "all_to_all"),
    (re.compile(r"collective[-_]permute|ppermute"), "collective_permute"),
    (re.compile(r"reduce[-_]scatter"), "reduce_scatter"),
    (re.compile(r"all[-_]reduce|psum"), "all_reduce"),
    (re.compile(r"copy[-_](start|done)|^(send|recv|infeed|outfeed)\b"), "host_transfer"),
    (re.compile(r"^(dot|convolution)\b|ynn_fusion|matmul|gemm"), "matmul"),
]


@dataclass(frozen=True)
class _Instr:
    opcode: str
    line: str
    calls: tuple[str, ...]
    operand: str  # the first one (a copy-done's copy-start)


def _parse_module(hlo_text: str) -> tuple[str, dict[str, _Instr], dict[str, list[str]]]:
    """(module name, instruction name -> instruction, computation -> its instructions' names)."""
    module, comp = "", ""
    instrs: dict[str, _Instr] = {}
    comps: dict[str, list[str]] = defaultdict(list)
    for line in hlo_text.splitlines():
        if line.startswith("HloModule "):
            module = line.split()[1].rstrip(",")
        elif line[:1] in ("%", "E") and line.rstrip().endswith("{"):  # a computation's header
            comp = line.removeprefix("ENTRY ").split()[0].lstrip("%")
        elif m := _INSTR.match(line):
            rest = " " + m.group(2)
            op = _OPCODE.search(rest)
            first = _OPERAND.match(rest, op.end()) if op else None
            branches = _BRANCHES.search(line)
            called = _CALLS.findall(line) + (
                [b.strip().lstrip("%") for b in branches.group(1).split(",")] if branches else []
            )
            instrs[m.group(1)] = _Instr(
                op.group(1) if op else "", line, tuple(called), first.group(1) if first else ""
            )
            comps[comp].append(m.group(1))
    return module, instrs, comps


def hlo_categories(hlo_text: str) -> tuple[str, dict[str, str]]:
    """(module name, instruction name -> category) from a compiled module's text (`compiled.as_text()`)."""
    module, instrs, comps = _parse_module(hlo_text)
    sorter = _Categories(instrs, comps)
    return module, {n: sorter.category(i) for n, i in instrs.items()}


class _Categories:
    """One module's instructions sorted into categories, each computation's opcodes gathered once."""

    def __init__(self, instrs: dict[str, _Instr], comps: dict[str, list[str]]):
        self.instrs, self.comps, self.inside = instrs, comps, {}

    def opcodes(self, comp: str) -> set[str]:
        """Every opcode a computation runs, through what it calls."""
        if comp not in self.inside:
            self.inside[comp] = set()  # a cycle cannot happen in HLO; this only guards the recursion
            names = self.comps.get(comp, [])
            self.inside[comp] = {self.instrs[n].opcode for n in names}.union(
                *(self.opcodes(c) for n in names for c in self.instrs[n].calls)
            )
        return self.inside[comp]

    def category(self, i: _Instr) -> str:
        if i.opcode in _CONTAINERS:
            return CONTAINER
        if i.opcode == "copy-done" and i.operand in self.instrs:  # a transfer is where its copy-start points
            return self.category(self.instrs[i.operand])
        ops = {i.opcode}.union(*(self.opcodes(c) for c in i.calls))
        bases = {o.removesuffix("-start").removesuffix("-done").removesuffix("-update") for o in ops}
        for op, cat in _COLLECTIVE_OPS.items():
            if op in bases:
                return cat
        target = m.group(1) if (m := _TARGET.search(i.line)) else ""
        if i.opcode in _HOST_OPS or target in _HOST_TARGETS or _HOST_SPACE in i.line.split(" metadata=")[0]:
            return "host_transfer"
        if (name := _OP_NAME.search(i.line)) and _SCOPE.search(name.group(1)):
            return "attention"
        if ops & _MATMUL_OPS or _MATMUL_TARGET.search(target):
            return "matmul"
        return "other_compute"


def category_by_name(name: str) -> str:
    """An op's category from its name alone (a trace read without its module's text)."""
    return next((cat for pattern, cat in _BY_NAME if pattern.search(name)), "other_compute")


def load(path: str) -> dict[str, Any]:
    """A Perfetto / Chrome trace file (`perfetto_trace.json.gz` or `*.trace.json.gz`)."""
    with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
        return json.load(f)


def device_ops(trace: dict[str, Any] | list, module: str = "") -> dict[str, list[tuple[float, float, str]]]:
    """Per device: (start µs, end µs, HLO op name) of each op event (of `module` only, where events say)."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    threads = {
        (e.get("pid"), e.get("tid")): (e.get("args") or {}).get("name", "")
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    out: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        args = e.get("args") or {}
        if "hlo_op" in args:
            name = args["hlo_op"]
        elif threads.get((e.get("pid"), e.get("tid"))) == "XLA Ops":
            name = e.get("name", "")
        else:
            continue
        if module and not str(args.get("hlo_module", module)).startswith(module):
            continue  # another program's op (a transfer, a probe) traced alongside the step
        start = float(e["ts"])
        out[str(args.get("device_ordinal", e.get("pid")))].append((start, start + float(e["dur"]), name))
    return dict(out)


@dataclass(frozen=True)
class Breakdown:
    """Seconds per step, averaged over the traced devices; `seconds` (CATEGORIES) adds up to `step_s`."""

    steps: int
    devices: int
    step_s: float  # traced wall time per step: first op start to last op end, over every device
    seconds: dict[str, float]
    collective_exposed_s: float  # collective time with no compute beside it on its device
    collective_overlapped_s: float

    def limiter(self) -> str:
        """What the step spends most of its time on, in the planner's words (plan/steptime.py)."""
        s = self.seconds
        groups = {
            "matmuls": s["matmul"],
            "attention kernel": s["attention"],
            "exposed collectives": self.collective_exposed_s,
            "host transfers": s["host_transfer"],
            "other compute": s["other_compute"],
            "idle": s["idle"],
        }
        name, secs = max(groups.items(), key=lambda kv: kv[1])
        return f"{name} {secs / self.step_s:.0%} of the step" if self.step_s > 0 else name


def _one_device(ops: list[tuple[float, float, str]], t0: float, t1: float) -> tuple[Counter, float, float]:
    """(µs per category, exposed, overlapped) on one device within [t0, t1]."""
    edges = sorted(
        [(s, 1, c) for s, _, c in ops] + [(e, -1, c) for _, e, c in ops], key=lambda x: (x[0], x[1])
    )
    secs: Counter = Counter()
    active: Counter = Counter()
    exposed = overlapped = busy = 0.0
    now = t0
    for t, delta, cat in edges:
        dt = t - now
        if dt > 0:
            leaves = {c: n for c, n in active.items() if n > 0 and c != CONTAINER}
            if total := sum(leaves.values()):
                for c, n in leaves.items():
                    secs[c] += dt * n / total
            elif active[CONTAINER] > 0:
                secs["other_compute"] += dt  # a loop's own control, between its body's ops
            if total or active[CONTAINER] > 0:
                busy += dt
            if any(c in COLLECTIVES for c in leaves):
                if any(c in COMPUTE for c in leaves):
                    overlapped += dt
                else:
                    exposed += dt
            now = t
        active[cat] += delta
    secs["idle"] = (t1 - t0) - busy
    return secs, exposed, overlapped


def breakdown(trace: dict[str, Any] | list, hlo_text: str = "", steps: int = 1) -> Breakdown:
    """The trace of `steps` consecutive steps as seconds per step per category (see the module docstring);
    `hlo_text`: the traced program's `compiled.as_text()` (without it, categories come from op names)."""
    module, cats = hlo_categories(hlo_text) if hlo_text else ("", {})
    by_device = device_ops(trace, module)
    if not by_device:
        raise ValueError("the trace has no device op events (was the step traced?)")
    t0 = min(s for ops in by_device.values() for s, _, _ in ops)
    t1 = max(e for ops in by_device.values() for _, e, _ in ops)
    total: Counter = Counter()
    exposed = overlapped = 0.0
    for ops in by_device.values():
        named = [(s, e, cats.get(n) or category_by_name(n)) for s, e, n in ops]
        secs, x, o = _one_device(named, t0, t1)
        total.update(secs)
        exposed, overlapped = exposed + x, overlapped + o
    scale = 1e-6 / len(by_device) / steps  # µs summed over devices -> s per device per step
    return Breakdown(
        steps=steps,
        devices=len(by_device),
        step_s=(t1 - t0) * 1e-6 / steps,
        seconds={c: total[c] * scale for c in CATEGORIES},
        collective_exposed_s=exposed * scale,
        collective_overlapped_s=overlapped * scale,
    )
